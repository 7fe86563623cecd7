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
//     stacked chain (depth N), in --repeat rounds of both (each round
//     opens the images afresh, so a round pays for a cold chain again);
//     each row is the median round, with the spread.
// Each fresh-overlay and raw row is compared with the allocated row of its
// size ("vs base": IOPS ratio), each deep read row with depth 0.
// With --device, the written images are on the device instead: each fresh
// overlay (its backing file, the base, stays in the scratch directory),
// the allocated image (a qcow2 image there, written in full first), and
// one "raw device" row in place of the two raw files.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench_workloads.h"

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
  int read_rounds = 3;
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
  p.read_rounds = o.repeat.value_or(p.read_rounds);
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

// The IOPS of the row that `row` is compared with: the allocated row of
// its size for writes, depth 0 for reads.
std::optional<double> BaselineIops(const std::vector<Record>& rows,
                                   const Record& row) {
  const std::string op = row.Find("op")->str();
  const double bs = row.Find("bs")->number();
  const std::string pattern = row.Find("pattern")->str();
  for (const Record& o : rows) {
    if (o.Find("op")->str() != op || o.Find("bs")->number() != bs ||
        o.Find("pattern")->str() != pattern) {
      continue;
    }
    const std::string t = o.Find("target")->str();
    if ((op == "write" && t == "allocated") ||
        (op == "read" && o.Find("depth")->number() == 0)) {
      if (&o == &row) return std::nullopt;
      return o.Find("iops")->number();
    }
  }
  return std::nullopt;
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

}  // namespace

absl::Status RunRmw(Env& env, Report* report) {
  absl::StatusOr<Params> p = Resolve(env.opts);
  if (!p.ok()) return p.status();
  report->params.Set("image_size", Value::Uint(p->size))
      .Set("cluster_size", Value::Uint(p->cluster))
      .Set("bs", Value::UintList(p->bs))
      .Set("qd", Value::Uint(p->qd))
      .Set("depth", Value::Uint(p->depth))
      .Set("writes", Value::Uint(p->writes))
      .Set("read_seconds", Value::Num(p->read_seconds))
      .Set("read_rounds", Value::Uint(p->read_rounds));

  auto paths = BuildChain(env, *p);
  if (!paths.ok()) return paths.status();
  const std::string& base_path = (*paths)[0];

  // Per write size: two fresh overlays, the allocated image, two raw files
  // (on a device: the device).
  const bool on_device = !env.device.empty();
  const size_t total =
      p->bs.size() * (on_device ? 4 : 5) + 3 + 2 * p->read_rounds;
  size_t done = 0;
  auto label = [&](const Cell& c) {
    return absl::StrFormat(
        "[%u/%u] %s %s%s %s%s", ++done, total, OpName(c.op),
        FormatBlockSize(c.bs), c.sequential ? " sequential" : "", c.target,
        c.extended_l2 ? (*c.extended_l2 ? " (extended L2)" : " (standard L2)")
                      : "");
  };
  std::string engine;
  // Writes into a new overlay over the base, deleted afterwards.
  auto fresh_cell = [&](const Cell& c) -> absl::Status {
    CreateOptions fresh;
    fresh.cluster_size = p->cluster;
    fresh.extended_l2 = *c.extended_l2;
    fresh.backing_file =
        on_device ? std::filesystem::absolute(base_path).string()
                  : env.scratch->BaseName("base.qcow2");
    fresh.backing_format = "qcow2";
    const std::string path =
        on_device ? env.device : env.scratch->Path("fresh.qcow2");
    auto image = CreateBenchImage(path, fresh, env.direct);
    if (!image.ok()) return image.status();
    if (engine.empty()) engine = EngineName(**image);
    absl::Status s = Measure(env, **image, *p, c, label(c),
                             env.opts.seed + report->rows.size(), report);
    if (s.ok()) s = (*image)->Close();
    image->reset();
    if (s.ok() && !on_device) s = env.scratch->Remove(path);
    return s;
  };
  // The base is written everywhere: every write lands in its own cluster.
  // (Its contents change; later cells do not depend on them.) On a device:
  // a qcow2 image there, written in full first.
  auto allocated_cell = [&](const Cell& c) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Image>> image;
    if (on_device) {
      CreateOptions full;
      full.size = p->size;
      full.cluster_size = p->cluster;
      image = CreateBenchImage(env.device, full, env.direct);
      if (image.ok()) {
        if (absl::Status s = FillImage(**image, 0x5a, env.progress,
                                       "qcow2 on " + env.device);
            !s.ok()) {
          return s;
        }
      }
    } else {
      image = OpenBenchImage(base_path, env.direct, true, "qcow2");
    }
    if (!image.ok()) return image.status();
    absl::Status s = Measure(env, **image, *p, c, label(c),
                             env.opts.seed + report->rows.size(), report);
    if (s.ok()) s = (*image)->Close();
    return s;
  };
  for (uint64_t bs : p->bs) {
    for (bool xl2 : {false, true}) {
      if (absl::Status s = fresh_cell({"fresh overlay", Op::kWrite, bs, xl2});
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s =
            allocated_cell({"allocated", Op::kWrite, bs, std::nullopt});
        !s.ok()) {
      return s;
    }
    if (on_device) {
      // No file system: the device itself, as raw, is the ceiling.
      auto image = OpenBenchImage(env.device, env.direct, true, "raw");
      if (!image.ok()) return image.status();
      const Cell c{"raw device", Op::kWrite, bs, std::nullopt};
      absl::Status s = Measure(env, **image, *p, c, label(c),
                               env.opts.seed + report->rows.size(), report);
      if (s.ok()) s = (*image)->Close();
      if (!s.ok()) return s;
      continue;
    }
    // What the file system charges for writing into blocks it has not
    // written yet, with no qcow2 at all: a fresh sparse raw file, and one
    // whose blocks are reserved with fallocate (unwritten extents), as an
    // overlay reserves the room it grows into.
    for (bool reserved : {false, true}) {
      CreateOptions raw;
      raw.format = ImageFormat::kRaw;
      raw.size = p->size;
      if (reserved) raw.preallocation = Preallocation::kFalloc;
      const std::string raw_path = env.scratch->Path("fresh.raw");
      auto image = CreateBenchImage(raw_path, raw, env.direct);
      if (!image.ok()) return image.status();
      const Cell c{reserved ? "reserved raw file" : "fresh raw file",
                   Op::kWrite, bs, std::nullopt};
      absl::Status s = Measure(env, **image, *p, c, label(c),
                               env.opts.seed + report->rows.size(), report);
      if (s.ok()) s = (*image)->Close();
      image->reset();
      if (s.ok()) s = env.scratch->Remove(raw_path);
      if (!s.ok()) return s;
    }
  }
  // Small sequential writes: with standard L2 entries each new cluster
  // would otherwise be copied on its first write.
  for (bool xl2 : {false, true}) {
    Cell c{"fresh overlay", Op::kWrite, kReadSize, xl2};
    c.sequential = true;
    if (absl::Status s = fresh_cell(c); !s.ok()) return s;
  }
  {
    Cell c{"allocated", Op::kWrite, kReadSize, std::nullopt};
    c.sequential = true;
    if (absl::Status s = allocated_cell(c); !s.ok()) return s;
  }
  // Rounds of (depth 0, depth N), both reading the same offsets in a
  // round, so that a drift of the device lands on both alike.
  const uint64_t read_seed = env.opts.seed + report->rows.size();
  std::vector<Record> rounds[2];
  for (int round = 0; round < p->read_rounds; ++round) {
    for (int i = 0; i < 2; ++i) {
      const int d = i == 0 ? 0 : p->depth;
      auto image = OpenBenchImage((*paths)[d], env.direct, false, "qcow2");
      if (!image.ok()) return image.status();
      Cell c{absl::StrCat("depth ", d), Op::kRead, kReadSize, std::nullopt, d};
      absl::Status s =
          Measure(env, **image, *p, c, label(c), read_seed + round, report);
      if (s.ok()) s = (*image)->Close();
      if (!s.ok()) return s;
      rounds[i].push_back(std::move(report->rows.back()));
      report->rows.pop_back();
    }
  }
  for (std::vector<Record>& runs : rounds) {
    std::sort(runs.begin(), runs.end(), [](const Record& a, const Record& b) {
      return a.Find("iops")->number() < b.Find("iops")->number();
    });
    Record row = runs[runs.size() / 2];
    row.Set("runs", Value::Uint(runs.size()))
        .Set("iops_min", Value::Num(runs.front().Find("iops")->number()))
        .Set("iops_max", Value::Num(runs.back().Find("iops")->number()));
    report->rows.push_back(std::move(row));
  }
  AddCommonParams(env.direct, engine, &report->params);
  report->params.Set("device",
                     on_device ? Value::Str(env.device) : Value());

  for (Record& row : report->rows) {
    const std::optional<double> base = BaselineIops(report->rows, row);
    row.Set("ratio_vs_baseline",
            Value::Ratio(base ? Ratio(row.Find("iops")->number(), *base)
                              : std::nullopt));
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
  report->columns = {
      {"op", "op", 0, true},
      {"bs", "bs"},
      {"pattern", "pattern", 0, true},
      {"target", "target", 0, true},
      {"l2", "l2", 0, true},
      {"IOPS", "iops", 0},
      {"MB/s", "mb_per_s", 1},
      {"vs base", "ratio_vs_baseline", 2},
      {"write amp", "write_amplification", 3},
      {"cow read/B", "cow_read_per_guest_byte", 3},
      {"allocs", "cluster_allocations", 0},
      {"cow rd/alloc", "cow_read_clusters_per_alloc", 2},
      {"wr/alloc", "host_write_clusters_per_alloc", 2},
      {"IOPS min", "iops_min", 0},
      {"IOPS max", "iops_max", 0},
  };
  report->plot_title.clear();
  return absl::OkStatus();
}

}  // namespace qcow2::tool::bench
