// SPDX-License-Identifier: Apache-2.0
// What qcowtool's chain commands (commit, rebase, stream) share: their
// common flags (-f, -b, -p, -q, -t, -U, --backing-root, qemu-img's
// meanings), the usage text's end, and -p progress fed from lib/ops'
// fraction-done calls.
#ifndef QCOW2_TOOLS_CHAIN_OP_CLI_H_
#define QCOW2_TOOLS_CHAIN_OP_CLI_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "qcow2/maintenance.h"
#include "qcow2/options.h"
#include "tools/cli_util.h"
#include "tools/option_parser.h"
#include "tools/progress.h"

namespace qcow2::tool {

// The flags every chain command takes, as parsed.
struct ChainArgs {
  std::string image;    // the one image argument
  std::string format;   // -f
  std::string backing;  // -b
  bool have_backing = false;
  bool progress = false;  // -p, unless -q
  bool quiet = false;     // -q
  ChainOpOptions opts;  // -t, -U and --backing-root applied
  OpenPolicy policy;               // -U and --backing-root as given
  std::string cache = "writeback";  // -t as given
};

// Adds the shared flags to `parser` (-U and --force-share only when
// `force_share`), to be stored in `args`.
void AddChainOptions(OptionParser* parser, bool force_share, ChainArgs* args);

// Parses argv with `parser` (the shared flags and the command's own).
// Returns -1 when the command should go on, else the exit status (help
// printed, or a usage error, or a bad -t: 1).
int ParseChainArgs(int argc, char** argv, OptionParser* parser,
                   ChainArgs* args);

// `head` followed by the help lines of --backing-root and -h, and the
// exit status line `exit_line`.
std::string ChainUsage(std::string_view head, std::string_view exit_line);

// Runs `op` with qemu-img's progress line when `enabled`: 0 at the start,
// the fraction `op` reports through the callback it is given, 100 when it
// succeeds. Returns what `op` returns.
absl::Status WithProgress(
    bool enabled, ChainOpOptions* opts,
    const std::function<absl::Status()>& op);

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_CHAIN_OP_CLI_H_
