// SPDX-License-Identifier: Apache-2.0
// qcowtool stream (qcowtool's own verb, no qemu-img equivalent): QEMU's
// block-stream job done offline. The work is qcow2::StreamChain
// (qcow2/maintenance.h).
#include <string>

#include "qcow2/maintenance.h"
#include "tools/chain_op_cli.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool stream [-f FMT] [-b BASE] [-p] [-q] [-t CACHE] TOP\n"
    "\n"
    "Pulls into TOP the data of every image between TOP and BASE, then makes\n"
    "BASE TOP's backing file: the images in between are no longer needed by\n"
    "TOP (they are left as they are). Without -b the whole chain is pulled\n"
    "in and TOP is left with no backing file. The disk TOP shows does not\n"
    "change. Offline form of QEMU's block-stream job; qcowtool only (with\n"
    "qemu-img: 'rebase -F FMT -b BASE TOP').\n"
    "\n"
    "  -f FMT      format of TOP: qcow2 or raw (default: probe)\n"
    "  -b BASE     the image to keep as TOP's backing file: a file of TOP's\n"
    "              backing chain, by the name the image above it stores or\n"
    "              by path; TOP then names it by that stored name when TOP\n"
    "              shares that image's directory, else by absolute path\n"
    "  -p          show progress\n"
    "  -q          quiet (no progress)\n"
    "  -t CACHE    cache mode: none, writeback, unsafe, directsync,\n"
    "              writethrough (none and directsync open with O_DIRECT)\n";

}  // namespace

int RunStream(int argc, char** argv) {
  const std::string usage = ChainUsage(
      kUsage, "Exit status: 0 streamed, 1 on any error (as qemu-img rebase).\n");
  ChainArgs args;
  OptionParser parser(usage);
  AddChainOptions(&parser, false, &args);
  if (int rc = ParseChainArgs(argc, argv, &parser, &args); rc >= 0) {
    return rc;
  }
  StreamSpec spec;
  spec.image = args.image;
  spec.format = args.format;
  spec.base = args.backing;
  absl::Status s = WithProgress(args.progress, &args.opts, [&] {
    return StreamChain(spec, args.opts);
  });
  return s.ok() ? kExitOk : ReportFailure(s.message());
}

}  // namespace qcow2::tool
