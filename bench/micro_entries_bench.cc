// SPDX-License-Identifier: Apache-2.0
// Micro-benchmarks of the L2 entry codecs (lib/format/entries.h): decoding
// big-endian entries from a table slice, classifying standard and extended
// entries, encoding entries back, and the compressed-cluster descriptor.
#include <cstdint>
#include <vector>

#include "benchmark/benchmark.h"
#include "lib/format/entries.h"
#include "lib/base/endian.h"

namespace qcow2::bench {
namespace {

using internal::ClassifySubcluster;
using internal::kEntryOffsetMask;
using internal::kOflagCompressed;
using internal::kOflagCopied;
using internal::kOflagZero;

constexpr uint32_t kClusterBits = 16;
constexpr int kEntries = 4096;

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A realistic mix of standard L2 entries: mostly allocated data, some
// unallocated, zero and compressed ones.
std::vector<uint64_t> StandardEntries() {
  std::vector<uint64_t> e(kEntries);
  for (int i = 0; i < kEntries; ++i) {
    const uint64_t r = Mix(i);
    const uint64_t offset = ((r >> 8) % (1u << 20)) << kClusterBits;
    switch (r % 8) {
      case 0:
        e[i] = 0;
        break;
      case 1:
        e[i] = kOflagZero;
        break;
      case 2:
        e[i] = internal::EncodeCompressed(offset + 1234, 20000, kClusterBits);
        break;
      default:
        e[i] = kOflagCopied | offset;
        break;
    }
  }
  return e;
}

// The same entries as stored in an L2 slice (big-endian).
std::vector<uint8_t> Slice(const std::vector<uint64_t>& entries) {
  std::vector<uint8_t> bytes(entries.size() * 8);
  for (size_t i = 0; i < entries.size(); ++i) {
    internal::StoreBE64(&bytes[i * 8], entries[i]);
  }
  return bytes;
}

void BM_L2DecodeClassifyStandard(benchmark::State& state) {
  const std::vector<uint8_t> slice = Slice(StandardEntries());
  for (auto _ : state) {
    uint64_t data = 0;
    for (int i = 0; i < kEntries; ++i) {
      const uint64_t e = internal::LoadBE64(&slice[i * 8]);
      const auto t = ClassifySubcluster(e, 0, false, 0);
      if (t == internal::SubclusterType::kNormal) data += e & kEntryOffsetMask;
    }
    benchmark::DoNotOptimize(data);
  }
  state.SetItemsProcessed(state.iterations() * kEntries);
}
BENCHMARK(BM_L2DecodeClassifyStandard);

void BM_L2ClassifyExtended(benchmark::State& state) {
  std::vector<uint64_t> entries(kEntries), bitmaps(kEntries);
  for (int i = 0; i < kEntries; ++i) {
    const uint64_t r = Mix(i);
    const uint32_t alloc = static_cast<uint32_t>(r);
    const uint32_t zero = static_cast<uint32_t>(r >> 32) & ~alloc;
    const bool has_cluster = (r >> 7) % 4 != 0;
    entries[i] =
        has_cluster ? (kOflagCopied | (((r >> 9) % (1u << 20)) << 16)) : 0;
    bitmaps[i] =
        has_cluster ? (uint64_t{zero} << 32) | alloc : uint64_t{zero} << 32;
  }
  for (auto _ : state) {
    int normal = 0;
    for (int i = 0; i < kEntries; ++i) {
      normal += ClassifySubcluster(entries[i], bitmaps[i], true, i % 32) ==
                internal::SubclusterType::kNormal;
    }
    benchmark::DoNotOptimize(normal);
  }
  state.SetItemsProcessed(state.iterations() * kEntries);
}
BENCHMARK(BM_L2ClassifyExtended);

void BM_L2EncodeStandard(benchmark::State& state) {
  std::vector<uint8_t> slice(kEntries * 8);
  for (auto _ : state) {
    for (int i = 0; i < kEntries; ++i) {
      const uint64_t offset = uint64_t(i + 16) << kClusterBits;
      internal::StoreBE64(&slice[i * 8], kOflagCopied | offset);
    }
    benchmark::DoNotOptimize(slice.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kEntries);
}
BENCHMARK(BM_L2EncodeStandard);

void BM_CompressedDescriptorRoundTrip(benchmark::State& state) {
  const uint32_t bits = static_cast<uint32_t>(state.range(0));
  uint64_t sum = 0;
  uint64_t i = 0;
  for (auto _ : state) {
    const uint64_t offset = (Mix(i++) % (1ull << 40)) & ~uint64_t{1};
    const uint64_t e =
        internal::EncodeCompressed(offset, (1u << bits) / 2 + 100, bits);
    const internal::CompressedExtent x = internal::DecodeCompressed(e, bits);
    sum += x.host_offset + x.length + ((e & kOflagCompressed) != 0);
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_CompressedDescriptorRoundTrip)->Arg(12)->Arg(16)->Arg(21);

}  // namespace
}  // namespace qcow2::bench
