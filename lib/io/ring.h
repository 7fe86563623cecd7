// SPDX-License-Identifier: Apache-2.0
// One io_uring ring and the IoOps it runs: the io layer's half of a
// Queue's executor (lib/engine/queue_impl.h decides what goes on the ring
// and when; this puts it there and takes the completions off). An op goes
// on the ring only with the descriptor its file offers (File::ring_file(),
// lib/io/ring_file.h) in IoOp::fd.
//
// Not thread-safe: one thread submits and reaps.
#ifndef QCOW2_LIB_IO_RING_H_
#define QCOW2_LIB_IO_RING_H_

#include <liburing.h>

#include <cstdint>

#include "lib/io/io_plan.h"

namespace qcow2::internal {

// IoOp::type on the ring.
inline constexpr uint8_t kOpRead = 0, kOpWrite = 1, kOpFlush = 2;

class Ring {
 public:
  Ring() = default;
  ~Ring() {
    SetBusy(false);
    Exit();
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // Sets the ring up with room for `entries` submissions. 0, or the
  // errno that stopped it (the ring then stays unusable: ok() is false).
  int Init(unsigned entries);
  bool ok() const { return ok_; }
  int fd() const { return ring_.ring_fd; }
  // Tears the ring down (anything still on it is cancelled).
  void Exit();

  // Puts `op` on the ring: fdatasync, zero range, or the read or write of
  // what is left past op->done (a short transfer resumes there). False
  // when the submission queue is full even after a submit: the caller
  // keeps the op and offers it again later.
  bool Prep(IoOp* op);
  // Puts a poll for `fd` becoming readable on the ring; its completion
  // carries `data`. False when the submission queue is full.
  bool PrepPoll(int fd, void* data);
  // Hands what is prepared to the kernel.
  void Submit();
  // Takes the next completion: its op (or PrepPoll's `data`) and result.
  // With `wait`, submits what is prepared and blocks for one first, in
  // one system call. False when none is there.
  bool Next(bool wait, void** data, int* res);
  // Completions are waiting to be taken.
  bool HasCompletions();
  // The kernel makes `fd` readable for every completion it posts.
  // 0 or -errno.
  int RegisterEventFd(int fd);

  // Whether the ring's owner has requests in flight. A large buffered read
  // goes to io_uring's workers, to be copied beside this thread's work,
  // only while fewer rings of the process are busy than it may use CPUs:
  // once every CPU has a busy ring's thread, a hand-off buys no more
  // parallel copying and costs each read a wake-up and a switch, so each
  // thread copies its own reads.
  void SetBusy(bool busy);

 private:
  io_uring_sqe* GetSqe();

  io_uring ring_{};
  bool ok_ = false;
  bool busy_ = false;
};

// Gives the calling thread's io_uring workers the process's one shared
// map of per-file work (see ring.cc), unless the thread has used io_uring
// before. Cheap after the first call in a thread; safe from any thread.
void JoinSharedIoWorkers();

// Rings marked busy (Ring::SetBusy), and the CPUs the process may use:
// large buffered reads are handed to io_uring's workers while the first is
// below the second.
int BusyRings();
int UsableCpus();

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_IO_RING_H_
