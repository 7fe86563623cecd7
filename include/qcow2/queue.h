// SPDX-License-Identifier: Apache-2.0
// Asynchronous I/O on an image: a Queue submits requests and delivers their
// completions.
//
//   auto queue = image->CreateQueue(qcow2::QueueOptions{});
//   (*queue)->SubmitRead(offset, absl::MakeSpan(buf),
//                        [](absl::Status s) { ... });
//   while ((*queue)->in_flight() > 0) (*queue)->Poll(1);
//
// Threading contract:
//  - A Queue belongs to one thread at a time: that thread submits, polls and
//    gets the completion callbacks (they run only inside Poll() and
//    Drain(), never inside a Submit call). A callback may submit new
//    requests on the same queue. Give each vCPU or iothread its
//    own Queue; one image serves any number of queues at once, and its
//    caches and allocator are shared among them safely.
//  - Requests from any queues that touch different guest clusters run in
//    parallel, allocating or not; no lock is held while data moves, while
//    the L2 table slices and refcount blocks a request needs come off the
//    disk (a write, write-zeroes or discard looks them up before it
//    changes anything), while the file is grown ahead of new clusters,
//    nor while a flush, or a request that evicted dirty metadata from a
//    cache or had a cache written out (a discard, a commit), writes
//    metadata back, nor while a flush fills clusters whose copy-on-write
//    was deferred or discards the clusters it freed. What metadata I/O
//    is left under the image's metadata lock (docs/architecture.md) is
//    counted in IoStats::host_calls_under_lock. Such write-backs, fills,
//    discards and growth are blocking calls on the thread that polls the
//    request's queue. A
//    flush may wait for another flush's fill or metadata write-back in
//    progress (flushes that wait share one write-back), never for a queue
//    to be polled.
//  - Requests whose guest ranges overlap (at cluster granularity) run one
//    after the other, in the order they were submitted (across queues: the
//    order the Submit calls reached the image). Each sees all or none of
//    the other's effect: results equal running every request alone, in
//    that order.
//  - Buffers passed to Submit* must stay valid until the callback runs.
//  - Flush covers every write whose callback ran before the flush was
//    submitted, on every queue.
//  - Destroying a Queue waits for its requests (callbacks still run); the
//    Queue must be destroyed before its Image is closed.
//
// Backend: io_uring (one ring per queue) for files the library opened
// itself; if a ring cannot be set up (old kernel, seccomp), the queue runs
// the same requests synchronously and says so once on stderr. Files given
// by the embedder (File objects) are always driven synchronously.
#ifndef QCOW2_QUEUE_H_
#define QCOW2_QUEUE_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "qcow2/export.h"
#include "qcow2/stats.h"

namespace qcow2 {

namespace internal {
class QueueImpl;
}

struct QueueOptions {
  // Maximum requests in flight (flushes included); Submit* fails with
  // kResourceExhausted beyond it.
  int depth = 128;
  // false: never try io_uring (run requests synchronously).
  bool use_io_uring = true;
};

// Called once per request with its result.
using Completion = std::function<void(absl::Status)>;

class QCOW2_EXPORT Queue {
 public:
  ~Queue();
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;

  // Each returns an error at once (and never calls `done`) for a request
  // that cannot be queued: closed image, read-only image, range past the
  // end, queue full. Otherwise `done` runs later from Poll()/Drain().
  absl::Status SubmitRead(uint64_t offset, absl::Span<uint8_t> buf,
                          Completion done);
  absl::Status SubmitWrite(uint64_t offset, absl::Span<const uint8_t> data,
                           Completion done);
  absl::Status SubmitWriteZeroes(uint64_t offset, uint64_t len, bool unmap,
                                 Completion done);
  absl::Status SubmitDiscard(uint64_t offset, uint64_t len, Completion done);
  absl::Status SubmitFlush(Completion done);

  // Moves requests forward and runs callbacks of finished ones; waits until
  // at least `min_complete` requests finished (fewer if fewer are in
  // flight). Returns the number of callbacks run.
  int Poll(int min_complete = 0);
  // Polls until nothing is in flight.
  void Drain();

  int in_flight() const;
  int depth() const;
  // True when this queue drives its files through io_uring.
  bool uses_io_uring() const;

  // This queue's counters (only requests submitted here).
  IoStats stats() const;

 private:
  friend class Image;
  explicit Queue(std::unique_ptr<internal::QueueImpl> impl);
  std::unique_ptr<internal::QueueImpl> impl_;
};

}  // namespace qcow2

#endif  // QCOW2_QUEUE_H_
