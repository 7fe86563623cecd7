// SPDX-License-Identifier: Apache-2.0
// The asynchronous executor behind qcow2::Queue: one io_uring ring per
// queue. Requests are planned by the engine and run by the runner
// (lib/engine/runner.h); their I/O goes on the ring with no lock held.
// Files that offer no RingFile (File::ring_file(): only the library's own
// PosixFile does), and I/O the ring cannot take as is (unaligned
// O_DIRECT), run synchronously on the calling thread.
#ifndef QCOW2_LIB_ENGINE_QUEUE_IMPL_H_
#define QCOW2_LIB_ENGINE_QUEUE_IMPL_H_

#include <array>
#include <atomic>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "lib/base/mutex.h"
#include "lib/engine/engine.h"
#include "lib/engine/request.h"
#include "lib/engine/runner.h"
#include "lib/io/ring.h"
#include "qcow2/types.h"

namespace qcow2::internal {

// Not thread-safe, but for Wake (any thread) and Snapshot (any thread):
// one thread submits and polls.
class QueueImpl final : public Executor,
                        public Waiter,
                        public StatsRegistry::Source {
 public:
  QueueImpl(Engine* engine, const QueueOptions& opts);
  ~QueueImpl() override;

  bool uses_io_uring() const { return ring_.ok(); }
  int depth() const { return depth_; }
  int in_flight() const { return in_flight_; }

  // A new request, default-initialised, in the memory of one this queue
  // finished (no allocation of the large Request per submit), or new.
  std::unique_ptr<Request> NewRequest();
  absl::Status Submit(std::unique_ptr<Request> r);
  Engine* engine() const { return engine_; }
  int Poll(int min_complete);
  // The embedder's notifier (Queue::EventFd): created on the first call.
  int EventFd();

  // Executor.
  void Issue(Request* r, IoOp* op, OpType type) override;
  void Done(Request* r) override;
  // Waiter: any thread, with the engine's metadata lock held.
  void Wake(Request* r) override;
  // StatsRegistry::Source: any thread.
  IoStats Snapshot() const override;

 private:
  static constexpr size_t kStatFields = sizeof(IoStats) / sizeof(uint64_t);

  // Plans woken requests again and starts them.
  void DrainWoken();
  // Starts r's stages after it was planned.
  void Start(Request* r);
  void Prep(IoOp* op);
  void SubmitBacklog();
  void ArmEventFd();
  // Handles one completion; with `wait`, blocks for it. Returns false when
  // none was there.
  bool ReapOne(bool wait);
  void OnComplete(IoOp* op, int res);
  // The op is done (or failed into r->status): r goes on when it was the
  // last one in flight.
  void OpDone(Request* r);
  int RunCallbacks();
  // r is finished and its callback taken: destroyed, its memory kept for
  // NewRequest (up to the queue's depth) or freed.
  void Recycle(Request* r);
  // Submits the ops prepared on the ring (and the backlog, as far as it
  // fits) to the kernel.
  void PushToKernel();
  // Makes the embedder's notifier readable (when there is one).
  void Notify();
  // Notify() when Poll(0) has something to do now (finished requests to
  // call back, woken requests to plan): the end of Submit and Poll.
  void NotifyIfReady();
  // Puts an aligned bounce buffer in place of op's iovecs when the file
  // wants `align` and only the memory is unaligned (offset and length are
  // aligned): the op still goes on the ring, not through the file's
  // synchronous bounce. False when it cannot.
  bool StartBounce(IoOp* op, uint32_t align);
  // Gives the caller's iovecs back (after copying a read into them when
  // `copy_out`) and keeps the buffer for the next bounce.
  void EndBounce(IoOp* op, bool copy_out);

  Engine* const engine_;
  const int depth_;
  Ring ring_;
  // Internal: wake-ups (Wake) for the polling thread, watched by the ring.
  int event_fd_ = -1;
  // The embedder's notifier, never read by the queue: written by Notify()
  // and, once registered with io_uring_register_eventfd, by the kernel for
  // every completion posted on the ring. Written from any thread (Wake).
  std::atomic<int> notify_fd_{-1};
  uint64_t event_buf_ = 0;
  bool event_armed_ = false;
  bool closing_ = false;
  int in_flight_ = 0;          // submitted, callback not yet run
  std::deque<IoOp*> backlog_;  // ops waiting for a free SQE
  std::deque<Request*> done_;
  // Finished requests' memory, each holding a default-initialised Request.
  std::vector<Request*> spare_;
  // Bounce buffers not in use, with their sizes, and those sizes' sum.
  std::vector<std::pair<void*, size_t>> spare_bounces_;
  size_t spare_bounce_bytes_ = 0;
  Mutex wake_mu_;
  // Requests whose wait ended, to plan again on the polling thread.
  std::vector<Request*> woken_ ABSL_GUARDED_BY(wake_mu_);
  std::array<std::atomic<uint64_t>, kStatFields> stats_{};
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_ENGINE_QUEUE_IMPL_H_
