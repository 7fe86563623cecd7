// SPDX-License-Identifier: Apache-2.0
// Where guest ranges of the layers under the top of a chain resolve: which
// layer stores them, and how. Those layers are read-only while the chain is
// open, so a resolution stays true until the chain itself changes (a new
// overlay becomes the top), and a read through a deep chain looks up one
// cached piece instead of walking every layer's L2 tables.
#ifndef QCOW2_LIB_CHAIN_BACKING_MAP_H_
#define QCOW2_LIB_CHAIN_BACKING_MAP_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "lib/layer/layer.h"

namespace qcow2::internal {

class BackingMap {
 public:
  // Pieces never cross a granule boundary.
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
      : max_pieces_(max_pieces),
        max_blocks_(std::max<size_t>(1, max_pieces / 4)) {}

  // The piece containing `offset`, if one is held.
  std::optional<Piece> Find(uint64_t offset) const;
  // Where a new piece at `offset` (not in any piece) must end: at the
  // start of the next piece in its granule, or at the granule's end.
  uint64_t FreeEnd(uint64_t offset) const;
  // Adds a piece inside one granule that overlaps none already held. When
  // full (max_pieces pieces, or max_pieces / 4 blocks of 1 KiB: at most
  // 32 MiB by default however sparse the reads), everything is dropped
  // first (the cache only saves work; it is rebuilt on demand).
  void Insert(const Piece& piece);
  void Clear();
  size_t size() const { return pieces_; }

  static constexpr size_t kDefaultMaxPieces = 1 << 17;

 private:
  // Most granules resolve to one piece covering all of them. Such a piece
  // is kept in 16 bytes in a block indexed by granule, so that the lookup
  // on every read touches one small record; granules cut into several
  // pieces are kept in `split_`.
  struct Whole {
    uint64_t where = 0;  // host offset, or the L2 entry if compressed
    int32_t depth = 0;
    uint8_t kind = 0;    // Extent::Kind + 1; 0: no whole-granule piece
    bool has_host_cluster = false;
    bool split = false;  // the granule's pieces are in split_
  };
  static constexpr int kBlockBits = 6;
  static constexpr size_t kBlockGranules = size_t{1} << kBlockBits;
  using Block = std::array<Whole, kBlockGranules>;  // 1 KiB: 4 MiB of guest
  using Granule = absl::InlinedVector<Piece, 2>;    // sorted by start

  const Whole* WholeOf(uint64_t granule) const;
  const Granule* SplitOf(uint64_t granule) const;

  size_t max_pieces_;
  size_t max_blocks_;
  size_t pieces_ = 0;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Block>> blocks_;
  absl::flat_hash_map<uint64_t, Granule> split_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CHAIN_BACKING_MAP_H_
