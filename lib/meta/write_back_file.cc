// SPDX-License-Identifier: Apache-2.0
#include "lib/meta/write_back_file.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lib/base/events.h"

namespace qcow2::internal {

// Keeps the events emitted while recording in the log, in order with its
// writes.
class WriteBackFile::Capture : public EventCapture {
 public:
  explicit Capture(WriteBackFile* file) : file_(file) {}
  void Captured(std::string_view event) override {
    Item item{Item::kEvent};
    item.event = std::string(event);
    file_->recording_->items.push_back(std::move(item));
  }
  EventCapture* saved = nullptr;

 private:
  WriteBackFile* const file_;
};

WriteBackFile::WriteBackFile(File* base) : base_(base) {}

WriteBackFile::~WriteBackFile() {
  if (capture_ != nullptr) SetThreadEventCapture(capture_->saved);
}

void WriteBackFile::BeginRecord() {
  recording_ = std::make_unique<Log>();
  capture_ = std::make_unique<Capture>(this);
  capture_->saved = SetThreadEventCapture(capture_.get());
}

uint64_t WriteBackFile::EndRecord() {
  SetThreadEventCapture(capture_->saved);
  capture_.reset();
  std::unique_ptr<Log> log = std::move(recording_);
  const bool io =
      std::any_of(log->items.begin(), log->items.end(),
                  [](const Item& i) { return i.kind != Item::kEvent; });
  if (!io) {
    // Events alone: nothing to write, so nothing to wait for. They happen
    // now.
    for (const Item& item : log->items) EmitEvent(item.event);
    log->items.clear();
  }
  MutexLock lock(&mu_);
  if (!log->items.empty()) {
    log->seq = next_seq_++;
    queue_.push_back(std::move(log));
  }
  return next_seq_ - 1;
}

void WriteBackFile::Pin(std::shared_ptr<const void> pin) {
  if (recording_ != nullptr) recording_->pins.push_back(std::move(pin));
}

size_t WriteBackFile::queued() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

namespace {
thread_local WriteBackFile::DeferEvictions* t_defer_evictions = nullptr;
}  // namespace

WriteBackFile::DeferEvictions::DeferEvictions() : saved_(t_defer_evictions) {
  t_defer_evictions = this;
}

WriteBackFile::DeferEvictions::~DeferEvictions() { t_defer_evictions = saved_; }

bool WriteBackFile::DeferEvictions::Active() {
  return t_defer_evictions != nullptr;
}

bool WriteBackFile::DeferEvictions::Spend() {
  DeferEvictions* d = t_defer_evictions;
  if (d == nullptr || d->left_ == 0) return false;
  --d->left_;
  return true;
}

absl::Status WriteBackFile::WriteBack(uint64_t ticket) {
  MutexLock lock(&mu_);
  return WriteQueued(ticket);
}

WriteBackFile::RecordScope::RecordScope(WriteBackFile* file)
    : file_(file != nullptr && !file->recording() &&
                    DeferEvictions::Spend()
                ? file
                : nullptr) {
  if (file_ != nullptr) file_->armed_ = true;
}

WriteBackFile::RecordScope::~RecordScope() {
  if (file_ == nullptr) return;
  file_->armed_ = false;
  if (file_->recording_ != nullptr) file_->EndRecord();
}

bool WriteBackFile::Written(uint64_t ticket) const {
  MutexLock lock(&mu_);
  return written_seq_ >= ticket;
}

absl::Status WriteBackFile::WriteQueued(uint64_t ticket) {
  while (written_seq_ < ticket) {
    if (replaying_) {
      cv_.Wait(&mu_);
      continue;
    }
    // Logs are popped only here, by the one thread replaying, so the
    // pointers stay valid while the lock is released.
    std::vector<const Log*> batch;
    for (const auto& log : queue_) {
      if (log->seq > ticket) break;
      batch.push_back(log.get());
    }
    replaying_ = true;
    mu_.Unlock();
    absl::Status s;
    size_t done = 0;
    for (const Log* log : batch) {
      s = Replay(*log);
      if (!s.ok()) break;
      ++done;
    }
    mu_.Lock();
    replaying_ = false;
    for (size_t i = 0; i < done; ++i) {
      written_seq_ = queue_.front()->seq;
      queue_.pop_front();
    }
    cv_.SignalAll();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status WriteBackFile::Replay(const Log& log) {
  for (const Item& item : log.items) {
    switch (item.kind) {
      case Item::kEvent:
        EmitEvent(item.event);
        break;
      case Item::kWrite:
        if (absl::Status s = base_->WriteAt(item.offset, item.data); !s.ok()) {
          return absl::Status(
              s.code(), absl::StrCat("writing metadata back at ", item.offset,
                                     ": ", s.message()));
        }
        break;
      case Item::kFlush:
        if (absl::Status s = FlushBase(); !s.ok()) return s;
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status WriteBackFile::Settle() {
  if (recording_ != nullptr) {
    return absl::InternalError(
        absl::StrCat(name(),
                     ": an operation other than a write or a flush while a "
                     "metadata write-back is recorded"));
  }
  MutexLock lock(&mu_);
  return WriteQueued(next_seq_ - 1);
}

absl::Status WriteBackFile::WriteAt(uint64_t offset,
                                    absl::Span<const uint8_t> data) {
  if (armed_ && recording_ == nullptr) BeginRecord();
  if (recording_ != nullptr) {
    Item item{Item::kWrite};
    item.offset = offset;
    item.data.assign(data.begin(), data.end());
    recording_->items.push_back(std::move(item));
    return absl::OkStatus();
  }
  if (absl::Status s = Settle(); !s.ok()) return s;
  return base_->WriteAt(offset, data);
}

absl::Status WriteBackFile::Flush() {
  if (armed_ && recording_ == nullptr) BeginRecord();
  if (recording_ != nullptr) {
    recording_->items.push_back(Item{Item::kFlush});
    return absl::OkStatus();
  }
  if (absl::Status s = Settle(); !s.ok()) return s;
  return FlushBase();
}

absl::Status WriteBackFile::FlushBase() {
  // The data file first: metadata written after this flush (an L2 entry)
  // may point at data written before it.
  if (flush_first_ != nullptr) {
    if (absl::Status s = flush_first_->Flush(); !s.ok()) return s;
  }
  return base_->Flush();
}

absl::Status WriteBackFile::Truncate(uint64_t size) {
  if (absl::Status s = Settle(); !s.ok()) return s;
  return base_->Truncate(size);
}

absl::Status WriteBackFile::Extend(uint64_t old_size, uint64_t new_size) {
  if (absl::Status s = Settle(); !s.ok()) return s;
  return base_->Extend(old_size, new_size);
}

absl::Status WriteBackFile::Allocate(uint64_t offset, uint64_t len) {
  if (absl::Status s = Settle(); !s.ok()) return s;
  return base_->Allocate(offset, len);
}

absl::Status WriteBackFile::WriteZeroes(uint64_t offset, uint64_t len) {
  if (absl::Status s = Settle(); !s.ok()) return s;
  return base_->WriteZeroes(offset, len);
}

absl::Status WriteBackFile::Discard(uint64_t offset, uint64_t len) {
  // No wait: only clusters freed and out of quarantine are discarded. The
  // caches dropped their entries when they were freed, and the flush that
  // let them out wrote every log recorded before that.
  return base_->Discard(offset, len);
}

}  // namespace qcow2::internal
