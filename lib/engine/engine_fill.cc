// SPDX-License-Identifier: Apache-2.0
// The request engine's fill stage and flush recording: pending clusters
// (deferred copy-on-write) filled with no lock held, for a flush or for a
// request that holds them whole, and a flush's metadata write-back
// recorded once for every flush that waits meanwhile (group commit).
#include <utility>

#include "lib/engine/engine.h"
#include "lib/meta/eviction_scope.h"
#include "lib/driver/qcow2_layer.h"

namespace qcow2::internal {

bool Engine::PlanFillRound(Request* r, Qcow2Layer* top) {
  if (!top->pending().HasPendingIn(r->offset, r->len)) return false;
  if (filling_ != nullptr) {
    // One fill at a time, and the one in flight may be filling clusters
    // of r's (a flush fills those of a request granted them whole): r
    // waits for it, which runs at once on its executor's thread.
    fill_waiters_.push_back(r);
    r->parked = true;
    return true;
  }
  PlanDeferringMisses(r, [&] {
    return top->pending().PlanFillsFor(r->offset, r->len, &r->plan);
  });
  if (!r->status.ok() || r->miss.cache != nullptr || r->parked) return true;
  if (!r->plan.HasWork()) return false;  // nothing to fill: plan r itself
  r->fill.active = true;
  filling_ = r;
  return true;
}

void Engine::PlanFill(Request* r, Qcow2Layer* top) {
  r->fill.done = true;
  const uint64_t per_cluster = uint64_t{1}
                               << (locks_.cluster_bits() - locks_.unit_bits());
  absl::Status s;
  for (uint64_t cluster : top->pending().Clusters()) {
    const uint64_t first = cluster * per_cluster;
    const uint64_t last = first + per_cluster - 1;
    // A request granted the whole cluster (a write, write-zeroes or
    // discard, not planned yet or reading a deferred miss) keeps it: no
    // hold is needed, and when it plans it waits for this fill
    // (PlanFillRound). Requests holding bytes of it (reads, and writes
    // into its units, whose bytes the fill writes again) do not mind.
    const bool held_whole = locks_.HeldWhole(first, last);
    const size_t commits_before = r->plan.commits.size();
    s = top->pending().PlanFill(cluster, &r->plan);
    if (!s.ok()) break;
    if (held_whole) continue;
    if (r->plan.commits.size() == commits_before) continue;  // not pending
    // Held from now on: later requests on the cluster wait for the fill.
    // Adjacent clusters share one hold.
    if (!r->fill.holds.empty() && r->fill.holds.back()->lock.last + 1 == first) {
      locks_.SetLast(r->fill.holds.back().get(), last);
      continue;
    }
    auto hold = std::make_unique<Request>();
    hold->kind = Request::Kind::kFlush;
    hold->lock.first = first;
    hold->lock.last = last;
    hold->lock.granted = true;  // never waits
    // Shared, as a read's: it keeps writes off the cluster, not reads,
    // which read what the pending cluster maps until the fill commits.
    hold->lock.shared = true;
    locks_.Add(hold.get());
    r->fill.holds.push_back(std::move(hold));
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
  r->fill.active = true;
  filling_ = r;
}

void Engine::EndFill(Request* r) {
  // What the commits write out (a cache written before a new dependency)
  // goes into a log for the request's executor, written before its own
  // I/O (the flush proper, or the write the fill was for).
  WriteBackFile* const meta = chain_->TopWriteBack();
  EvictionScope evictions(meta, &r->write_back.ticket, &r->write_back.file);
  WriteBackFile::RecordScope record(
      r->status.ok() && !r->plan.commits.empty() ? meta : nullptr);
  Qcow2Layer* top = chain_->top_qcow2();
  if (r->status.ok()) {
    for (auto& commit : r->plan.commits) {
      // Each commit ends its own cluster's fill: run them all.
      if (absl::Status s = commit(); !s.ok() && r->status.ok()) {
        r->status = top != nullptr ? top->header_writer().Fail(std::move(s)) : s;
      }
    }
  } else {
    for (auto& abort : r->plan.aborts) abort();
    // As a failed fill under the lock would: kDataLoss marks the image.
    if (top != nullptr) r->status = top->header_writer().Fail(r->status);
  }
  r->plan.Clear();
  for (auto& hold : r->fill.holds) locks_.Remove(hold.get(), /*grant=*/false);
  const bool held = !r->fill.holds.empty();
  r->fill.holds.clear();
  if (held) locks_.GrantWaiters();
  if (filling_ == r) {
    filling_ = nullptr;
    for (Request* w : fill_waiters_) w->waiter->Wake(w);
    fill_waiters_.clear();
  }
  r->fill.active = false;
}

void Engine::FinishFill(Request* r) {
  EngineLock lock(&mu_);
  StatsScope scope(&r->stats);
  EndFill(r);
  if (!r->status.ok()) return;
  if (chain_->closed()) {
    r->status = chain_->ClosedError();
    return;
  }
  PlanLocked(r);  // the flush proper, or the request the fill was for
}

void Engine::RecordFlush(Request* r) {
  r->flush.record = false;
  EngineLock lock(&mu_);
  StatsScope scope(&r->stats);
  Qcow2Layer* top = chain_->top_qcow2();
  if (top == nullptr) return;
  flushes_.Record(r, top, &mu_);
}

}  // namespace qcow2::internal
