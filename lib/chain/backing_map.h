// Where guest ranges of the layers under the top of a chain resolve: which
// layer stores them, and how. Those layers are read-only while the chain is
// open, so a resolution stays true until the chain itself changes (a new
// overlay becomes the top), and a read through a deep chain looks up one
// cached piece instead of walking every layer's L2 tables.
#ifndef QCOW2_LIB_CHAIN_BACKING_MAP_H_
#define QCOW2_LIB_CHAIN_BACKING_MAP_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "lib/chain/layer.h"

namespace qcow2::internal {

class BackingMap {
 public:
  // Pieces never cross a granule boundary; lookups hash the granule.
  static constexpr uint64_t kGranule = 64 << 10;

  // [start, start + length) resolves to `extent` (never kUnallocated) in
  // the layer at `depth`; depth -1 with kZero for ranges no layer stores
  // (past the bottom, or past the end of a layer).
  struct Piece {
    uint64_t start = 0;
    uint64_t length = 0;
    int depth = -1;
    Extent extent;
  };

  explicit BackingMap(size_t max_pieces = kDefaultMaxPieces)
      : max_pieces_(max_pieces) {}

  // The piece containing `offset`, or null.
  const Piece* Find(uint64_t offset) const;
  // Where a new piece at `offset` (not in any piece) may start and must
  // end: from the end of the piece before it in its granule (or the
  // granule's start) to the start of the next (or the granule's end).
  uint64_t FreeStart(uint64_t offset) const;
  uint64_t FreeEnd(uint64_t offset) const;
  // Adds a piece inside one granule that overlaps none already held. When
  // full, everything is dropped first (the cache only saves work; it is
  // rebuilt on demand).
  const Piece* Insert(const Piece& piece);
  void Clear() {
    granules_.clear();
    pieces_ = 0;
  }
  size_t size() const { return pieces_; }

  static constexpr size_t kDefaultMaxPieces = 1 << 17;

 private:
  using Granule = absl::InlinedVector<Piece, 1>;  // sorted by start
  const Granule* GranuleOf(uint64_t offset) const;

  size_t max_pieces_;
  size_t pieces_ = 0;
  absl::flat_hash_map<uint64_t, Granule> granules_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CHAIN_BACKING_MAP_H_
