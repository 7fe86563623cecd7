// SPDX-License-Identifier: Apache-2.0
#include "lib/meta/metadata_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lib/meta/write_back_file.h"
#include "lib/io/io_plan.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

namespace {
thread_local MissDeferral* t_deferral = nullptr;
}  // namespace

MissDeferral::MissDeferral(const IoPlan* plan, bool even_with_work)
    : plan_(plan), even_with_work_(even_with_work), saved_(t_deferral) {
  t_deferral = this;
}

MissDeferral::~MissDeferral() { t_deferral = saved_; }

MissDeferral::Paused::Paused() : saved_(t_deferral) { t_deferral = nullptr; }
MissDeferral::Paused::~Paused() { t_deferral = saved_; }

MissDeferral* MissDeferral::Active() {
  MissDeferral* d = t_deferral;
  if (d == nullptr || d->deferred() || d->even_with_work_) return d;
  return d->plan_->HasWork() ? nullptr : d;
}

MetadataCache::MetadataCache(File* file, uint32_t entry_size, size_t capacity,
                             std::string what)
    : file_(file),
      write_back_(dynamic_cast<WriteBackFile*>(file)),
      read_file_(write_back_ != nullptr ? write_back_->base() : file),
      entry_size_(entry_size),
      capacity_(capacity < 4 ? 4 : capacity),
      what_(std::move(what)) {}

MetadataCache::Handle MetadataCache::Insert(uint64_t offset) {
  auto e = std::make_shared<Entry>();
  e->offset = offset;
  e->data.resize(entry_size_);
  lru_.push_front(offset);
  map_[offset] = Slot{e, lru_.begin()};
  return e;
}

absl::StatusOr<MetadataCache::Handle> MetadataCache::Get(uint64_t offset,
                                                         bool may_defer) {
  auto it = map_.find(offset);
  if (it != map_.end()) {
    // Already the most recent (a run of look-ups of one entry): no move.
    if (it->second.lru != lru_.begin()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
    }
    return it->second.entry;
  }
  if (may_defer) {
    if (MissDeferral* d = MissDeferral::Active()) {
      d->cache = this;
      d->offset = offset;
      d->read_start = offset;
      d->read_len = entry_size_;
      if (readahead_ > entry_size_ &&
          capacity_ >= 4 * size_t{readahead_ / entry_size_}) {
        d->read_start = offset / readahead_ * readahead_;
        d->read_len = readahead_;
      }
      d->epoch = epoch_;
      return absl::UnavailableError(
          absl::StrCat(what_, " at ", offset, " is not cached (deferred)"));
    }
  }
  RETURN_IF_ERROR(MakeRoom());
  Handle e = Insert(offset);
  if (read_counter_ != nullptr) CountMetadata(read_counter_, entry_size_);
  absl::Status s = file_->ReadAt(offset, absl::MakeSpan(e->data));
  if (!s.ok()) {
    lru_.erase(map_[offset].lru);
    map_.erase(offset);
    return absl::Status(s.code(), absl::StrCat("reading ", what_, " at ",
                                               offset, ": ", s.message()));
  }
  return e;
}

absl::StatusOr<MetadataCache::Handle> MetadataCache::InsertLoaded(
    uint64_t start, uint64_t want, uint64_t epoch,
    absl::Span<const uint8_t> data) {
  if (read_counter_ != nullptr) CountMetadata(read_counter_, data.size());
  if (epoch != epoch_ || data.size() % entry_size_ != 0 || want < start ||
      want - start >= data.size()) {
    auto it = map_.find(want);
    return it != map_.end() ? it->second.entry : Handle();
  }
  Handle wanted;
  // The wanted entry last, so that it is the most recently used.
  const uint64_t n = data.size() / entry_size_;
  const uint64_t w = (want - start) / entry_size_;
  for (uint64_t k = 1; k <= n; ++k) {
    const uint64_t i = (w + k) % n;
    const uint64_t offset = start + i * entry_size_;
    auto it = map_.find(offset);
    if (it != map_.end()) {
      if (i == w) {
        lru_.splice(lru_.begin(), lru_, it->second.lru);
        wanted = it->second.entry;
      }
      continue;
    }
    RETURN_IF_ERROR(MakeRoom());
    // MakeRoom may have written an entry back: another offset, so the
    // bytes read are still those on disk.
    Handle e = Insert(offset);
    const auto from = data.begin() + static_cast<ptrdiff_t>(i * entry_size_);
    std::copy(from, from + entry_size_, e->data.begin());
    if (i == w) wanted = std::move(e);
  }
  return wanted;
}

absl::StatusOr<MetadataCache::Handle> MetadataCache::GetNew(uint64_t offset) {
  ++epoch_;
  auto it = map_.find(offset);
  if (it != map_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    std::fill(it->second.entry->data.begin(), it->second.entry->data.end(), 0);
    it->second.entry->MarkAllDirty();
    return it->second.entry;
  }
  RETURN_IF_ERROR(MakeRoom());
  Handle e = Insert(offset);
  e->MarkAllDirty();
  return e;
}

absl::Status MetadataCache::MakeRoom() {
  if (map_.size() < capacity_) return absl::OkStatus();
  // A dirty entry met on the way is recorded for the request's executor to
  // write without the lock (it stays pinned, and cached, until then), and
  // the walk goes on for a clean one, when the engine allows it. While the
  // file records already (a flush, a new L2 table), the same: an entry
  // written into a log that is not on disk yet must stay cached.
  const bool outer = write_back_ != nullptr && write_back_->recording();
  const bool defer = write_back_ != nullptr && !outer &&
                     WriteBackFile::DeferEvictions::Spend();
  bool recording = false;
  absl::Status s;
  // Walk from the least recently used end; skip pinned entries.
  auto it = lru_.end();
  while (it != lru_.begin()) {
    --it;
    Slot& slot = map_[*it];
    if (slot.entry.use_count() > 1) continue;
    if (slot.entry->dirty) {
      if (defer || outer) {
        if (defer && !recording) {
          write_back_->BeginRecord();
          recording = true;
        }
        s = WriteEntry(slot.entry);  // pins it: skipped from now on
        if (!s.ok()) break;
        continue;
      }
      s = WriteEntry(slot.entry);
      if (!s.ok()) break;
    }
    map_.erase(*it);
    lru_.erase(it);
    break;
  }
  if (recording) write_back_->EndRecord();
  // Everything pinned: the cache grows past its capacity for now.
  return s;
}

absl::Status MetadataCache::FlushDependencies() {
  if (depends_on_ != nullptr) {
    // Forget the dependency only once it is met: after an I/O error the
    // next attempt must honour it again.
    RETURN_IF_ERROR(depends_on_->Flush());
    depends_on_ = nullptr;
    depends_on_flush_ = true;
  }
  if (depends_on_flush_) {
    CountMetadata(&IoStats::host_flushes, 1);
    RETURN_IF_ERROR(file_->Flush());
    depends_on_flush_ = false;
  }
  return absl::OkStatus();
}

absl::Status MetadataCache::WriteEntry(const Handle& handle) {
  RETURN_IF_ERROR(FlushDependencies());
  Entry& e = *handle;
  ++epoch_;
  // Only the changed bytes, in whole aligned blocks; the rest of the entry
  // on disk already equals the cache.
  const uint32_t align = std::min(kWriteAlign, entry_size_);  // powers of 2
  const uint32_t begin = static_cast<uint32_t>(AlignDown(e.dirty_begin, align));
  const uint32_t end = static_cast<uint32_t>(AlignUp(e.dirty_end, align));
  if (write_hook_) write_hook_(e.offset + begin, end - begin);
  if (write_counter_ != nullptr) CountMetadata(write_counter_, end - begin);
  absl::Status s = file_->WriteAt(
      e.offset + begin, absl::MakeConstSpan(e.data).subspan(begin, end - begin));
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("writing ", what_, " at ",
                                               e.offset, ": ", s.message()));
  }
  e.dirty = false;
  // A recorded write is not on disk yet: the entry must not be evicted
  // and read back before it is.
  if (write_back_ != nullptr) write_back_->Pin(handle);
  return absl::OkStatus();
}

absl::Status MetadataCache::Flush() {
  // Write in offset order: the file sees sequential-ish writes.
  std::vector<Handle> dirty;
  for (auto& [offset, slot] : map_) {
    if (slot.entry->dirty) dirty.push_back(slot.entry);
  }
  if (dirty.empty()) {
    // Nothing waits on the dependency; dropping it keeps the graph acyclic
    // (every later change sets its own dependency first).
    depends_on_ = nullptr;
  } else {
    std::sort(dirty.begin(), dirty.end(), [](const Handle& a, const Handle& b) {
      return a->offset < b->offset;
    });
    for (const Handle& e : dirty) RETURN_IF_ERROR(WriteEntry(e));
  }
  return flush_tail_ ? flush_tail_() : absl::OkStatus();
}

absl::Status MetadataCache::SetDependency(MetadataCache* other) {
  if (other == this || depends_on_ == other) return absl::OkStatus();
  // Keep the dependency graph a single edge: a cache that itself waits on
  // another is written out now, so no cycle can form. While a request is
  // planned (DeferEvictions) that write-back is recorded instead, for its
  // executor to write with no lock held: entries stay pinned until then,
  // and every later metadata write goes after it.
  const bool must_write = other->depends_on_ != nullptr ||
                          depends_on_ != nullptr;
  const bool record = must_write && write_back_ != nullptr &&
                      !write_back_->recording() &&
                      WriteBackFile::DeferEvictions::Spend();
  if (record) write_back_->BeginRecord();
  absl::Status s;
  if (other->depends_on_ != nullptr) s = other->Flush();
  if (s.ok() && depends_on_ != nullptr) s = Flush();
  if (record) write_back_->EndRecord();
  RETURN_IF_ERROR(s);
  depends_on_ = other;
  return absl::OkStatus();
}

void MetadataCache::Invalidate(uint64_t offset, uint64_t len) {
  ++epoch_;
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (*it >= offset && *it < offset + len) {
      map_.erase(*it);
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
}

void MetadataCache::Clear() {
  ++epoch_;
  map_.clear();
  lru_.clear();
  depends_on_ = nullptr;
  depends_on_flush_ = false;
}

bool MetadataCache::HasDirty() const {
  for (const auto& [offset, slot] : map_) {
    if (slot.entry->dirty) return true;
  }
  return false;
}

}  // namespace qcow2::internal
