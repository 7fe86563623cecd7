// SPDX-License-Identifier: Apache-2.0
#include "tools/serve_cli.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace qcow2::tool {

void AddServeCommonOptions(OptionParser* parser, const ServeCommonArgs& out) {
  parser->Format(out.format)
      .Flag("read-only", 'r', out.read_only)
      .Flag("direct", 0, out.direct)
      .Flag("fork", 0, out.fork)
      .Text("pid-file", 0, out.pid_file)
      .Secrets(out.secrets)
      .Help();
}

OptionParser::Handler CountOption(
    const OptionParser& parser, std::string_view name, int min, int max,
    std::string_view expected,
    std::function<void(const char* text, int value)> store) {
  return [&parser, name = std::string(name), min, max,
          expected = std::string(expected),
          store = std::move(store)](const char* text) {
    int v = 0;
    if (!absl::SimpleAtoi(text, &v) || v < min || v > max) {
      return parser.Error(
          absl::StrCat(name, " '", text, "': expected ", expected));
    }
    store(text, v);
    return kGoOn;
  };
}

int ExpectServedImage(const OptionParser& parser,
                      const std::vector<std::string>& operands,
                      const ServeCommonArgs& common, std::string* image) {
  if (operands.size() != 1) {
    return parser.Error(operands.empty() ? "no IMAGE given"
                                         : "more than one IMAGE given");
  }
  *image = operands[0];
  if (absl::Status s = common.secrets->ResolveImage(image, common.format);
      !s.ok()) {
    return ReportError(s);
  }
  return kGoOn;
}

}  // namespace qcow2::tool
