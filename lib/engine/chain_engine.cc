// The request engine on a chain: guest-cluster range locks taken in
// arrival order, planning under the metadata lock, commit or abort after
// the I/O, and the synchronous API as requests run on the calling thread.
#include <condition_variable>
#include <mutex>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "lib/meta/metadata_cache.h"
#include "lib/chain/chain.h"
#include "lib/meta/eviction_scope.h"
#include "lib/qcow2/qcow2_layer.h"
#include "lib/base/events.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

namespace {

// Wakes a thread blocked in RunSync.
class SyncWaiter : public Waiter {
 public:
  void Wake(Request*) override {
    std::lock_guard<std::mutex> lock(mu_);
    woken_ = true;
    cv_.notify_one();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return woken_; });
    woken_ = false;  // a request may wait more than once
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool woken_ = false;
};


}  // namespace

WriteBackFile* Chain::TopWriteBack() {
  Qcow2Layer* top = top_qcow2();
  return top != nullptr && writable_ ? top->meta_file() : nullptr;
}

absl::Status Chain::ClosedError() const {
  return absl::FailedPreconditionError(
      absl::StrCat(layers_[0]->filename(), ": image is closed"));
}

absl::Status Chain::Validate(const Request& r) const {
  std::lock_guard<std::mutex> lock(mu_);
  UnderLockScope under_lock;
  if (closed_) return ClosedError();
  if (r.kind == Request::kFlush) return absl::OkStatus();
  if (r.kind != Request::kRead) RETURN_IF_ERROR(CheckWritable());
  return CheckRange(r.offset, r.len);
}

bool Chain::Conflicts(const Request* a, const Request* b) const {
  if (a->lock_shared && b->lock_shared) return false;
  return a->lock_first <= b->lock_last && b->lock_first <= a->lock_last;
}

bool Chain::CanGrant(const Request* r) const {
  bool before = true;
  for (const Request* other : lock_list_) {
    if (other == r) {
      before = false;
      continue;
    }
    // Later requests normally wait behind r; one may hold a range that
    // overlaps r's only if r widened its range after it was granted.
    if ((before || other->lock_granted) && Conflicts(other, r)) return false;
  }
  return true;
}

uint32_t Chain::LockClusterBits() const {
  const auto* top = dynamic_cast<const Qcow2Layer*>(layers_[0].get());
  return top != nullptr ? top->geometry().cluster_bits : 16;
}

uint32_t Chain::LockUnitBits() const {
  return std::min(LockClusterBits(), Qcow2Layer::kFineLockBits);
}

void Chain::SetLockRange(Request* r, bool fine) const {
  const uint32_t cbits = LockClusterBits();
  const uint32_t ubits = LockUnitBits();
  const uint64_t last_byte = r->offset + r->len - 1;
  r->lock_fine = fine;
  if (fine) {
    r->lock_first = r->offset >> ubits;
    r->lock_last = last_byte >> ubits;
  } else {
    r->lock_first = (r->offset >> cbits) << (cbits - ubits);
    r->lock_last = (((last_byte >> cbits) + 1) << (cbits - ubits)) - 1;
  }
}

bool Chain::WidenLock(Request* r) {
  SetLockRange(r, false);
  r->lock_granted = CanGrant(r);
  if (r->lock_granted) return true;
  r->parked = true;
  // r gave up what it held: earlier requests that waited only for it
  // (they could not go on while a later request held an overlapping
  // range) may go on now, and r waits for them.
  GrantWaiters();
  return false;
}

bool Chain::Begin(Request* r) {
  std::lock_guard<std::mutex> lock(mu_);
  UnderLockScope under_lock;
  StatsScope scope(&r->stats);
  if (closed_) {
    r->status = ClosedError();
    return true;
  }
  if (r->kind != Request::kFlush) {
    absl::Status s = r->kind == Request::kRead ? absl::OkStatus()
                                               : CheckWritable();
    if (s.ok()) s = CheckRange(r->offset, r->len);
    if (!s.ok()) {
      r->status = std::move(s);
      return true;
    }
  }
  // Read-only chains never change: reads need no ordering.
  if (r->kind == Request::kFlush || r->len == 0 || !writable_) {
    PlanLocked(r);
    return true;
  }
  // Reads hold their own bytes: a read never changes metadata, and a
  // request that does holds whole clusters. Writes do when the top allows
  // it (ours in place, or deferred copy-on-write); the rest hold whole
  // clusters. A raw top has no metadata at all.
  Qcow2Layer* top = top_qcow2();
  bool fine = r->kind == Request::kRead || top == nullptr;
  if (r->kind == Request::kWrite && top != nullptr) {
    fine = top->FineWritable(r->offset, r->len, /*stream=*/true);
    top->NoteWriteBegun(r->offset, r->len);
  }
  SetLockRange(r, fine);
  r->lock_shared = r->kind == Request::kRead;
  lock_list_.push_back(r);
  r->in_lock_list = true;
  if (!CanGrant(r)) return false;
  r->lock_granted = true;
  r->fine_just_checked = fine;
  PlanLocked(r);
  r->fine_just_checked = false;
  return true;
}

void Chain::Plan(Request* r) {
  std::lock_guard<std::mutex> lock(mu_);
  UnderLockScope under_lock;
  StatsScope scope(&r->stats);
  PlanLocked(r);
}

void Chain::PlanLocked(Request* r) {
  r->parked = false;
  IoStats& st = r->stats;
  Qcow2Layer* top = top_qcow2();
  if (top != nullptr && r->kind != Request::kRead &&
      r->kind != Request::kFlush) {
    // The first write's header update is written by its own executor,
    // with no lock held: until it is, every write waits for it before
    // its own I/O (clearing the autoclear bits must precede any change).
    if (const uint64_t ticket = top->UnwrittenHeaderTicket(); ticket != 0) {
      r->write_back_file = top->meta_file();
      r->write_back_ticket = std::max(r->write_back_ticket, ticket);
    }
  }
  switch (r->kind) {
    case Request::kRead:
      if (!r->counted) {
        st.guest_read_ops++;
        st.guest_read_bytes += r->len;
      }
      r->counted = true;
      PlanDeferringMisses(r, [&] {
        return PlanRead(0, r->offset, r->rbuf, r->len, &r->plan,
                        IoCategory::kGuestData);
      });
      break;
    case Request::kWrite:
      if (!r->counted) {
        st.guest_write_ops++;
        st.guest_write_bytes += r->len;
      }
      r->counted = true;
      if (r->len == 0) break;
      if (top != nullptr) {
        // What allowed a byte-range lock may have changed while the write
        // waited: then it needs its whole clusters.
        if (r->lock_fine && !r->fine_just_checked &&
            !top->FineWritable(r->offset, r->len, /*stream=*/false) &&
            !WidenLock(r)) {
          break;  // parked until it holds them
        }
        const bool fine = r->lock_fine;
        if (!fine && PlanFillRound(r, top)) break;
        PlanDeferringMisses(r, [&] {
          return top->PlanWrite(r->offset,
                                absl::MakeConstSpan(r->wbuf, r->len),
                                &r->plan, fine, &r->probe);
        });
      } else {
        IoOp op;
        op.file = layers_[0]->file();
        op.offset = r->offset;
        op.guest_bytes = r->len;
        op.Add(r->wbuf, r->len);
        r->plan.writes.push_back(std::move(op));
      }
      break;
    case Request::kWriteZeroes:
    case Request::kDiscard: {
      const bool discard = r->kind == Request::kDiscard;
      if (!r->counted) {
        (discard ? st.guest_discard_ops : st.guest_zero_ops)++;
        (discard ? st.guest_discard_bytes : st.guest_zero_bytes) += r->len;
      }
      r->counted = true;
      if (r->len == 0) break;
      // qcow2: mostly metadata, changed here under the lock (the tables
      // it needs are read first, without it); zero bytes written into
      // part of a cluster are planned, and metadata written out on the
      // way (evictions, a cache written before a free) is recorded, for
      // the executor.
      if (top != nullptr) {
        if (PlanFillRound(r, top)) break;
        PlanDeferringMisses(r, [&] {
          return top->Zero(r->offset, r->len, discard || r->unmap, &r->plan,
                           &r->zero_done, &r->zero_more);
        });
        if (!r->status.ok()) r->zero_more = false;
      } else {
        // A raw file: one zero-range call, run by the executor.
        IoOp op;
        op.file = layers_[0]->file();
        op.offset = r->offset;
        op.bytes = r->len;
        op.zero_range = true;
        r->plan.writes.push_back(std::move(op));
      }
      break;
    }
    case Request::kFlush:
      if (!r->counted) st.guest_flush_ops++;
      r->counted = true;
      if (closed_) {
        r->status = ClosedError();
        break;
      }
      if (!writable_) break;
      if (top != nullptr) {
        // Clusters with deferred copy-on-write get their contents and L2
        // entries first: the executor fills them, then FinishFill plans
        // again. One flush fills at a time; the others wait for it, as
        // the clusters they must see committed may be the ones in flight.
        // (Its executor runs the fill at once, blocking: the wait never
        // depends on a queue being polled.)
        if (!r->filled) {
          if (filling_ != nullptr) {
            fill_waiters_.push_back(r);
            r->parked = true;
            break;
          }
          PlanFill(r, top);
          if (!r->status.ok() || r->filling) break;
        }
        // The metadata write-back is recorded by the executor
        // (RecordFlush): any flush recorded from now on covers this one.
        r->record_flush = true;
        r->flush_arrival = flushes_recorded_;
      }
      r->flush_file = layers_[0]->file();
      break;
  }
}

void Chain::PlanDeferringMisses(Request* r,
                                absl::FunctionRef<absl::Status()> plan) {
  if (r->stale_misses >= kMaxStaleMisses) {
    // The cache keeps changing under this request's reads: read at once.
    r->status = plan();
    r->pinned.clear();
    return;
  }
  // A read's plan holds only reads into its own buffers: it can be
  // dropped at any miss and made again (the entries read for it stay
  // pinned, so each round gets further). A write's may hold allocations.
  MissDeferral deferral(&r->plan, r->kind == Request::kRead);
  absl::Status s;
  {
    WriteBackFile* const meta = TopWriteBack();
    EvictionScope evictions(meta, r);
    // The metadata writes of a change (write-outs for dependencies,
    // evictions, table growth) go into one log for its executor. A log
    // keeps what it writes cached until it is written: write-zeroes and
    // discard, whose ranges have no bound, plan in bounded rounds.
    WriteBackFile::RecordScope record(r->kind == Request::kRead ? nullptr
                                                                : meta);
    s = plan();
  }
  if (!deferral.deferred()) {
    r->status = std::move(s);
    r->pinned.clear();  // the plan holds what it needs
    return;
  }
  // Planning stopped at a metadata miss while the plan was still empty:
  // drop it, and have the executor read the entry with no lock held.
  for (auto& abort : r->plan.aborts) abort();
  r->plan.Clear();
  r->status = absl::OkStatus();
  MetadataCache* cache = deferral.cache;
  auto [it, first] = misses_in_flight_.try_emplace(
      std::pair<const void*, uint64_t>(cache, deferral.read_start));
  if (first) {
    it->second.reader = r->waiter;
  } else if (it->second.reader == r->waiter) {
    // A request of the same queue is reading this: wait for it. (Never
    // for another queue's read: that would make this queue's progress
    // depend on another thread polling, for requests that do not overlap.)
    it->second.parked.push_back(r);
    r->parked = true;
    return;
  }
  r->miss_cache = cache;
  r->miss_epoch = deferral.epoch;
  r->miss_offset = deferral.offset;
  r->miss_op = MissRead(deferral, &r->plan);
}

IoOp Chain::MissRead(const MissDeferral& deferral, IoPlan* buffers) {
  IoOp op;
  op.file = deferral.cache->read_file();
  op.offset = deferral.read_start;
  op.category = IoCategory::kMetadata;
  op.Add(buffers->Buffer(deferral.read_len), deferral.read_len);
  return op;
}

absl::Status Chain::MissReadError(const MetadataCache* cache,
                                  uint64_t offset, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("reading ", cache->what(),
                                             " at ", offset, ": ",
                                             s.message()));
}

void Chain::Grow(Request* r) {
  IoPlan& p = r->plan;
  File* file = std::exchange(p.grow_file, nullptr);
  if (file == nullptr) return;
  absl::Status s = file->Reserve(p.grow_from, p.grow_to - p.grow_from);
  if (s.ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  UnderLockScope under_lock;
  StatsScope scope(&r->stats);
  Qcow2Layer* top = top_qcow2();
  if (top != nullptr) s = top->GrowWithoutReserve(s);
  if (!s.ok() && r->status.ok()) r->status = std::move(s);
}

void Chain::LoadMiss(Request* r) {
  std::lock_guard<std::mutex> lock(mu_);
  UnderLockScope under_lock;
  StatsScope scope(&r->stats);
  MetadataCache* cache = r->miss_cache;
  r->miss_cache = nullptr;
  // Whatever came of the read, those waiting for it plan again (and one of
  // them reads it if it is still missing).
  if (auto node = misses_in_flight_.extract(
          std::pair<const void*, uint64_t>(cache, r->miss_op.offset))) {
    for (Request* w : node.mapped().parked) w->waiter->Wake(w);
  }
  if (!r->status.ok()) {
    r->status = MissReadError(cache, r->miss_offset, r->status);
    return;
  }
  const iovec& v = r->miss_op.iov[0];
  absl::StatusOr<MetadataCache::Handle> entry;
  {
    EvictionScope evictions(TopWriteBack(), r);
    entry = cache->InsertLoaded(
        r->miss_op.offset, r->miss_offset, r->miss_epoch,
        absl::MakeConstSpan(static_cast<const uint8_t*>(v.iov_base),
                            v.iov_len));
  }
  if (!entry.ok()) {
    r->status = entry.status();
    return;
  }
  if (*entry == nullptr) {
    ++r->stale_misses;
  } else {
    r->pinned.push_back(std::move(*entry));
  }
  r->plan.Clear();
  if (closed_) {
    r->status = ClosedError();
    return;
  }
  PlanLocked(r);
}

void Chain::NextRound(Request* r) {
  std::lock_guard<std::mutex> lock(mu_);
  UnderLockScope under_lock;
  StatsScope scope(&r->stats);
  r->zero_more = false;
  if (!r->status.ok()) return;  // Finish abandons the round
  {
    WriteBackFile* const meta = TopWriteBack();
    EvictionScope evictions(meta, r);
    WriteBackFile::RecordScope record(r->plan.commits.empty() ? nullptr
                                                              : meta);
    r->status = RunCommits(r);
  }
  r->plan.Clear();
  r->stale_misses = 0;
  if (r->status.ok() && closed_) r->status = ClosedError();
  if (!r->status.ok()) return;
  PlanLocked(r);
}

absl::Status Chain::RunCommits(Request* r) {
  for (auto& commit : r->plan.commits) {
    absl::Status s = commit();
    if (!s.ok()) {
      // Clusters of the remaining changes leak at worst.
      Qcow2Layer* top = top_qcow2();
      return top != nullptr ? top->Fail(std::move(s)) : s;
    }
  }
  return absl::OkStatus();
}

void Chain::GrantWaiters() {
  for (Request* w : lock_list_) {
    if (w->lock_granted || !CanGrant(w)) continue;
    w->lock_granted = true;
    w->waiter->Wake(w);
  }
}

void Chain::Finish(Request* r) {
  WriteBackFile* meta = nullptr;
  uint64_t ticket = 0;
  Qcow2Layer* top = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    UnderLockScope under_lock;
    FinishLocked(r);
    top = top_qcow2();
    // Metadata written out by the commits (a cache a new dependency
    // needed on disk first, an eviction) was recorded: written here, with
    // no lock held.
    if (r->commit_write_back != 0) {
      meta = TopWriteBack();
      ticket = r->commit_write_back;
    }
  }
  if (meta != nullptr) {
    StatsScope scope(&r->stats);
    absl::Status s = meta->WriteBack(ticket);
    // The log stays queued and the next flush writes it again.
    if (!s.ok() && r->status.ok()) r->status = std::move(s);
  }
  if (!r->released.empty() && top != nullptr) {
    // Clusters a flush released: their bytes handed back to the file
    // system with no lock held; reusable only after that.
    {
      StatsScope scope(&r->stats);
      top->DiscardReleased(r->released);
    }
    std::lock_guard<std::mutex> lock(mu_);
    UnderLockScope under_lock;
    top->EndDiscard(r->released);
    r->released.clear();
  }
  if (r->owner == nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    UnderLockScope under_lock;
    retired_stats_ += r->stats;
  }
}

void Chain::FinishLocked(Request* r) {
  StatsScope scope(&r->stats);
  if (r->status.ok()) {
    WriteBackFile* const meta = TopWriteBack();
    EvictionScope evictions(meta, &r->commit_write_back);
    // The commits' metadata writes in one log, written after the lock is
    // released (bounded by the request's clusters).
    WriteBackFile::RecordScope record(r->plan.commits.empty() ? nullptr
                                                              : meta);
    r->status = RunCommits(r);
  } else {
    for (auto& abort : r->plan.aborts) abort();
  }
  if (r->kind == Request::kFlush && r->status.ok() && r->flush_file != nullptr) {
    if (Qcow2Layer* top = top_qcow2()) {
      top->FinishFlush(r->flush_generation, &r->released);
    }
  }
  r->pinned.clear();
  if (r->in_lock_list) {
    lock_list_.remove(r);
    r->in_lock_list = false;
    GrantWaiters();
  }
}

absl::Status Chain::RunSync(Request* r) {
  SyncWaiter waiter;
  r->waiter = &waiter;
  if (!Begin(r)) {
    waiter.Wait();
    Plan(r);
  }
  while (true) {
    while (r->miss_cache != nullptr || r->parked) {
      if (r->parked) {
        // Another request reads the entry this one missed.
        waiter.Wait();
        Plan(r);
        continue;
      }
      // A deferred metadata miss: read it with no lock held, plan again.
      r->status = RunOp(r->miss_op, false);
      LoadMiss(r);
    }
    Grow(r);
    if (r->filling) {
      // A fill of pending clusters: its I/O with no lock held. A flush
      // goes on to its write-back; other requests were planned again.
      if (r->status.ok()) r->status = RunPlanIo(r->plan, &r->stats);
      FinishFill(r);
      if (r->kind != Request::kFlush && r->status.ok()) continue;
    }
    if (r->status.ok() && r->record_flush) RecordFlush(r);
    if (r->status.ok() && r->write_back_file != nullptr) {
      r->status = r->write_back_file->WriteBack(r->write_back_ticket);
    }
    if (r->status.ok()) {
      if (r->kind == Request::kFlush) {
        if (r->flush_file != nullptr) {
          r->stats.host_flushes++;
          r->status = r->flush_file->Flush();
        }
      } else {
        r->status = RunPlanIo(r->plan, &r->stats);
      }
    }
    if (!r->zero_more || !r->status.ok()) break;
    NextRound(r);  // a long write-zeroes or discard goes on
    if (!r->status.ok()) break;
  }
  Finish(r);
  r->plan.Clear();
  return r->status;
}

absl::Status Chain::Read(uint64_t offset, absl::Span<uint8_t> buf) {
  Request r;
  r.kind = Request::kRead;
  r.offset = offset;
  r.len = buf.size();
  r.rbuf = buf.data();
  return RunSync(&r);
}

absl::Status Chain::Write(uint64_t offset, absl::Span<const uint8_t> data) {
  Request r;
  r.kind = Request::kWrite;
  r.offset = offset;
  r.len = data.size();
  r.wbuf = data.data();
  return RunSync(&r);
}

absl::Status Chain::WriteZeroes(uint64_t offset, uint64_t len, bool unmap) {
  Request r;
  r.kind = Request::kWriteZeroes;
  r.offset = offset;
  r.len = len;
  r.unmap = unmap;
  return RunSync(&r);
}

absl::Status Chain::Discard(uint64_t offset, uint64_t len) {
  Request r;
  r.kind = Request::kDiscard;
  r.offset = offset;
  r.len = len;
  return RunSync(&r);
}

absl::Status Chain::Flush() {
  Request r;
  r.kind = Request::kFlush;
  return RunSync(&r);
}

void Chain::Register(StatsSource* q) {
  std::lock_guard<std::mutex> lock(mu_);
  UnderLockScope under_lock;
  sources_.push_back(q);
}

void Chain::Unregister(StatsSource* q) {
  std::lock_guard<std::mutex> lock(mu_);
  UnderLockScope under_lock;
  retired_stats_ += q->Snapshot();
  sources_.erase(std::remove(sources_.begin(), sources_.end(), q),
                 sources_.end());
}

IoStats Chain::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  UnderLockScope under_lock;
  IoStats total = retired_stats_;
  for (const StatsSource* q : sources_) total += q->Snapshot();
  return total;
}

}  // namespace qcow2::internal
