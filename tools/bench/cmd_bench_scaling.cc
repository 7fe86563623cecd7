// SPDX-License-Identifier: Apache-2.0
// qcowtool bench scaling: aggregate sequential write throughput of 1..N
// writers, each a thread with its own Queue writing its own region, on
// separate images or one shared image, qcow2 against raw; optionally each
// writer flushing every --flush-interval writes, as guests do.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench/bench_workloads.h"

namespace qcow2::tool::bench {
namespace {

struct Params {
  std::vector<int> writers = {1, 2, 4, 8};
  std::vector<std::string> modes = {"separate", "shared", "raw-separate",
                                    "raw-shared"};
  uint64_t size_per_writer = 256ull << 20;
  uint32_t bs = 4 << 20;
  int qd = 4;
  uint32_t cluster = 64 << 10;
  bool extended_l2 = false;
  int repeat = 3;
  uint64_t flush_every = 0;  // per writer, besides the final flush
};

absl::StatusOr<Params> Resolve(const BenchOptions& o) {
  Params p;
  if (!o.writers.empty()) p.writers = o.writers;
  if (!o.modes.empty()) p.modes = o.modes;
  for (const std::string& m : p.modes) {
    if (m == "read" || m == "write") {
      return OptionError(absl::StrCat("--modes: '", m,
                                      "' applies to qd (scaling takes "
                                      "separate, shared, raw-separate, "
                                      "raw-shared)"));
    }
  }
  p.size_per_writer = o.size_per_writer.value_or(p.size_per_writer);
  if (o.bs.size() > 1) return OptionError("--bs takes one size for scaling");
  if (o.qd.size() > 1) return OptionError("--qd takes one value for scaling");
  if (!o.bs.empty()) p.bs = static_cast<uint32_t>(o.bs[0]);
  if (!o.qd.empty()) p.qd = o.qd[0];
  p.cluster = static_cast<uint32_t>(o.cluster_size.value_or(p.cluster));
  if (o.extended_l2 == "both") {
    return OptionError("--extended-l2: 'both' applies to sweep only");
  }
  p.extended_l2 = o.extended_l2.value_or("off") == "on";
  p.repeat = o.repeat.value_or(p.repeat);
  p.flush_every = o.pattern.flush_interval;
  if (p.extended_l2 && p.cluster < (16u << 10)) {
    return OptionError("--extended-l2=on needs --cluster-size of 16k or more");
  }
  if (p.size_per_writer % p.bs != 0) {
    return OptionError(
        absl::StrCat("--size-per-writer must be a multiple of "
                     "--bs (",
                     FormatBlockSize(p.bs), ")"));
  }
  return p;
}

struct Result {
  int writers;
  std::string mode;
  JobResult r;  // the median run (by throughput) of the repeats
  IoStats delta;
  double min_mb_per_s = 0;
  double max_mb_per_s = 0;
};

// The median run of `runs` (all of one cell), with the spread.
Result Median(std::vector<Result> runs) {
  std::sort(runs.begin(), runs.end(), [](const Result& a, const Result& b) {
    return a.r.mb_per_s() < b.r.mb_per_s();
  });
  Result m = runs[runs.size() / 2];
  m.min_mb_per_s = runs.front().r.mb_per_s();
  m.max_mb_per_s = runs.back().r.mb_per_s();
  return m;
}

IoStats SumStats(const std::vector<std::unique_ptr<Image>>& images) {
  IoStats sum;
  for (const auto& image : images) sum += image->GetStats();
  return sum;
}

absl::StatusOr<Result> RunCell(Env& env, const Params& p, int writers,
                               const std::string& mode, std::string* engine) {
  const bool raw = absl::StartsWith(mode, "raw-");
  const bool shared = absl::EndsWith(mode, "shared");
  std::vector<std::unique_ptr<Image>> images;
  std::vector<std::string> paths;
  const int files = shared ? 1 : writers;
  for (int i = 0; i < files; ++i) {
    paths.push_back(env.scratch->Path(
        absl::StrCat("scaling-", i, raw ? ".raw" : ".qcow2")));
    CreateOptions c;
    c.format = raw ? ImageFormat::kRaw : ImageFormat::kQcow2;
    c.size = p.size_per_writer * (shared ? writers : 1);
    c.cluster_size = p.cluster;
    c.extended_l2 = p.extended_l2;
    auto image = CreateBenchImage(paths.back(), c, env.direct);
    if (!image.ok()) return image.status();
    images.push_back(std::move(*image));
  }
  if (engine->empty()) *engine = EngineName(*images[0]);

  std::vector<ThreadJob> jobs;
  for (int j = 0; j < writers; ++j) {
    ThreadJob job;
    job.image = images[shared ? 0 : j].get();
    job.spec.op = Op::kWrite;
    job.spec.qd = p.qd;
    job.spec.max_len = p.bs;
    job.spec.next = SequentialRequests(shared ? j * p.size_per_writer : 0,
                                       p.size_per_writer, p.bs);
    job.spec.count = p.size_per_writer / p.bs;
    job.spec.flush = true;
    job.spec.flush_every = p.flush_every;
    job.spec.progress = &env.progress;
    jobs.push_back(std::move(job));
  }
  const IoStats before = SumStats(images);
  auto r = RunParallel(std::move(jobs));
  if (!r.ok()) return r.status();
  Result result{writers, mode, *r, SumStats(images).Since(before)};
  for (auto& image : images) {
    if (absl::Status s = image->Close(); !s.ok()) return s;
  }
  images.clear();
  for (const std::string& path : paths) {
    if (absl::Status s = env.scratch->Remove(path); !s.ok()) return s;
  }
  return result;
}

// The throughput of the cell with `writers` writers in `mode`, or nullopt.
std::optional<double> MbPerS(const std::vector<Result>& all, int writers,
                             const std::string& mode) {
  for (const Result& o : all) {
    if (o.writers == writers && o.mode == mode) return o.r.mb_per_s();
  }
  return std::nullopt;
}

void BuildRows(const Params& p, const std::vector<Result>& results,
               Report* report) {
  Panel panel{"Aggregate sequential write throughput", "writers", "MB/s"};
  for (int w : p.writers) panel.categories.push_back(absl::StrCat(w));
  for (const std::string& mode : p.modes) {
    panel.series.push_back(
        Series{mode, std::vector<std::optional<double>>(p.writers.size())});
  }
  for (const Result& res : results) {
    Record row;
    row.Set("writers", Value::Uint(res.writers))
        .Set("mode", Value::Str(res.mode))
        .Set("bs", Value::Uint(p.bs))
        .Set("qd", Value::Uint(p.qd))
        .Set("runs", Value::Uint(p.repeat))
        .Set("min_mb_per_s", Value::Num(res.min_mb_per_s))
        .Set("max_mb_per_s", Value::Num(res.max_mb_per_s));
    AddRateColumns(res.r, &row);
    AddIoColumns(res.delta, Op::kWrite, &row);
    row.Set("guest_flushes", Value::Uint(res.delta.guest_flush_ops));
    std::optional<double> ratio;
    if (!absl::StartsWith(res.mode, "raw-")) {
      const std::optional<double> raw =
          MbPerS(results, res.writers, "raw-" + res.mode);
      if (raw) ratio = Ratio(res.r.mb_per_s(), *raw);
    }
    row.Set("ratio_vs_raw", Value::Ratio(ratio));
    // Scaling: this cell against one writer in the same mode.
    std::optional<double> vs_one;
    if (const std::optional<double> one = MbPerS(results, 1, res.mode)) {
      vs_one = Ratio(res.r.mb_per_s(), *one);
    }
    row.Set("ratio_vs_1_writer", Value::Ratio(vs_one));
    report->rows.push_back(std::move(row));
    for (size_t m = 0; m < p.modes.size(); ++m) {
      if (p.modes[m] != res.mode) continue;
      for (size_t w = 0; w < p.writers.size(); ++w) {
        if (p.writers[w] != res.writers) continue;
        panel.series[m].values[w] = res.r.mb_per_s();
      }
    }
  }
  report->columns = {
      {"writers", "writers"},    {"mode", "mode", 0, true},
      {"MB/s", "mb_per_s", 1},   {"min", "min_mb_per_s", 1},
      {"max", "max_mb_per_s", 1}, {"vs raw", "ratio_vs_raw", 2},
      {"vs 1w", "ratio_vs_1_writer", 2},
      {"seconds", "seconds", 2}, {"write amp", "write_amplification", 3},
      {"locked calls", "host_calls_under_lock"}};
  report->plot_title = "qcowtool bench scaling";
  report->plot = {panel};
}

}  // namespace

absl::Status RunScaling(Env& env, Report* report) {
  absl::StatusOr<Params> p = Resolve(env.opts);
  if (!p.ok()) return p.status();
  std::string modes;
  for (const std::string& m : p->modes) {
    absl::StrAppend(&modes, modes.empty() ? "" : ",", m);
  }
  report->params.Set("writers", Value::UintList(p->writers))
      .Set("size_per_writer", Value::Uint(p->size_per_writer))
      .Set("bs", Value::Uint(p->bs))
      .Set("qd", Value::Uint(p->qd))
      .Set("cluster_size", Value::Uint(p->cluster))
      .Set("extended_l2", Value::Bool(p->extended_l2))
      .Set("modes", Value::Str(modes))
      .Set("repeat", Value::Uint(p->repeat))
      .Set("flush_interval", Value::Uint(p->flush_every));

  // Rounds: every cell once per round, so that a drift of the device (burst
  // credit, another tenant) lands on every mode alike rather than on the
  // cells measured last. Within a round the modes of each writer count
  // take turns going first: the first cell after a change in the number
  // of threads can pay for it (on tmpfs, 8 writers right after 4 ran at
  // half speed, whichever mode it was).
  const size_t nmodes = p->modes.size();
  const size_t cells = p->writers.size() * nmodes;
  const size_t total = cells * p->repeat;
  std::vector<std::vector<Result>> runs(cells);
  std::string engine;
  size_t done = 0;
  for (int round = 0; round < p->repeat; ++round) {
    for (size_t w = 0; w < p->writers.size(); ++w) {
      const int writers = p->writers[w];
      for (size_t k = 0; k < nmodes; ++k) {
        const size_t m = (k + static_cast<size_t>(round)) % nmodes;
        const std::string& mode = p->modes[m];
        env.progress.BeginCell(absl::StrFormat(
            "[%u/%u] %d writer%s, %s", ++done, total, writers,
            writers > 1 ? "s" : "", mode));
        auto r = RunCell(env, *p, writers, mode, &engine);
        if (!r.ok()) return r.status();
        env.progress.EndCell(absl::StrFormat("%.1f MB/s", r->r.mb_per_s()));
        runs[w * nmodes + m].push_back(std::move(*r));
      }
    }
  }
  std::vector<Result> results;
  for (auto& cell_runs : runs) results.push_back(Median(std::move(cell_runs)));
  AddCommonParams(env.direct, engine, &report->params);
  BuildRows(*p, results, report);
  return absl::OkStatus();
}

}  // namespace qcow2::tool::bench
