// SPDX-License-Identifier: Apache-2.0
#include "tools/chain_op_cli.h"

#include "absl/strings/str_cat.h"
#include "tools/cli_util.h"

namespace qcow2::tool {

void AddChainOptions(OptionParser* parser, bool force_share, ChainArgs* args) {
  parser->Help().BackingRoot(&args->policy).Secrets(&args->policy);
  if (force_share) parser->ForceShare(&args->policy);
  parser->Format("", 'f', &args->format)
      .Add("", 'b', OptionParser::Arg::kRequired,
           [args](const char* v) {
             args->backing = v;
             args->have_backing = true;
             return kGoOn;
           })
      .Flag("", 'p', &args->progress)
      .Flag("", 'q', &args->quiet)
      .Text("", 't', &args->cache);
}

int ParseChainArgs(int argc, char** argv, OptionParser* parser,
                   ChainArgs* args) {
  std::vector<std::string> operands;
  if (int rc = parser->Parse(argc, argv, &operands); rc != kGoOn) return rc;
  if (operands.size() != 1) {
    return parser->Error("Expecting one image file name");
  }
  args->image = operands[0];
  if (args->quiet) args->progress = false;
  if (absl::Status s = args->policy.ResolveImage(&args->image, &args->format);
      !s.ok()) {
    return ReportError(s);
  }
  args->policy.ApplyTo(&args->opts.open);
  if (absl::Status s = ApplyCacheMode(args->cache, &args->opts.open);
      !s.ok()) {
    return ReportFailure(s.message());
  }
  return -1;
}

std::string ChainUsage(std::string_view head, std::string_view exit_line) {
  return absl::StrCat(std::string(head), kBackingRootHelp, kSecretHelp,
                      "  -h, --help  show this help\n\n",
                      std::string(exit_line));
}

absl::Status WithProgress(bool enabled, ChainOpOptions* opts,
                          const std::function<absl::Status()>& op) {
  if (!enabled) return op();
  Progress bar(true, 1.0f);
  bar.Advance(0);
  double shown = 0;  // percent already on the line
  auto to = [&](double percent) {
    if (percent > shown) {
      bar.Advance(static_cast<float>(percent - shown));
      shown = percent;
    }
  };
  opts->progress = [&](double fraction) { to(fraction * 100); };
  absl::Status s = op();
  opts->progress = nullptr;
  if (s.ok()) to(100);
  return s;
}

}  // namespace qcow2::tool
