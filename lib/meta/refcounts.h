// SPDX-License-Identifier: Apache-2.0
// Host cluster reference counts of one qcow2 image: the refcount table (in
// memory, written through) and refcount blocks (through a write-back cache),
// for every refcount width from 1 to 64 bits, plus cluster allocation.
//
// Ordering (docs/crash-consistency.md): a new refcount block is written and
// flushed before the table entry that points at it (the entry waits in
// memory until the block cache is next flushed); a grown table is written
// and flushed before the header points at it; the old table is freed last.
// Clusters freed since the last Flush() are not handed out again until then,
// so an on-disk pointer can never meet a cluster's new owner.
#ifndef QCOW2_LIB_META_REFCOUNTS_H_
#define QCOW2_LIB_META_REFCOUNTS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/meta/metadata_cache.h"
#include "lib/meta/metadata_set.h"
#include "qcow2/file.h"

namespace qcow2::internal {

class Refcounts {
 public:
  struct Params {
    File* file = nullptr;
    std::string filename;
    uint32_t cluster_bits = 16;
    uint32_t refcount_order = 4;
    uint64_t table_offset = 0;
    uint32_t table_clusters = 0;
    std::vector<uint64_t> table;  // host order, refcount_table_clusters worth
    uint64_t cache_bytes = 1 << 20;
  };
  // Writes the header fields for a new refcount table location (offset and
  // cluster count in one write) and makes them durable.
  using HeaderWriter =
      std::function<absl::Status(uint64_t table_offset, uint32_t clusters)>;

  explicit Refcounts(Params p);

  // Loads the refcount table of an image.
  static absl::StatusOr<std::vector<uint64_t>> LoadTable(
      File* file, uint64_t offset, uint32_t clusters, uint32_t cluster_bits,
      const std::string& filename);

  void set_header_writer(HeaderWriter w) { header_writer_ = std::move(w); }

  // Records the refcount table and every refcount block it names in
  // `metadata` and keeps them there as the table changes. From then on the
  // allocator refuses (kDataLoss) to hand out a metadata cluster whose
  // refcount claims it is free, and no count of a metadata cluster may drop
  // to 0. `metadata` is not owned and must outlive this object.
  void TrackMetadata(MetadataSet* metadata);

  uint64_t cluster_size() const { return cluster_size_; }
  uint64_t max_refcount() const { return max_refcount_; }
  uint64_t table_offset() const { return table_offset_; }
  uint32_t table_clusters() const { return table_clusters_; }
  const std::vector<uint64_t>& table() const { return table_; }
  MetadataCache& cache() { return cache_; }

  // Refcount of host cluster `cluster` (an index, not a byte offset). With
  // `may_defer`, a block not cached may be a deferred miss
  // (MetadataCache::Get): the search for free clusters, which changes
  // nothing until it has found them, lets the engine read the block with
  // no lock held.
  absl::StatusOr<uint64_t> Get(uint64_t cluster, bool may_defer = false);

  // Adds `delta` to every cluster overlapping [offset, offset + len).
  // Fails with kDataLoss on underflow or overflow, or when the count of a
  // tracked metadata cluster would drop to 0 (nothing is changed then for
  // the failing cluster).
  absl::Status Update(uint64_t offset, uint64_t len, int64_t delta);

  // Allocates `n` contiguous clusters with refcount 1 and returns the byte
  // offset of the first. Fails with kDataLoss if the search meets a cluster
  // with refcount 0 that holds tracked metadata (corrupt refcounts).
  absl::StatusOr<uint64_t> Allocate(uint64_t n);
  // Looks for the clusters `n` calls of Allocate(1) would return (free
  // ones from the search's starting point on), changing nothing: the
  // refcount blocks the search meets may be deferred misses, and so may
  // the blocks counting the refcount table when the search nears the end
  // of what the table covers (a growth frees the old table).
  absl::Status ProbeAllocate(uint64_t n);

  // Writes dirty refcount blocks (not the file flush) and lets clusters
  // freed before this call be reused once the caller has flushed the file.
  absl::Status Flush();
  // Closes the set of clusters freed so far (after Flush() wrote the
  // refcounts that free them) and returns its generation.
  uint64_t SealQuarantine();
  // Called by the owner after the file flush that followed Flush() and
  // SealQuarantine(): clusters of generations up to `generation` become
  // reusable and their bytes are discarded. Flushes may overlap: a file
  // flush covers every generation sealed before it started.
  //
  // With `to_discard`, the discard is left to the caller, to do without
  // the owner's lock: the ranges ([start, end) clusters) are appended to
  // it and stay unusable until EndDiscard(*to_discard).
  void ReleaseQuarantine(
      uint64_t generation,
      std::vector<std::pair<uint64_t, uint64_t>>* to_discard = nullptr);
  void EndDiscard(const std::vector<std::pair<uint64_t, uint64_t>>& ranges);
  // Seals and releases everything (single-threaded flush).
  void ReleaseQuarantine() { ReleaseQuarantine(SealQuarantine()); }

  // Highest cluster index + 1 that has ever been in use or allocated: the
  // allocator's view of the end of the image.
  uint64_t end_cluster() const { return end_cluster_; }
  void NoteEnd(uint64_t end_cluster) {
    if (end_cluster > end_cluster_) end_cluster_ = end_cluster;
  }
  // Highest cluster index + 1 ever given to metadata (refcount blocks and
  // tables here; L1 and L2 tables by the owner through NoteMetadataEnd).
  // Metadata may reach the disk even when the step that links it failed
  // (a failed flush can still write it later), so the file never ends
  // below this.
  uint64_t metadata_end_cluster() const { return metadata_end_cluster_; }
  void NoteMetadataEnd(uint64_t end_cluster) {
    NoteEnd(end_cluster);
    if (end_cluster > metadata_end_cluster_) {
      metadata_end_cluster_ = end_cluster;
    }
  }

  // Called when a cluster's refcount drops to 0 (to drop cached copies and
  // discard its bytes).
  void set_free_hook(std::function<void(uint64_t offset)> hook) {
    free_hook_ = std::move(hook);
  }

 private:
  // The cached refcount block that counts `cluster`, its table entry
  // validated; a null handle when no block is allocated for it.
  absl::StatusOr<MetadataCache::Handle> BlockOf(uint64_t cluster,
                                                bool may_defer = false);
  // WriteRefcount (lib/format/entries.h) into a cached block, marking the
  // bytes it changed dirty.
  void SetEntry(MetadataCache::Entry& block, uint64_t index,
                uint64_t value) const;
  absl::StatusOr<uint64_t> FindFree(uint64_t n);
  // Allocate(1)'s common case, what FindFree(1) and Update(+1) would do
  // together through one look-up of a refcount block: the first free
  // cluster from the search's starting point on, when the block that
  // counts that point exists and holds one. kNoCluster otherwise (the
  // general path then searches, making blocks as needed).
  static constexpr uint64_t kNoCluster = ~uint64_t{0};
  absl::StatusOr<uint64_t> AllocateOneInBlock();
  // Ensures a refcount block exists for cluster `cluster`; may allocate one
  // (and grow the table). Returns true if it had to allocate.
  absl::StatusOr<bool> EnsureBlock(uint64_t cluster);
  absl::Status GrowTable(uint64_t needed_index);
  // The flush tail of the block cache: flushes the file, then writes the
  // table entries of blocks created since the last flush.
  absl::Status WriteTableEntries();
  absl::Status Corrupt(const std::string& what) const;
  bool Quarantined(uint64_t cluster, uint64_t n) const;
  // A refcount table entry as a tracked block offset (0: none or invalid).
  uint64_t TrackedBlock(uint64_t entry) const;
  // kDataLoss if host cluster `cluster` holds tracked metadata; `why` says
  // what was about to happen to it.
  absl::Status CheckNotMetadata(uint64_t cluster, const char* why) const;

  File* const file_;
  const std::string filename_;
  const uint32_t cluster_bits_;
  const uint64_t cluster_size_;
  const uint32_t refcount_order_;
  const uint64_t block_entries_;
  const uint64_t max_refcount_;
  uint64_t table_offset_;
  uint32_t table_clusters_;
  std::vector<uint64_t> table_;
  // Indices of table_ entries that name new blocks and are not yet on disk.
  std::vector<uint64_t> unwritten_table_entries_;
  MetadataCache cache_;
  HeaderWriter header_writer_;
  std::function<void(uint64_t)> free_hook_;
  MetadataSet* metadata_ = nullptr;
  uint64_t free_hint_ = 0;
  uint64_t end_cluster_ = 0;
  uint64_t metadata_end_cluster_ = 0;
  // Clusters freed since the last flush: [start, end) cluster ranges.
  std::vector<std::pair<uint64_t, uint64_t>> quarantine_;
  struct Sealed {
    uint64_t generation;
    uint64_t start, end;
  };
  std::vector<Sealed> pending_release_;
  // The generation of released ranges the owner is discarding.
  static constexpr uint64_t kDiscarding = ~uint64_t{0};
  uint64_t generation_ = 0;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_META_REFCOUNTS_H_
