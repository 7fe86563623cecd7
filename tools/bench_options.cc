// SPDX-License-Identifier: Apache-2.0
#include "tools/bench_options.h"

#include <getopt.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace qcow2::tool::bench {
namespace {

absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }

constexpr std::string_view kWorkloads[] = {"overlay", "scaling", "qd",
                                           "pattern", "cdm",     "sweep",
                                           "rmw"};

// scaling's modes, then qd's.
constexpr std::string_view kModeNames[] = {"separate",   "shared",
                                           "raw-separate", "raw-shared",
                                           "read",       "write"};

absl::Status Bad(std::string_view option, std::string_view text,
                 std::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(AV(option), ": invalid value '", AV(text), "' (expected ",
                   AV(expected), ")"));
}

// A decimal or 0x-hex unsigned integer without suffix, at most `max`.
absl::StatusOr<uint64_t> ParseUint(std::string_view option,
                                   std::string_view text, uint64_t max) {
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 0);
  if (s.empty() || s[0] == '-' || *end != '\0' || errno != 0 || v > max) {
    return Bad(option, text, absl::StrCat("an integer from 0 to ", max));
  }
  return v;
}

absl::StatusOr<int> ParsePositiveInt(std::string_view option,
                                     std::string_view text, int max) {
  auto v = ParseUint(option, text, static_cast<uint64_t>(max));
  if (v.ok() && *v == 0) return Bad(option, text, "a positive integer");
  if (!v.ok()) return v.status();
  return static_cast<int>(*v);
}

absl::StatusOr<double> ParseSeconds(std::string_view option,
                                    std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !(v > 0) || v > 1e6) {
    return Bad(option, text, "a number of seconds above 0, e.g. 0.5");
  }
  return v;
}

absl::StatusOr<uint64_t> ParseSizeOpt(std::string_view option,
                                      std::string_view text, uint64_t min,
                                      uint64_t multiple) {
  auto v = ParseSize(text);
  if (!v.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(option), ": ", v.status().message()));
  }
  if (*v < min || *v % multiple != 0) {
    return Bad(option, text,
               absl::StrCat("a size of at least ", min,
                            " bytes, a multiple "
                            "of ",
                            multiple));
  }
  return *v;
}

absl::StatusOr<uint64_t> ParseClusterSize(std::string_view option,
                                          std::string_view text) {
  auto v = ParseSize(text);
  if (!v.ok() || *v < 512 || *v > (2u << 20) || (*v & (*v - 1)) != 0) {
    return Bad(option, text, "a power of two from 512 to 2M");
  }
  return *v;
}

bool Known(std::string_view name) {
  return std::find(std::begin(kWorkloads), std::end(kWorkloads), name) !=
         std::end(kWorkloads);
}

enum LongOption {
  kOutput = 256,
  kDir,
  kDevice,
  kForce,
  kTime,
  kCount,
  kCache,
  kPlot,
  kSeed,
  kDepth,
  kImageSize,
  kClusterSize,
  kOverlayClusterSize,
  kExtendedL2,
  kOverlayWrites,
  kBs,
  kQd,
  kWriters,
  kModes,
  kSizePerWriter,
  kRepeat,
  kMix,
  kClusterSizes,
  kPattern,
  kFlushInterval,
  kNoDrain,
  kPair,
  kBurst,
  kQuiet,
};

const option kOptions[] = {
    {"output", required_argument, nullptr, kOutput},
    {"dir", required_argument, nullptr, kDir},
    {"device", required_argument, nullptr, kDevice},
    {"force", no_argument, nullptr, kForce},
    {"time", required_argument, nullptr, kTime},
    {"count", required_argument, nullptr, kCount},
    {"cache", required_argument, nullptr, kCache},
    {"plot", required_argument, nullptr, kPlot},
    {"seed", required_argument, nullptr, kSeed},
    {"quiet", no_argument, nullptr, kQuiet},
    {"depth", required_argument, nullptr, kDepth},
    {"image-size", required_argument, nullptr, kImageSize},
    {"cluster-size", required_argument, nullptr, kClusterSize},
    {"overlay-cluster-size", required_argument, nullptr, kOverlayClusterSize},
    {"extended-l2", required_argument, nullptr, kExtendedL2},
    {"overlay-writes", required_argument, nullptr, kOverlayWrites},
    {"bs", required_argument, nullptr, kBs},
    {"qd", required_argument, nullptr, kQd},
    {"writers", required_argument, nullptr, kWriters},
    {"modes", required_argument, nullptr, kModes},
    {"size-per-writer", required_argument, nullptr, kSizePerWriter},
    {"repeat", required_argument, nullptr, kRepeat},
    {"mix", required_argument, nullptr, kMix},
    {"cluster-sizes", required_argument, nullptr, kClusterSizes},
    {"pattern", required_argument, nullptr, kPattern},
    {"flush-interval", required_argument, nullptr, kFlushInterval},
    {"no-drain", no_argument, nullptr, kNoDrain},
    {"pair", required_argument, nullptr, kPair},
    {"burst", required_argument, nullptr, kBurst},
    {"help", no_argument, nullptr, 'h'},
    {nullptr, 0, nullptr, 0},
};

// The name `c` is reported by: "--bs", "-c".
std::string OptionName(int c) {
  if (c < 256) return std::string("-") + static_cast<char>(c);
  for (const option& o : kOptions) {
    if (o.name != nullptr && o.val == c) return std::string("--") + o.name;
  }
  return "?";
}

// Applies one option. `name` is how it is reported.
absl::Status Apply(int c, const std::string& name, const char* arg,
                   BenchOptions* o) {
  PatternFlags& p = o->pattern;
  switch (c) {
    case kOutput: {
      auto f = ParseOutputFormat(arg);
      if (!f.ok()) return f.status();
      o->output = *f;
      return absl::OkStatus();
    }
    case kDir:
      o->dir = arg;
      return absl::OkStatus();
    case kDevice:
      o->device = arg;
      return absl::OkStatus();
    case kForce:
      o->force = true;
      return absl::OkStatus();
    case kPlot:
      o->plot = arg;
      return absl::OkStatus();
    case kQuiet:
    case 'q':
      o->quiet = true;
      return absl::OkStatus();
    case kCache:
    case 't': {
      const std::string_view v = arg;
      if (v != "none" && v != "writeback") {
        return Bad(name, v, "none (O_DIRECT) or writeback");
      }
      o->direct_io = v == "none";
      return absl::OkStatus();
    }
    case kExtendedL2: {
      const std::string_view v = arg;
      if (v != "on" && v != "off" && v != "both") {
        return Bad(name, v, "on or off (sweep: also both)");
      }
      o->extended_l2 = std::string(v);
      return absl::OkStatus();
    }
    case kModes: {
      o->modes.clear();
      for (absl::string_view m : absl::StrSplit(arg, ',')) {
        const std::string_view mv(m.data(), m.size());
        if (std::find(std::begin(kModeNames), std::end(kModeNames), mv) ==
            std::end(kModeNames)) {
          return Bad(name, mv,
                     "a list of separate, shared, raw-separate, raw-shared "
                     "(scaling) or of read, write (qd)");
        }
        o->modes.emplace_back(mv);
      }
      return absl::OkStatus();
    }
    case kNoDrain:
      p.drain_on_flush = false;
      return absl::OkStatus();
    case kPair:
      p.pair = arg;
      return absl::OkStatus();
    case 'w':
      p.write = true;
      return absl::OkStatus();
    case 'U':
      p.force_share = true;
      return absl::OkStatus();
    case 'n':
      return absl::OkStatus();  // accepted, no effect
    case 'i': {
      const std::string_view v = arg;
      if (v != "threads" && v != "native" && v != "io_uring") {
        return Bad(name, v, "threads, native or io_uring");
      }
      p.aio = std::string(v);
      return absl::OkStatus();
    }
    case 'f': {
      if (absl::Status s = CheckImageFormat(arg); !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": ", s.message()));
      }
      p.format = arg;
      return absl::OkStatus();
    }
  }
  // Options with parsed values.
  absl::Status status;
  auto take = [&](auto parsed, auto& field) {
    if (!parsed.ok()) {
      status = parsed.status();
    } else {
      field = *parsed;
    }
  };
  switch (c) {
    case kTime:
      take(ParseSeconds(name, arg), o->seconds);
      break;
    case kCount:
      take(ParsePositiveInt(name, arg, 1 << 30), o->count);
      break;
    case kSeed:
      take(ParseUint(name, arg, ~0ull), o->seed);
      break;
    case kDepth:
      take(ParseUint(name, arg, 32), o->chain_depth);
      break;
    case kImageSize:
      take(ParseSizeOpt(name, arg, 64 << 10, 512), o->image_size);
      break;
    case kSizePerWriter:
      take(ParseSizeOpt(name, arg, 4096, 512), o->size_per_writer);
      break;
    case kRepeat:
      take(ParsePositiveInt(name, arg, 99), o->repeat);
      break;
    case kClusterSize:
      take(ParseClusterSize(name, arg), o->cluster_size);
      break;
    case kOverlayClusterSize:
      take(ParseClusterSize(name, arg), o->overlay_cluster_size);
      break;
    case kOverlayWrites:
      take(ParseUint(name, arg, 100), o->overlay_writes_pct);
      break;
    case kBs:
      take(ParseSizeList(name, arg), o->bs);
      break;
    case kQd:
      take(ParseIntList(name, arg, 4096), o->qd);
      break;
    case kWriters:
      take(ParseIntList(name, arg, 256), o->writers);
      break;
    case kMix:
      take(ParseMix(arg), o->mix);
      break;
    case kClusterSizes: {
      std::vector<uint64_t> list;
      for (absl::string_view item : absl::StrSplit(arg, ',')) {
        auto v =
            ParseClusterSize(name, std::string_view(item.data(), item.size()));
        if (!v.ok()) return v.status();
        list.push_back(*v);
      }
      o->cluster_sizes = list;
      break;
    }
    case kPattern:
      take(ParseUint(name, arg, 255), p.pattern);
      break;
    case kFlushInterval:
      take(ParseUint(name, arg, 0x7fffffff), p.flush_interval);
      break;
    case kBurst:
      take(ParsePositiveInt(name, arg, 1 << 30), p.burst);
      break;
    case 'c':
      take(ParseUint(name, arg, 0x7fffffff), p.count);
      break;
    case 'd':
      take(ParsePositiveInt(name, arg, 65536), p.depth);
      break;
    case 's':
      take(ParseSizeOpt(name, arg, 1, 1), p.size);
      break;
    case 'S':
      take(ParseSizeOpt(name, arg, 1, 1), p.step);
      break;
    case 'o':
      take(ParseSizeOpt(name, arg, 0, 1), p.offset);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown option ", name));
  }
  return status;
}

}  // namespace

bool BenchOptions::Given(std::string_view name) const {
  return std::find(given.begin(), given.end(), name) != given.end();
}

absl::StatusOr<std::vector<uint64_t>> ParseSizeList(std::string_view option,
                                                    std::string_view text) {
  std::vector<uint64_t> out;
  for (absl::string_view item : absl::StrSplit(AV(text), ',')) {
    auto v = ParseSizeOpt(option, std::string_view(item.data(), item.size()),
                          512, 512);
    if (!v.ok()) return v.status();
    if (*v > (64u << 20)) return Bad(option, text, "sizes up to 64M");
    out.push_back(*v);
  }
  return out;
}

absl::StatusOr<std::vector<int>> ParseIntList(std::string_view option,
                                              std::string_view text, int max) {
  std::vector<int> out;
  for (absl::string_view item : absl::StrSplit(AV(text), ',')) {
    auto v = ParsePositiveInt(option,
                              std::string_view(item.data(), item.size()), max);
    if (!v.ok()) return v.status();
    out.push_back(*v);
  }
  return out;
}

absl::StatusOr<std::vector<MixEntry>> ParseMix(std::string_view text) {
  std::vector<MixEntry> out;
  for (absl::string_view item : absl::StrSplit(AV(text), ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
    if (parts.size() != 2) {
      return Bad("--mix", text,
                 "SIZE:WEIGHT[,SIZE:WEIGHT...], e.g. 4k:70,64k:30");
    }
    auto bs =
        ParseSizeOpt("--mix", {parts[0].data(), parts[0].size()}, 512, 512);
    if (!bs.ok()) return bs.status();
    auto w =
        ParsePositiveInt("--mix", {parts[1].data(), parts[1].size()}, 1000000);
    if (!w.ok()) return w.status();
    if (*bs > (64u << 20)) return Bad("--mix", text, "sizes up to 64M");
    out.push_back(
        MixEntry{static_cast<uint32_t>(*bs), static_cast<uint32_t>(*w)});
  }
  return out;
}

int ParseBenchArgs(int argc, char** argv,
                   std::string (*usage_for)(std::string_view workload,
                                            bool full),
                   BenchOptions* out) {
  int first = 1;
  if (argc > 1 && argv[1][0] != '-') {
    if (!Known(argv[1])) {
      return UsageError(usage_for("", false),
                        absl::StrCat("unknown workload '", argv[1], "'"));
    }
    out->workload = argv[1];
    first = 2;
  }
  // getopt_long prefixes its messages with argv[0].
  std::string prog = first == 2 ? absl::StrCat("qcowtool bench ", out->workload)
                                : std::string("qcowtool bench");
  std::vector<char*> args = {prog.data()};
  for (int i = first; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  const int n = static_cast<int>(args.size()) - 1;
  const std::string_view named =
      first == 2 ? std::string_view(out->workload) : std::string_view();
  const std::string usage = usage_for(named, false);

  ResetGetopt();
  int c;
  while ((c = getopt_long(n, args.data(), "hqc:d:f:i:no:s:S:t:wU", kOptions,
                          nullptr)) != -1) {
    if (c == 'h') return PrintHelp(usage_for(named, true));
    if (c == '?' || c == ':') return UsageError(usage, "");
    const std::string name = c == 't' ? "--cache" : OptionName(c);
    if (absl::Status s = Apply(c, name, optarg, out); !s.ok()) {
      return UsageError(usage, s.message());
    }
    out->given.push_back(name);
  }
  for (int i = optind; i < n; ++i) {
    if (out->workload == "pattern" && out->pattern.image.empty()) {
      out->pattern.image = args[i];
      continue;
    }
    return UsageError(usage,
                      absl::StrCat("unexpected argument '", args[i], "'"));
  }
  return -1;
}

}  // namespace qcow2::tool::bench
