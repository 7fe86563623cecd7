// SPDX-License-Identifier: Apache-2.0
// The guest-to-host cluster mapping of one qcow2 image: the L1 table (kept
// in memory) and L2 tables (through a slice cache).
#ifndef QCOW2_LIB_META_CLUSTER_MAP_H_
#define QCOW2_LIB_META_CLUSTER_MAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/meta/metadata_cache.h"
#include "lib/meta/metadata_set.h"
#include "lib/format/header.h"
#include "qcow2/file.h"

namespace qcow2::internal {

// Geometry derived from the header, shared by the map and the writer.
struct Geometry {
  uint32_t cluster_bits = 16;
  uint64_t cluster_size = 1ull << 16;
  bool extended_l2 = false;
  uint32_t entry_size = 8;        // bytes per L2 entry
  uint64_t l2_entries = 8192;     // entries per L2 table
  uint32_t slice_bytes = 4096;    // bytes per cache slice
  uint64_t slice_entries = 512;   // entries per slice
  uint64_t subcluster_size = 1ull << 16;  // == cluster_size without ext L2
  int subclusters = 1;            // 32 with ext L2

  static Geometry From(const Header& h, uint32_t requested_slice_bytes);
};

// A position in an L2 table: the slice that holds the entry, pinned.
struct L2Ref {
  MetadataCache::Handle slice;
  uint32_t index = 0;  // entry index inside the slice

  uint64_t entry() const;
  uint64_t bitmap() const;  // 0 without extended L2
  void Set(uint64_t entry, uint64_t bitmap);
  bool extended = false;
};

class ClusterMap {
 public:
  ClusterMap(File* file, const std::string& filename, const Geometry& g,
             std::vector<uint64_t> l1, uint64_t l1_offset,
             uint64_t l2_cache_bytes);

  const Geometry& geometry() const { return g_; }
  const std::vector<uint64_t>& l1() const { return l1_; }
  uint64_t l1_offset() const { return l1_offset_; }
  MetadataCache& l2_cache() { return l2_cache_; }

  // The L1 entry index and L2 table offset covering guest cluster
  // `cluster` (0 when no L2 table is allocated). Validates the L1 entry:
  // reserved bits, alignment, the file end and, when metadata is tracked,
  // overlap with the header, the L1 table, the refcount table and refcount
  // blocks.
  absl::StatusOr<uint64_t> L2TableFor(uint64_t cluster);

  // Looks up the L2 entry of guest cluster `cluster`. Returns an empty ref
  // (slice == nullptr) when the L2 table is not allocated.
  absl::StatusOr<L2Ref> Lookup(uint64_t cluster);

  // The same without I/O: false when the L1 entry is invalid or the slice
  // is not cached; otherwise *ref is set (slice null: no L2 table).
  bool Peek(uint64_t cluster, L2Ref* ref);

  // Number of entries from `cluster` to the end of its slice.
  uint64_t EntriesLeftInSlice(uint64_t cluster) const;

  // Replaces the in-memory L1 entry (the writer persists it), keeping the
  // tracked metadata in step.
  void SetL1(uint64_t index, uint64_t entry);
  // Switches to a new L1 table at `offset` (after a header update).
  void ReplaceL1(std::vector<uint64_t> l1, uint64_t offset);

  // Records the L1 table and every L2 table it names in `metadata`, and
  // keeps them there as the L1 table changes. `metadata` is not owned and
  // must outlive the map. For writable images.
  void TrackMetadata(MetadataSet* metadata);

  // Bounds for validating offsets read from tables: the file size known at
  // open time, raised as tables are allocated.
  void set_file_limit(uint64_t bytes) {
    file_limit_ = bytes;
    l1_checked_.clear();
  }
  void RaiseFileLimit(uint64_t bytes) {
    if (bytes > file_limit_) file_limit_ = bytes;
  }
  uint64_t file_limit() const { return file_limit_; }

  absl::Status Corrupt(const std::string& what) const;

 private:
  // The L2 table an L1 entry names, as tracked in metadata_ (0: none).
  uint64_t TrackedTable(uint64_t l1_entry) const;
  // Adds (or removes) the L1 table and its L2 tables to metadata_.
  void TrackL1(bool add);

  const std::string filename_;
  const Geometry g_;
  std::vector<uint64_t> l1_;  // host byte order
  // L1 indices whose entry L2TableFor has found sound (its table aligned,
  // inside the file, clear of other metadata): not checked again until
  // the entry, the L1 table, the file limit or the metadata tracking
  // changes. (Metadata allocated later never overlaps a tracked table:
  // the allocator refuses a cluster the image uses for metadata.)
  std::vector<bool> l1_checked_;
  uint64_t l1_offset_;
  MetadataCache l2_cache_;
  uint64_t file_limit_ = kMaxHostOffset;
  MetadataSet* metadata_ = nullptr;  // writable images only
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_META_CLUSTER_MAP_H_
