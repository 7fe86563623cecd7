// SPDX-License-Identifier: Apache-2.0
#include "lib/engine/runner.h"

#include "lib/meta/write_back_file.h"

namespace qcow2::internal {

const char* StageName(Stage s) {
  switch (s) {
    case Stage::kPlanned: return "planned";
    case Stage::kMissRead: return "miss-read";
    case Stage::kReads: return "reads";
    case Stage::kWrites: return "writes";
    case Stage::kFileFlush: return "file-flush";
    case Stage::kRoundDone: return "round-done";
    case Stage::kDone: return "done";
  }
  return "?";
}

namespace {

// Issues each op of `ops` in turn; stops at the first error (the request
// is abandoned: nothing after it should reach the disk).
void IssueAll(Executor* x, Request* r, std::vector<IoOp>& ops,
              Executor::OpType type) {
  for (IoOp& op : ops) {
    if (!r->status.ok()) return;
    x->Issue(r, &op, type);
  }
}

// The kPlanned stage: what planning left before the plan's I/O. Returns
// false when r must stop here (parked, or a miss to read).
bool BeforeIo(Engine* engine, Executor* x, Request* r) {
  for (;;) {
    if (r->parked) return false;
    if (r->miss.cache != nullptr) {
      // A deferred metadata miss: read with no lock held, then planned
      // again (Engine::LoadMiss).
      r->stage = Stage::kMissRead;
      x->Issue(r, &r->miss.op, Executor::OpType::kRead);
      return false;
    }
    engine->Grow(r);  // blocking, no lock held (rarely: in steps)
    if (!r->fill.active) break;
    // A fill of pending clusters (deferred copy-on-write): blocking I/O
    // on this thread, with no lock held, so that a flush that waits for
    // it never waits for a queue to be polled. FinishFill then plans the
    // flush proper, or the request the fill was for (which may miss or
    // park like any planning).
    if (r->status.ok()) r->status = RunPlanIo(r->plan, &r->stats);
    engine->FinishFill(r);
    if (r->is_flush() || !r->status.ok()) break;
  }
  // A flush records (or finds recorded) its metadata write-back:
  // blocking, as it may wait for another flush's log.
  if (r->status.ok() && r->flush.data_file != nullptr) {
    r->status = r->flush.data_file->Flush();
    r->flush.data_file = nullptr;
  }
  if (r->status.ok() && r->flush.record) engine->RecordFlush(r);
  if (r->status.ok() && r->write_back.file != nullptr) {
    // Metadata writes recorded while it was planned (a flush's
    // write-back, evictions): blocking I/O on this thread, in their turn
    // among other requests' (no lock held).
    r->status = r->write_back.file->WriteBack(r->write_back.ticket);
  }
  return true;
}

}  // namespace

void Advance(Engine* engine, Executor* x, Request* r) {
  while (r->pending == 0) {
    switch (r->stage) {
      case Stage::kPlanned:
        if (!BeforeIo(engine, x, r)) {
          if (r->parked) return;
          continue;  // the miss read is issued (or already done)
        }
        r->stage = Stage::kReads;
        if (r->scattered_write()) {
          // The guest bytes go from the caller's segments, not a copy.
          MapIntoSegments(&r->plan.writes, r->segs);
        }
        IssueAll(x, r, r->plan.reads, Executor::OpType::kRead);
        break;
      case Stage::kMissRead:
        engine->LoadMiss(r);  // plans again
        r->stage = Stage::kPlanned;
        break;
      case Stage::kReads:
        r->stage = Stage::kWrites;
        for (auto& step : r->plan.after_reads) {
          if (!r->status.ok()) break;
          r->status = step();
        }
        IssueAll(x, r, r->plan.writes, Executor::OpType::kWrite);
        break;
      case Stage::kWrites:
        r->stage = Stage::kFileFlush;
        if (r->status.ok() && r->is_flush() && r->flush.file != nullptr) {
          r->stats.host_flushes++;
          r->flush.op.file = r->flush.file;
          x->Issue(r, &r->flush.op, Executor::OpType::kFlush);
        }
        break;
      case Stage::kFileFlush:
        r->stage = Stage::kRoundDone;
        break;
      case Stage::kRoundDone:
        if (r->zero_more && r->status.ok()) {
          // One round of a long write-zeroes or discard is done: commit
          // it and plan the next, which runs its stages from the start.
          engine->NextRound(r);
          if (r->status.ok()) {
            r->stage = Stage::kPlanned;
            break;
          }
        }
        engine->Finish(r);
        r->stage = Stage::kDone;
        x->Done(r);
        return;
      case Stage::kDone:
        return;
    }
  }
}

namespace {

// Carries out every op at once with blocking calls, and wakes the calling
// thread when a wait for other requests ends.
class SyncExecutor final : public Executor, public BlockingWaiter {
 public:
  void Issue(Request* r, IoOp* op, OpType type) override {
    absl::Status s;
    if (type == OpType::kFlush) {
      s = op->file->Flush();
    } else {
      s = RunOp(*op, type == OpType::kWrite);
      if (s.ok()) CountIo(*op, type == OpType::kWrite, &r->stats);
    }
    if (!s.ok() && r->status.ok()) r->status = std::move(s);
  }
  void Done(Request*) override {}
};

}  // namespace

void BlockingWaiter::Wake(Request*) {
  std::lock_guard<std::mutex> lock(mu_);
  woken_ = true;
  cv_.notify_one();
}

void BlockingWaiter::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return woken_; });
  woken_ = false;  // a request may wait more than once
}

absl::Status RunSync(Engine* engine, Request* r) {
  SyncExecutor x;
  r->waiter = &x;
  r->stage = Stage::kPlanned;
  if (!engine->Begin(r)) {
    x.Wait();
    engine->Plan(r);
  }
  for (;;) {
    Advance(engine, &x, r);
    if (r->stage == Stage::kDone) break;
    // Parked: another request reads the entry this one missed, a fill
    // runs, or a widened range is held.
    x.Wait();
    engine->Plan(r);
    r->stage = Stage::kPlanned;
  }
  r->plan.Clear();
  return r->status;
}

}  // namespace qcow2::internal
