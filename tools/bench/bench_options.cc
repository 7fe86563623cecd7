// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/bench_options.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tools/option_parser.h"

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

// A value kept as given.
absl::StatusOr<std::string> Text(std::string_view, std::string_view text) {
  return std::string(text);
}

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

// Takes one option's value: `name` is how errors and BenchOptions::given
// report the option ("--bs", "-c").
using Setter =
    std::function<absl::Status(const std::string& name, const char* arg)>;

struct BenchOption {
  const char* long_name;  // "" for a letter alone
  char letter;            // 0 for a long name alone
  OptionParser::Arg arg;
  const char* name;  // as reported
  Setter set;
};

constexpr auto kNone = OptionParser::Arg::kNone;
constexpr auto kValue = OptionParser::Arg::kRequired;

// A field set to `parse(name, arg)`'s value.
template <typename Field, typename Parse>
Setter Store(Field* field, Parse parse) {
  return [field, parse](const std::string& name,
                        const char* arg) -> absl::Status {
    auto v = parse(std::string_view(name), std::string_view(arg));
    if (!v.ok()) return v.status();
    *field = *v;
    return absl::OkStatus();
  };
}

// A flag set to `value`.
template <typename Field, typename Value>
Setter Set(Field* field, Value value) {
  return [field, value](const std::string&, const char*) {
    *field = value;
    return absl::OkStatus();
  };
}

// A value that must be one of `allowed`, kept as text.
template <typename Field>
Setter OneOf(Field* field, std::vector<std::string_view> allowed,
             const char* expected) {
  return [field, allowed, expected](const std::string& name,
                                    const char* arg) {
    const std::string_view v = arg;
    if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      return Bad(name, v, expected);
    }
    *field = std::string(v);
    return absl::OkStatus();
  };
}

absl::StatusOr<bool> ParseCache(std::string_view name, std::string_view v) {
  if (v != "none" && v != "writeback") {
    return Bad(name, v, "none (O_DIRECT) or writeback");
  }
  return v == "none";
}

absl::StatusOr<std::vector<std::string>> ParseModes(std::string_view name,
                                                    std::string_view text) {
  std::vector<std::string> modes;
  for (absl::string_view m : absl::StrSplit(AV(text), ',')) {
    const std::string_view mv(m.data(), m.size());
    if (std::find(std::begin(kModeNames), std::end(kModeNames), mv) ==
        std::end(kModeNames)) {
      return Bad(name, mv,
                 "a list of separate, shared, raw-separate, raw-shared "
                 "(scaling) or of read, write (qd)");
    }
    modes.emplace_back(mv);
  }
  return modes;
}

absl::StatusOr<std::vector<uint64_t>> ParseClusterSizes(
    std::string_view name, std::string_view text) {
  std::vector<uint64_t> list;
  for (absl::string_view item : absl::StrSplit(AV(text), ',')) {
    auto v = ParseClusterSize(name, std::string_view(item.data(), item.size()));
    if (!v.ok()) return v.status();
    list.push_back(*v);
  }
  return list;
}

absl::StatusOr<std::string> ParseImageFormat(std::string_view name,
                                             std::string_view text) {
  if (absl::Status s = CheckImageFormat(text); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(name), ": ", s.message()));
  }
  return std::string(text);
}

absl::StatusOr<OutputFormat> ParseOutput(std::string_view,
                                         std::string_view text) {
  return ParseOutputFormat(text);
}

// Parsers of a number range, in the Store(field, parse) form.
auto Uint(uint64_t max) {
  return [max](std::string_view n, std::string_view t) {
    return ParseUint(n, t, max);
  };
}
auto PositiveInt(int max) {
  return [max](std::string_view n, std::string_view t) {
    return ParsePositiveInt(n, t, max);
  };
}
auto IntList(int max) {
  return [max](std::string_view n, std::string_view t) {
    return ParseIntList(n, t, max);
  };
}
auto SizeOpt(uint64_t min, uint64_t multiple) {
  return [min, multiple](std::string_view n, std::string_view t) {
    return ParseSizeOpt(n, t, min, multiple);
  };
}

// The options every workload shares, in the order getopt lists them.
std::vector<BenchOption> CommonOptions(BenchOptions* o) {
  return {
      {"output", 0, kValue, "--output", Store(&o->output, ParseOutput)},
      {"dir", 0, kValue, "--dir", Store(&o->dir, Text)},
      {"device", 0, kValue, "--device", Store(&o->device, Text)},
      {"force", 0, kNone, "--force", Set(&o->force, true)},
      {"time", 0, kValue, "--time", Store(&o->seconds, ParseSeconds)},
      {"count", 0, kValue, "--count", Store(&o->count, PositiveInt(1 << 30))},
      {"cache", 0, kValue, "--cache", Store(&o->direct_io, ParseCache)},
      {"plot", 0, kValue, "--plot", Store(&o->plot, Text)},
      {"seed", 0, kValue, "--seed", Store(&o->seed, Uint(~0ull))},
      {"quiet", 0, kNone, "--quiet", Set(&o->quiet, true)},
  };
}

// The workloads' shape options.
std::vector<BenchOption> ShapeOptions(BenchOptions* o) {
  return {
      {"depth", 0, kValue, "--depth", Store(&o->chain_depth, Uint(32))},
      {"image-size", 0, kValue, "--image-size",
       Store(&o->image_size, SizeOpt(64 << 10, 512))},
      {"cluster-size", 0, kValue, "--cluster-size",
       Store(&o->cluster_size, ParseClusterSize)},
      {"overlay-cluster-size", 0, kValue, "--overlay-cluster-size",
       Store(&o->overlay_cluster_size, ParseClusterSize)},
      {"extended-l2", 0, kValue, "--extended-l2",
       OneOf(&o->extended_l2, {"on", "off", "both"},
             "on or off (sweep: also both)")},
      {"overlay-writes", 0, kValue, "--overlay-writes",
       Store(&o->overlay_writes_pct, Uint(100))},
      {"bs", 0, kValue, "--bs", Store(&o->bs, ParseSizeList)},
      {"qd", 0, kValue, "--qd", Store(&o->qd, IntList(4096))},
      {"writers", 0, kValue, "--writers", Store(&o->writers, IntList(256))},
      {"modes", 0, kValue, "--modes", Store(&o->modes, ParseModes)},
      {"size-per-writer", 0, kValue, "--size-per-writer",
       Store(&o->size_per_writer, SizeOpt(4096, 512))},
      {"repeat", 0, kValue, "--repeat", Store(&o->repeat, PositiveInt(99))},
      {"mix", 0, kValue, "--mix",
       Store(&o->mix,
             [](std::string_view, std::string_view t) { return ParseMix(t); })},
      {"cluster-sizes", 0, kValue, "--cluster-sizes",
       Store(&o->cluster_sizes, ParseClusterSizes)},
  };
}

// qemu-img bench's own flags, for the pattern workload.
std::vector<BenchOption> PatternOptions(PatternFlags* p) {
  return {
      {"pattern", 0, kValue, "--pattern", Store(&p->pattern, Uint(255))},
      {"flush-interval", 0, kValue, "--flush-interval",
       Store(&p->flush_interval, Uint(0x7fffffff))},
      {"no-drain", 0, kNone, "--no-drain", Set(&p->drain_on_flush, false)},
      {"pair", 0, kValue, "--pair", Store(&p->pair, Text)},
      {"object", 0, kValue, "--object",
       [p](const std::string&, const char* v) {
         return p->secrets.AddObject(v);
       }},
      {"image-opts", 0, kNone, "--image-opts",
       [p](const std::string&, const char*) {
         p->secrets.image_opts = true;
         return absl::OkStatus();
       }},
      {"burst", 0, kValue, "--burst", Store(&p->burst, PositiveInt(1 << 30))},
      {"", 'c', kValue, "-c", Store(&p->count, Uint(0x7fffffff))},
      {"", 'd', kValue, "-d", Store(&p->depth, PositiveInt(65536))},
      {"", 'f', kValue, "-f", Store(&p->format, ParseImageFormat)},
      {"", 'i', kValue, "-i",
       OneOf(&p->aio, {"threads", "native", "io_uring"},
             "threads, native or io_uring")},
      {"", 'n', kNone, "-n",
       [](const std::string&, const char*) {
         return absl::OkStatus();  // accepted, no effect
       }},
      {"", 'o', kValue, "-o", Store(&p->offset, SizeOpt(0, 1))},
      {"", 's', kValue, "-s", Store(&p->size, SizeOpt(1, 1))},
      {"", 'S', kValue, "-S", Store(&p->step, SizeOpt(1, 1))},
      {"", 'w', kNone, "-w", Set(&p->write, true)},
      {"", 'U', kNone, "-U", Set(&p->force_share, true)},
  };
}

// Short forms of common options (-t reported as --cache, as before).
std::vector<BenchOption> ShortOptions(BenchOptions* o) {
  return {
      {"", 'q', kNone, "-q", Set(&o->quiet, true)},
      {"", 't', kValue, "--cache", Store(&o->direct_io, ParseCache)},
  };
}

// Adds `options` to `parser`: each sets its field and is noted in
// `o->given`, or is a usage error naming the bad value.
void AddBenchOptions(std::vector<BenchOption> options, OptionParser* parser,
                     BenchOptions* o) {
  for (BenchOption& b : options) {
    parser->Add(b.long_name, b.letter, b.arg,
                [parser, o, name = std::string(b.name),
                 set = std::move(b.set)](const char* arg) {
                  if (absl::Status s = set(name, arg); !s.ok()) {
                    return parser->Error(s.message());
                  }
                  o->given.push_back(name);
                  return kGoOn;
                });
  }
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

  OptionParser parser(usage);
  AddBenchOptions(CommonOptions(out), &parser, out);
  AddBenchOptions(ShapeOptions(out), &parser, out);
  AddBenchOptions(PatternOptions(&out->pattern), &parser, out);
  parser.Help(usage_for(named, true));
  AddBenchOptions(ShortOptions(out), &parser, out);
  std::vector<std::string> operands;
  if (int rc = parser.Parse(n, args.data(), &operands); rc != kGoOn) {
    return rc;
  }
  for (const std::string& operand : operands) {
    if (out->workload == "pattern" && out->pattern.image.empty()) {
      out->pattern.image = operand;
      continue;
    }
    return UsageError(usage,
                      absl::StrCat("unexpected argument '", operand, "'"));
  }
  return -1;
}

}  // namespace qcow2::tool::bench
