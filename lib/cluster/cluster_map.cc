#include "lib/cluster/cluster_map.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/format/entries.h"
#include "lib/util/endian.h"
#include "lib/util/status_macros.h"

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
  StoreBE64(&slice->data[index * (extended ? 16 : 8)], entry);
  if (extended) StoreBE64(&slice->data[index * 16 + 8], bitmap);
  slice->dirty = true;
}

ClusterMap::ClusterMap(File* file, const std::string& filename,
                       const Geometry& g, std::vector<uint64_t> l1,
                       uint64_t l1_offset, uint64_t l2_cache_bytes)
    : file_(file),
      filename_(filename),
      g_(g),
      l1_(std::move(l1)),
      l1_offset_(l1_offset),
      l2_cache_(file, g.slice_bytes, l2_cache_bytes / g.slice_bytes,
                "L2 table") {}

absl::Status ClusterMap::Corrupt(const std::string& what) const {
  return absl::DataLossError(
      absl::StrCat(filename_, ": corrupt image: ", what));
}

absl::StatusOr<uint64_t> ClusterMap::L2TableFor(uint64_t cluster) {
  uint64_t l1_index = cluster / g_.l2_entries;
  if (l1_index >= l1_.size()) return 0;
  uint64_t e = l1_[l1_index];
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
  return off;
}

absl::StatusOr<L2Ref> ClusterMap::Lookup(uint64_t cluster) {
  ASSIGN_OR_RETURN(uint64_t l2_offset, L2TableFor(cluster));
  L2Ref ref;
  ref.extended = g_.extended_l2;
  if (l2_offset == 0) return ref;
  uint64_t l2_index = cluster % g_.l2_entries;
  uint64_t slice_offset =
      l2_offset + (l2_index / g_.slice_entries) * g_.slice_bytes;
  ASSIGN_OR_RETURN(ref.slice, l2_cache_.Get(slice_offset));
  ref.index = static_cast<uint32_t>(l2_index % g_.slice_entries);
  return ref;
}

uint64_t ClusterMap::EntriesLeftInSlice(uint64_t cluster) const {
  return g_.slice_entries - (cluster % g_.l2_entries) % g_.slice_entries;
}

}  // namespace qcow2::internal
