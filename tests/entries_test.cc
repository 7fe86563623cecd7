// SPDX-License-Identifier: Apache-2.0
// Tests for the L2 entry helpers in lib/format/entries.h that the read path
// relies on for speed: SubclusterRunEnd must agree with classifying the
// subclusters one by one.
#include "lib/format/entries.h"

#include <cstdint>
#include <random>

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

}  // namespace
}  // namespace qcow2::internal
