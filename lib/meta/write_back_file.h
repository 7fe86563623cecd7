// SPDX-License-Identifier: Apache-2.0
// The file an image's metadata is written through, so that a flush's
// metadata write-back runs without the image's lock.
//
// A flush decides what to write while it holds the lock: the dirty L2 and
// refcount entries in the order the crash-ordering rules require, the file
// flushes between them, the L1 and refcount table entries of new tables.
// Between BeginRecord() and EndRecord() those writes and flushes are not
// carried out: they are copied, in order, into a *log* that EndRecord()
// queues. The caches take the recorded writes as done (their entries are
// clean). WriteBack() then carries the queued logs out, in the order they
// were recorded, on the calling thread and with no lock of the caller's
// held; other requests plan and commit meanwhile.
//
// Until a log is written, the disk is behind what the caches believe:
//  - every other write, flush or size change through this file (an
//    eviction, a table copy, a header update) first waits for the logs
//    queued before it to be written, or writes them itself, so nothing
//    reaches the disk out of the recorded order;
//  - each cache entry a log writes stays pinned in its cache (Pin) until
//    the log is written, so it is never evicted and read back stale;
//  - events (lib/base/events.h) emitted while recording are kept in the
//    log and emitted again as the log is written, before the I/O they name
//    (a log of events alone is not queued: they are emitted as it ends).
// Reads pass straight through: nothing read through this file lies in a
// queued log (cache entries are pinned; the L1 and refcount tables are
// read only at open).
// A log that fails stays queued and is written again, first, by the next
// WriteBack or the next write through this file: its writes were recorded
// in a crash-safe order, and every later log assumes them.
//
// Thread safety: recording and every operation other than WriteBack and
// reads happen under the owner's lock (one at a time). WriteBack and
// reads may run on any thread at any time.
#ifndef QCOW2_LIB_META_WRITE_BACK_FILE_H_
#define QCOW2_LIB_META_WRITE_BACK_FILE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lib/base/mutex.h"
#include "qcow2/file.h"

namespace qcow2::internal {

class WriteBackFile : public File {
 public:
  explicit WriteBackFile(File* base);
  ~WriteBackFile() override;

  File* base() const { return base_; }

  // A file flushed before every flush of the base (an image's external
  // data file): not owned, set before any I/O, outlives this.
  void set_flush_first(File* f) { flush_first_ = f; }

  // Starts a log: until EndRecord(), writes and flushes are recorded.
  void BeginRecord();
  // Queues the log (if it holds anything) and returns a ticket for
  // WriteBack: the last log queued so far.
  uint64_t EndRecord();

  // Records what is written through `file` in its scope as one log, when
  // `file` is not null, not recording already, and the DeferEvictions
  // budget in force has a recording left (see below); else does nothing.
  // The log begins at the first write or flush (a scope that writes
  // nothing costs nothing); from then on, only writes and flushes may go
  // through the file until the scope ends.
  class RecordScope {
   public:
    explicit RecordScope(WriteBackFile* file);
    ~RecordScope();
    RecordScope(const RecordScope&) = delete;
    RecordScope& operator=(const RecordScope&) = delete;

   private:
    WriteBackFile* const file_;
  };
  // Recording, or in a RecordScope that will record its first write.
  bool recording() const { return recording_ != nullptr || armed_; }
  // While recording: the ticket the log will have once queued.
  uint64_t recording_ticket() const { return next_seq_; }
  // Keeps `pin` alive until the log being recorded is written (no-op when
  // not recording).
  void Pin(std::shared_ptr<const void> pin);

  // Writes every queued log up to and including `ticket`, unless written
  // already; waits while another thread writes logs. On failure, the
  // failed log and those after it stay queued.
  absl::Status WriteBack(uint64_t ticket);

  // Whether every log up to and including `ticket` is written.
  bool Written(uint64_t ticket) const;

  // Logs queued and not yet written (for tests).
  size_t queued() const;
  // The ticket that covers every log queued so far. Under the owner's lock
  // (logs are queued only under it), so no mutex: it is read on every
  // request's planning.
  uint64_t last_queued() const { return next_seq_ - 1; }

  // Installed on a thread while it plans a request whose executor will
  // call WriteBack(last_queued()) before the request's own I/O: a cache
  // then records the write-back of entries it evicts, or that it must
  // write out before a new dependency (MetadataCache::MakeRoom,
  // SetDependency), instead of writing them under the lock. Elsewhere they
  // are written at once, so that no log waits long for someone to write
  // it. At most kBudget such recordings per installation: recorded
  // entries stay cached until written, so a request that touches much
  // metadata (a discard of a large range) writes the rest at once and the
  // cache stays near its capacity.
  class DeferEvictions {
   public:
    static constexpr int kBudget = 16;
    DeferEvictions();
    ~DeferEvictions();
    DeferEvictions(const DeferEvictions&) = delete;
    DeferEvictions& operator=(const DeferEvictions&) = delete;
    static bool Active();
    // Takes one recording from the budget of the installation in force:
    // false if there is none, or it is spent.
    static bool Spend();

   private:
    DeferEvictions* const saved_;
    int left_ = kBudget;
  };

  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) override {
    return base_->ReadAt(offset, buf);
  }
  absl::Status ReadvAt(uint64_t offset, absl::Span<const iovec> iov) override {
    return base_->ReadvAt(offset, iov);
  }
  absl::Status WriteAt(uint64_t offset,
                       absl::Span<const uint8_t> data) override;
  absl::Status Flush() override;
  absl::StatusOr<uint64_t> Size() override { return base_->Size(); }
  absl::Status Truncate(uint64_t size) override;
  absl::Status Extend(uint64_t old_size, uint64_t new_size) override;
  absl::Status Allocate(uint64_t offset, uint64_t len) override;
  absl::Status WriteZeroes(uint64_t offset, uint64_t len) override;
  absl::Status Discard(uint64_t offset, uint64_t len) override;
  absl::StatusOr<bool> DataRun(uint64_t offset, uint64_t max_len,
                               uint64_t* len) override {
    return base_->DataRun(offset, max_len, len);
  }
  const std::string& name() const override { return base_->name(); }
  uint32_t alignment() const override { return base_->alignment(); }

 private:
  struct Item {
    enum Kind : uint8_t { kWrite, kFlush, kEvent } kind;
    uint64_t offset = 0;
    std::vector<uint8_t> data;  // kWrite
    std::string event;          // kEvent
  };
  struct Log {
    uint64_t seq = 0;
    std::vector<Item> items;
    std::vector<std::shared_ptr<const void>> pins;
  };
  class Capture;

  // Writes the queued logs up to `ticket` once no other thread is
  // writing; mu_ is let go around the I/O.
  absl::Status WriteQueued(uint64_t ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before an operation outside a recording: the queued logs are written.
  absl::Status Settle();
  // Flushes flush_first_ (if any), then the base.
  absl::Status FlushBase();
  // Carries out one log's items on the base file.
  absl::Status Replay(const Log& log);

  File* const base_;
  File* flush_first_ = nullptr;
  // The log being recorded (owner's lock only).
  std::unique_ptr<Log> recording_;
  bool armed_ = false;  // a RecordScope's log begins at the next write
  std::unique_ptr<Capture> capture_;

  mutable Mutex mu_;
  CondVar cv_;
  // Recorded, not yet written.
  std::deque<std::unique_ptr<Log>> queue_ ABSL_GUARDED_BY(mu_);
  // Written under mu_ and the owner's lock, so either may read it (not
  // annotated: the owner's lock is not one this class can name).
  uint64_t next_seq_ = 1;
  // Every log up to this one is written.
  uint64_t written_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool replaying_ ABSL_GUARDED_BY(mu_) = false;  // a thread writes logs
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_META_WRITE_BACK_FILE_H_
