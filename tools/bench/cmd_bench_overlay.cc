// SPDX-License-Identifier: Apache-2.0
// qcowtool bench overlay: random I/O through backing chains of growing
// depth.
//
// Setup: a qcow2 base image, fully written, then N overlays stacked with
// Image::CreateOverlay (live external snapshots), each given one 4 KiB
// write in each of --overlay-writes percent of its clusters (distinct,
// chosen at random), so each overlay maps that share of the disk. Cells: for
// each depth d = 0..N (the image whose top is overlay d; d = 0 is the base)
// and each block size and queue depth, random reads of that image and
// random writes into a fresh overlay created on top of it (the state right
// after an external snapshot), which is deleted afterwards so every write
// cell starts from the same chain.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench/bench_workloads.h"

namespace qcow2::tool::bench {
namespace {

constexpr uint64_t kDefaultSize = 1ull << 30;
constexpr double kDefaultSeconds = 1.0;
constexpr uint32_t kOverlayWriteSize = 4096;

struct Params {
  uint64_t size = kDefaultSize;
  uint32_t cluster = 64 << 10;
  uint32_t overlay_cluster = 64 << 10;
  bool extended_l2 = false;
  int depth = 3;
  uint32_t overlay_writes_pct = 10;
  std::vector<uint64_t> bs = {4096, 64 << 10};
  std::vector<int> qd = {32};
};

absl::StatusOr<Params> Resolve(const BenchOptions& o) {
  Params p;
  p.size = o.image_size.value_or(kDefaultSize);
  p.cluster = static_cast<uint32_t>(o.cluster_size.value_or(64 << 10));
  p.overlay_cluster =
      static_cast<uint32_t>(o.overlay_cluster_size.value_or(p.cluster));
  p.extended_l2 = o.extended_l2.value_or("off") == "on";
  if (o.extended_l2 == "both") {
    return OptionError(
        "--extended-l2: 'both' applies to sweep "
        "only; use on or off");
  }
  if (p.extended_l2 && p.overlay_cluster < (16u << 10)) {
    return OptionError(
        "--extended-l2=on needs an overlay cluster size of at least 16k");
  }
  p.depth = o.chain_depth.value_or(3);
  p.overlay_writes_pct = o.overlay_writes_pct.value_or(10);
  if (!o.bs.empty()) p.bs = o.bs;
  if (!o.qd.empty()) p.qd = o.qd;
  for (uint64_t bs : p.bs) {
    if (bs > p.size) {
      return OptionError(absl::StrCat("--bs ", FormatBlockSize(bs),
                                      " is larger than the "
                                      "image (--image-size)"));
    }
  }
  return p;
}

void AddParams(const Params& p, const BenchOptions& o, Record* params) {
  params->Set("image_size", Value::Uint(p.size))
      .Set("cluster_size", Value::Uint(p.cluster))
      .Set("overlay_cluster_size", Value::Uint(p.overlay_cluster))
      .Set("extended_l2", Value::Bool(p.extended_l2))
      .Set("depth", Value::Uint(p.depth))
      .Set("overlay_writes_pct", Value::Uint(p.overlay_writes_pct))
      .Set("bs", Value::UintList(p.bs))
      .Set("qd", Value::UintList(p.qd));
  AddLimitParams(o, kDefaultSeconds, params);
}

// One 4 KiB write at a random 4 KiB-aligned offset in each of `n`
// distinct clusters chosen at random, so the overlay allocates exactly
// n clusters.
RequestGen ClusterSample(const Params& p, uint64_t n, uint64_t seed) {
  const uint64_t clusters = p.size / p.overlay_cluster;
  std::vector<uint64_t> order(clusters);
  for (uint64_t i = 0; i < clusters; ++i) order[i] = i;
  Rng rng(seed);
  for (uint64_t i = 0; i < n; ++i) {
    std::swap(order[i], order[i + rng.Below(clusters - i)]);
  }
  order.resize(n);
  const uint64_t blocks =
      std::max<uint64_t>(1, p.overlay_cluster / kOverlayWriteSize);
  return [order = std::move(order), next = size_t{0}, rng, blocks,
          cs = p.overlay_cluster]() mutable {
    const uint64_t c = order[next++ % order.size()];
    return Request{c * cs + rng.Below(blocks) * kOverlayWriteSize,
                   kOverlayWriteSize};
  };
}

// Creates and fills the base, stacks the overlays; returns the file name
// (in the scratch directory) of the top at each depth.
absl::StatusOr<std::vector<std::string>> BuildChain(Env& env, const Params& p) {
  std::vector<std::string> names = {"base.qcow2"};
  CreateOptions base;
  base.size = p.size;
  base.cluster_size = p.cluster;
  auto image = CreateBenchImage(env.scratch->Path(names[0]), base, env.direct);
  if (!image.ok()) return image.status();
  if (auto s = FillImage(**image, 0x5a, env.progress, "base.qcow2"); !s.ok()) {
    return s;
  }
  const uint64_t clusters = p.size / p.overlay_cluster;
  const uint64_t writes = clusters * p.overlay_writes_pct / 100;
  for (int d = 1; d <= p.depth; ++d) {
    names.push_back(absl::StrCat("overlay-", d, ".qcow2"));
    CreateOptions ov;
    ov.cluster_size = p.overlay_cluster;
    absl::Status s =
        (*image)->CreateOverlay(env.scratch->Path(names.back()), ov);
    if (!s.ok()) return s;
    if (writes == 0) continue;
    env.progress.Step(absl::StrCat("writing ", names.back(), " (4 KiB into ",
                                   writes, " random clusters)"));
    JobSpec spec;
    spec.op = Op::kWrite;
    spec.qd = 32;
    spec.max_len = kOverlayWriteSize;
    spec.next = ClusterSample(p, writes, env.opts.seed * 1000 + d);
    spec.count = writes;
    spec.flush = true;
    spec.fill = static_cast<uint8_t>(0x10 + d);
    if (auto r = RunOne(**image, std::move(spec)); !r.ok()) return r.status();
  }
  if (absl::Status s = (*image)->Close(); !s.ok()) return s;
  return names;
}

struct Cell {
  int depth;
  Op op;
  uint64_t bs;
  int qd;
};

// Runs one cell on `image` and appends its rows.
absl::Status Measure(Env& env, Image& image, const Params& p, const Cell& c,
                     const std::string& label, Report* report) {
  env.progress.BeginCell(label);
  JobSpec spec;
  spec.op = c.op;
  spec.qd = c.qd;
  spec.max_len = static_cast<uint32_t>(c.bs);
  spec.next = RandomRequests(0, p.size, spec.max_len,
                             env.opts.seed + report->rows.size());
  spec.flush = c.op == Op::kWrite;
  spec.progress = &env.progress;
  ApplyLimits(env.opts, kDefaultSeconds, &spec);
  const IoStats before = image.GetStats();
  auto r = RunOne(image, std::move(spec));
  if (!r.ok()) return r.status();
  const IoStats delta = image.GetStats().Since(before);
  env.progress.EndCell(CellSummary(*r));

  Record row;
  row.Set("depth", Value::Uint(c.depth))
      .Set("op", Value::Str(OpName(c.op)))
      .Set("bs", Value::Uint(c.bs))
      .Set("qd", Value::Uint(c.qd));
  AddRateColumns(*r, &row);
  AddIoColumns(delta, c.op, &row);
  Record human;
  for (const auto& [k, v] : row.members()) {
    human.Set(k, k == "bs" ? Value::Str(FormatBlockSize(c.bs)) : v);
  }
  report->rows.push_back(std::move(row));
  report->human_rows.push_back(std::move(human));
  return absl::OkStatus();
}

// Random writes into a fresh overlay over the chain topped by `top`.
absl::Status MeasureWrite(Env& env, const Params& p, const std::string& top,
                          const Cell& c, const std::string& label,
                          Report* report) {
  CreateOptions fresh;
  fresh.cluster_size = p.overlay_cluster;
  fresh.extended_l2 = p.extended_l2;
  fresh.backing_file = env.scratch->BaseName(top);
  fresh.backing_format = "qcow2";
  const std::string path = env.scratch->Path("fresh.qcow2");
  auto image = CreateBenchImage(path, fresh, env.direct);
  if (!image.ok()) return image.status();
  absl::Status s = Measure(env, **image, p, c, label, report);
  if (s.ok()) s = (*image)->Close();
  image->reset();
  absl::Status removed = env.scratch->Remove(path);
  return s.ok() ? removed : s;
}

void BuildPlot(const Params& p, Report* report) {
  Panel iops{"IOPS by chain depth", "depth of the image's top", "IOPS"};
  Panel amp{"Write amplification (host bytes written per guest byte)",
            "depth of the chain under the fresh overlay",
            "host bytes / guest byte"};
  amp.empty_note = "no data: the I/O counters reported no guest bytes";
  for (int d = 0; d <= p.depth; ++d) {
    iops.categories.push_back(absl::StrCat(d));
    amp.categories.push_back(absl::StrCat(d));
  }
  for (const Record& row : report->rows) {
    const std::string op = row.Find("op")->str();
    const std::string name = absl::StrCat(
        op, " ",
        FormatBlockSize(static_cast<uint64_t>(row.Find("bs")->number())),
        p.qd.size() > 1 ? absl::StrCat(" qd", row.Find("qd")->number()) : "");
    const size_t d = static_cast<size_t>(row.Find("depth")->number());
    auto put = [&](Panel& panel, const Value* v) {
      Series* s = nullptr;
      for (Series& e : panel.series) {
        if (e.name == name) s = &e;
      }
      if (s == nullptr) {
        panel.series.push_back(Series{name, {}});
        s = &panel.series.back();
        s->values.resize(panel.categories.size());
      }
      if (v != nullptr && !v->is_null()) s->values[d] = v->number();
    };
    put(iops, row.Find("iops"));
    if (op == "write") put(amp, row.Find("write_amplification"));
  }
  report->plot_title = "qcowtool bench overlay";
  report->plot = {iops, amp};
}

}  // namespace

absl::Status RunOverlay(Env& env, Report* report) {
  absl::StatusOr<Params> p = Resolve(env.opts);
  if (!p.ok()) return p.status();
  AddParams(*p, env.opts, &report->params);

  auto names = BuildChain(env, *p);
  if (!names.ok()) return names.status();

  const size_t total = (p->depth + 1) * 2 * p->bs.size() * p->qd.size();
  for (int d = 0; d <= p->depth; ++d) {
    const std::string top = env.scratch->Path((*names)[d]);
    for (Op op : {Op::kRead, Op::kWrite}) {
      std::unique_ptr<Image> reader;
      if (op == Op::kRead) {
        auto image = OpenBenchImage(top, env.direct, false, "qcow2");
        if (!image.ok()) return image.status();
        reader = std::move(*image);
        if (d == 0) {
          AddCommonParams(env.direct, EngineName(*reader), &report->params);
        }
      }
      for (uint64_t bs : p->bs) {
        for (int qd : p->qd) {
          const Cell c{d, op, bs, qd};
          const std::string label = absl::StrFormat(
              "[%u/%u] depth %d %s %s qd%d", report->rows.size() + 1, total, d,
              OpName(op), FormatBlockSize(bs), qd);
          absl::Status s =
              op == Op::kRead
                  ? Measure(env, *reader, *p, c, label, report)
                  : MeasureWrite(env, *p, (*names)[d], c, label, report);
          if (!s.ok()) return s;
        }
      }
    }
  }
  report->columns = {
      {"depth", "depth"},
      {"op", "op", 0, true},
      {"bs", "bs"},
      {"qd", "qd"},
      {"MB/s", "mb_per_s", 1},
      {"IOPS", "iops", 0},
      {"p50 us", "lat_p50_us", 1},
      {"p99 us", "lat_p99_us", 1},
      {"write amp", "write_amplification", 2},
      {"cow read/B", "cow_read_per_guest_byte", 2},
  };
  BuildPlot(*p, report);
  return absl::OkStatus();
}

}  // namespace qcow2::tool::bench
