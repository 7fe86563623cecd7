// BackingMap: the cache of where guest ranges under the top of a chain
// resolve. Pieces stay inside their 64 KiB granule; the free span around an
// offset is bounded by its neighbours; a full map starts over.
#include "lib/chain/backing_map.h"

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
  EXPECT_EQ(m.Find(0), nullptr);
  m.Insert(DataPiece(G + 4096, 8192, 3, 1 << 20));
  m.Insert(DataPiece(G, 4096, 1, 2 << 20));
  ASSERT_NE(m.Find(G), nullptr);
  EXPECT_EQ(m.Find(G)->depth, 1);
  EXPECT_EQ(m.Find(G + 4095)->depth, 1);
  EXPECT_EQ(m.Find(G + 4096)->depth, 3);
  EXPECT_EQ(m.Find(G + 4096 + 8191)->extent.host_offset, 1u << 20);
  EXPECT_EQ(m.Find(G + 4096 + 8192), nullptr);  // past the second piece
  EXPECT_EQ(m.Find(G - 1), nullptr);            // the granule before
  EXPECT_EQ(m.Find(2 * G), nullptr);            // the granule after
  EXPECT_EQ(m.size(), 2u);
}

TEST(BackingMapTest, FreeSpanStopsAtNeighboursAndGranuleEdges) {
  BackingMap m;
  // Empty granule: all of it.
  EXPECT_EQ(m.FreeStart(3 * G + 100), 3 * G);
  EXPECT_EQ(m.FreeEnd(3 * G + 100), 4 * G);
  // Pieces at [3G+4k, 3G+8k) and [3G+32k, 3G+40k).
  m.Insert(DataPiece(3 * G + 4096, 4096, 1, 0));
  m.Insert(DataPiece(3 * G + 32768, 8192, 2, 0));
  EXPECT_EQ(m.FreeStart(3 * G + 100), 3 * G);
  EXPECT_EQ(m.FreeEnd(3 * G + 100), 3 * G + 4096);
  EXPECT_EQ(m.FreeStart(3 * G + 20000), 3 * G + 8192);
  EXPECT_EQ(m.FreeEnd(3 * G + 20000), 3 * G + 32768);
  EXPECT_EQ(m.FreeStart(3 * G + 50000), 3 * G + 40960);
  EXPECT_EQ(m.FreeEnd(3 * G + 50000), 4 * G);
}

TEST(BackingMapTest, StartsOverWhenFull) {
  BackingMap m(/*max_pieces=*/4);
  for (uint64_t i = 0; i < 4; ++i) m.Insert(DataPiece(i * G, G, 1, i * G));
  EXPECT_EQ(m.size(), 4u);
  ASSERT_NE(m.Find(3 * G), nullptr);
  const BackingMap::Piece* p = m.Insert(DataPiece(9 * G, 512, 2, 77));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->extent.host_offset, 77u);
  EXPECT_EQ(m.size(), 1u);
  EXPECT_EQ(m.Find(3 * G), nullptr);
  EXPECT_NE(m.Find(9 * G + 511), nullptr);
  m.Clear();
  EXPECT_EQ(m.size(), 0u);
  EXPECT_EQ(m.Find(9 * G), nullptr);
}

}  // namespace
}  // namespace qcow2::internal
