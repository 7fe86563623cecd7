#include "lib/chain/backing_map.h"

#include <algorithm>

namespace qcow2::internal {

const BackingMap::Granule* BackingMap::GranuleOf(uint64_t offset) const {
  auto it = granules_.find(offset / kGranule);
  return it == granules_.end() ? nullptr : &it->second;
}

const BackingMap::Piece* BackingMap::Find(uint64_t offset) const {
  const Granule* g = GranuleOf(offset);
  if (g == nullptr) return nullptr;
  for (const Piece& p : *g) {
    if (offset - p.start < p.length) return &p;
  }
  return nullptr;
}

uint64_t BackingMap::FreeStart(uint64_t offset) const {
  uint64_t start = offset / kGranule * kGranule;
  if (const Granule* g = GranuleOf(offset)) {
    for (const Piece& p : *g) {
      if (p.start + p.length <= offset) start = std::max(start, p.start + p.length);
    }
  }
  return start;
}

uint64_t BackingMap::FreeEnd(uint64_t offset) const {
  uint64_t end = (offset / kGranule + 1) * kGranule;
  if (const Granule* g = GranuleOf(offset)) {
    for (const Piece& p : *g) {
      if (p.start > offset) end = std::min(end, p.start);
    }
  }
  return end;
}

const BackingMap::Piece* BackingMap::Insert(const Piece& piece) {
  if (pieces_ >= max_pieces_) Clear();
  Granule& g = granules_[piece.start / kGranule];
  auto at = std::upper_bound(
      g.begin(), g.end(), piece.start,
      [](uint64_t start, const Piece& p) { return start < p.start; });
  ++pieces_;
  return &*g.insert(at, piece);
}

}  // namespace qcow2::internal
