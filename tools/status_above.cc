// SPDX-License-Identifier: Apache-2.0
#include "tools/status_above.h"

#include <algorithm>
#include <utility>

namespace qcow2::tool {

StatusAbove::StatusAbove(Image* image, std::vector<std::string> names)
    : image_(image),
      infos_(image->GetChainInfo()),
      walker_(image, std::move(names)) {}

uint64_t StatusAbove::TableBoundary(uint64_t offset, int depth) const {
  uint64_t boundary = image_->size();
  for (int d = 0; d <= depth && d < static_cast<int>(infos_.size()); ++d) {
    const LayerInfo& info = infos_[d];
    if (info.format != ImageFormat::kQcow2 || info.cluster_size == 0) continue;
    const uint64_t entry_bytes = info.extended_l2 ? 16 : 8;
    const uint64_t span = info.cluster_size / entry_bytes * info.cluster_size;
    boundary = std::min(boundary, offset - offset % span + span);
  }
  return boundary;
}

unsigned StatusAbove::Flags(const MapEntry& e) const {
  if (!e.present) {
    // Reads as zeros because no layer has it. Past the end of a shorter
    // backing file QEMU counts the zeros as allocated in that file.
    const size_t below = static_cast<size_t>(e.depth) + 1;
    if (below < infos_.size() && e.start >= infos_[below].virtual_size) {
      return kStatusZero | kStatusAllocated;
    }
    return e.zero ? kStatusZero : 0;
  }
  unsigned f = kStatusAllocated;
  if (e.data) f |= kStatusData;
  if (e.zero) f |= kStatusZero;
  if (e.offset) f |= kStatusOffsetValid;
  return f;
}

absl::StatusOr<StatusRange> StatusAbove::Get(uint64_t offset) {
  const uint64_t size = image_->size();
  if (offset >= last_start_ && offset < last_end_) {
    return StatusRange{last_end_ - offset, last_flags_};
  }
  absl::StatusOr<MapEntry> first = walker_.Get(offset, size - offset);
  if (!first.ok()) return first.status();
  // libqcow2 may stop a range early (at an L2 cache slice); QEMU goes on
  // to the end of the L2 table while the status stays the same.
  const uint64_t limit = TableBoundary(offset, first->depth);
  MapEntry cur = *first;
  const unsigned flags = Flags(cur);
  uint64_t end = offset + cur.length;
  while (end < limit) {
    absl::StatusOr<MapEntry> next = walker_.Get(end, limit - end);
    if (!next.ok()) return next.status();
    MapEntry probe = cur;
    probe.length = end - offset;
    if (!Mergeable(probe, *next) || Flags(*next) != flags) break;
    end += next->length;
  }
  end = std::min(end, limit);
  last_start_ = offset;
  last_end_ = end;
  last_flags_ = flags | (end == size ? kStatusEof : 0);
  return StatusRange{end - offset, last_flags_};
}

}  // namespace qcow2::tool
