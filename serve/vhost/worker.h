// SPDX-License-Identifier: Apache-2.0
// An event loop serving virtqueues: one thread, one io_uring, one
// qcow2::Queue. The ring polls every kick eventfd of its virtqueues,
// the Queue's notifier and the loop's mailbox, and writes the call
// eventfds; guest buffers go to the Queue's readv/writev as they are.
// Used entries finished in one turn of the loop are published together,
// with at most one interrupt per virtqueue.
//
// The control thread (the one speaking vhost-user) changes a virtqueue
// only through the calls below, which run on the loop's thread and return
// when done: the loop's state is never shared.
#ifndef QCOW2_SERVE_VHOST_WORKER_H_
#define QCOW2_SERVE_VHOST_WORKER_H_

#include <liburing.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"
#include "serve/vhost/blk.h"
#include "serve/vhost/guest_memory.h"
#include "serve/vhost/split_ring.h"

namespace qcow2::vhost {

inline constexpr int kMaxQueues = 64;

// What the loops share with the device (read-only but for `writeback`
// and the error signal).
struct DeviceShared {
  BlkGeometry geometry;
  std::string serial;                  // GET_ID (up to 20 bytes)
  uint64_t discard_granularity = 512;  // the image's cluster size
  std::atomic<bool> writeback{true};   // config WCE; off: flush every write
  int error_fd = -1;                   // eventfd: a loop found a broken ring
};

struct VqStart {
  int index = 0;
  RingConfig ring;
  std::shared_ptr<const GuestMemory> mem;
  int kick_fd = -1;  // owned by the device; valid until StopVq returns
  int call_fd = -1;  // -1: no interrupts
};

class Worker {
 public:
  Worker(Image* image, DeviceShared* shared, int queue_depth);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Creates the Queue and the io_uring and starts the thread.
  absl::Status Start();

  // Each runs on the loop's thread and returns when it has.
  absl::Status StartVq(const VqStart& v);
  // Stops taking chains from the virtqueue, waits until every chain taken
  // is completed in the used ring, and returns the next avail index.
  uint16_t StopVq(int index);
  void SetCall(int index, int call_fd);

 private:
  struct Vq {
    bool running = false;
    bool broken = false;
    bool dirty = false;       // used entries not yet published
    bool full = false;        // stopped popping: the Queue was full
    uint32_t gen = 0;         // tags this start's ring operations
    int in_flight = 0;
    SplitRing ring;
    std::shared_ptr<const GuestMemory> mem;
    int kick_fd = -1;
    int call_fd = -1;
    std::promise<uint16_t>* stopped = nullptr;  // StopVq waiting
  };
  enum Kind : uint8_t { kMailbox = 1, kQueueNotify, kKick, kCall, kCancel };

  void Run();
  void Call(std::function<void()> fn);
  io_uring_sqe* Sqe();
  void ArmPoll(int fd, uint64_t tag);
  static void Reset(int fd);
  void HandleCqe(const io_uring_cqe* cqe);
  void RunMailbox();
  void ProcessVq(int index);
  void Submit(int index, const Chain& chain);
  // Writes popped from one virtqueue in one pass that continue each other
  // go to the Queue as one request (as QEMU's virtio-blk device merges
  // them): one write, one hand-off to io_uring's worker, one completion.
  // AddWrite takes the request into the merge, sending the one it does
  // not continue first; SubmitMerged sends what is gathered. ProcessVq
  // sends it before it returns, and Submit before any other request.
  void AddWrite(int index, uint16_t head, uint8_t* status, uint64_t offset,
                const BlkRequest& r);
  void SubmitMerged();
  void Finish(int index, uint16_t head, uint8_t* status, uint8_t value,
              uint32_t written);
  void Fail(int index, const absl::Status& why);
  void Notify();
  void MaybeStopped(int index);

  Image* image_;
  DeviceShared* shared_;
  int depth_;
  std::unique_ptr<Queue> queue_;
  io_uring ring_{};
  bool ring_ready_ = false;
  int mailbox_fd_ = -1;
  std::mutex mu_;
  std::vector<std::function<void()>> mailbox_;  // guarded by mu_
  bool quit_ = false;                           // loop thread only
  Vq vqs_[kMaxQueues];
  Chain chain_;
  struct MergedWrite {
    struct Part {
      uint16_t head;
      uint8_t* status;
    };
    int index = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    std::vector<iovec> iov;
    std::vector<Part> parts;  // empty: nothing gathered
  };
  MergedWrite merged_;
  std::thread thread_;
};

}  // namespace qcow2::vhost

#endif  // QCOW2_SERVE_VHOST_WORKER_H_
