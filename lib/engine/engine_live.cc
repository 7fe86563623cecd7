// SPDX-License-Identifier: Apache-2.0
// The engine's part of live stream and live commit (include/qcow2/live.h):
// range holds in the range-lock table, the stream's copy-on-read under a
// hold, the layers below the top read beside the guest's requests, and the
// switch of the chain under a hold of the whole disk.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/driver/qcow2_layer.h"
#include "lib/engine/engine.h"
#include "lib/engine/runner.h"

namespace qcow2::internal {
namespace {

struct Run {
  uint64_t offset;
  uint64_t len;
};

// Reads each run through `from`'s chain from layer `depth` (the caller
// keeps the runs from changing) and writes it into `to`: as a write the
// caller's hold covers (`preheld`), and with `zeros`, a run that reads as
// zeros as write-zeroes.
absl::Status CopyRuns(Engine* from, int depth, Engine* to, bool preheld,
                      bool zeros, const std::vector<Run>& runs,
                      uint64_t* copied) {
  std::vector<uint8_t> buf;
  for (const Run& run : runs) {
    buf.resize(run.len);
    RETURN_IF_ERROR(from->ReadFrom(depth, run.offset, absl::MakeSpan(buf)));
    Request w;
    w.kind = Request::Kind::kWrite;
    w.offset = run.offset;
    w.len = run.len;
    w.wbuf = buf.data();
    w.lock.preheld = preheld;
    if (zeros && std::all_of(buf.begin(), buf.end(),
                             [](uint8_t b) { return b == 0; })) {
      w.kind = Request::Kind::kWriteZeroes;
      w.wbuf = nullptr;
    }
    RETURN_IF_ERROR(RunSync(to, &w));
    *copied += run.len;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Engine::RefuseDuringLiveJob(const char* what) const {
  if (!live_job_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      chain_->filename(), ": ", what,
      " must wait: a live stream or commit is running on the image"));
}

absl::Status Engine::BeginLiveJob(const char* what, int base) {
  EngineLock lock(&mu_);
  RETURN_IF_ERROR(chain_->CheckWritable());
  if (chain_->top_qcow2() == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        chain_->filename(), ": ", what, " needs a qcow2 top image (a raw "
        "image has no backing file)"));
  }
  if (base < 1 || base > chain_->length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        chain_->filename(), ": ", what, ": base depth ", base,
        " is not in the chain (1 to ", chain_->length(), ")"));
  }
  if (live_job_) {
    return absl::FailedPreconditionError(absl::StrCat(
        chain_->filename(), ": ", what,
        ": another live stream or commit is running on the image"));
  }
  live_job_ = true;
  return absl::OkStatus();
}

void Engine::EndLiveJob() {
  EngineLock lock(&mu_);
  live_job_ = false;
}

std::unique_ptr<Request> Engine::Hold(uint64_t offset, uint64_t len) {
  auto hold = std::make_unique<Request>();
  hold->kind = Request::Kind::kWrite;
  hold->offset = offset;
  hold->len = len;
  BlockingWaiter waiter;
  {
    EngineLock lock(&mu_);
    locks_.SetRange(hold.get(), /*fine=*/false);
    locks_.Add(hold.get());
    if (locks_.CanGrant(hold.get())) {
      locks_.Grant(hold.get());
      return hold;
    }
    // GrantWaiters grants it and wakes the waiter, under the lock.
    hold->waiter = &waiter;
  }
  waiter.Wait();
  EngineLock lock(&mu_);
  hold->waiter = nullptr;
  return hold;
}

void Engine::ReleaseHold(Request* hold) {
  EngineLock lock(&mu_);
  locks_.Remove(hold);
}

absl::StatusOr<uint64_t> Engine::AllocatedAbove(int below, uint64_t offset,
                                                uint64_t max_len,
                                                bool* allocated) {
  EngineLock lock(&mu_);
  if (chain_->closed()) return chain_->ClosedError();
  return chain_->AllocatedAbove(below, offset, max_len, allocated);
}

absl::Status Engine::ReadFrom(int depth, uint64_t offset,
                              absl::Span<uint8_t> buf) {
  IoPlan plan;
  IoStats stats;
  absl::Status s = [&]() -> absl::Status {
    EngineLock lock(&mu_);
    StatsScope scope(&stats);
    RETURN_IF_ERROR(chain_->CheckRange(offset, buf.size()));
    return chain_->PlanRead(depth, offset, buf.data(), buf.size(), &plan,
                            IoCategory::kCow);
  }();
  // The layers below the top are never written while the chain is open,
  // and a switch keeps the ones it drops open: the plan stays good (from
  // the top, the caller's hold keeps the range's clusters in place).
  if (s.ok()) s = RunPlanIo(plan, &stats);
  stats_.Retire(stats);
  return s;
}

absl::Status Engine::Populate(uint64_t offset, uint64_t len, int below,
                              uint64_t* copied) {
  std::unique_ptr<Request> hold = Hold(offset, len);
  std::vector<Run> runs;
  absl::Status s = [&]() -> absl::Status {
    CountedCall counted(&stats_);
    EngineLock lock(&mu_);
    RETURN_IF_ERROR(chain_->CheckWritable());
    RETURN_IF_ERROR(chain_->CheckRange(offset, len));
    Layer* top = chain_->layer(0);
    const uint64_t end = offset + len;
    for (uint64_t pos = offset; pos < end;) {
      // What the top maps as its own (data, zeros, a pending cluster's
      // written units) is the guest's: never copied over.
      ASSIGN_OR_RETURN(Extent e, top->Map(pos, end - pos));
      const uint64_t piece_end = pos + e.length;
      if (e.kind != Extent::kUnallocated) {
        pos = piece_end;
        continue;
      }
      while (pos < piece_end) {
        bool allocated = false;
        ASSIGN_OR_RETURN(uint64_t n, chain_->AllocatedAbove(
                                         below, pos, piece_end - pos,
                                         &allocated));
        if (allocated) {
          if (!runs.empty() && runs.back().offset + runs.back().len == pos) {
            runs.back().len += n;
          } else {
            runs.push_back({pos, n});
          }
        }
        pos += n;
      }
    }
    return absl::OkStatus();
  }();
  // Under the hold nothing changes what the top allocates in the range:
  // each run is read through the chain and written as a guest write.
  if (s.ok()) s = CopyRuns(this, 1, this, /*preheld=*/true, false, runs, copied);
  ReleaseHold(hold.get());
  return s;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::OpenLayerWriter(int depth) {
  std::string path;
  OpenOptions oo;
  {
    EngineLock lock(&mu_);
    if (depth < 1 || depth >= chain_->length()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no layer at depth ", depth, " below the top"));
    }
    RETURN_IF_ERROR(chain_->LockForWrite(depth));
    path = chain_->layer(depth)->filename();
    oo = chain_->options();
    oo.format = chain_->FormatOf(depth);
  }
  // A descriptor of its own, open for writing (the chain's is read-only)
  // and taking no locks: the chain's holds the write lock for it.
  FileOpener* opener = oo.opener ? oo.opener : DefaultFileOpener();
  FileOptions fo;
  fo.read_only = false;
  fo.direct = oo.direct_io;
  fo.lock = false;
  oo.read_write = true;
  oo.lock = false;
  oo.force_share = false;
  absl::StatusOr<std::unique_ptr<Engine>> writer = [&]()
      -> absl::StatusOr<std::unique_ptr<Engine>> {
    ASSIGN_OR_RETURN(std::unique_ptr<File> file, opener->Open(path, fo));
    return Open(std::move(file), oo);
  }();
  if (!writer.ok()) EndLayerWriter(depth);
  return writer;
}

void Engine::EndLayerWriter(int depth) {
  EngineLock lock(&mu_);
  chain_->UnlockForWrite(depth);
}

absl::Status Engine::SwitchBacking(int last, bool reopen_last) {
  std::unique_ptr<Request> hold = Hold(0, size());
  absl::Status s = [&]() -> absl::Status {
    // Everything the job wrote (and every guest write finished so far)
    // is durable before the header can name the new backing file.
    Request flush;
    flush.kind = Request::Kind::kFlush;
    RETURN_IF_ERROR(RunSync(this, &flush));
    EngineLock lock(&mu_);
    RETURN_IF_ERROR(chain_->CheckWritable());
    Qcow2Layer* top = chain_->top_qcow2();
    const int backing = reopen_last ? last : last + 1;
    std::unique_ptr<Layer> replacement;
    if (reopen_last) {
      // Opened before the header changes: a failure leaves all as it was.
      ASSIGN_OR_RETURN(replacement, chain_->Reopen(last));
    }
    RETURN_IF_ERROR(top->header_writer().ChangeBackingFile(
        chain_->BackingNameFor(backing), chain_->FormatOf(backing)));
    chain_->DropLayers(last, std::move(replacement));
    return absl::OkStatus();
  }();
  ReleaseHold(hold.get());
  return s;
}

void Engine::SetDirtyLog(uint64_t granule) {
  EngineLock lock(&mu_);
  dirty_granule_ = granule;
  dirty_bits_.clear();
  if (granule == 0) return;
  const uint64_t granules = (chain_->size() + granule - 1) / granule;
  dirty_bits_.assign((granules + 63) / 64, 0);
}

void Engine::MarkDirtyLocked(uint64_t offset, uint64_t len) {
  if (dirty_granule_ == 0 || len == 0) return;
  const uint64_t last = std::min<uint64_t>(
      (offset + len - 1) / dirty_granule_, dirty_bits_.size() * 64 - 1);
  for (uint64_t g = offset / dirty_granule_; g <= last; ++g) {
    dirty_bits_[g / 64] |= uint64_t{1} << (g % 64);
  }
}

std::vector<uint64_t> Engine::DirtyGranules() const {
  EngineLock lock(&mu_);
  std::vector<uint64_t> out;
  for (size_t w = 0; w < dirty_bits_.size(); ++w) {
    for (uint64_t bits = dirty_bits_[w]; bits != 0; bits &= bits - 1) {
      out.push_back((w * 64 + __builtin_ctzll(bits)) * dirty_granule_);
    }
  }
  return out;
}

absl::Status Engine::CopyActive(uint64_t offset, uint64_t len, int base,
                                Engine* writer, bool held, uint64_t* copied) {
  std::unique_ptr<Request> hold;
  if (!held) hold = Hold(offset, len);
  std::vector<Run> runs;
  absl::Status s = [&]() -> absl::Status {
    EngineLock lock(&mu_);
    RETURN_IF_ERROR(chain_->CheckWritable());
    RETURN_IF_ERROR(chain_->CheckRange(offset, len));
    // Cleared under the hold: a change that finishes from now on marks
    // the granules again, one that finished before is in what is read.
    if (dirty_granule_ != 0) {
      for (uint64_t g = offset / dirty_granule_,
                    last = (offset + len - 1) / dirty_granule_;
           g <= last; ++g) {
        dirty_bits_[g / 64] &= ~(uint64_t{1} << (g % 64));
      }
    }
    for (uint64_t pos = offset, end = offset + len; pos < end;) {
      bool allocated = false;
      ASSIGN_OR_RETURN(uint64_t n, chain_->AllocatedAbove(
                                       base, pos, end - pos, &allocated, 0));
      if (allocated) runs.push_back({pos, n});
      pos += n;
    }
    return absl::OkStatus();
  }();
  // Zeros (a zero cluster above, or data that is all zeros) go into the
  // base as zeros, not as allocated data.
  if (s.ok()) {
    s = CopyRuns(this, 0, writer, /*preheld=*/false, /*zeros=*/true, runs,
                 copied);
  }
  if (hold != nullptr) ReleaseHold(hold.get());
  return s;
}

void Engine::EndPivotLocked() {
  pivoting_ = false;
  for (Request* w : pivot_waiters_) w->waiter->Wake(w);
  pivot_waiters_.clear();
}

absl::Status Engine::PivotActive(int base,
                                 absl::FunctionRef<absl::Status()> last_copy) {
  {
    // A flush planned against the old top (its files, its write-back and
    // the clusters it releases) must not finish against the new one:
    // those in flight finish first, new ones wait for the switch. Before
    // the hold: a flush's fill holds clusters in the range-lock table.
    EngineLock lock(&mu_);
    pivoting_ = true;
    while (flushes_in_flight_ > 0) flushes_done_.Wait(&mu_);
  }
  std::unique_ptr<Request> hold = Hold(0, size());
  absl::Status s = last_copy();
  {
    EngineLock lock(&mu_);
    if (s.ok()) s = chain_->PivotTo(base);
    if (s.ok()) {
      // The new top's clusters: the requests waiting for the hold are
      // ranged again (none holds one but the hold).
      SetLockGeometry(chain_.get(), &locks_);
      dirty_granule_ = 0;
      dirty_bits_.clear();
    }
    EndPivotLocked();
  }
  ReleaseHold(hold.get());
  return s;
}

}  // namespace qcow2::internal
