// SPDX-License-Identifier: Apache-2.0
// qcowtool bench cdm: CrystalDiskMark's four standard tests, reads then
// writes, on a qcow2 image and on a raw file of the same size in the same
// directory (both written in full first, so reads find data and writes
// overwrite allocated clusters, as in CrystalDiskMark's test file).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "tools/bench/bench_workloads.h"

namespace qcow2::tool::bench {
namespace {

constexpr double kDefaultSeconds = 2.0;

struct Test {
  const char* name;
  bool sequential;
  uint32_t bs;
  int qd;       // per thread
  int threads;  // each with its own Queue
};

constexpr Test kTests[] = {
    {"SEQ1M Q8T1", true, 1 << 20, 8, 1},
    {"SEQ128K Q32T1", true, 128 << 10, 32, 1},
    {"RND4K Q32T16", false, 4096, 32, 16},
    {"RND4K Q1T1", false, 4096, 1, 1},
};

struct Result {
  const Test* test;
  Op op;
  const char* target;
  JobResult r;
  IoStats delta;
};

absl::StatusOr<Result> Measure(Env& env, Image& image, const Test& t, Op op,
                               const char* target, const std::string& label) {
  env.progress.BeginCell(label);
  std::vector<ThreadJob> jobs;
  for (int i = 0; i < t.threads; ++i) {
    ThreadJob job;
    job.image = &image;
    job.spec.op = op;
    job.spec.qd = t.qd;
    job.spec.max_len = t.bs;
    job.spec.next = t.sequential ? SequentialRequests(0, image.size(), t.bs)
                                 : RandomRequests(0, image.size(), t.bs,
                                                  env.opts.seed * 64 + i);
    job.spec.flush = op == Op::kWrite;
    job.spec.progress = &env.progress;
    ApplyLimits(env.opts, kDefaultSeconds, &job.spec);
    jobs.push_back(std::move(job));
  }
  const IoStats before = image.GetStats();
  auto r = RunParallel(std::move(jobs));
  if (!r.ok()) return r.status();
  env.progress.EndCell(CellSummary(*r));
  return Result{&t, op, target, *r, image.GetStats().Since(before)};
}

void BuildRows(const std::vector<Result>& results, Report* report) {
  Panel mbs{"Throughput (MB/s)", "test", "MB/s"};
  mbs.bars = true;
  Panel amp{"qcow2 write amplification (host bytes written per guest byte)",
            "test", "host bytes / guest byte"};
  amp.bars = true;
  amp.empty_note = "no data: the I/O counters reported no guest bytes";
  Series q{"qcow2", {}}, r{"raw", {}}, a{"qcow2 writes", {}};
  for (size_t i = 0; i + 1 < results.size(); i += 2) {
    const Result& qc = results[i];
    const Result& raw = results[i + 1];
    const std::optional<double> ratio =
        Ratio(qc.r.mb_per_s(), raw.r.mb_per_s());
    for (const Result* res : {&qc, &raw}) {
      Record row;
      row.Set("test", Value::Str(res->test->name))
          .Set("op", Value::Str(OpName(res->op)))
          .Set("target", Value::Str(res->target))
          .Set("bs", Value::Uint(res->test->bs))
          .Set("qd", Value::Uint(res->test->qd))
          .Set("threads", Value::Uint(res->test->threads));
      AddRateColumns(res->r, &row);
      AddIoColumns(res->delta, res->op, &row);
      row.Set("ratio_vs_raw", res == &qc ? Value::Ratio(ratio) : Value());
      report->rows.push_back(std::move(row));
    }
    Record h;
    h.Set("test", Value::Str(qc.test->name))
        .Set("op", Value::Str(OpName(qc.op)))
        .Set("q_mbs", Value::Num(qc.r.mb_per_s()))
        .Set("r_mbs", Value::Num(raw.r.mb_per_s()))
        .Set("ratio", Value::Ratio(ratio))
        .Set("q_iops", Value::Num(qc.r.iops()))
        .Set("r_iops", Value::Num(raw.r.iops()))
        .Set("amp", *report->rows[report->rows.size() - 2].Find(
                        "write_amplification"));
    report->human_rows.push_back(std::move(h));
    const std::string label = absl::StrReplaceAll(qc.test->name, {{" ", "\n"}});
    mbs.categories.push_back(absl::StrCat(label, "\n", OpName(qc.op)));
    q.values.push_back(qc.r.mb_per_s());
    r.values.push_back(raw.r.mb_per_s());
    if (qc.op == Op::kWrite) {
      amp.categories.push_back(label);
      const Value* wa =
          report->rows[report->rows.size() - 2].Find("write_amplification");
      a.values.push_back(wa->is_null() ? std::nullopt
                                       : std::optional<double>(wa->number()));
    }
  }
  mbs.series = {q, r};
  amp.series = {a};
  report->columns = {{"test", "test", 0, true},  {"op", "op", 0, true},
                     {"qcow2 MB/s", "q_mbs", 1}, {"raw MB/s", "r_mbs", 1},
                     {"qcow2/raw", "ratio", 3},  {"qcow2 IOPS", "q_iops", 0},
                     {"raw IOPS", "r_iops", 0},  {"write amp", "amp", 3}};
  report->plot_title = "qcowtool bench cdm";
  report->plot = {mbs, amp};
}

}  // namespace

absl::Status RunCdm(Env& env, Report* report) {
  const uint64_t size = env.opts.image_size.value_or(1ull << 30);
  const uint32_t cluster =
      static_cast<uint32_t>(env.opts.cluster_size.value_or(64 << 10));
  if (size < (1u << 20)) return OptionError("--image-size must be at least 1M");
  report->params.Set("image_size", Value::Uint(size))
      .Set("cluster_size", Value::Uint(cluster));
  AddLimitParams(env.opts, kDefaultSeconds, &report->params);

  auto targets = MakeFilledTargets(*env.scratch, env.progress, "cdm", size,
                                   cluster, env.direct);
  if (!targets.ok()) return targets.status();
  AddCommonParams(env.direct, EngineName(*targets->qcow2), &report->params);

  std::vector<Result> results;
  const size_t total = 2 * 2 * (sizeof kTests / sizeof kTests[0]);
  for (Op op : {Op::kRead, Op::kWrite}) {
    for (const Test& t : kTests) {
      for (const char* target : {"qcow2", "raw"}) {
        Image& image =
            std::string_view(target) == "raw" ? *targets->raw : *targets->qcow2;
        const std::string label =
            absl::StrFormat("[%u/%u] %s %s %s", results.size() + 1, total,
                            t.name, OpName(op), target);
        auto r = Measure(env, image, t, op, target, label);
        if (!r.ok()) return r.status();
        results.push_back(std::move(*r));
      }
    }
  }
  for (Image* image : {targets->qcow2.get(), targets->raw.get()}) {
    if (absl::Status s = image->Close(); !s.ok()) return s;
  }
  BuildRows(results, report);
  return absl::OkStatus();
}

}  // namespace qcow2::tool::bench
