// SPDX-License-Identifier: Apache-2.0
#include "lib/meta/cluster_map.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/format/entries.h"
#include "lib/base/endian.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

Geometry Geometry::From(const Header& h, uint32_t requested_slice_bytes) {
  Geometry g;
  g.cluster_bits = h.cluster_bits;
  g.cluster_size = h.cluster_size();
  g.extended_l2 = h.extended_l2();
  g.entry_size = h.l2_entry_size();
  g.l2_entries = g.cluster_size / g.entry_size;
  uint32_t slice = requested_slice_bytes;
  if (slice < 512 || (slice & (slice - 1)) != 0) slice = 4096;
  if (slice > g.cluster_size) slice = static_cast<uint32_t>(g.cluster_size);
  g.slice_bytes = slice;
  g.slice_entries = slice / g.entry_size;
  g.subclusters = g.extended_l2 ? kSubclustersPerCluster : 1;
  g.subcluster_size = g.cluster_size / g.subclusters;
  return g;
}

uint64_t L2Ref::entry() const {
  return LoadBE64(&slice->data[index * (extended ? 16 : 8)]);
}

uint64_t L2Ref::bitmap() const {
  return extended ? LoadBE64(&slice->data[index * 16 + 8]) : 0;
}

void L2Ref::Set(uint64_t entry, uint64_t bitmap) {
  const uint32_t size = extended ? 16 : 8;
  StoreBE64(&slice->data[index * size], entry);
  if (extended) StoreBE64(&slice->data[index * 16 + 8], bitmap);
  slice->MarkDirty(static_cast<uint32_t>(index * size), size);
}

ClusterMap::ClusterMap(File* file, const std::string& filename,
                       const Geometry& g, std::vector<uint64_t> l1,
                       uint64_t l1_offset, uint64_t l2_cache_bytes)
    : filename_(filename),
      g_(g),
      l1_(std::move(l1)),
      l1_offset_(l1_offset),
      l2_cache_(file, g.slice_bytes, l2_cache_bytes / g.slice_bytes,
                "L2 table") {
  // A miss read without the lock brings in the whole table.
  l2_cache_.set_readahead(g.cluster_size);
}

absl::Status ClusterMap::Corrupt(const std::string& what) const {
  return absl::DataLossError(
      absl::StrCat(filename_, ": corrupt image: ", what));
}

absl::StatusOr<uint64_t> ClusterMap::L2TableFor(uint64_t cluster) {
  uint64_t l1_index = cluster / g_.l2_entries;
  if (l1_index >= l1_.size()) return 0;
  uint64_t e = l1_[l1_index];
  if (l1_index < l1_checked_.size() && l1_checked_[l1_index]) {
    return e & kEntryOffsetMask;
  }
  if (e & kL1ReservedMask) {
    return Corrupt(absl::StrFormat("L1 entry %d (0x%016x) has reserved bits set",
                                   l1_index, e));
  }
  uint64_t off = e & kEntryOffsetMask;
  if (off == 0) return 0;
  if (off & (g_.cluster_size - 1)) {
    return Corrupt(absl::StrFormat(
        "L2 table offset 0x%x in L1 entry %d is not cluster aligned", off,
        l1_index));
  }
  if (off >= file_limit_) {
    return Corrupt(absl::StrFormat(
        "L2 table offset 0x%x in L1 entry %d lies past the end of the file",
        off, l1_index));
  }
  uint64_t at;
  MetadataSet::Kind kind;
  constexpr uint32_t kOtherTables = (1u << MetadataSet::kHeader) |
                                    (1u << MetadataSet::kL1Table) |
                                    (1u << MetadataSet::kRefcountTable) |
                                    (1u << MetadataSet::kRefcountBlock);
  if (metadata_ != nullptr &&
      metadata_->Find(off, g_.cluster_size, kOtherTables, &at, &kind)) {
    return Corrupt(absl::StrFormat(
        "L2 table offset 0x%x in L1 entry %d overlaps %s", off, l1_index,
        MetadataSet::Name(kind)));
  }
  if (l1_checked_.size() < l1_.size()) l1_checked_.resize(l1_.size());
  l1_checked_[l1_index] = true;
  return off;
}

uint64_t ClusterMap::TrackedTable(uint64_t l1_entry) const {
  // Entries a lookup refuses anyway (reserved bits, unaligned) are not
  // tracked; past-the-end ones are, which costs nothing.
  const uint64_t table = l1_entry & kEntryOffsetMask;
  if ((l1_entry & kL1ReservedMask) || (table & (g_.cluster_size - 1))) {
    return 0;
  }
  return table;
}

void ClusterMap::TrackL1(bool add) {
  auto apply = [&](MetadataSet::Kind kind, uint64_t offset, uint64_t len) {
    if (add) {
      metadata_->Add(kind, offset, len);
    } else {
      metadata_->Remove(kind, offset, len);
    }
  };
  apply(MetadataSet::kL1Table, l1_offset_, uint64_t{l1_.size()} * 8);
  for (uint64_t e : l1_) {
    const uint64_t table = TrackedTable(e);
    if (table != 0) apply(MetadataSet::kL2Table, table, g_.cluster_size);
  }
}

void ClusterMap::TrackMetadata(MetadataSet* metadata) {
  metadata_ = metadata;
  l1_checked_.clear();
  TrackL1(true);
}

void ClusterMap::SetL1(uint64_t index, uint64_t entry) {
  if (metadata_ != nullptr) {
    const uint64_t old_table = TrackedTable(l1_[index]);
    if (old_table != 0) {
      metadata_->Remove(MetadataSet::kL2Table, old_table, g_.cluster_size);
    }
    const uint64_t table = TrackedTable(entry);
    if (table != 0) {
      metadata_->Add(MetadataSet::kL2Table, table, g_.cluster_size);
    }
  }
  l1_[index] = entry;
  if (index < l1_checked_.size()) l1_checked_[index] = false;
}

void ClusterMap::ReplaceL1(std::vector<uint64_t> l1, uint64_t offset) {
  if (metadata_ != nullptr) TrackL1(false);
  l1_ = std::move(l1);
  l1_checked_.clear();
  l1_offset_ = offset;
  if (metadata_ != nullptr) TrackL1(true);
}

absl::StatusOr<L2Ref> ClusterMap::Lookup(uint64_t cluster) {
  ASSIGN_OR_RETURN(uint64_t l2_offset, L2TableFor(cluster));
  L2Ref ref;
  ref.extended = g_.extended_l2;
  if (l2_offset == 0) return ref;
  uint64_t l2_index = cluster % g_.l2_entries;
  uint64_t slice_offset =
      l2_offset + (l2_index / g_.slice_entries) * g_.slice_bytes;
  // A miss may be read later, without the lock (MissDeferral).
  ASSIGN_OR_RETURN(ref.slice,
                   l2_cache_.Get(slice_offset, /*may_defer=*/true));
  ref.index = static_cast<uint32_t>(l2_index % g_.slice_entries);
  return ref;
}

bool ClusterMap::Peek(uint64_t cluster, L2Ref* ref) {
  absl::StatusOr<uint64_t> l2_offset = L2TableFor(cluster);
  if (!l2_offset.ok()) return false;
  *ref = L2Ref();
  ref->extended = g_.extended_l2;
  if (*l2_offset == 0) return true;
  const uint64_t l2_index = cluster % g_.l2_entries;
  ref->slice = l2_cache_.Peek(*l2_offset +
                              (l2_index / g_.slice_entries) * g_.slice_bytes);
  ref->index = static_cast<uint32_t>(l2_index % g_.slice_entries);
  return ref->slice != nullptr;
}

uint64_t ClusterMap::EntriesLeftInSlice(uint64_t cluster) const {
  return g_.slice_entries - (cluster % g_.l2_entries) % g_.slice_entries;
}

}  // namespace qcow2::internal
