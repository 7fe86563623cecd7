// SPDX-License-Identifier: Apache-2.0
// qcowtool bench rmw: what copy-on-write costs right after an external
// snapshot, side by side with the same I/O where nothing is copied.
//
// Setup: a qcow2 base image (--image-size, --cluster-size), fully written,
// and --depth overlays stacked on it, each given a 4 KiB write in 1% of its
// clusters (for the deep-chain read rows). Cells, in this order:
//   - for each --bs: random writes into a fresh overlay over the base, with
//     standard and with extended L2 entries (a new overlay each, deleted
//     afterwards), then the same writes into a fully allocated image (the
//     base itself, whose clusters are all its own), and into a fresh
//     sparse raw file and into a fresh raw file reserved with fallocate
//     (what the file system alone charges for new blocks);
//   - 4 KiB sequential writes into a fresh overlay (standard and extended
//     L2) and into the allocated image: small writes that follow one
//     another fill each new cluster with no copy (deferred copy-on-write);
//   - 4 KiB random reads of the base alone (depth 0) and of the top of the
//     stacked chain (depth N), each round opening the images afresh, so
//     that a round pays for a cold chain again.
// Each group (the random writes of one size, the sequential writes, the
// reads) runs in --repeat rounds, the write cells in the reverse order in
// odd rounds; a row is its cell's median round, with the spread. Each
// fresh-overlay and raw row is compared with the allocated cell of its
// round ("vs base"), each fresh overlay with the reserved raw file or the
// raw device ("vs raw"), each deep read with depth 0: the median of the
// rounds' IOPS ratios.
// With --device, the written images are on the device instead: each fresh
// overlay (its backing file, the base, stays in the scratch directory),
// the allocated image (a qcow2 image there, written in full first), and
// one "raw device" row in place of the two raw files.
#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench/bench_workloads.h"

namespace qcow2::tool::bench {
namespace {

constexpr uint64_t kDefaultSize = 1ull << 30;
constexpr uint64_t kDefaultWrites = 10000;
constexpr double kDefaultReadSeconds = 2.0;
constexpr uint32_t kReadSize = 4096;

struct Params {
  uint64_t size = kDefaultSize;
  uint32_t cluster = 64 << 10;
  std::vector<uint64_t> bs = {4096, 64 << 10};
  int qd = 32;
  int depth = 32;
  uint64_t writes = kDefaultWrites;
  double read_seconds = kDefaultReadSeconds;
  int rounds = 3;  // of the write cells and of the reads
};

absl::StatusOr<Params> Resolve(const BenchOptions& o) {
  Params p;
  p.size = o.image_size.value_or(kDefaultSize);
  p.cluster = static_cast<uint32_t>(o.cluster_size.value_or(p.cluster));
  if (p.cluster < (16u << 10)) {
    return OptionError(
        "--cluster-size must be 16k or more (the extended-L2 rows need it)");
  }
  if (!o.bs.empty()) p.bs = o.bs;
  if (o.qd.size() > 1) return OptionError("--qd takes one value for rmw");
  if (!o.qd.empty()) p.qd = o.qd[0];
  p.depth = o.chain_depth.value_or(p.depth);
  p.writes = o.count.value_or(p.writes);
  p.read_seconds = o.seconds.value_or(p.read_seconds);
  p.rounds = o.repeat.value_or(p.rounds);
  for (uint64_t bs : p.bs) {
    if (bs > p.size) {
      return OptionError(absl::StrCat("--bs ", FormatBlockSize(bs),
                                      " is larger than the image "
                                      "(--image-size)"));
    }
  }
  return p;
}

struct Cell {
  std::string target;  // "fresh overlay", "allocated", "depth N"
  Op op;
  uint64_t bs;
  std::optional<bool> extended_l2;  // fresh overlays only
  int depth = 0;
  bool sequential = false;
};

// Runs `c` on `image` with random offsets from `seed` and appends its row.
absl::Status Measure(Env& env, Image& image, const Params& p, const Cell& c,
                     const std::string& label, uint64_t seed, Report* report) {
  env.progress.BeginCell(label);
  JobSpec spec;
  spec.op = c.op;
  spec.qd = p.qd;
  spec.max_len = static_cast<uint32_t>(c.bs);
  spec.next = c.sequential ? SequentialRequests(0, p.size, spec.max_len)
                           : RandomRequests(0, p.size, spec.max_len, seed);
  if (c.op == Op::kWrite) {
    spec.count = p.writes;
    spec.flush = true;  // metadata written back inside the timed span
  } else {
    spec.seconds = p.read_seconds;
  }
  spec.progress = &env.progress;
  const IoStats before = image.GetStats();
  auto r = RunOne(image, std::move(spec));
  if (!r.ok()) return r.status();
  const IoStats d = image.GetStats().Since(before);
  env.progress.EndCell(CellSummary(*r));

  Record row;
  row.Set("target", Value::Str(c.target))
      .Set("op", Value::Str(OpName(c.op)))
      .Set("bs", Value::Uint(c.bs))
      .Set("qd", Value::Uint(p.qd))
      .Set("depth", Value::Uint(c.depth))
      .Set("pattern", Value::Str(c.sequential ? "sequential" : "random"))
      .Set("extended_l2",
           c.extended_l2 ? Value::Bool(*c.extended_l2) : Value());
  AddRateColumns(*r, &row);
  AddIoColumns(d, c.op, &row);
  row.Set("cluster_allocations", Value::Uint(d.cluster_allocations))
      .Set("cow_copies", Value::Uint(d.cow_head_copies + d.cow_tail_copies))
      .Set("metadata_write_bytes", Value::Uint(d.metadata_write_bytes()));
  // Copy-on-write per allocated cluster, in clusters' worth: at most one
  // read of the old contents and one write of the cluster.
  const bool allocs = d.cluster_allocations > 0;
  const double per = static_cast<double>(d.cluster_allocations) * p.cluster;
  row.Set("cow_read_clusters_per_alloc",
          allocs ? Value::Num(d.cow_read_bytes / per) : Value())
      .Set("host_write_clusters_per_alloc",
           allocs ? Value::Num((d.host_data_write_bytes + d.cow_write_bytes) /
                               per)
                  : Value());
  report->rows.push_back(std::move(row));
  return absl::OkStatus();
}

// The median of `runs` (one per round, in round order) by IOPS, with
// their number, spread and every round's IOPS.
Record MedianRun(std::vector<Record> runs) {
  std::vector<double> iops;
  for (const Record& r : runs) iops.push_back(r.Find("iops")->number());
  std::sort(runs.begin(), runs.end(), [](const Record& a, const Record& b) {
    return a.Find("iops")->number() < b.Find("iops")->number();
  });
  Record row = runs[runs.size() / 2];
  row.Set("runs", Value::Uint(runs.size()))
      .Set("iops_min", Value::Num(runs.front().Find("iops")->number()))
      .Set("iops_max", Value::Num(runs.back().Find("iops")->number()))
      .Set("round_iops", Value::NumList(iops));
  return row;
}

// The median over rounds of a's IOPS over b's in the same round (a and b
// hold one row per round, in round order).
std::optional<double> MedianRatio(const std::vector<Record>& a,
                                  const std::vector<Record>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const std::optional<double> x =
        Ratio(a[i].Find("iops")->number(), b[i].Find("iops")->number());
    if (x) r.push_back(*x);
  }
  if (r.empty()) return std::nullopt;
  std::sort(r.begin(), r.end());
  return r[r.size() / 2];
}

// Creates the base and the stacked chain; returns the top's path at each
// depth (index 0: the base).
absl::StatusOr<std::vector<std::string>> BuildChain(Env& env, const Params& p) {
  std::vector<std::string> paths = {env.scratch->Path("base.qcow2")};
  CreateOptions base;
  base.size = p.size;
  base.cluster_size = p.cluster;
  auto image = CreateBenchImage(paths[0], base, env.direct);
  if (!image.ok()) return image.status();
  if (auto s = FillImage(**image, 0x5a, env.progress, "base.qcow2"); !s.ok()) {
    return s;
  }
  const uint64_t clusters = p.size / p.cluster;
  const uint64_t writes = std::max<uint64_t>(1, clusters / 100);
  for (int d = 1; d <= p.depth; ++d) {
    paths.push_back(env.scratch->Path(absl::StrCat("overlay-", d, ".qcow2")));
    CreateOptions ov;
    ov.cluster_size = p.cluster;
    if (absl::Status s = (*image)->CreateOverlay(paths.back(), ov); !s.ok()) {
      return s;
    }
    env.progress.Step(absl::StrFormat("overlay %d of %d: 4 KiB into %u clusters",
                                      d, p.depth, writes));
    JobSpec spec;
    spec.op = Op::kWrite;
    spec.qd = 32;
    spec.max_len = kReadSize;
    spec.next = RandomRequests(0, p.size, kReadSize, env.opts.seed * 977 + d);
    spec.count = writes;
    spec.flush = true;
    spec.fill = static_cast<uint8_t>(d);
    if (auto r = RunOne(**image, std::move(spec)); !r.ok()) return r.status();
  }
  if (absl::Status s = (*image)->Close(); !s.ok()) return s;
  return paths;
}

// A cell of a group, and how to measure it once (appending its row).
using CellRun = std::function<absl::Status(const Cell&, uint64_t seed)>;
struct GroupCell {
  Cell cell;
  CellRun run;
};
using Group = std::vector<GroupCell>;

// One `bench rmw` run: the chain it built and the cells it measures, in
// the order the header comment lists them.
class RmwRun {
 public:
  RmwRun(Env& env, const Params& p, std::vector<std::string> paths,
         Report* report)
      : env_(env),
        p_(p),
        paths_(std::move(paths)),
        report_(report),
        on_device_(!env.device.empty()),
        // Per write size: two fresh overlays, the allocated image, two raw
        // files (on a device: the device); then 3 sequential, 2 reads.
        total_((p.bs.size() * (on_device_ ? 4 : 5) + 3 + 2) * p.rounds) {}

  absl::Status Run() {
    std::vector<Group> groups;
    for (uint64_t bs : p_.bs) groups.push_back(RandomWriteGroup(bs));
    groups.push_back(SequentialWriteGroup());
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      if (absl::Status s = RunGroup(gi, groups[gi]); !s.ok()) return s;
    }
    if (absl::Status s = RunReads(); !s.ok()) return s;
    AddCommonParams(env_.direct, engine_, &report_->params);
    report_->params.Set("device",
                        on_device_ ? Value::Str(env_.device) : Value());
    return absl::OkStatus();
  }

 private:
  std::string Label(const Cell& c) {
    return absl::StrFormat(
        "[%u/%u] %s %s%s %s%s", ++done_, total_, OpName(c.op),
        FormatBlockSize(c.bs), c.sequential ? " sequential" : "", c.target,
        c.extended_l2 ? (*c.extended_l2 ? " (extended L2)" : " (standard L2)")
                      : "");
  }

  // Measures `c` on `image`, then closes it.
  absl::Status MeasureAndClose(Image& image, const Cell& c, uint64_t seed) {
    absl::Status s = Measure(env_, image, p_, c, Label(c), seed, report_);
    if (s.ok()) s = image.Close();
    return s;
  }

  // Writes into a new overlay over the base, deleted afterwards.
  absl::Status FreshCell(const Cell& c, uint64_t seed) {
    CreateOptions fresh;
    fresh.cluster_size = p_.cluster;
    fresh.extended_l2 = *c.extended_l2;
    fresh.backing_file =
        on_device_ ? std::filesystem::absolute(paths_[0]).string()
                   : env_.scratch->BaseName("base.qcow2");
    fresh.backing_format = "qcow2";
    const std::string path =
        on_device_ ? env_.device : env_.scratch->Path("fresh.qcow2");
    auto image = CreateBenchImage(path, fresh, env_.direct);
    if (!image.ok()) return image.status();
    if (engine_.empty()) engine_ = EngineName(**image);
    absl::Status s = MeasureAndClose(**image, c, seed);
    image->reset();
    if (s.ok() && !on_device_) s = env_.scratch->Remove(path);
    return s;
  }

  // The base is written everywhere: every write lands in its own cluster.
  // (Its contents change; later cells do not depend on them.) On a device:
  // a qcow2 image there, written in full first.
  absl::Status AllocatedCell(const Cell& c, uint64_t seed) {
    absl::StatusOr<std::unique_ptr<Image>> image;
    if (on_device_) {
      CreateOptions full;
      full.size = p_.size;
      full.cluster_size = p_.cluster;
      image = CreateBenchImage(env_.device, full, env_.direct);
      if (image.ok()) {
        if (absl::Status s = FillImage(**image, 0x5a, env_.progress,
                                       "qcow2 on " + env_.device);
            !s.ok()) {
          return s;
        }
      }
    } else {
      image = OpenBenchImage(paths_[0], env_.direct, true, "qcow2");
    }
    if (!image.ok()) return image.status();
    return MeasureAndClose(**image, c, seed);
  }

  // No file system: the device itself, as raw, is the ceiling.
  absl::Status RawDeviceCell(const Cell& c, uint64_t seed) {
    auto image = OpenBenchImage(env_.device, env_.direct, true, "raw");
    if (!image.ok()) return image.status();
    return MeasureAndClose(**image, c, seed);
  }

  // What the file system charges for writing into blocks it has not
  // written yet, with no qcow2 at all: a fresh sparse raw file, or one
  // whose blocks are reserved with fallocate (unwritten extents), as an
  // overlay reserves the room it grows into.
  absl::Status RawFileCell(bool reserved, const Cell& c, uint64_t seed) {
    CreateOptions raw;
    raw.format = ImageFormat::kRaw;
    raw.size = p_.size;
    if (reserved) raw.preallocation = Preallocation::kFalloc;
    const std::string raw_path = env_.scratch->Path("fresh.raw");
    auto image = CreateBenchImage(raw_path, raw, env_.direct);
    if (!image.ok()) return image.status();
    absl::Status s = MeasureAndClose(**image, c, seed);
    image->reset();
    if (s.ok()) s = env_.scratch->Remove(raw_path);
    return s;
  }

  CellRun Fresh() {
    return [this](const Cell& c, uint64_t seed) { return FreshCell(c, seed); };
  }
  CellRun Allocated() {
    return [this](const Cell& c, uint64_t seed) {
      return AllocatedCell(c, seed);
    };
  }
  static void Add(Group* g, const Cell& c, CellRun run) {
    g->push_back(GroupCell{c, std::move(run)});
  }

  // Random writes of `bs` bytes into every target.
  Group RandomWriteGroup(uint64_t bs) {
    Group g;
    for (bool xl2 : {false, true}) {
      Add(&g, {"fresh overlay", Op::kWrite, bs, xl2}, Fresh());
    }
    Add(&g, {"allocated", Op::kWrite, bs, std::nullopt}, Allocated());
    if (on_device_) {
      Add(&g, {"raw device", Op::kWrite, bs, std::nullopt},
          [this](const Cell& c, uint64_t seed) {
            return RawDeviceCell(c, seed);
          });
      return g;
    }
    for (bool reserved : {false, true}) {
      Add(&g,
          {reserved ? "reserved raw file" : "fresh raw file", Op::kWrite, bs,
           std::nullopt},
          [this, reserved](const Cell& c, uint64_t seed) {
            return RawFileCell(reserved, c, seed);
          });
    }
    return g;
  }

  // Small sequential writes: with standard L2 entries each new cluster
  // would otherwise be copied on its first write.
  Group SequentialWriteGroup() {
    Group g;
    for (bool xl2 : {false, true}) {
      Cell c{"fresh overlay", Op::kWrite, kReadSize, xl2};
      c.sequential = true;
      Add(&g, c, Fresh());
    }
    Cell c{"allocated", Op::kWrite, kReadSize, std::nullopt};
    c.sequential = true;
    Add(&g, c, Allocated());
    return g;
  }

  // Group `gi` in --repeat rounds, the cells in one order in even rounds
  // and in the reverse order in odd ones (what runs first or last in a
  // round, on a drifting machine, lands on every cell alike); all cells of
  // a round write the same offsets.
  absl::Status RunGroup(size_t gi, Group& g) {
    std::vector<std::vector<Record>> runs(g.size());
    for (int round = 0; round < p_.rounds; ++round) {
      const uint64_t seed = env_.opts.seed + 1000 * (gi + 1) + round;
      for (size_t k = 0; k < g.size(); ++k) {
        const size_t i = round % 2 == 0 ? k : g.size() - 1 - k;
        if (absl::Status s = g[i].run(g[i].cell, seed); !s.ok()) return s;
        runs[i].push_back(std::move(report_->rows.back()));
        report_->rows.pop_back();
      }
    }
    AddGroupRows(g, runs);
    return absl::OkStatus();
  }

  // A row is the cell's median round by IOPS; its ratios are the medians
  // of the rounds' ratios (each against the same round's allocated and
  // raw cells), so a slow spell that hits one round moves its ratio once.
  void AddGroupRows(const Group& g,
                    const std::vector<std::vector<Record>>& runs) {
    auto index_of = [&](std::string_view target) -> std::optional<size_t> {
      for (size_t i = 0; i < g.size(); ++i) {
        if (g[i].cell.target == target) return i;
      }
      return std::nullopt;
    };
    const std::optional<size_t> alloc = index_of("allocated");
    std::optional<size_t> raw = index_of("reserved raw file");
    if (!raw) raw = index_of("raw device");
    auto ratio = [&](size_t i, std::optional<size_t> j) {
      return j && *j != i ? MedianRatio(runs[i], runs[*j]) : std::nullopt;
    };
    for (size_t i = 0; i < g.size(); ++i) {
      Record row = MedianRun(runs[i]);
      row.Set("ratio_vs_baseline", Value::Ratio(ratio(i, alloc)))
          .Set("ratio_vs_raw",
               Value::Ratio(g[i].cell.target == "fresh overlay"
                                ? ratio(i, raw)
                                : std::nullopt));
      report_->rows.push_back(std::move(row));
    }
  }

  // Rounds of (depth 0, depth N), both reading the same offsets in a
  // round, so that a drift of the device lands on both alike.
  absl::Status RunReads() {
    const uint64_t read_seed = env_.opts.seed + report_->rows.size();
    std::vector<Record> rounds[2];
    for (int round = 0; round < p_.rounds; ++round) {
      for (int i = 0; i < 2; ++i) {
        const int d = i == 0 ? 0 : p_.depth;
        auto image = OpenBenchImage(paths_[d], env_.direct, false, "qcow2");
        if (!image.ok()) return image.status();
        Cell c{absl::StrCat("depth ", d), Op::kRead, kReadSize, std::nullopt,
               d};
        if (absl::Status s = MeasureAndClose(**image, c, read_seed + round);
            !s.ok()) {
          return s;
        }
        rounds[i].push_back(std::move(report_->rows.back()));
        report_->rows.pop_back();
      }
    }
    const std::optional<double> deep = MedianRatio(rounds[1], rounds[0]);
    report_->rows.push_back(MedianRun(rounds[0]).Set(
        "ratio_vs_baseline", Value::Ratio(std::nullopt)));
    report_->rows.push_back(
        MedianRun(rounds[1]).Set("ratio_vs_baseline", Value::Ratio(deep)));
    for (size_t i = report_->rows.size() - 2; i < report_->rows.size(); ++i) {
      report_->rows[i].Set("ratio_vs_raw", Value());
    }
    return absl::OkStatus();
  }

  Env& env_;
  const Params& p_;
  const std::vector<std::string> paths_;  // the chain, base first
  Report* report_;
  const bool on_device_;
  const size_t total_;  // cells to measure, for the progress labels
  size_t done_ = 0;
  std::string engine_;
};

void SetParams(const Params& p, Report* report) {
  report->params.Set("image_size", Value::Uint(p.size))
      .Set("cluster_size", Value::Uint(p.cluster))
      .Set("bs", Value::UintList(p.bs))
      .Set("qd", Value::Uint(p.qd))
      .Set("depth", Value::Uint(p.depth))
      .Set("writes", Value::Uint(p.writes))
      .Set("read_seconds", Value::Num(p.read_seconds))
      .Set("rounds", Value::Uint(p.rounds));
}

// The rows for --output=human: sizes, patterns and L2 kinds in short.
void AddHumanRows(Report* report) {
  for (Record& row : report->rows) {
    Record human;
    for (const auto& [k, v] : row.members()) {
      if (k == "bs") {
        human.Set(k, Value::Str(FormatBlockSize(static_cast<uint64_t>(
                         v.number()))));
      } else if (k == "pattern") {
        human.Set(k, Value::Str(v.str() == "sequential" ? "seq" : "rand"));
      } else if (k == "extended_l2") {
        human.Set("l2", Value::Str(v.is_null()              ? "-"
                                   : v.ToJson() == "true" ? "ext"
                                                          : "std"));
      } else {
        human.Set(k, v);
      }
    }
    report->human_rows.push_back(std::move(human));
  }
}

void SetColumns(Report* report) {
  report->columns = {
      {"op", "op", 0, true},
      {"bs", "bs"},
      {"pattern", "pattern", 0, true},
      {"target", "target", 0, true},
      {"l2", "l2", 0, true},
      {"IOPS", "iops", 0},
      {"MB/s", "mb_per_s", 1},
      {"vs base", "ratio_vs_baseline", 2},
      {"vs raw", "ratio_vs_raw", 2},
      {"write amp", "write_amplification", 3},
      {"cow read/B", "cow_read_per_guest_byte", 3},
      {"allocs", "cluster_allocations", 0},
      {"cow rd/alloc", "cow_read_clusters_per_alloc", 2},
      {"wr/alloc", "host_write_clusters_per_alloc", 2},
      {"IOPS min", "iops_min", 0},
      {"IOPS max", "iops_max", 0},
  };
  report->plot_title.clear();
}

}  // namespace

absl::Status RunRmw(Env& env, Report* report) {
  absl::StatusOr<Params> p = Resolve(env.opts);
  if (!p.ok()) return p.status();
  SetParams(*p, report);
  auto paths = BuildChain(env, *p);
  if (!paths.ok()) return paths.status();
  RmwRun run(env, *p, *std::move(paths), report);
  if (absl::Status s = run.Run(); !s.ok()) return s;
  AddHumanRows(report);
  SetColumns(report);
  return absl::OkStatus();
}

}  // namespace qcow2::tool::bench
