#include "lib/chain/backing_map.h"

#include <limits>

namespace qcow2::internal {

const BackingMap::Piece* BackingMap::Find(uint64_t offset) const {
  auto it = pieces_.upper_bound(offset);
  if (it == pieces_.begin()) return nullptr;
  --it;
  const Piece& p = it->second;
  return offset - p.start < p.length ? &p : nullptr;
}

uint64_t BackingMap::NextStart(uint64_t offset) const {
  auto it = pieces_.upper_bound(offset);
  return it == pieces_.end() ? std::numeric_limits<uint64_t>::max()
                             : it->first;
}

const BackingMap::Piece* BackingMap::Insert(const Piece& piece) {
  if (pieces_.size() >= max_pieces_) pieces_.clear();
  return &pieces_.insert_or_assign(piece.start, piece).first->second;
}

}  // namespace qcow2::internal
