// SPDX-License-Identifier: Apache-2.0
// qcowtool bench sweep: which overlay options suit a write-size mix. For
// each cluster size and extended-L2 setting, a fresh overlay over one fully
// written backing file takes --count random writes drawn from --mix; the
// option set with the lowest write amplification (host bytes written per
// guest byte) wins, ties (within 1%) going to the higher IOPS.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench/bench_workloads.h"

namespace qcow2::tool::bench {
namespace {

struct Params {
  std::vector<MixEntry> mix = {{4096, 70}, {64 << 10, 30}};
  std::vector<uint64_t> cluster_sizes = {4 << 10,   16 << 10, 64 << 10,
                                         256 << 10, 1 << 20,  2 << 20};
  std::vector<bool> extended_l2 = {false, true};
  uint64_t count = 20000;
  int qd = 32;
  uint64_t size = 1ull << 30;
  uint32_t base_cluster = 64 << 10;
};

absl::StatusOr<Params> Resolve(const BenchOptions& o) {
  Params p;
  if (!o.mix.empty()) p.mix = o.mix;
  if (!o.cluster_sizes.empty()) p.cluster_sizes = o.cluster_sizes;
  if (o.extended_l2 == "on") p.extended_l2 = {true};
  if (o.extended_l2 == "off") p.extended_l2 = {false};
  p.count = o.count.value_or(p.count);
  if (p.count == 0) return OptionError("--count must be at least 1");
  if (o.qd.size() > 1) return OptionError("--qd takes one value for sweep");
  if (!o.qd.empty()) p.qd = o.qd[0];
  p.size = o.image_size.value_or(p.size);
  p.base_cluster = static_cast<uint32_t>(o.cluster_size.value_or(64 << 10));
  for (const MixEntry& m : p.mix) {
    if (m.bs > p.size) return OptionError("--mix: a size exceeds the image");
  }
  return p;
}

std::string MixText(const std::vector<MixEntry>& mix) {
  std::string out;
  for (const MixEntry& m : mix) {
    absl::StrAppend(&out, out.empty() ? "" : ",", FormatBlockSize(m.bs), ":",
                    m.weight);
  }
  return out;
}

struct Result {
  uint64_t cluster;
  bool extended_l2;
  JobResult r;
  IoStats delta;
  std::optional<double> amp;
};

absl::StatusOr<Result> Measure(Env& env, const Params& p,
                               const std::string& base, uint64_t cluster,
                               bool ext, const std::string& label) {
  CreateOptions c;
  c.cluster_size = static_cast<uint32_t>(cluster);
  c.extended_l2 = ext;
  c.backing_file = env.scratch->BaseName(base);
  c.backing_format = "qcow2";
  const std::string path = env.scratch->Path("sweep-overlay.qcow2");
  auto image = CreateBenchImage(path, c, env.direct);
  if (!image.ok()) return image.status();
  env.progress.BeginCell(label);
  JobSpec spec;
  spec.op = Op::kWrite;
  spec.qd = p.qd;
  for (const MixEntry& m : p.mix) spec.max_len = std::max(spec.max_len, m.bs);
  spec.next = MixRequests(0, p.size, p.mix, env.opts.seed);
  spec.count = p.count;
  spec.flush = true;
  spec.progress = &env.progress;
  const IoStats before = (*image)->GetStats();
  auto r = RunOne(**image, std::move(spec));
  if (!r.ok()) return r.status();
  const IoStats delta = (*image)->GetStats().Since(before);
  env.progress.EndCell(CellSummary(*r));
  if (absl::Status s = (*image)->Close(); !s.ok()) return s;
  image->reset();
  if (absl::Status s = env.scratch->Remove(path); !s.ok()) return s;
  return Result{cluster, ext, *r, delta,
                Ratio(static_cast<double>(delta.host_write_bytes()),
                      static_cast<double>(delta.guest_write_bytes))};
}

// Lowest amplification (absent counts as worst); within 1%, more IOPS.
const Result* Best(const std::vector<Result>& results) {
  const Result* best = nullptr;
  auto amp = [](const Result& r) {
    return r.amp.value_or(std::numeric_limits<double>::infinity());
  };
  for (const Result& r : results) {
    if (best == nullptr) {
      best = &r;
      continue;
    }
    const double a = amp(r), b = amp(*best);
    const bool tie = (std::isinf(a) && std::isinf(b)) ||
                     std::fabs(a - b) <= 0.01 * std::min(a, b);
    if ((!tie && a < b) || (tie && r.r.iops() > best->r.iops())) best = &r;
  }
  return best;
}

void Recommend(const std::vector<Result>& results, Report* report) {
  const Result* best = Best(results);
  if (best == nullptr) return;
  const std::string o =
      absl::StrCat("cluster_size=", FormatBlockSize(best->cluster),
                   ",extended_l2=", best->extended_l2 ? "on" : "off");
  const bool by_amp = best->amp.has_value();
  Record rec;
  rec.Set("cluster_size", Value::Uint(best->cluster))
      .Set("extended_l2", Value::Bool(best->extended_l2))
      .Set("basis", Value::Str(by_amp ? "write_amplification" : "iops"))
      .Set("write_amplification", Value::Ratio(best->amp))
      .Set("iops", Value::Num(best->r.iops()))
      .Set("create",
           Value::Str("qcowtool create -f qcow2 -o " + o + " IMAGE SIZE"))
      .Set("snapshot",
           Value::Str("qcowtool snapshot -o " + o + " IMAGE OVERLAY"));
  report->extra.emplace_back("recommendation", rec);
  report->tail = absl::StrFormat(
      "\nRecommended: %s (write amplification %s, %.0f IOPS)%s\n"
      "  %s\n  %s\n",
      o, best->amp ? absl::StrFormat("%.3f", *best->amp) : "-", best->r.iops(),
      by_amp ? ""
             : "\n  (the I/O counters reported no guest bytes: chosen by "
               "IOPS only)",
      rec.Find("create")->str(), rec.Find("snapshot")->str());
}

void BuildRows(const std::vector<Result>& results, Report* report) {
  Panel amp{"Bytes per guest byte written", "cluster size / extended L2",
            "bytes / guest byte"};
  amp.bars = true;
  amp.empty_note = "no data: the I/O counters reported no guest bytes";
  Panel iops{"IOPS", "cluster size / extended L2", "IOPS"};
  iops.bars = true;
  Series host{"host bytes written", {}}, cow{"COW bytes read", {}},
      ops{"IOPS", {}};
  for (const Result& res : results) {
    Record row;
    row.Set("cluster_size", Value::Uint(res.cluster))
        .Set("extended_l2", Value::Bool(res.extended_l2));
    AddRateColumns(res.r, &row);
    AddIoColumns(res.delta, Op::kWrite, &row);
    const std::string name = absl::StrCat(FormatBlockSize(res.cluster),
                                          res.extended_l2 ? "\next L2" : "");
    Record h = row;
    h.Set("name_cluster", Value::Str(FormatBlockSize(res.cluster)))
        .Set("name_ext", Value::Str(res.extended_l2 ? "on" : "off"));
    report->rows.push_back(std::move(row));
    report->human_rows.push_back(std::move(h));
    for (Panel* p : {&amp, &iops}) p->categories.push_back(name);
    const Record& r = report->rows.back();
    auto opt = [&](const char* key) -> std::optional<double> {
      const Value* v = r.Find(key);
      if (v == nullptr || v->is_null()) return std::nullopt;
      return v->number();
    };
    host.values.push_back(opt("write_amplification"));
    cow.values.push_back(opt("cow_read_per_guest_byte"));
    ops.values.push_back(res.r.iops());
  }
  amp.series = {host, cow};
  iops.series = {ops};
  report->columns = {{"cluster", "name_cluster"},
                     {"ext L2", "name_ext", 0, true},
                     {"IOPS", "iops", 0},
                     {"MB/s", "mb_per_s", 1},
                     {"p99 us", "lat_p99_us", 0},
                     {"write amp", "write_amplification", 3},
                     {"cow read/B", "cow_read_per_guest_byte", 3}};
  report->plot_title = "qcowtool bench sweep";
  report->plot = {amp, iops};
}

}  // namespace

absl::Status RunSweep(Env& env, Report* report) {
  absl::StatusOr<Params> p = Resolve(env.opts);
  if (!p.ok()) return p.status();
  report->params.Set("mix", Value::Str(MixText(p->mix)))
      .Set("cluster_sizes", Value::UintList(p->cluster_sizes))
      .Set("count", Value::Uint(p->count))
      .Set("qd", Value::Uint(p->qd))
      .Set("image_size", Value::Uint(p->size))
      .Set("backing_cluster_size", Value::Uint(p->base_cluster));

  const std::string base = "sweep-base.qcow2";
  CreateOptions c;
  c.size = p->size;
  c.cluster_size = p->base_cluster;
  auto image = CreateBenchImage(env.scratch->Path(base), c, env.direct);
  if (!image.ok()) return image.status();
  if (auto s = FillImage(**image, 0x5a, env.progress, base); !s.ok()) return s;
  AddCommonParams(env.direct, EngineName(**image), &report->params);
  if (absl::Status s = (*image)->Close(); !s.ok()) return s;
  image->reset();

  std::vector<std::pair<uint64_t, bool>> sets;
  for (uint64_t cs : p->cluster_sizes) {
    for (bool ext : p->extended_l2) {
      if (!ext || cs >= (16u << 10)) sets.emplace_back(cs, ext);
    }
  }
  if (sets.empty()) {
    return OptionError(
        "no option set left: extended L2 needs clusters of "
        "16k or more");
  }
  std::vector<Result> results;
  for (const auto& [cs, ext] : sets) {
    const std::string label = absl::StrFormat(
        "[%u/%u] cluster %s, extended L2 %s", results.size() + 1, sets.size(),
        FormatBlockSize(cs), ext ? "on" : "off");
    auto r = Measure(env, *p, base, cs, ext, label);
    if (!r.ok()) return r.status();
    results.push_back(std::move(*r));
  }
  BuildRows(results, report);
  Recommend(results, report);
  return absl::OkStatus();
}

}  // namespace qcow2::tool::bench
