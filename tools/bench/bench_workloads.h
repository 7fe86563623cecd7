// SPDX-License-Identifier: Apache-2.0
// The workloads of `qcowtool bench`, one file each (tools/bench/cmd_bench_*.cc).
// Each fills a Report from the options (unset ones take the workload's
// defaults); tools/bench/cmd_bench.cc parses the command line, checks which
// options apply, prints the report and writes the chart.
//
// Errors: kInvalidArgument for option values that do not fit together
// (reported as usage errors, exit 1); anything else is an image or I/O
// error (exit 2).
#ifndef QCOW2_TOOLS_BENCH_WORKLOADS_H_
#define QCOW2_TOOLS_BENCH_WORKLOADS_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "tools/bench/bench_options.h"
#include "tools/bench/bench_output.h"
#include "tools/bench/bench_progress.h"
#include "tools/bench/bench_setup.h"

namespace qcow2::tool::bench {

struct Env {
  const BenchOptions& opts;
  Scratch* scratch;  // null for 'pattern'
  Progress& progress;
  bool direct = true;  // --cache resolved against the workload's default
  std::string device;        // --device, checked (qd and rmw), or ""
  uint64_t device_size = 0;  // its size in bytes
};

// An error in the options that only shows once they are combined (e.g. a
// block size larger than the image): reported as a usage error (exit 1)
// rather than an image error (exit 2).
absl::Status OptionError(std::string_view message);
bool IsOptionError(const absl::Status& s);

// Sets spec->seconds and spec->count from --time and --count: with
// --count, only the limits given apply; without it, --time or
// `default_seconds`.
inline void ApplyLimits(const BenchOptions& o, double default_seconds,
                        JobSpec* spec) {
  spec->count = o.count.value_or(0);
  spec->seconds =
      o.count ? o.seconds.value_or(0) : o.seconds.value_or(default_seconds);
}

// Records "time" (null when only --count limits the cells) and "count"
// (null without --count).
inline void AddLimitParams(const BenchOptions& o, double default_seconds,
                           Record* params) {
  params->Set("time", o.count && !o.seconds
                          ? Value()
                          : Value::Num(o.seconds.value_or(default_seconds)));
  params->Set("count", o.count ? Value::Uint(*o.count) : Value());
}

absl::Status RunOverlay(Env& env, Report* report);
absl::Status RunScaling(Env& env, Report* report);
absl::Status RunQd(Env& env, Report* report);
absl::Status RunPattern(Env& env, Report* report);
absl::Status RunCdm(Env& env, Report* report);
absl::Status RunSweep(Env& env, Report* report);
absl::Status RunRmw(Env& env, Report* report);

}  // namespace qcow2::tool::bench

#endif  // QCOW2_TOOLS_BENCH_WORKLOADS_H_
