// SPDX-License-Identifier: Apache-2.0
// Tests for the entry helpers in lib/format/entries.h: SubclusterRunEnd,
// which the read path relies on for speed, must agree with classifying the
// subclusters one by one; the refcount block codec (every width) must lay
// entries out as QEMU does and keep its neighbours.
#include "lib/format/entries.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace qcow2::internal {
namespace {

// The slow definition: extend while ClassifySubcluster says the same.
int RunEndByClassifying(uint64_t entry, uint64_t bitmap, bool extended,
                        int sc, int subclusters) {
  const SubclusterType type = ClassifySubcluster(entry, bitmap, extended, sc);
  int end = sc + 1;
  while (end < subclusters &&
         ClassifySubcluster(entry, bitmap, extended, end) == type) {
    ++end;
  }
  return end;
}

TEST(SubclusterRunEndTest, StandardEntriesAreOneSubcluster) {
  EXPECT_EQ(SubclusterRunEnd(0, 0, 1), 1);
  EXPECT_EQ(SubclusterRunEnd(~0ull, 0, 1), 1);
}

TEST(SubclusterRunEndTest, EdgesOfTheBitmap) {
  EXPECT_EQ(SubclusterRunEnd(0, 0, 32), 32);
  EXPECT_EQ(SubclusterRunEnd(0, 31, 32), 32);
  EXPECT_EQ(SubclusterRunEnd(0xffffffffull, 0, 32), 32);
  EXPECT_EQ(SubclusterRunEnd(0x1ull, 0, 32), 1);        // allocated, then not
  EXPECT_EQ(SubclusterRunEnd(0x1ull, 1, 32), 32);
  EXPECT_EQ(SubclusterRunEnd(0x80000000ull, 0, 32), 31);
  EXPECT_EQ(SubclusterRunEnd(0x80000000ull << 32, 30, 32), 31);  // zero bit
  EXPECT_EQ(SubclusterRunEnd(0x0000000f0000000cull, 2, 32), 4);
}

// Every start in random valid entries, with and without a host cluster.
TEST(SubclusterRunEndTest, AgreesWithClassifyingEachSubcluster) {
  std::mt19937_64 rng(7);
  const uint64_t host = 0x50000;
  for (int i = 0; i < 20000; ++i) {
    const bool with_host = i % 2 == 0;
    // Sparse patterns make long runs; dense ones make short runs.
    uint32_t a = static_cast<uint32_t>(rng());
    uint32_t z = static_cast<uint32_t>(rng());
    if (i % 3 == 0) a &= static_cast<uint32_t>(rng());
    if (i % 5 == 0) z &= static_cast<uint32_t>(rng()) & static_cast<uint32_t>(rng());
    z &= ~a;              // a subcluster is never both allocated and zero
    if (!with_host) a = 0;  // allocated subclusters need a host cluster
    const uint64_t bitmap = (uint64_t{z} << 32) | a;
    const uint64_t entry = with_host ? host : 0;
    for (int sc = 0; sc < kSubclustersPerCluster; ++sc) {
      ASSERT_EQ(SubclusterRunEnd(bitmap, sc, kSubclustersPerCluster),
                RunEndByClassifying(entry, bitmap, true, sc,
                                    kSubclustersPerCluster))
          << std::hex << "bitmap 0x" << bitmap << " entry 0x" << entry
          << std::dec << " subcluster " << sc;
    }
  }
}

// QEMU's layout: big-endian from 8 bits up; below, entry 0 in the least
// significant bits of byte 0.
TEST(RefcountCodecTest, LayoutAsQemuHasIt) {
  uint8_t b[16] = {};
  WriteRefcount(b, 4, 1, 0x1234);  // 16 bits: bytes 2 and 3
  EXPECT_EQ(b[2], 0x12);
  EXPECT_EQ(b[3], 0x34);
  WriteRefcount(b, 0, 9, 1);  // 1 bit: byte 1, bit 1
  EXPECT_EQ(b[1], 0x02);
  uint8_t n[2] = {};
  WriteRefcount(n, 2, 1, 0xa);  // 4 bits: the high nibble of byte 0
  EXPECT_EQ(n[0], 0xa0);
  EXPECT_EQ(ReadRefcount(n, 2, 1), 0xau);
  EXPECT_EQ(ReadRefcount(n, 2, 0), 0u);
  EXPECT_EQ(MaxRefcount(0), 1u);
  EXPECT_EQ(MaxRefcount(4), 0xffffu);
  EXPECT_EQ(MaxRefcount(6), ~0ull);
  EXPECT_EQ(RefcountBlockEntries(16, 4), 32768u);
  EXPECT_EQ(RefcountBlockEntries(9, 0), 4096u);
}

// Every width: each entry written reads back (truncated to the width) and
// leaves every other entry as it was.
TEST(RefcountCodecTest, RoundTripKeepsNeighbours) {
  std::mt19937_64 rng(48);
  for (uint32_t order = 0; order <= 6; ++order) {
    const uint64_t entries = RefcountBlockEntries(9, order);
    std::vector<uint8_t> block(512, 0);
    std::vector<uint64_t> model(entries, 0);
    for (int step = 0; step < 4000; ++step) {
      const uint64_t i = rng() % entries;
      const uint64_t v = rng() & MaxRefcount(order);
      // Every other write carries bits above the width: dropped.
      const uint64_t high = (step & 1) ? ~MaxRefcount(order) : 0;
      WriteRefcount(block.data(), order, i, v | high);
      model[i] = v;
      if (step % 500 == 0) {
        for (uint64_t k = 0; k < entries; ++k) {
          ASSERT_EQ(ReadRefcount(block.data(), order, k), model[k])
              << "order " << order << " entry " << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace qcow2::internal
