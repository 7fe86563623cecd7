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
//  - Buffers passed to Submit* must stay valid until the callback runs
//    (for SubmitReadv/SubmitWritev: the segments' memory; the iovec array
//    itself is copied and may be reused as soon as the call returns).
//  - Flush covers every write whose callback ran before the flush was
//    submitted, on every queue.
//  - Destroying a Queue waits for its requests (callbacks still run); the
//    Queue must be destroyed before its Image is closed.
//
// Event loops: EventFd() gives a file descriptor to watch with epoll,
// poll or select (EPOLLIN). The pattern, with no lost wake-up:
//
//   int efd = queue->EventFd();              // once; owned by the queue
//   epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev);  // ev.events = EPOLLIN
//   for (;;) {
//     epoll_wait(ep, ...);                   // efd readable
//     uint64_t n; read(efd, &n, sizeof n);   // reset it first ...
//     while (queue->Poll(0) > 0) {}          // ... then reap until none
//   }
//
// The descriptor becomes readable whenever Poll(0) has work to do: an I/O
// of the queue finished, a request that waited for another may go on, or
// a request finished at once inside a Submit call (a read of zeros, an
// error found while planning). Reading it before polling means whatever
// finishes after that leaves it readable again. It may also be readable
// with nothing to reap (Poll(0) then returns 0). It is never a descriptor
// the queue reads or waits on itself.
//
// Backend: io_uring (one ring per queue) for files the library opened
// itself; if a ring cannot be set up (old kernel, seccomp), the queue runs
// the same requests synchronously and says so once on stderr. Files given
// by the embedder (File objects) are always driven synchronously.
#ifndef QCOW2_QUEUE_H_
#define QCOW2_QUEUE_H_

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "qcow2/export.h"
#include "qcow2/stats.h"
#include "qcow2/types.h"

namespace qcow2 {

namespace internal {
class QueueImpl;
}

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
  // As Image::WriteCompressed (one whole cluster, stored compressed when
  // that saves space): the cluster is compressed inside this call, on the
  // submitting thread; errors of that (raw image, a range that is not one
  // cluster) are returned at once.
  absl::Status SubmitWriteCompressed(uint64_t offset,
                                     absl::Span<const uint8_t> data,
                                     Completion done);
  // Vectored forms: the request covers the segments in order, `offset` to
  // offset + the sum of their lengths, as one request (ordered, atomic
  // against overlapping requests, one callback). The bytes move between
  // the file and the segments themselves: reads and writes of allocated
  // clusters are issued as preadv/pwritev (IORING_OP_READV/WRITEV) whose
  // iovecs point into the segments, split where the image's clusters do.
  // Only what must be merged with other data is copied: the head and tail
  // a copy-on-write combines with backing data, and decompressed
  // clusters. A write of two or more segments holds its whole clusters
  // (it never takes the byte-range path of deferred copy-on-write).
  // Segments may have any length (0 too) and alignment; `iov` may be
  // reused once the call returns, the memory it points to not until the
  // callback runs.
  absl::Status SubmitReadv(uint64_t offset, absl::Span<const iovec> iov,
                           Completion done);
  absl::Status SubmitWritev(uint64_t offset, absl::Span<const iovec> iov,
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

  // An eventfd (EFD_NONBLOCK | EFD_CLOEXEC) that is readable whenever
  // Poll(0) has completions to deliver or requests to move (see the event
  // loop pattern at the top of this file). Created on the first call; the
  // same descriptor every time after. Owned by the queue and closed with
  // it: never close it yourself. Returns a negative errno if it cannot be
  // created (EMFILE, ENFILE).
  int EventFd();

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

// For a thread that runs Queues beside io_uring rings of its own (an event
// loop that polls its sockets on a ring): call it first thing in the
// thread, before the thread's first io_uring call. Buffered writes to one
// image file from every such thread then wait their turn in io_uring
// instead of spinning on the file system's lock for that file on several
// CPUs at once (on ext4, 6% of the CPU of a server writing 1 MiB requests
// from two threads). Queues do it themselves on their first I/O, which is
// enough for threads with no ring of their own; it does nothing in a
// thread that used io_uring before, or on kernels before 5.18. Cheap and
// harmless to call again.
QCOW2_EXPORT void PrepareIoThread();

}  // namespace qcow2

#endif  // QCOW2_QUEUE_H_
