// SPDX-License-Identifier: Apache-2.0
#include "lib/chain/backing_map.h"

#include <algorithm>

namespace qcow2::internal {

const BackingMap::Whole* BackingMap::WholeOf(uint64_t granule) const {
  auto it = blocks_.find(granule >> kBlockBits);
  if (it == blocks_.end()) return nullptr;
  return &(*it->second)[granule & (kBlockGranules - 1)];
}

const BackingMap::Granule* BackingMap::SplitOf(uint64_t granule) const {
  const Whole* w = WholeOf(granule);
  if (w == nullptr || !w->split) return nullptr;
  auto it = split_.find(granule);
  return it == split_.end() ? nullptr : &it->second;
}

std::optional<BackingMap::Piece> BackingMap::Find(uint64_t offset) const {
  const uint64_t granule = offset / kGranule;
  const Whole* w = WholeOf(granule);
  if (w == nullptr) return std::nullopt;
  if (w->kind != 0) {
    Piece p;
    p.start = granule * kGranule;
    p.length = kGranule;
    p.depth = w->depth;
    p.extent.kind = static_cast<Extent::Kind>(w->kind - 1);
    p.extent.length = kGranule;
    if (p.extent.kind == Extent::kCompressed) {
      p.extent.entry = w->where;
    } else {
      p.extent.host_offset = w->where;
    }
    p.extent.has_host_cluster = w->has_host_cluster;
    return p;
  }
  if (const Granule* g = SplitOf(granule)) {
    for (const Piece& p : *g) {
      if (offset - p.start < p.length) return p;
    }
  }
  return std::nullopt;
}

uint64_t BackingMap::FreeEnd(uint64_t offset) const {
  uint64_t end = (offset / kGranule + 1) * kGranule;
  if (const Granule* g = SplitOf(offset / kGranule)) {
    for (const Piece& p : *g) {
      if (p.start > offset) end = std::min(end, p.start);
    }
  }
  return end;
}

void BackingMap::Insert(const Piece& piece) {
  if (pieces_ >= max_pieces_) Clear();
  const uint64_t granule = piece.start / kGranule;
  auto it = blocks_.find(granule >> kBlockBits);
  if (it == blocks_.end()) {
    if (blocks_.size() >= max_blocks_) Clear();
    it = blocks_.emplace(granule >> kBlockBits, std::make_unique<Block>())
             .first;
  }
  Whole& w = (*it->second)[granule & (kBlockGranules - 1)];
  ++pieces_;
  if (!w.split && w.kind == 0 && piece.start % kGranule == 0 &&
      piece.length == kGranule) {
    w.kind = static_cast<uint8_t>(piece.extent.kind + 1);
    w.depth = piece.depth;
    w.where = piece.extent.kind == Extent::kCompressed
                  ? piece.extent.entry
                  : piece.extent.host_offset;
    w.has_host_cluster = piece.extent.has_host_cluster;
    return;
  }
  w.split = true;
  Granule& g = split_[granule];
  auto at = std::upper_bound(
      g.begin(), g.end(), piece.start,
      [](uint64_t start, const Piece& p) { return start < p.start; });
  g.insert(at, piece);
}

void BackingMap::Clear() {
  blocks_.clear();
  split_.clear();
  pieces_ = 0;
}

}  // namespace qcow2::internal
