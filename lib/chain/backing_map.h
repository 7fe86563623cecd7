// Where guest ranges of the layers under the top of a chain resolve: which
// layer stores them, and how. Those layers are read-only while the chain is
// open, so a resolution stays true until the chain itself changes (a new
// overlay becomes the top), and a read through a deep chain looks up one
// cached piece instead of walking every layer's L2 tables.
#ifndef QCOW2_LIB_CHAIN_BACKING_MAP_H_
#define QCOW2_LIB_CHAIN_BACKING_MAP_H_

#include <cstddef>
#include <cstdint>
#include <map>

#include "lib/chain/layer.h"

namespace qcow2::internal {

class BackingMap {
 public:
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
  // Where the piece after `offset` starts (UINT64_MAX if none): a new piece
  // at `offset` must end there.
  uint64_t NextStart(uint64_t offset) const;
  // Adds a piece that overlaps none already held. When full, everything is
  // dropped first (the cache only saves work; it is rebuilt on demand).
  const Piece* Insert(const Piece& piece);
  void Clear() { pieces_.clear(); }
  size_t size() const { return pieces_.size(); }

  static constexpr size_t kDefaultMaxPieces = 1 << 15;

 private:
  size_t max_pieces_;
  std::map<uint64_t, Piece> pieces_;  // by start; disjoint
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CHAIN_BACKING_MAP_H_
