// SPDX-License-Identifier: Apache-2.0
// The command line of `qcowtool bench WORKLOAD [options]`. One parser reads
// every option; each workload then says which ones apply to it (an option
// given to a workload it does not apply to is a usage error naming it).
// Unset optionals take the workload's default.
#ifndef QCOW2_TOOLS_BENCH_OPTIONS_H_
#define QCOW2_TOOLS_BENCH_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/bench_runner.h"
#include "tools/cli_util.h"

namespace qcow2::tool::bench {

// qemu-img bench's own flags, for the `pattern` workload.
struct PatternFlags {
  uint64_t count = 75000;        // -c
  int depth = 64;                // -d
  uint64_t size = 4096;          // -s
  std::optional<uint64_t> step;  // -S (default: size)
  uint64_t offset = 0;           // -o
  bool write = false;            // -w
  bool force_share = false;      // -U (reads only)
  std::string format;            // -f (empty: probe)
  uint8_t pattern = 0;           // --pattern
  uint64_t flush_interval = 0;   // --flush-interval (writes; scaling too)
  bool drain_on_flush = true;    // --no-drain clears it
  std::string aio;               // -i (recorded; the engine decides)
  std::string image;             // the argument
  std::string pair;              // --pair: a second image, run alongside
  OpenPolicy secrets;            // --object, --image-opts
  uint64_t burst = 16384;        // --burst: requests per turn with --pair
};

struct BenchOptions {
  std::string workload = "overlay";
  // Options given, as spelled in messages ("--bs", "-c"), in order.
  std::vector<std::string> given;

  // Common.
  OutputFormat output = OutputFormat::kHuman;
  bool quiet = false;
  std::string dir;
  std::string device;  // --device (qd, rmw)
  bool force = false;  // --force: a --device with contents may be overwritten
  std::optional<double> seconds;  // --time
  std::optional<uint64_t> count;  // --count
  std::optional<bool> direct_io;  // --cache / -t
  std::string plot;
  uint64_t seed = 1;

  // Workload parameters.
  std::optional<uint64_t> image_size;
  std::optional<uint64_t> cluster_size;
  std::optional<uint64_t> overlay_cluster_size;
  std::optional<int> chain_depth;          // --depth (overlay)
  std::optional<std::string> extended_l2;  // on, off (sweep also: both)
  std::optional<uint32_t> overlay_writes_pct;
  std::vector<uint64_t> bs;
  std::vector<int> qd;
  std::vector<int> writers;
  std::vector<std::string> modes;
  std::optional<uint64_t> size_per_writer;
  std::optional<int> repeat;  // --repeat (scaling, qd; rmw read rounds)
  std::vector<MixEntry> mix;
  std::vector<uint64_t> cluster_sizes;

  PatternFlags pattern;

  bool Given(std::string_view name) const;
};

// Parses `argv` (argv[0] is "qcowtool bench"; argv[1] may name the
// workload). Returns -1 when parsed, else the exit status to return (help
// printed, or a usage error reported). `usage_for` gives the usage text of
// a workload ("" for the general one): the whole help when `full`, else
// the synopsis that usage errors print.
int ParseBenchArgs(int argc, char** argv,
                   std::string (*usage_for)(std::string_view workload,
                                            bool full),
                   BenchOptions* out);

// Value parsers (errors name `option`).
absl::StatusOr<std::vector<uint64_t>> ParseSizeList(std::string_view option,
                                                    std::string_view text);
absl::StatusOr<std::vector<int>> ParseIntList(std::string_view option,
                                              std::string_view text, int max);
absl::StatusOr<std::vector<MixEntry>> ParseMix(std::string_view text);

}  // namespace qcow2::tool::bench

#endif  // QCOW2_TOOLS_BENCH_OPTIONS_H_
