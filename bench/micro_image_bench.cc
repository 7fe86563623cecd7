// SPDX-License-Identifier: Apache-2.0
// Micro-benchmarks over in-memory images: an L2 cache hit
// (ClusterMap::Lookup), a refcount update in the refcount block cache
// (Refcounts::Update), Image::GetBlockStatus through chains of depth
// 0..3, and the CPU cost of one small synchronous write (planning, the
// probe before it, commit) in place and into a fresh overlay.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/micro_util.h"
#include "benchmark/benchmark.h"
#include "lib/meta/cluster_map.h"
#include "testing/memory_file.h"
#include "lib/meta/refcounts.h"
#include "qcow2/image.h"

namespace qcow2::bench {
namespace {

constexpr uint64_t kSize = 1ull << 30;
constexpr uint32_t kCluster = 64 << 10;
constexpr uint64_t kStride = 2;  // every other cluster allocated
// Clusters touched by the lookup benchmark: 1024 clusters = two L2 slices
// of 512 entries, all cached after the first pass.
constexpr uint64_t kHotClusters = 1024;

void BM_ClusterMapLookupHit(benchmark::State& state) {
  MemChain chain;
  if (absl::Status s = BuildChain(&chain, 0, kSize, kCluster, kStride);
      !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  auto hl = ReadHeaderAndL1(chain.fs, chain.paths[0]);
  if (!hl.ok()) {
    state.SkipWithError(hl.status().ToString().c_str());
    return;
  }
  const std::string& name = chain.paths[0];
  internal::MemoryFile file(name, chain.fs.Store(name), true);
  internal::ClusterMap map(&file, name,
                           internal::Geometry::From(hl->header, 4096), hl->l1,
                           hl->header.l1_table_offset, 32ull << 20);
  uint64_t cluster = 0, sum = 0;
  for (auto _ : state) {
    absl::StatusOr<internal::L2Ref> ref = map.Lookup(cluster);
    if (!ref.ok() || ref->slice == nullptr) {
      state.SkipWithError("lookup failed");
      return;
    }
    sum += ref->entry();
    cluster = (cluster + 1) % kHotClusters;
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ClusterMapLookupHit);

void BM_RefcountUpdate(benchmark::State& state) {
  MemChain chain;
  if (absl::Status s = BuildChain(&chain, 0, kSize, kCluster, kStride);
      !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  auto hl = ReadHeaderAndL1(chain.fs, chain.paths[0]);
  if (!hl.ok()) {
    state.SkipWithError(hl.status().ToString().c_str());
    return;
  }
  const internal::Header& h = hl->header;
  const std::string& name = chain.paths[0];
  internal::MemoryFile file(name, chain.fs.Store(name), false);
  auto table = internal::Refcounts::LoadTable(&file, h.refcount_table_offset,
                                              h.refcount_table_clusters,
                                              h.cluster_bits, name);
  if (!table.ok()) {
    state.SkipWithError(table.status().ToString().c_str());
    return;
  }
  internal::Refcounts::Params p;
  p.file = &file;
  p.filename = name;
  p.cluster_bits = h.cluster_bits;
  p.refcount_order = h.refcount_order;
  p.table_offset = h.refcount_table_offset;
  p.table_clusters = h.refcount_table_clusters;
  p.table = std::move(*table);
  internal::Refcounts refcounts(std::move(p));
  // Clusters 0..n-1 of the file are in use (header, tables, data), so
  // +1 then -1 never frees one.
  auto size = file.Size();
  const uint64_t in_use = std::min<uint64_t>(*size / kCluster, 256);
  uint64_t c = 0;
  for (auto _ : state) {
    const uint64_t offset = c * kCluster;
    absl::Status s = refcounts.Update(offset, kCluster, +1);
    if (s.ok()) s = refcounts.Update(offset, kCluster, -1);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    c = (c + 1) % in_use;
  }
  state.SetItemsProcessed(state.iterations() * 2);
}
BENCHMARK(BM_RefcountUpdate);

// Walks the first 64 MiB of the top image run by run, as `qemu-img map`
// does. Arg: chain depth below the top.
void BM_GetBlockStatus(benchmark::State& state) {
  const int depth = static_cast<int>(state.range(0));
  MemChain chain;
  if (absl::Status s =
          BuildChain(&chain, depth, kSize, kCluster, kStride + depth);
      !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  OpenOptions o;
  o.opener = &chain.fs;
  auto image = Image::Open(chain.paths.back(), o);
  if (!image.ok()) {
    state.SkipWithError(image.status().ToString().c_str());
    return;
  }
  constexpr uint64_t kWalk = 64ull << 20;
  uint64_t offset = 0;
  for (auto _ : state) {
    auto st = (*image)->GetBlockStatus(offset, kWalk - offset);
    if (!st.ok()) {
      state.SkipWithError(st.status().ToString().c_str());
      return;
    }
    offset += st->length;
    if (offset >= kWalk) offset = 0;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_GetBlockStatus)->Arg(0)->Arg(1)->Arg(3);

// A 4 KiB write into clusters of ours, in place, all metadata cached.
void BM_WriteInPlace4K(benchmark::State& state) {
  MemChain chain;
  if (absl::Status s = BuildChain(&chain, 0, kSize, kCluster, 1); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  OpenOptions o;
  o.opener = &chain.fs;
  o.read_write = true;
  auto image = Image::Open(chain.paths.back(), o);
  if (!image.ok()) {
    state.SkipWithError(image.status().ToString().c_str());
    return;
  }
  const std::vector<uint8_t> data(4096, 0x5a);
  uint64_t cluster = 0;
  for (auto _ : state) {
    absl::Status s = (*image)->Write(cluster * kCluster + 8192, data);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    cluster = (cluster + 1) % kHotClusters;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_WriteInPlace4K);

// A 4 KiB write into a cluster the top of a two-image chain does not own
// yet: allocation, and the copy-on-write of the rest from below (memory
// I/O). Every 1,024 writes a fresh overlay is made (not timed).
void BM_WriteIntoOverlay4K(benchmark::State& state) {
  constexpr uint64_t kBase = 64ull << 20;
  constexpr uint64_t kPerOverlay = 1024;
  MemChain chain;
  if (absl::Status s = BuildChain(&chain, 0, kBase, kCluster, 1); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  OpenOptions o;
  o.opener = &chain.fs;
  o.read_write = true;
  std::unique_ptr<Image> image;
  const std::vector<uint8_t> data(4096, 0x5a);
  uint64_t n = 0;
  for (auto _ : state) {
    if (n % kPerOverlay == 0) {
      state.PauseTiming();
      const std::string top = "ov" + std::to_string(n) + ".qcow2";
      if (image != nullptr) {
        image->Close().IgnoreError();
        // The last overlay's bytes are given back.
        auto last = chain.fs.Store("ov" + std::to_string(n - kPerOverlay) +
                                   ".qcow2");
        std::vector<uint8_t>().swap(last->bytes);
      }
      auto open = Image::Open(chain.paths.back(), o);
      absl::Status s = open.status();
      if (s.ok()) {
        image = std::move(*open);
        CreateOptions ov;
        ov.cluster_size = kCluster;
        s = image->CreateOverlay(top, ov);
      }
      if (!s.ok()) {
        state.SkipWithError(s.ToString().c_str());
        return;
      }
      state.ResumeTiming();
    }
    absl::Status s =
        image->Write((n % kPerOverlay) * kCluster + 8192, data);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    ++n;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_WriteIntoOverlay4K);

}  // namespace
}  // namespace qcow2::bench
