// SPDX-License-Identifier: Apache-2.0
// Planning one request under the metadata lock: what it reads, writes and
// commits, per kind, with metadata misses deferred to its executor.
#include <algorithm>
#include <utility>

#include "lib/engine/engine.h"
#include "lib/meta/eviction_scope.h"
#include "lib/meta/metadata_cache.h"
#include "lib/driver/qcow2_layer.h"

namespace qcow2::internal {

namespace {

// Counts the guest side of a request, once however often it is planned.
void CountGuest(Request* r) {
  if (std::exchange(r->counted, true)) return;
  IoStats& st = r->stats;
  switch (r->kind) {
    case Request::Kind::kRead:
      st.guest_read_ops++;
      st.guest_read_bytes += r->len;
      break;
    case Request::Kind::kWrite:
      st.guest_write_ops++;
      st.guest_write_bytes += r->len;
      break;
    case Request::Kind::kWriteZeroes:
      st.guest_zero_ops++;
      st.guest_zero_bytes += r->len;
      break;
    case Request::Kind::kDiscard:
      st.guest_discard_ops++;
      st.guest_discard_bytes += r->len;
      break;
    case Request::Kind::kFlush:
      st.guest_flush_ops++;
      break;
  }
}

// A write, or a write of zeros, straight to a raw top: one op.
IoOp RawTopOp(File* file, const Request& r) {
  IoOp op;
  op.file = file;
  op.offset = r.offset;
  if (r.kind == Request::Kind::kWrite) {
    op.guest_bytes = r.len;
    op.Add(r.wbuf, r.len);
  } else {
    op.bytes = r.len;
    op.zero_range = true;
  }
  return op;
}

}  // namespace

void Engine::PlanLocked(Request* r) {
  r->parked = false;
  CountGuest(r);
  Qcow2Layer* top = chain_->top_qcow2();
  if (top != nullptr && r->changes()) {
    // Persistent dirty bitmaps: the granules this change touches (in
    // memory, under the lock; idempotent if r is planned again).
    top->bitmaps().Mark(r->offset, r->len);
    // The first write's header update is written by its own executor,
    // with no lock held: until it is, every write waits for it before
    // its own I/O (clearing the autoclear bits must precede any change).
    if (const uint64_t ticket = top->header_writer().UnwrittenHeaderTicket(); ticket != 0) {
      r->write_back.file = top->meta_file();
      r->write_back.ticket = std::max(r->write_back.ticket, ticket);
    }
  }
  switch (r->kind) {
    case Request::Kind::kRead:
      PlanDeferringMisses(r, [&] {
        mu_.AssertHeld();  // run by PlanDeferringMisses, under the lock
        // Straight into the caller's buffer, or each of its segments.
        return ForEachSegment(
            *r, [&](uint64_t at, uint8_t* dest, uint64_t n) {
              mu_.AssertHeld();
              return chain_->PlanRead(0, at, dest, n, &r->plan,
                                      IoCategory::kGuestData);
            });
      });
      break;
    case Request::Kind::kWrite: {
      if (r->len == 0) break;
      if (top == nullptr) {
        r->plan.writes.push_back(RawTopOp(chain_->layer(0)->file(), *r));
        break;
      }
      // What allowed a byte-range lock may have changed while the write
      // waited: then it needs its whole clusters.
      if (r->lock.fine && !r->lock.fine_just_checked &&
          !top->pending().FineWritable(r->offset, r->len, /*stream=*/false) &&
          !locks_.Widen(r)) {
        break;  // parked until it holds them
      }
      const bool fine = r->lock.fine;
      if (!fine && PlanFillRound(r, top)) break;
      if (r->compressed) {
        if (r->compressed_for != top) {
          r->status = absl::FailedPreconditionError(
              "the image's top changed while a compressed write was "
              "prepared for it");
          break;
        }
        PlanDeferringMisses(r, [&] {
          return top->writer().PlanWriteCompressed(
              r->offset, r->stream, r->len, &r->plan, &r->probe);
        });
        break;
      }
      PlanDeferringMisses(r, [&] {
        return top->writer().PlanWrite(r->offset, absl::MakeConstSpan(r->wbuf, r->len),
                              &r->plan, fine, &r->probe);
      });
      break;
    }
    case Request::Kind::kWriteZeroes:
    case Request::Kind::kDiscard: {
      if (r->len == 0) break;
      if (top == nullptr) {
        // A raw file: one zero-range call, run by the executor.
        r->plan.writes.push_back(RawTopOp(chain_->layer(0)->file(), *r));
        break;
      }
      // qcow2: mostly metadata, changed here under the lock (the tables
      // it needs are read first, without it); zero bytes written into
      // part of a cluster are planned, and metadata written out on the
      // way (evictions, a cache written before a free) is recorded, for
      // the executor.
      if (PlanFillRound(r, top)) break;
      const bool free = r->kind == Request::Kind::kDiscard || r->unmap;
      PlanDeferringMisses(r, [&] {
        return top->zeroer().Zero(r->offset, r->len, free, &r->plan, &r->zero_done,
                         &r->zero_more);
      });
      if (!r->status.ok()) r->zero_more = false;
      break;
    }
    case Request::Kind::kFlush:
      if (chain_->closed()) {
        r->status = chain_->ClosedError();
        break;
      }
      if (!r->flush.counted) {
        if (pivoting_) {
          // An active commit is switching the top: planned after it.
          pivot_waiters_.push_back(r);
          r->parked = true;
          break;
        }
        r->flush.counted = true;
        ++flushes_in_flight_;
      }
      if (!writable_) break;
      if (top != nullptr) {
        // Clusters with deferred copy-on-write get their contents and L2
        // entries first: the executor fills them, then FinishFill plans
        // again. One flush fills at a time; the others wait for it, as
        // the clusters they must see committed may be the ones in flight.
        // (Its executor runs the fill at once, blocking: the wait never
        // depends on a queue being polled.)
        if (!r->fill.done) {
          if (filling_ != nullptr) {
            fill_waiters_.push_back(r);
            r->parked = true;
            break;
          }
          PlanFill(r, top);
          if (!r->status.ok() || r->fill.active) break;
        }
        // The metadata write-back is recorded by the executor
        // (RecordFlush): any flush recorded from now on covers this one.
        flushes_.Join(r);
      }
      r->flush.file = chain_->layer(0)->file();
      if (File* data = chain_->layer(0)->data_file(); data != r->flush.file) {
        r->flush.data_file = data;
      }
      break;
  }
}

void Engine::PlanDeferringMisses(Request* r,
                                 absl::FunctionRef<absl::Status()> plan) {
  if (r->miss.stale >= kMaxStaleMisses) {
    // The cache keeps changing under this request's reads: read at once.
    r->status = plan();
    r->pinned.clear();
    return;
  }
  // A read's plan holds only reads into its own buffers: it can be
  // dropped at any miss and made again (the entries read for it stay
  // pinned, so each round gets further). A write's may hold allocations.
  MissDeferral deferral(&r->plan, r->is_read());
  absl::Status s;
  {
    WriteBackFile* const meta = chain_->TopWriteBack();
    EvictionScope evictions(meta, &r->write_back.ticket, &r->write_back.file);
    // The metadata writes of a change (write-outs for dependencies,
    // evictions, table growth) go into one log for its executor. A log
    // keeps what it writes cached until it is written: write-zeroes and
    // discard, whose ranges have no bound, plan in bounded rounds.
    WriteBackFile::RecordScope record(r->is_read() ? nullptr : meta);
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
  misses_.Claim(r, deferral);
}

}  // namespace qcow2::internal
