// SPDX-License-Identifier: Apache-2.0
// The command-line parts `qcowtool serve` (NBD) and `qcowtool serve
// --vhost-user-blk` share: their common options and the IMAGE operand.
#ifndef QCOW2_TOOLS_SERVE_CLI_H_
#define QCOW2_TOOLS_SERVE_CLI_H_

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tools/cli_util.h"
#include "tools/option_parser.h"

namespace qcow2::tool {

// Where the options both servers take are stored.
struct ServeCommonArgs {
  std::string* format;    // -f, --format
  bool* read_only;        // -r, --read-only
  bool* direct;           // --direct
  bool* fork;             // --fork
  std::string* pid_file;  // --pid-file
  OpenPolicy* secrets;    // --object, --image-opts
};

// Adds -f, -r, --direct, --fork, --pid-file, --object, --image-opts and
// -h to `parser`.
void AddServeCommonOptions(OptionParser* parser, const ServeCommonArgs& out);

// A whole-number option from `min` to `max`; else the usage error
// "NAME 'VALUE': expected EXPECTED". `store` gets the text and the number.
OptionParser::Handler CountOption(
    const OptionParser& parser, std::string_view name, int min, int max,
    std::string_view expected,
    std::function<void(const char* text, int value)> store);

// Exactly one IMAGE, else "no IMAGE given" or "more than one IMAGE given";
// with --image-opts, IMAGE's options resolved (file name, format, key
// secret: OpenPolicy::ResolveImage).
int ExpectServedImage(const OptionParser& parser,
                      const std::vector<std::string>& operands,
                      const ServeCommonArgs& common, std::string* image);

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_SERVE_CLI_H_
