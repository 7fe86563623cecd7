// SPDX-License-Identifier: Apache-2.0
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
//
// Reading a missing entry without the owner's lock: while a MissDeferral is
// installed on the calling thread, Get(offset, /*may_defer=*/true) does not
// read on a miss. It records what is missing and fails with
// kUnavailable; the caller drops what it was doing, reads the entry with no
// lock held and hands it back with InsertLoaded, then starts over. An entry
// read that way is taken only if nothing in the cache changed its bytes on
// disk meanwhile (every write-back, new entry and invalidation moves an
// epoch); otherwise the caller is told to read again.
#ifndef QCOW2_LIB_META_METADATA_CACHE_H_
#define QCOW2_LIB_META_METADATA_CACHE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "qcow2/file.h"
#include "qcow2/stats.h"

namespace qcow2::internal {

class IoPlan;
class MetadataCache;
class WriteBackFile;

// Installed on a thread while the engine plans one request whose executor
// can fetch a missing entry itself. For a write, a miss is deferred only
// while `plan` is still empty: once the plan holds allocations or I/O,
// dropping it would waste what it holds, so later misses are read at once.
// A read's plan is dropped and made again at any miss.
class MissDeferral {
 public:
  // Misses are deferred while `plan` is empty, or at any time with
  // `even_with_work` (a read's plan: dropping it undoes nothing).
  explicit MissDeferral(const IoPlan* plan, bool even_with_work = false);
  ~MissDeferral();
  MissDeferral(const MissDeferral&) = delete;
  MissDeferral& operator=(const MissDeferral&) = delete;

  // The deferral in force on this thread, if a miss may be deferred now.
  static MissDeferral* Active();
  // While one lives, no deferral is in force on this thread: what runs
  // meanwhile changes metadata as it goes, which dropping the plan would
  // not undo, so a miss is read at once. (A probe of what it needs comes
  // first, under the deferral.)
  class Paused {
   public:
    Paused();
    ~Paused();
    Paused(const Paused&) = delete;
    Paused& operator=(const Paused&) = delete;

   private:
    MissDeferral* const saved_;
  };

  bool deferred() const { return cache != nullptr; }

  // What was missing (set by MetadataCache::Get), and what to read for it:
  // [read_start, read_start + read_len) covers `offset` (more than one
  // entry with read-ahead).
  MetadataCache* cache = nullptr;
  uint64_t offset = 0;
  uint64_t read_start = 0;
  uint32_t read_len = 0;
  uint64_t epoch = 0;

 private:
  const IoPlan* const plan_;
  const bool even_with_work_;
  MissDeferral* const saved_;
};

class MetadataCache {
 public:
  struct Entry {
    uint64_t offset = 0;
    std::vector<uint8_t> data;
    bool dirty = false;
    // While dirty: the bytes changed since the entry was last written,
    // [dirty_begin, dirty_end). A write-back writes only those, widened to
    // kWriteAlign: a flush after a few refcount changes writes 4 KiB of a
    // 64 KiB refcount block, not all of it.
    uint32_t dirty_begin = 0;
    uint32_t dirty_end = 0;

    // Every change to `data` is followed by one of these.
    void MarkAllDirty() { MarkDirty(0, static_cast<uint32_t>(data.size())); }
    void MarkDirty(uint32_t begin, uint32_t len) {
      const uint32_t end = begin + len;
      if (!dirty) {
        dirty_begin = begin;
        dirty_end = end;
      } else {
        dirty_begin = std::min(dirty_begin, begin);
        dirty_end = std::max(dirty_end, end);
      }
      dirty = true;
    }
  };
  // Write-backs of part of an entry start and end on multiples of this
  // (or of the entry size, if smaller): a whole block for O_DIRECT files.
  static constexpr uint32_t kWriteAlign = 4096;
  // A pinned entry: it is not evicted while a handle to it is alive.
  using Handle = std::shared_ptr<Entry>;

  // Called just before a dirty entry is written, with its offset and size
  // (the image uses it to count metadata bytes and for fault injection).
  using WriteHook = std::function<void(uint64_t offset, uint32_t size)>;

  MetadataCache(File* file, uint32_t entry_size, size_t capacity,
                std::string what);

  uint32_t entry_size() const { return entry_size_; }

  // Returns the entry at `offset` (entry-size aligned), reading it on a
  // miss; with `may_defer`, a miss may instead be deferred (see above).
  absl::StatusOr<Handle> Get(uint64_t offset, bool may_defer = false);
  // The entry at `offset` if it is cached, else null. No I/O, and the LRU
  // order is left alone.
  Handle Peek(uint64_t offset) const {
    auto it = map_.find(offset);
    return it == map_.end() ? nullptr : it->second.entry;
  }

  // Takes the entries read without the lock after a deferred miss: `data`
  // holds whole entries from `start`. `epoch` is the one recorded at the
  // miss. Entries already cached are left as they are. Returns the entry at
  // `want` (inserted now or by another reader meanwhile), or null when the
  // bytes may be stale (the cache changed since) and were dropped.
  absl::StatusOr<Handle> InsertLoaded(uint64_t start, uint64_t want,
                                      uint64_t epoch,
                                      absl::Span<const uint8_t> data);

  // A deferred miss reads the whole aligned `unit` around the entry (an L2
  // table: every slice of it), when the cache holds at least four such
  // units. 0 or the entry size: the entry alone.
  void set_readahead(uint32_t unit) { readahead_ = unit; }

  File* file() const { return file_; }
  // The file a deferred miss reads, with no lock held: under a
  // WriteBackFile, the file beneath it (an entry whose recorded write-back
  // is still queued stays pinned here, so it is never the one missing).
  File* read_file() const { return read_file_; }
  const std::string& what() const { return what_; }

  // Returns a zero-filled dirty entry for `offset` without reading the file
  // (for newly allocated tables).
  absl::StatusOr<Handle> GetNew(uint64_t offset);

  // Writes every dirty entry (after the dependencies), then runs the
  // flush tail, if any. Does not flush the file afterwards.
  absl::Status Flush();

  // Runs at the end of every Flush(), dirty entries or not: for pointers
  // to this cache's entries that may reach the disk only after the entries
  // are durable (the refcount table entry of a new refcount block). A
  // cache that depends on this one sees them written, like the entries,
  // before its own writes.
  using FlushTail = std::function<absl::Status()>;
  void set_flush_tail(FlushTail tail) { flush_tail_ = std::move(tail); }

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
  absl::Status WriteEntry(const Handle& e);
  absl::Status FlushDependencies();
  Handle Insert(uint64_t offset);

  File* const file_;
  // file_ if it is a WriteBackFile: entries it records are pinned to it.
  WriteBackFile* const write_back_;
  File* const read_file_;
  const uint32_t entry_size_;
  const size_t capacity_;
  const std::string what_;
  absl::flat_hash_map<uint64_t, Slot> map_;
  std::list<uint64_t> lru_;  // front = most recently used
  MetadataCache* depends_on_ = nullptr;
  bool depends_on_flush_ = false;
  WriteHook write_hook_;
  FlushTail flush_tail_;
  // Moves whenever an entry's bytes on disk may change, or an entry is
  // created or dropped without a read (see InsertLoaded).
  uint64_t epoch_ = 0;
  uint32_t readahead_ = 0;
  uint64_t IoStats::*read_counter_ = nullptr;
  uint64_t IoStats::*write_counter_ = nullptr;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_META_METADATA_CACHE_H_
