// A write-back LRU cache of fixed-size metadata pieces (L2 table slices or
// refcount blocks) of one image file.
//
// Crash ordering is expressed with dependencies, as the update-ordering rules
// in docs/crash-consistency.md require:
//  - SetDependency(other): every dirty entry of `other` is written (and the
//    file flushed) before any dirty entry of this cache is written.
//  - SetDependsOnFlush(): the file is flushed before any dirty entry of this
//    cache is written (used after guest data is written to a newly
//    allocated cluster, which must be durable before the L2 entry pointing
//    at it).
//
// Not thread-safe: the owner serialises access.
#ifndef QCOW2_LIB_CACHE_METADATA_CACHE_H_
#define QCOW2_LIB_CACHE_METADATA_CACHE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "qcow2/file.h"
#include "qcow2/stats.h"

namespace qcow2::internal {

class MetadataCache {
 public:
  struct Entry {
    uint64_t offset = 0;
    std::vector<uint8_t> data;
    bool dirty = false;
  };
  // A pinned entry: it is not evicted while a handle to it is alive.
  using Handle = std::shared_ptr<Entry>;

  // Called just before a dirty entry is written, with its offset and size
  // (the image uses it to count metadata bytes and for fault injection).
  using WriteHook = std::function<void(uint64_t offset, uint32_t size)>;

  MetadataCache(File* file, uint32_t entry_size, size_t capacity,
                std::string what);

  uint32_t entry_size() const { return entry_size_; }

  // Returns the entry at `offset` (entry-size aligned), reading it on a miss.
  absl::StatusOr<Handle> Get(uint64_t offset);

  // Returns a zero-filled dirty entry for `offset` without reading the file
  // (for newly allocated tables).
  absl::StatusOr<Handle> GetNew(uint64_t offset);

  void MarkDirty(const Handle& h) { h->dirty = true; }

  // Writes every dirty entry (after the dependencies). Does not flush the
  // file afterwards.
  absl::Status Flush();

  absl::Status SetDependency(MetadataCache* other);
  void SetDependsOnFlush() { depends_on_flush_ = true; }

  // Drops entries inside [offset, offset+len) without writing them (the
  // clusters were freed or are about to be rewritten by the caller).
  void Invalidate(uint64_t offset, uint64_t len);

  // Drops every entry without writing (after an error made them untrusted).
  void Clear();

  bool HasDirty() const;
  void set_write_hook(WriteHook hook) { write_hook_ = std::move(hook); }
  // The IoStats fields that count this cache's reads and writes.
  void set_counters(uint64_t IoStats::*read, uint64_t IoStats::*write) {
    read_counter_ = read;
    write_counter_ = write;
  }

 private:
  struct Slot {
    Handle entry;
    std::list<uint64_t>::iterator lru;
  };

  absl::Status MakeRoom();
  absl::Status WriteEntry(Entry& e);
  absl::Status FlushDependencies();
  Handle Insert(uint64_t offset);

  File* const file_;
  const uint32_t entry_size_;
  const size_t capacity_;
  const std::string what_;
  absl::flat_hash_map<uint64_t, Slot> map_;
  std::list<uint64_t> lru_;  // front = most recently used
  MetadataCache* depends_on_ = nullptr;
  bool depends_on_flush_ = false;
  WriteHook write_hook_;
  uint64_t IoStats::*read_counter_ = nullptr;
  uint64_t IoStats::*write_counter_ = nullptr;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CACHE_METADATA_CACHE_H_
