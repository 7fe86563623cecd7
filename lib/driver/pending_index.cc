// SPDX-License-Identifier: Apache-2.0
#include "lib/driver/pending_index.h"

#include <algorithm>

namespace qcow2::internal {

const PendingIndex::Cluster* PendingIndex::Find(uint64_t cluster) const {
  auto it = clusters_.find(cluster);
  return it == clusters_.end() ? nullptr : &it->second;
}

PendingIndex::Cluster* PendingIndex::Find(uint64_t cluster) {
  auto it = clusters_.find(cluster);
  return it == clusters_.end() ? nullptr : &it->second;
}

std::vector<uint64_t> PendingIndex::Clusters() const {
  std::vector<uint64_t> out;
  out.reserve(clusters_.size());
  for (const auto& [cluster, p] : clusters_) out.push_back(cluster);
  std::sort(out.begin(), out.end());
  return out;
}

absl::InlinedVector<uint64_t, 4> PendingIndex::Between(uint64_t first,
                                                       uint64_t last) const {
  absl::InlinedVector<uint64_t, 4> out;
  if (clusters_.empty() || last < first) return out;
  if (last - first < clusters_.size()) {
    for (uint64_t c = first;; ++c) {
      if (clusters_.contains(c)) out.push_back(c);
      if (c == last) break;
    }
    return out;
  }
  for (const auto& [cluster, p] : clusters_) {
    if (cluster >= first && cluster <= last) out.push_back(cluster);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool PendingIndex::HasPendingIn(uint64_t offset, uint64_t len,
                                uint32_t bits) const {
  if (clusters_.empty() || len == 0) return false;
  return !Between(offset >> bits, (offset + len - 1) >> bits).empty();
}

uint64_t PendingIndex::ClipAtPending(uint64_t offset, uint64_t len,
                                     uint32_t bits) const {
  if (clusters_.empty() || len == 0) return len;
  const uint64_t own = offset >> bits;
  const uint64_t last = (offset + len - 1) >> bits;
  if (last == own) return len;
  const absl::InlinedVector<uint64_t, 4> after = Between(own + 1, last);
  if (after.empty()) return len;
  return (after.front() << bits) - offset;
}

}  // namespace qcow2::internal
