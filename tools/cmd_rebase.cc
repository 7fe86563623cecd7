// SPDX-License-Identifier: Apache-2.0
// qcowtool rebase: changes an image's backing file, with qemu-img rebase's
// flags, messages and exit status (1 on any error). The work is
// qcow2::Rebase (qcow2/maintenance.h).
#include <string>

#include "qcow2/maintenance.h"
#include "tools/chain_op_cli.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool rebase [-f FMT] [-F BACKING_FMT] [-b BACKING] [-u] [-p]\n"
    "                       [-q] [-U] [-t CACHE] [-T SRC_CACHE] IMAGE\n"
    "\n"
    "Makes BACKING the backing file of IMAGE, as 'qemu-img rebase' does.\n"
    "Safe mode (the default) first copies into IMAGE every range that it\n"
    "does not allocate itself and that the old backing chain and BACKING\n"
    "read differently, so the disk IMAGE shows does not change; then the\n"
    "header takes the new name. -b \"\" pulls the whole old chain into IMAGE\n"
    "and leaves it with no backing file. A relative BACKING is relative to\n"
    "IMAGE's directory.\n"
    "\n"
    "  -f FMT      format of IMAGE: qcow2 or raw (default: probe)\n"
    "  -F FMT      format of BACKING: qcow2 or raw (needed with a BACKING)\n"
    "  -b BACKING  the new backing file (\"\": none)\n"
    "  -u          unsafe: only rewrite the name; the data is not looked at\n"
    "              and the old backing file need not exist (without -b:\n"
    "              drop the backing file)\n"
    "  -p          show progress\n"
    "  -q          quiet (no progress)\n"
    "  -t CACHE    cache mode: none, writeback, unsafe, directsync,\n"
    "              writethrough (none and directsync open with O_DIRECT)\n"
    "  -T CACHE    cache mode of the backing files (checked; they are read\n"
    "              with -t's mode)\n"
    "  -U, --force-share  open the backing files even while another process\n"
    "              writes them (only the shared read lock is taken)\n";

}  // namespace

int RunRebase(int argc, char** argv) {
  const std::string usage =
      ChainUsage(kUsage, "Exit status (qemu-img's): 0 rebased, 1 on any error.\n");
  ChainArgs args;
  RebaseSpec spec;
  std::string src_cache = "writeback", bad_format;
  OptionParser parser(usage);
  AddChainOptions(&parser, true, &args);
  parser.Flag("", 'u', &spec.unsafe)
      .Text("", 'T', &src_cache)
      .Add("", 'F', OptionParser::Arg::kRequired, [&](const char* v) {
        // Reported after the other options, as qemu-img does.
        if (!CheckImageFormat(v).ok()) bad_format = v;
        spec.backing_format = v;
        return kGoOn;
      });
  if (int rc = ParseChainArgs(argc, argv, &parser, &args); rc >= 0) {
    return rc;
  }
  if (!bad_format.empty()) {
    return UsageError(usage, CheckImageFormat(bad_format).message());
  }
  if (!args.have_backing && !spec.unsafe) {
    return UsageError(usage,
                      "Must specify backing file (-b) or use unsafe mode (-u)");
  }
  OpenOptions src;
  src.key_secret = args.policy.key_secret;
  if (absl::Status s = ApplyCacheMode(src_cache, &src); !s.ok()) {
    return ReportFailure(s.message());
  }
  spec.image = args.image;
  spec.format = args.format;
  spec.backing = args.backing;
  // No backing file: no format either (qemu-img ignores -F then).
  if (spec.backing.empty()) spec.backing_format.clear();
  absl::Status s = WithProgress(args.progress && !spec.unsafe, &args.opts,
                                [&] { return Rebase(spec, args.opts); });
  return s.ok() ? kExitOk : ReportFailure(s.message());
}

}  // namespace qcow2::tool
