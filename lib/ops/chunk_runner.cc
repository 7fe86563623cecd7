// SPDX-License-Identifier: Apache-2.0
#include "lib/ops/chunk_runner.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace qcow2::ops {

bool AllZero(const uint8_t* data, uint64_t len) {
  static constexpr uint8_t kZeros[4096] = {};
  while (len > 0) {
    const uint64_t n = std::min<uint64_t>(len, sizeof kZeros);
    if (std::memcmp(data, kZeros, n) != 0) return false;
    data += n;
    len -= n;
  }
  return true;
}

ChunkRunner::ChunkRunner(std::vector<Queue*> queues, int depth,
                         uint64_t chunk_bytes)
    : queues_(std::move(queues)), chunk_bytes_(chunk_bytes) {
  for (int i = 0; i < std::max(1, depth); ++i) {
    slots_.push_back(std::make_unique<Slot>());
  }
}

absl::Status ChunkRunner::Issue(
    Slot& slot, const std::function<absl::Status(Completion)>& submit) {
  ++slot.pending;
  Slot* s = &slot;
  absl::Status queued = submit([this, s](absl::Status done) {
    if (!done.ok() && s->status.ok()) s->status = std::move(done);
    if (--s->pending == 0) Advance(*s);
  });
  if (!queued.ok()) --slot.pending;  // the completion never runs
  return queued;
}

void ChunkRunner::Free(Slot& slot) {
  if (!slot.status.ok()) {
    if (error_.ok()) error_ = slot.status;
  } else if (progress_) {
    progress_(slot.chunk.len);
  }
  slot.busy = false;
  --busy_;
}

void ChunkRunner::Advance(Slot& slot) {
  while (slot.pending == 0) {
    if (!slot.status.ok() || slot.stage == stages_.size()) {
      Free(slot);
      return;
    }
    absl::Status s = stages_[slot.stage++](slot);
    if (!s.ok() && slot.status.ok()) slot.status = std::move(s);
  }
}

absl::Status ChunkRunner::Run(const NextFn& next, std::vector<StageFn> stages,
                              const std::function<void(uint64_t)>& progress) {
  stages_ = std::move(stages);
  progress_ = progress;
  bool more = true;
  for (;;) {
    for (auto& slot : slots_) {
      if (!more || !error_.ok()) break;
      if (slot->busy) continue;
      if (control_ != nullptr && control_->cancelled()) {
        error_ = absl::CancelledError("cancelled");
        break;
      }
      absl::StatusOr<bool> got = next(&slot->chunk);
      if (!got.ok()) {
        error_ = got.status();
        break;
      }
      if (!*got) {
        more = false;
        break;
      }
      if (slot->a.size() < chunk_bytes_) {
        slot->a.resize(chunk_bytes_);
        slot->b.resize(chunk_bytes_);
      }
      slot->busy = true;
      slot->stage = 0;
      slot->status = absl::OkStatus();
      ++busy_;
      Advance(*slot);
    }
    if (busy_ == 0 && (!more || !error_.ok())) break;
    if (busy_ == 0) continue;
    int reaped = 0;
    for (Queue* q : queues_) reaped += q->Poll(0);
    if (reaped > 0) continue;
    // Nothing ready: wait on a queue with requests in flight (a chunk in
    // flight has at least one somewhere).
    bool waited = false;
    for (Queue* q : queues_) {
      if (q->in_flight() > 0) {
        q->Poll(1);
        waited = true;
        break;
      }
    }
    if (!waited) {
      return absl::InternalError(
          "chunk runner: chunks in flight but no request on any queue");
    }
  }
  return error_;
}

}  // namespace qcow2::ops
