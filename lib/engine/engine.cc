// SPDX-License-Identifier: Apache-2.0
// The request engine's steps around planning: taking a guest range in
// arrival order (Begin), reading deferred misses (LoadMiss), growing the
// file (Grow), further rounds (NextRound), and commit or abort (Finish).
#include "lib/engine/engine.h"

#include <algorithm>
#include <utility>

#include "lib/base/status_macros.h"
#include "lib/meta/eviction_scope.h"
#include "lib/meta/metadata_cache.h"
#include "lib/driver/qcow2_layer.h"

namespace qcow2::internal {

void SetLockGeometry(Chain* chain, RangeLockTable* locks) {
  const Qcow2Layer* top = chain->top_qcow2();
  const uint32_t cbits = top != nullptr ? top->header().cluster_bits : 16;
  locks->Regeometry(cbits, std::min(cbits, PendingClusters::kFineLockBits));
}

Engine::Engine(std::unique_ptr<Chain> chain)
    : chain_(std::move(chain)), writable_(chain_->writable()) {
  MutexLock lock(&mu_);
  SetLockGeometry(chain_.get(), &locks_);
  for (int i = 0; i < chain_->length(); ++i) {
    Qcow2Layer* q = chain_->layer(i)->AsQcow2();
    if (q != nullptr && q->luks() != nullptr) encrypted_ = true;
  }
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(
    std::unique_ptr<File> top, const OpenOptions& opts) {
  ASSIGN_OR_RETURN(std::unique_ptr<Chain> chain,
                   Chain::Open(std::move(top), opts));
  return std::unique_ptr<Engine>(new Engine(std::move(chain)));
}

absl::Status Engine::Validate(const Request& r) const {
  EngineLock lock(&mu_);
  return CheckLocked(r);
}

absl::Status Engine::CheckLocked(const Request& r) const {
  if (chain_->closed()) return chain_->ClosedError();
  if (r.is_flush()) return absl::OkStatus();
  if (!r.is_read()) RETURN_IF_ERROR(chain_->CheckWritable());
  if (encrypted_ && ((r.offset | r.len) & 511) != 0) {
    // The cipher works on whole 512-byte sectors (QEMU's request
    // alignment for encrypted qcow2); we do not read-modify-write.
    return absl::InvalidArgumentError(absl::StrCat(
        chain_->layer(0)->filename(), ": request at ", r.offset, " (", r.len,
        " bytes) is not in whole 512-byte sectors, as I/O to a chain with "
        "an encrypted image must be"));
  }
  return chain_->CheckRange(r.offset, r.len);
}

bool Engine::Begin(Request* r, absl::Status* rejected) {
  EngineLock lock(&mu_);
  absl::Status checked = CheckLocked(*r);
  if (!checked.ok() && rejected != nullptr) {
    *rejected = std::move(checked);
    return true;
  }
  ++unfinished_;  // until Finish
  if (!checked.ok()) {
    r->status = std::move(checked);
    return true;
  }
  StatsScope scope(&r->stats);
  if (r->lock.preheld) {
    locks_.SetRange(r, /*fine=*/false);
    r->lock.granted = true;
    PlanLocked(r);
    return true;
  }
  // Read-only chains never change: reads need no ordering.
  if (r->is_flush() || r->len == 0 || !writable_) {
    PlanLocked(r);
    return true;
  }
  // Reads hold their own bytes: a read never changes metadata, and a
  // request that does holds whole clusters. Writes do when the top allows
  // it (ours in place, or deferred copy-on-write); the rest hold whole
  // clusters. A raw top has no metadata at all.
  Qcow2Layer* top = chain_->top_qcow2();
  bool fine = r->is_read() || top == nullptr;
  if (r->kind == Request::Kind::kWrite && top != nullptr) {
    // A vectored write of several segments holds its whole clusters
    // (request.h: Request::segs).
    fine = !r->scattered_write() && !r->compressed &&
           top->pending().FineWritable(r->offset, r->len, /*stream=*/true);
    top->pending().NoteWriteBegun(r->offset, r->len);
  }
  locks_.SetRange(r, fine);
  r->lock.shared = r->is_read();
  locks_.Add(r);
  if (!locks_.CanGrant(r)) return false;
  locks_.Grant(r);
  r->lock.fine_just_checked = fine;
  PlanLocked(r);
  r->lock.fine_just_checked = false;
  return true;
}

void Engine::Plan(Request* r) {
  EngineLock lock(&mu_);
  StatsScope scope(&r->stats);
  PlanLocked(r);
}

void Engine::LoadMiss(Request* r) {
  EngineLock lock(&mu_);
  StatsScope scope(&r->stats);
  MetadataCache* cache = std::exchange(r->miss.cache, nullptr);
  // Whatever came of the read, those waiting for it plan again (and one of
  // them reads it if it is still missing).
  misses_.Release(cache, r->miss.op.offset);
  if (!r->status.ok()) {
    r->status = MissTable::ReadError(cache, r->miss.offset, r->status);
    return;
  }
  const iovec& v = r->miss.op.iov[0];
  absl::StatusOr<MetadataCache::Handle> entry;
  {
    EvictionScope evictions(chain_->TopWriteBack(), &r->write_back.ticket,
                            &r->write_back.file);
    entry = cache->InsertLoaded(
        r->miss.op.offset, r->miss.offset, r->miss.epoch,
        absl::MakeConstSpan(static_cast<const uint8_t*>(v.iov_base),
                            v.iov_len));
  }
  if (!entry.ok()) {
    r->status = entry.status();
    return;
  }
  if (*entry == nullptr) {
    ++r->miss.stale;
  } else {
    r->pinned.push_back(std::move(*entry));
  }
  r->plan.Clear();
  if (chain_->closed()) {
    r->status = chain_->ClosedError();
    return;
  }
  PlanLocked(r);
}

void Engine::NextRound(Request* r) {
  EngineLock lock(&mu_);
  StatsScope scope(&r->stats);
  r->zero_more = false;
  if (!r->status.ok()) return;  // Finish abandons the round
  {
    WriteBackFile* const meta = chain_->TopWriteBack();
    EvictionScope evictions(meta, &r->write_back.ticket, &r->write_back.file);
    WriteBackFile::RecordScope record(r->plan.commits.empty() ? nullptr
                                                              : meta);
    r->status = RunCommits(r);
  }
  r->plan.Clear();
  r->miss.stale = 0;
  if (r->status.ok() && chain_->closed()) r->status = chain_->ClosedError();
  if (!r->status.ok()) return;
  PlanLocked(r);
}

void Engine::Grow(Request* r) {
  IoPlan& p = r->plan;
  File* file = std::exchange(p.grow_file, nullptr);
  if (file == nullptr) return;
  absl::Status s = file->Reserve(p.grow_from, p.grow_to - p.grow_from);
  if (s.ok()) return;
  EngineLock lock(&mu_);
  StatsScope scope(&r->stats);
  if (Qcow2Layer* top = chain_->top_qcow2()) s = top->host_space().GrowWithoutReserve(s);
  if (!s.ok() && r->status.ok()) r->status = std::move(s);
}

absl::Status Engine::RunCommits(Request* r) {
  for (auto& commit : r->plan.commits) {
    absl::Status s = commit();
    if (!s.ok()) {
      // Clusters of the remaining changes leak at worst.
      Qcow2Layer* top = chain_->top_qcow2();
      return top != nullptr ? top->header_writer().Fail(std::move(s)) : s;
    }
  }
  return absl::OkStatus();
}

void Engine::Finish(Request* r) {
  WriteBackFile* meta = nullptr;
  uint64_t ticket = 0;
  Qcow2Layer* top = nullptr;
  bool ended = false;  // RequestEndedLocked ran
  {
    EngineLock lock(&mu_);
    FinishLocked(r);
    top = chain_->top_qcow2();
    // Metadata written out by the commits (a cache a new dependency
    // needed on disk first, an eviction) was recorded: written here, with
    // no lock held.
    if (r->write_back.after_commit != 0) {
      meta = chain_->TopWriteBack();
      ticket = r->write_back.after_commit;
    }
    if (meta == nullptr && (r->flush.released.empty() || top == nullptr)) {
      RequestEndedLocked();  // nothing left to write
      ended = true;
    }
  }
  if (meta != nullptr) {
    StatsScope scope(&r->stats);
    absl::Status s = meta->WriteBack(ticket);
    // The log stays queued and the next flush writes it again.
    if (!s.ok() && r->status.ok()) r->status = std::move(s);
  }
  if (!r->flush.released.empty() && top != nullptr) {
    // Clusters a flush released: their bytes handed back to the file
    // system with no lock held; reusable only after that.
    {
      StatsScope scope(&r->stats);
      top->flusher().DiscardReleased(r->flush.released);
    }
    EngineLock lock(&mu_);
    top->flusher().EndDiscard(r->flush.released);
    r->flush.released.clear();
    RequestEndedLocked();
    ended = true;
  }
  if (!ended) {
    EngineLock lock(&mu_);
    RequestEndedLocked();
  }
  if (r->owner == nullptr) stats_.Retire(r->stats);
}

void Engine::RequestEndedLocked() {
  // The last request of a closed image: its locks go now (Engine::Close).
  if (--unfinished_ == 0) chain_->DropImageLocksAfterClose();
}

void Engine::FinishLocked(Request* r) {
  StatsScope scope(&r->stats);
  if (r->status.ok()) {
    WriteBackFile* const meta = chain_->TopWriteBack();
    EvictionScope evictions(meta, &r->write_back.after_commit);
    // The commits' metadata writes in one log, written after the lock is
    // released (bounded by the request's clusters).
    WriteBackFile::RecordScope record(r->plan.commits.empty() ? nullptr
                                                              : meta);
    r->status = RunCommits(r);
  } else {
    for (auto& abort : r->plan.aborts) abort();
  }
  // After the data and its metadata are in place: an active commit's
  // copy that reads the range from now on sees this change.
  if (r->changes()) MarkDirtyLocked(r->offset, r->len);
  if (r->is_flush() && r->flush.counted) {
    r->flush.counted = false;
    if (--flushes_in_flight_ == 0) flushes_done_.SignalAll();
  }
  if (r->is_flush() && r->status.ok() && r->flush.file != nullptr) {
    if (Qcow2Layer* top = chain_->top_qcow2()) {
      top->flusher().FinishFlush(r->flush.generation, &r->flush.released);
    }
  }
  r->pinned.clear();
  locks_.Remove(r);
}

absl::Status Engine::CreateOverlay(const std::string& path,
                                   const CreateOptions& opts,
                                   Chain::ImageCreator create) {
  CountedCall counted(&stats_);
  EngineLock lock(&mu_);
  RETURN_IF_ERROR(RefuseDuringLiveJob("a new overlay"));
  RETURN_IF_ERROR(chain_->CreateOverlay(path, opts, create));
  // The new top's clusters may differ: no request holds a range now (a
  // caller of this must have none in flight).
  SetLockGeometry(chain_.get(), &locks_);
  return absl::OkStatus();
}

}  // namespace qcow2::internal
