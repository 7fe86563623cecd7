// SPDX-License-Identifier: Apache-2.0
// BackingMap: the cache of where guest ranges under the top of a chain
// resolve. Pieces stay inside their 64 KiB granule; the free span after an
// offset ends at the next piece; a piece covering its whole granule
// (kept in a compact record) comes back exactly as inserted, whatever its
// kind; a full map starts over.
#include "lib/chain/backing_map.h"

#include <optional>

#include "gtest/gtest.h"

namespace qcow2::internal {
namespace {

constexpr uint64_t G = BackingMap::kGranule;

BackingMap::Piece DataPiece(uint64_t start, uint64_t length, int depth,
                            uint64_t host) {
  BackingMap::Piece p;
  p.start = start;
  p.length = length;
  p.depth = depth;
  p.extent.kind = Extent::kData;
  p.extent.length = length;
  p.extent.host_offset = host;
  return p;
}

TEST(BackingMapTest, FindsThePieceHoldingAnOffset) {
  BackingMap m;
  EXPECT_FALSE(m.Find(0));
  m.Insert(DataPiece(G + 4096, 8192, 3, 1 << 20));
  m.Insert(DataPiece(G, 4096, 1, 2 << 20));
  ASSERT_TRUE(m.Find(G));
  EXPECT_EQ(m.Find(G)->depth, 1);
  EXPECT_EQ(m.Find(G + 4095)->depth, 1);
  EXPECT_EQ(m.Find(G + 4096)->depth, 3);
  EXPECT_EQ(m.Find(G + 4096 + 8191)->extent.host_offset, 1u << 20);
  EXPECT_FALSE(m.Find(G + 4096 + 8192));  // past the second piece
  EXPECT_FALSE(m.Find(G - 1));            // the granule before
  EXPECT_FALSE(m.Find(2 * G));            // the granule after
  EXPECT_EQ(m.size(), 2u);
}

TEST(BackingMapTest, FreeSpanEndsAtTheNextPieceOrTheGranuleEdge) {
  BackingMap m;
  // Empty granule: all of it.
  EXPECT_EQ(m.FreeEnd(3 * G + 100), 4 * G);
  // Pieces at [3G+4k, 3G+8k) and [3G+32k, 3G+40k).
  m.Insert(DataPiece(3 * G + 4096, 4096, 1, 0));
  m.Insert(DataPiece(3 * G + 32768, 8192, 2, 0));
  EXPECT_EQ(m.FreeEnd(3 * G + 100), 3 * G + 4096);
  EXPECT_EQ(m.FreeEnd(3 * G + 20000), 3 * G + 32768);
  EXPECT_EQ(m.FreeEnd(3 * G + 50000), 4 * G);
}

TEST(BackingMapTest, StartsOverWhenFull) {
  BackingMap m(/*max_pieces=*/4);
  for (uint64_t i = 0; i < 4; ++i) m.Insert(DataPiece(i * G, G, 1, i * G));
  EXPECT_EQ(m.size(), 4u);
  ASSERT_TRUE(m.Find(3 * G));
  m.Insert(DataPiece(9 * G, 512, 2, 77));
  EXPECT_EQ(m.size(), 1u);
  ASSERT_TRUE(m.Find(9 * G + 511));
  EXPECT_EQ(m.Find(9 * G + 511)->extent.host_offset, 77u);
  EXPECT_FALSE(m.Find(3 * G));
  m.Clear();
  EXPECT_EQ(m.size(), 0u);
  EXPECT_FALSE(m.Find(9 * G));
}

// Pieces spread over more blocks (4 MiB of guest each) than the bound
// allows also start the map over, however few pieces there are.
TEST(BackingMapTest, StartsOverWhenTooManyBlocks) {
  BackingMap m(/*max_pieces=*/8);  // two blocks
  const uint64_t block = 64 * G;
  m.Insert(DataPiece(0, G, 1, 0));
  m.Insert(DataPiece(block, G, 1, 0));
  EXPECT_EQ(m.size(), 2u);
  m.Insert(DataPiece(5 * block, G, 1, 0));
  EXPECT_EQ(m.size(), 1u);
  EXPECT_FALSE(m.Find(0));
  EXPECT_TRUE(m.Find(5 * block));
}

// Whole-granule pieces of every kind come back as they went in; a granule
// cut into pieces keeps them apart; the two kinds live side by side.
TEST(BackingMapTest, WholeGranulesKeepEveryField) {
  BackingMap m;
  BackingMap::Piece data = DataPiece(7 * G, G, 5, 0x123450000ull);
  BackingMap::Piece compressed;
  compressed.start = 8 * G;
  compressed.length = G;
  compressed.depth = 2;
  compressed.extent.kind = Extent::kCompressed;
  compressed.extent.length = G;
  compressed.extent.entry = 0x4000000000abcdefull;
  BackingMap::Piece zero_alloc;
  zero_alloc.start = 100 * G;  // another block
  zero_alloc.length = G;
  zero_alloc.depth = 1;
  zero_alloc.extent.kind = Extent::kZero;
  zero_alloc.extent.length = G;
  zero_alloc.extent.has_host_cluster = true;
  zero_alloc.extent.host_offset = 0x70000;
  BackingMap::Piece past_end;  // no layer stores it
  past_end.start = 9 * G;
  past_end.length = G;
  past_end.extent.kind = Extent::kZero;
  past_end.extent.length = G;
  for (const auto& p : {data, compressed, zero_alloc, past_end}) m.Insert(p);
  m.Insert(DataPiece(10 * G + 4096, 4096, 3, 0x9000));  // a split granule
  EXPECT_EQ(m.size(), 5u);
  for (const auto& want : {data, compressed, zero_alloc, past_end}) {
    for (uint64_t at : {want.start, want.start + G / 2, want.start + G - 1}) {
      std::optional<BackingMap::Piece> got = m.Find(at);
      ASSERT_TRUE(got) << at;
      EXPECT_EQ(got->start, want.start);
      EXPECT_EQ(got->length, want.length);
      EXPECT_EQ(got->depth, want.depth);
      EXPECT_EQ(got->extent.kind, want.extent.kind);
      EXPECT_EQ(got->extent.length, want.extent.length);
      EXPECT_EQ(got->extent.host_offset, want.extent.host_offset);
      EXPECT_EQ(got->extent.entry, want.extent.entry);
      EXPECT_EQ(got->extent.has_host_cluster, want.extent.has_host_cluster);
    }
  }
  EXPECT_FALSE(m.Find(10 * G));
  EXPECT_EQ(m.Find(10 * G + 4096)->extent.host_offset, 0x9000u);
  EXPECT_EQ(m.FreeEnd(10 * G + 100), 10 * G + 4096);
  EXPECT_EQ(m.FreeEnd(10 * G + 9000), 11 * G);
  EXPECT_FALSE(m.Find(11 * G));
}

}  // namespace
}  // namespace qcow2::internal
