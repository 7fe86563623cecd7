// SPDX-License-Identifier: Apache-2.0
// qcowtool commit: writes an image's data into its backing file, with
// qemu-img commit's flags, messages and exit status (1 on any error). The
// work is qcow2::Commit (qcow2/maintenance.h).
#include <cstdio>
#include <string>

#include "qcow2/maintenance.h"
#include "tools/chain_op_cli.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool commit [-f FMT] [-b BASE] [-d] [-p] [-q] [-t CACHE]\n"
    "                       TOP\n"
    "\n"
    "Writes the data TOP holds into its backing file, as 'qemu-img commit'\n"
    "does, then empties TOP (it reads as its backing file again). With -b,\n"
    "the data of TOP and of every image between TOP and BASE goes into BASE,\n"
    "and nothing else changes: TOP is not emptied (as in qemu-img 7.2, -b\n"
    "implies -d) and no backing name is rewritten.\n"
    "\n"
    "  -f FMT      format of TOP: qcow2 or raw (default: probe)\n"
    "  -b BASE     the image to commit into: a file of TOP's backing chain,\n"
    "              by the name the image above it stores or by path\n"
    "              (default: TOP's backing file)\n"
    "  -d          leave TOP as it is (do not empty it)\n"
    "  -p          show progress\n"
    "  -q          quiet: no \"Image committed.\" message, no progress\n"
    "  -t CACHE    cache mode: none, writeback, unsafe, directsync,\n"
    "              writethrough (none and directsync open with O_DIRECT)\n";

}  // namespace

int RunCommit(int argc, char** argv) {
  const std::string usage = ChainUsage(
      kUsage, "Exit status (qemu-img's): 0 committed, 1 on any error.\n");
  ChainArgs args;
  CommitSpec spec;
  OptionParser parser(usage);
  AddChainOptions(&parser, false, &args);
  parser.Flag("", 'd', &spec.keep_top);
  if (int rc = ParseChainArgs(argc, argv, &parser, &args); rc >= 0) {
    return rc;
  }
  spec.image = args.image;
  spec.format = args.format;
  spec.base = args.backing;
  absl::Status s = WithProgress(args.progress, &args.opts, [&] {
    return Commit(spec, args.opts).status();
  });
  if (!s.ok()) return ReportFailure(s.message());
  if (!args.quiet) std::printf("Image committed.\n");
  return kExitOk;
}

}  // namespace qcow2::tool
