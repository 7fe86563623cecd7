// SPDX-License-Identifier: Apache-2.0
// Live stream, live commit and active commit: chain operations on an open
// Image while its Queues (and synchronous calls on other threads) keep
// reading and writing it, as QEMU's block-stream and block-commit jobs
// (the active one with its pivot) do for a running guest. Each blocks the thread that calls it until the job ends;
// a hypervisor runs it on a worker thread and cancels it from any other
// (LiveJobControl). When it ends the top's backing file name is rewritten
// (one write of the header cluster) and the open chain is switched to the
// shorter one without stopping the queues. A power cut at any instant
// leaves the old chain or the new one on disk, each reading the disk the
// guest had flushed (docs/crash-consistency.md, "Live stream and
// commit"). docs/embedding.md shows the use.
//
//   qcow2::LiveJobControl control;  // control.Cancel() from any thread
//   qcow2::LiveJobOptions o;
//   o.control = &control;
//   o.rate_limit = 64 << 20;  // bytes per second
//   absl::Status s = image->LiveStream(/*base=*/2, o);
#ifndef QCOW2_LIVE_H_
#define QCOW2_LIVE_H_

#include <atomic>
#include <cstdint>
#include <functional>

#include "qcow2/export.h"

namespace qcow2 {

// Cancels a running live job from any thread. The job stops at its next
// chunk and returns kCancelled, leaving the old chain as it was (in use,
// reading the same data). One control may serve one job at a time.
class QCOW2_EXPORT LiveJobControl {
 public:
  void Cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const {
    return cancelled_.load(std::memory_order_relaxed);
  }
  // Lets the control serve another job.
  void Reset() { cancelled_.store(false, std::memory_order_relaxed); }

 private:
  std::atomic<bool> cancelled_{false};
};

struct LiveJobOptions {
  // Bytes per chunk: the unit the job copies, holds (live stream: the
  // chunk's clusters are held against guest requests while it is copied)
  // and reports progress in. A multiple of 512, at most 64 MiB.
  // Default: 1 MiB.
  uint64_t chunk = 1 << 20;
  // Chunks in flight at once (worker threads of the job). 1..64.
  // Default: 2.
  int depth = 2;
  // Bytes copied per second at most, over the whole job (a token bucket
  // of one second's worth): 0 is no limit.
  uint64_t rate_limit = 0;
  // Called on the job's threads (one call at a time) as chunks finish:
  // bytes of the disk done so far and in all (the job walks the whole
  // disk; `done` counts what it has looked at, copied or not). May be
  // empty.
  std::function<void(uint64_t done, uint64_t total)> progress;
  // Cancellation: may be null.
  LiveJobControl* control = nullptr;
};

}  // namespace qcow2

#endif  // QCOW2_LIVE_H_
