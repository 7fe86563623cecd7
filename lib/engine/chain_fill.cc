// The request engine's fill stage and flush recording: pending clusters
// (deferred copy-on-write) filled with no lock held, for a flush or for a
// request that holds them whole, and a flush's metadata write-back
// recorded once for every flush that waits meanwhile (group commit).
#include <mutex>
#include <utility>

#include "lib/chain/chain.h"
#include "lib/meta/eviction_scope.h"
#include "lib/qcow2/qcow2_layer.h"
#include "lib/base/events.h"

namespace qcow2::internal {

bool Chain::PlanFillRound(Request* r, Qcow2Layer* top) {
  if (!top->HasPendingIn(r->offset, r->len)) return false;
  if (filling_ != nullptr) {
    // One fill at a time, and the one in flight may be filling clusters
    // of r's (a flush fills those of a request granted them whole): r
    // waits for it, which runs at once on its executor's thread.
    fill_waiters_.push_back(r);
    r->parked = true;
    return true;
  }
  PlanDeferringMisses(r, [&] {
    return top->PlanFillsFor(r->offset, r->len, &r->plan);
  });
  if (!r->status.ok() || r->miss_cache != nullptr || r->parked) return true;
  if (!r->plan.HasWork()) return false;  // nothing to fill: plan r itself
  r->filling = true;
  filling_ = r;
  return true;
}

void Chain::PlanFill(Request* r, Qcow2Layer* top) {
  r->filled = true;
  const uint32_t cbits = LockClusterBits();
  const uint32_t ubits = LockUnitBits();
  const uint64_t per_cluster = uint64_t{1} << (cbits - ubits);
  absl::Status s;
  for (uint64_t cluster : top->PendingClusters()) {
    const uint64_t first = cluster * per_cluster;
    const uint64_t last = first + per_cluster - 1;
    // A request granted the whole cluster (a write, write-zeroes or
    // discard, not planned yet or reading a deferred miss) keeps it: no
    // hold is needed, and when it plans it waits for this fill
    // (PlanFillRound). Requests holding bytes of it (reads, and writes
    // into its units, whose bytes the fill writes again) do not mind.
    bool held_whole = false;
    for (const Request* other : lock_list_) {
      if (other->lock_granted && !other->lock_fine &&
          other->kind != Request::kFlush && other->lock_first <= last &&
          first <= other->lock_last) {
        held_whole = true;
        break;
      }
    }
    const size_t commits_before = r->plan.commits.size();
    s = top->PlanFill(cluster, &r->plan);
    if (!s.ok()) break;
    if (held_whole) continue;
    if (r->plan.commits.size() == commits_before) continue;  // not pending
    // Held from now on: later requests on the cluster wait for the fill.
    // Adjacent clusters share one hold.
    if (!r->fill_locks.empty() &&
        r->fill_locks.back()->lock_last + 1 == first) {
      r->fill_locks.back()->lock_last = last;
      continue;
    }
    auto hold = std::make_unique<Request>();
    hold->kind = Request::kFlush;
    hold->lock_first = first;
    hold->lock_last = last;
    hold->lock_granted = true;  // never waits (see chain.h)
    // Shared, as a read's: it keeps writes off the cluster, not reads,
    // which read what the pending cluster maps until the fill commits.
    hold->lock_shared = true;
    hold->in_lock_list = true;
    lock_list_.push_back(hold.get());
    r->fill_locks.push_back(std::move(hold));
  }
  if (!s.ok()) {
    r->status = std::move(s);
    EndFill(r);  // undoes the fills planned so far
    return;
  }
  if (r->plan.commits.empty()) return;
  if (r->plan.reads.empty() && r->plan.writes.empty()) {
    // Nothing to copy or write again (the uncovered units of a fresh
    // cluster known to read as zeros, say): commit now.
    EndFill(r);
    return;
  }
  r->filling = true;
  filling_ = r;
}

void Chain::EndFill(Request* r) {
  // What the commits write out (a cache written before a new dependency)
  // goes into a log for the request's executor, written before its own
  // I/O (the flush proper, or the write the fill was for).
  WriteBackFile* const meta = TopWriteBack();
  EvictionScope evictions(meta, r);
  WriteBackFile::RecordScope record(
      r->status.ok() && !r->plan.commits.empty() ? meta : nullptr);
  if (r->status.ok()) {
    for (auto& commit : r->plan.commits) {
      // Each commit ends its own cluster's fill: run them all.
      if (absl::Status s = commit(); !s.ok() && r->status.ok()) {
        Qcow2Layer* top = top_qcow2();
        r->status = top != nullptr ? top->Fail(std::move(s)) : s;
      }
    }
  } else {
    for (auto& abort : r->plan.aborts) abort();
    // As a failed fill under the lock would: kDataLoss marks the image.
    if (Qcow2Layer* top = top_qcow2()) r->status = top->Fail(r->status);
  }
  r->plan.Clear();
  for (auto& hold : r->fill_locks) lock_list_.remove(hold.get());
  const bool held = !r->fill_locks.empty();
  r->fill_locks.clear();
  if (held) GrantWaiters();
  if (filling_ == r) {
    filling_ = nullptr;
    for (Request* w : fill_waiters_) w->waiter->Wake(w);
    fill_waiters_.clear();
  }
  r->filling = false;
}

void Chain::FinishFill(Request* r) {
  std::lock_guard<std::mutex> lock(mu_);
  UnderLockScope under_lock;
  StatsScope scope(&r->stats);
  EndFill(r);
  if (!r->status.ok()) return;
  if (closed_) {
    r->status = ClosedError();
    return;
  }
  PlanLocked(r);  // the flush proper
}

void Chain::RecordFlush(Request* r) {
  r->record_flush = false;
  std::unique_lock<std::mutex> lock(mu_);
  UnderLockScope under_lock;
  StatsScope scope(&r->stats);
  Qcow2Layer* top = top_qcow2();
  if (top == nullptr) return;
  for (;;) {
    if (flushes_recorded_ > r->flush_arrival) {
      // Another flush recorded the caches after this one came in: its
      // log holds every metadata change this one must make durable.
      // Wait for that log to be written, then flush the file.
      r->write_back_file = top->meta_file();
      r->write_back_ticket = covering_ticket_;
      r->flush_generation = covering_generation_;
      return;
    }
    if (!flush_recording_) break;
    // Another flush is writing its log: its successor records once, for
    // every flush waiting meanwhile.
    EmitEvent("flush-wait");
    flush_recorded_cv_.wait(lock);
  }
  absl::StatusOr<Qcow2Layer::FlushTicket> t = top->BeginFlush();
  if (!t.ok()) {
    r->status = t.status();
    return;
  }
  ++flushes_recorded_;
  covering_ticket_ = t->write_back;
  covering_generation_ = t->generation;
  r->flush_generation = t->generation;
  if (t->write_back == 0) return;  // nothing recorded (read-only, closed)
  flush_recording_ = true;
  WriteBackFile* meta = top->meta_file();
  lock.unlock();
  under_lock.Pause();
  r->status = meta->WriteBack(t->write_back);
  under_lock.Resume();
  lock.lock();
  flush_recording_ = false;
  flush_recorded_cv_.notify_all();
}

}  // namespace qcow2::internal
