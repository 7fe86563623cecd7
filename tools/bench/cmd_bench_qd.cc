// SPDX-License-Identifier: Apache-2.0
// qcowtool bench qd: random reads (and writes) of a fully written qcow2
// image and of a raw file of the same size, through the same engine and
// backend, at several queue depths; the ratios of IOPS and of CPU time per
// request show what the qcow2 mapping costs.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench/bench_workloads.h"

namespace qcow2::tool::bench {
namespace {

constexpr double kDefaultSeconds = 1.0;

struct Params {
  std::vector<Op> ops = {Op::kRead};
  std::vector<int> qd = {1, 8, 32, 128};
  uint32_t bs = 4096;
  uint64_t size = 1ull << 30;
  uint32_t cluster = 64 << 10;
  int rounds = 1;
};

absl::StatusOr<Params> Resolve(const BenchOptions& o) {
  Params p;
  if (!o.modes.empty()) {
    p.ops.clear();
    for (const std::string& m : o.modes) {
      if (m != "read" && m != "write") {
        return OptionError(absl::StrCat(
            "--modes: '", m, "' applies to scaling (qd takes read, write)"));
      }
      p.ops.push_back(m == "read" ? Op::kRead : Op::kWrite);
    }
  }
  if (!o.qd.empty()) p.qd = o.qd;
  if (o.bs.size() > 1) return OptionError("--bs takes one size for qd");
  if (!o.bs.empty()) p.bs = static_cast<uint32_t>(o.bs[0]);
  p.size = o.image_size.value_or(p.size);
  p.cluster = static_cast<uint32_t>(o.cluster_size.value_or(p.cluster));
  p.rounds = o.repeat.value_or(p.rounds);
  if (p.bs > p.size) {
    return OptionError("--bs is larger than the image (--image-size)");
  }
  return p;
}

struct Result {
  Op op;
  int qd;
  const char* target;
  JobResult r;
  IoStats delta;
};

// Requests go to [start, start + p.size) of `image`.
absl::StatusOr<Result> Measure(Env& env, const Params& p, Image& image,
                               uint64_t start, Op op, int qd,
                               const char* target, const std::string& label) {
  env.progress.BeginCell(label);
  JobSpec spec;
  spec.op = op;
  spec.qd = qd;
  spec.max_len = p.bs;
  spec.next = RandomRequests(start, p.size, p.bs, env.opts.seed + qd);
  spec.progress = &env.progress;
  ApplyLimits(env.opts, kDefaultSeconds, &spec);
  const IoStats before = image.GetStats();
  auto r = RunOne(image, std::move(spec));
  if (!r.ok()) return r.status();
  env.progress.EndCell(CellSummary(*r));
  return Result{op, qd, target, *r, image.GetStats().Since(before)};
}

// The run of `runs` (one per round) with the median IOPS.
const Result& MedianRun(const std::vector<Result>& runs) {
  std::vector<const Result*> sorted;
  for (const Result& r : runs) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(), [](const Result* a, const Result* b) {
    return a->r.iops() < b->r.iops();
  });
  return *sorted[(sorted.size() - 1) / 2];
}

// A cell: the qcow2 and the raw runs of one op and queue depth, one of
// each per round.
struct Cell {
  std::vector<Result> qcow2, raw;
};

void BuildRows(const std::vector<Cell>& cells, int rounds, Report* report) {
  Panel iops{"Random IOPS by queue depth", "queue depth", "IOPS"};
  Panel lat{"p99 latency by queue depth", "queue depth", "microseconds"};
  Series q_iops{"qcow2", {}}, r_iops{"raw", {}}, q_lat{"qcow2 p99", {}},
      r_lat{"raw p99", {}};
  const bool both_ops = cells.size() >= 2 && cells.front().qcow2[0].op !=
                                                 cells.back().qcow2[0].op;
  for (const Cell& cell : cells) {
    const Result& q = MedianRun(cell.qcow2);
    const Result& raw = MedianRun(cell.raw);
    const std::optional<double> ratio = Ratio(q.r.iops(), raw.r.iops());
    const std::optional<double> cpu_ratio =
        Ratio(q.r.cpu_us_per_op(), raw.r.cpu_us_per_op());
    // The spread of the rounds' own ratios (each round's two runs share
    // its files and its minute).
    double lo = 0, hi = 0;
    for (size_t i = 0; i < cell.qcow2.size(); ++i) {
      const double x = Ratio(cell.qcow2[i].r.iops(), cell.raw[i].r.iops())
                           .value_or(0);
      lo = i == 0 ? x : std::min(lo, x);
      hi = i == 0 ? x : std::max(hi, x);
    }
    for (const Result* res : {&q, &raw}) {
      Record row;
      row.Set("op", Value::Str(OpName(res->op)))
          .Set("qd", Value::Uint(res->qd))
          .Set("target", Value::Str(res->target))
          .Set("rounds", Value::Uint(static_cast<uint64_t>(rounds)));
      AddRateColumns(res->r, &row);
      AddIoColumns(res->delta, res->op, &row);
      row.Set("ratio_vs_raw", res == &q ? Value::Ratio(ratio) : Value())
          .Set("cpu_ratio_vs_raw", res == &q ? Value::Ratio(cpu_ratio) : Value())
          .Set("round_ratio_min", res == &q ? Value::Ratio(lo) : Value())
          .Set("round_ratio_max", res == &q ? Value::Ratio(hi) : Value());
      report->rows.push_back(std::move(row));
    }
    Record h;
    h.Set("op", Value::Str(OpName(q.op)))
        .Set("qd", Value::Uint(q.qd))
        .Set("q_iops", Value::Num(q.r.iops()))
        .Set("r_iops", Value::Num(raw.r.iops()))
        .Set("ratio", Value::Ratio(ratio))
        .Set("lo", Value::Ratio(lo))
        .Set("hi", Value::Ratio(hi))
        .Set("q_cpu", Value::Num(q.r.cpu_us_per_op()))
        .Set("r_cpu", Value::Num(raw.r.cpu_us_per_op()))
        .Set("cpu_ratio", Value::Ratio(cpu_ratio))
        .Set("q_p50", Value::Num(q.r.latency.PercentileUs(0.5)))
        .Set("r_p50", Value::Num(raw.r.latency.PercentileUs(0.5)))
        .Set("q_p99", Value::Num(q.r.latency.PercentileUs(0.99)))
        .Set("r_p99", Value::Num(raw.r.latency.PercentileUs(0.99)));
    report->human_rows.push_back(std::move(h));
    const std::string category =
        both_ops ? absl::StrCat(OpName(q.op), " ", q.qd) : absl::StrCat(q.qd);
    iops.categories.push_back(category);
    lat.categories.push_back(category);
    q_iops.values.push_back(q.r.iops());
    r_iops.values.push_back(raw.r.iops());
    q_lat.values.push_back(q.r.latency.PercentileUs(0.99));
    r_lat.values.push_back(raw.r.latency.PercentileUs(0.99));
  }
  iops.series = {q_iops, r_iops};
  lat.series = {q_lat, r_lat};
  report->columns = {{"op", "op"},
                     {"qd", "qd"},
                     {"qcow2 IOPS", "q_iops", 0},
                     {"raw IOPS", "r_iops", 0},
                     {"qcow2/raw", "ratio", 3},
                     {"qcow2 CPU us/op", "q_cpu", 2},
                     {"raw CPU us/op", "r_cpu", 2},
                     {"CPU qcow2/raw", "cpu_ratio", 3},
                     {"qcow2 p50 us", "q_p50", 1},
                     {"raw p50 us", "r_p50", 1},
                     {"qcow2 p99 us", "q_p99", 1},
                     {"raw p99 us", "r_p99", 1}};
  if (rounds > 1) {
    // After qcow2/raw: the lowest and highest of the rounds' ratios.
    report->columns.insert(report->columns.begin() + 5,
                           {{"round min", "lo", 3}, {"round max", "hi", 3}});
  }
  report->plot_title = "qcowtool bench qd";
  report->plot = {iops, lat};
}

}  // namespace

absl::Status RunQd(Env& env, Report* report) {
  absl::StatusOr<Params> p = Resolve(env.opts);
  if (!p.ok()) return p.status();
  std::string modes;
  for (Op op : p->ops) absl::StrAppend(&modes, modes.empty() ? "" : ",", OpName(op));
  report->params.Set("modes", Value::Str(modes))
      .Set("qd", Value::UintList(p->qd))
      .Set("bs", Value::Uint(p->bs))
      .Set("image_size", Value::Uint(p->size))
      .Set("cluster_size", Value::Uint(p->cluster));
  AddLimitParams(env.opts, kDefaultSeconds, &report->params);

  if (!env.device.empty() && !DeviceRawStart(env.device_size, p->size)) {
    return OptionError(absl::StrCat(
        "--device ", env.device, " (", FormatSize(env.device_size),
        ") is too small for a qcow2 image and a raw range of --image-size ",
        FormatSize(p->size), " each"));
  }
  report->params.Set("rounds", Value::Uint(static_cast<uint64_t>(p->rounds)));
  report->params.Set("device",
                     env.device.empty() ? Value() : Value::Str(env.device));

  // Each round writes new targets: on tmpfs (and any page cache) the
  // memory a file's pages landed in changes what a copy costs, by up to
  // half in one run seen here, so one pair of files decides nothing. The
  // two targets take turns being written first (the first takes the
  // memory the last round freed) and being measured first.
  std::vector<Cell> cells(p->ops.size() * p->qd.size());
  const size_t total = 2 * cells.size() * static_cast<size_t>(p->rounds);
  size_t done = 0;
  for (int round = 0; round < p->rounds; ++round) {
    auto targets =
        env.device.empty()
            ? MakeFilledTargets(*env.scratch, env.progress, "qd", p->size,
                                p->cluster, env.direct,
                                /*raw_first=*/round % 2 == 1)
            : MakeDeviceTargets(env.device, env.device_size, env.progress,
                                p->size, p->cluster, env.direct);
    if (!targets.ok()) return targets.status();
    if (round == 0) {
      AddCommonParams(env.direct, EngineName(*targets->qcow2),
                      &report->params);
    }
    size_t c = 0;
    for (Op op : p->ops) {
      for (int qd : p->qd) {
        Cell& cell = cells[c++];
        for (int k = 0; k < 2; ++k) {
          // Measured first: raw in rounds 2-3 of every 4 (written first:
          // raw in odd rounds), so that the two orders do not coincide.
          const bool raw = (k == 1) != (round / 2 % 2 == 1);
          const char* target = raw ? "raw" : "qcow2";
          Image& image = raw ? *targets->raw : *targets->qcow2;
          const std::string label = absl::StrFormat(
              "[%u/%u] %s %s random %s qd%d", ++done, total, target,
              FormatBlockSize(p->bs), OpName(op), qd);
          auto r = Measure(env, *p, image, raw ? targets->raw_start : 0, op,
                           qd, target, label);
          if (!r.ok()) return r.status();
          (raw ? cell.raw : cell.qcow2).push_back(std::move(*r));
        }
      }
    }
    for (Image* image : {targets->qcow2.get(), targets->raw.get()}) {
      if (absl::Status s = image->Close(); !s.ok()) return s;
    }
    targets->qcow2.reset();
    targets->raw.reset();
    if (env.device.empty()) {
      // Before the next round writes its own.
      std::remove(targets->qcow2_path.c_str());
      std::remove(targets->raw_path.c_str());
    }
  }
  BuildRows(cells, p->rounds, report);
  return absl::OkStatus();
}

}  // namespace qcow2::tool::bench
