// SPDX-License-Identifier: Apache-2.0
#include "tools/chain_op_cli.h"

#include <getopt.h>

#include "absl/strings/str_cat.h"
#include "tools/cli_util.h"

namespace qcow2::tool {

int ParseChainArgs(int argc, char** argv, std::string_view shortopts,
                   bool force_share, const std::string& usage,
                   const std::function<bool(int, const char*)>& extra,
                   ChainArgs* args) {
  static const option kOptions[] = {
      {"help", no_argument, nullptr, 'h'},
      {"force-share", no_argument, nullptr, 'U'},
      {"backing-root", required_argument, nullptr, kOptBackingRoot},
      {nullptr, 0, nullptr, 0},
  };
  const std::string opts = absl::StrCat("hf:b:pqt:", force_share ? "U" : "",
                                        std::string(shortopts));
  OpenPolicy policy;
  std::string cache = "writeback";
  ResetGetopt();
  int c;
  while ((c = getopt_long(argc, argv, opts.c_str(), kOptions, nullptr)) !=
         -1) {
    switch (c) {
      case 'h':
        return PrintHelp(usage);
      case 'f':
        if (auto s = CheckImageFormat(optarg); !s.ok()) {
          return UsageError(usage, s.message());
        }
        args->format = optarg;
        break;
      case 'b':
        args->backing = optarg;
        args->have_backing = true;
        break;
      case 'p':
        args->progress = true;
        break;
      case 'q':
        args->quiet = true;
        break;
      case 't':
        cache = optarg;
        break;
      default:
        if ((c == 'U' && !force_share) || !(policy.Take(c, optarg) ||
                                            extra(c, optarg))) {
          return UsageError(usage, "");
        }
    }
  }
  if (argc - optind != 1) {
    return UsageError(usage, "Expecting one image file name");
  }
  args->image = argv[optind];
  if (args->quiet) args->progress = false;
  policy.ApplyTo(&args->opts.open);
  if (absl::Status s = ApplyCacheMode(cache, &args->opts.open); !s.ok()) {
    return ReportFailure(s.message());
  }
  return -1;
}

std::string ChainUsage(std::string_view head, std::string_view exit_line) {
  return absl::StrCat(std::string(head), kBackingRootHelp, "  -h, --help  show this help\n\n",
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
