// SPDX-License-Identifier: Apache-2.0
#include "lib/io/ring.h"

#include <linux/falloc.h>
#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace qcow2::internal {

namespace {

// Buffered reads at least this long go to the ring's workers (Prep): from
// here up the hand-off costs a few percent of the copy's CPU time.
constexpr uint64_t kAsyncReadBytes = 256 << 10;

// Rings whose owners have requests in flight (Ring::SetBusy).
std::atomic<int> busy_rings{0};


// The ring whose work map every thread's io_uring workers adopt: set up on
// first use and kept for the life of the process. Its queue size bounds
// each thread's number of io_uring workers for file I/O (with four per
// CPU), as a queue's own ring would.
int SharedWorkAnchorFd() {
  static const int fd = [] {
    static Ring anchor;
    return anchor.Init(256) == 0 ? anchor.fd() : -1;
  }();
  return fd;
}

}  // namespace

// io_uring runs a buffered write on one of the submitting thread's kernel
// workers, and keeps writes to one file in order by hashing them on the
// file: a worker takes a file's next write only when no worker sharing its
// map runs one. That map comes from the ring through which the thread
// first entered io_uring, so threads with rings of their own (one per
// Queue) write one file from several workers at once. The file system
// lets one writer in at a time anyway (ext4 holds the inode lock for the
// whole copy), and the others spin on that lock on their CPUs: 6% of a
// vhost-user-blk server's CPU at 1 MiB writes from two queues, where
// qemu-storage-daemon, one thread and one ring, spends none. Registering
// this thread with one process-wide ring before anything else makes every
// thread's workers share that ring's map, so the writes wait in the
// queue instead. Reads are not hashed and still run side by side.
void JoinSharedIoWorkers() {
  thread_local bool joined = false;
  if (joined) return;
  joined = true;
  const int fd = SharedWorkAnchorFd();
  if (fd < 0) return;
  // Registering a ring's descriptor enters the thread into that ring
  // (the kernel's task context, and with it the workers' map, are made
  // then); the registration itself is not wanted and is undone. Kernels
  // before 5.18 lack it: the thread then keeps a map of its own.
  io_uring_rsrc_update update{};
  update.offset = -1U;  // any free slot
  update.data = static_cast<uint64_t>(fd);
  if (::syscall(__NR_io_uring_register, fd, IORING_REGISTER_RING_FDS, &update,
                1) == 1) {
    update.data = 0;  // unregistering names the slot (offset) alone
    ::syscall(__NR_io_uring_register, fd, IORING_UNREGISTER_RING_FDS, &update,
              1);
  }
}

int Ring::Init(unsigned entries) {
  JoinSharedIoWorkers();
  // Completions run when this thread next enters the kernel (it does to
  // reap them) rather than by an interrupt of whatever it is doing: a
  // buffered write or a device without nowait completes on a kernel
  // worker, which would otherwise send an inter-processor interrupt per
  // request (in a VM, an exit to the host). A sleeping thread is still
  // woken; the flag makes liburing's peek enter the kernel when
  // completions wait there. Kernels before 5.19 take neither flag.
  int rc = io_uring_queue_init(
      entries, &ring_, IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG);
  if (rc == -EINVAL) rc = io_uring_queue_init(entries, &ring_, 0);
  ok_ = rc == 0;
  return -rc;
}

void Ring::Exit() {
  if (!ok_) return;
  io_uring_queue_exit(&ring_);
  ok_ = false;
}

io_uring_sqe* Ring::GetSqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) {
    JoinSharedIoWorkers();
    io_uring_submit(&ring_);
    sqe = io_uring_get_sqe(&ring_);
  }
  return sqe;
}

bool Ring::Prep(IoOp* op) {
  io_uring_sqe* sqe = GetSqe();
  if (sqe == nullptr) return false;
  if (op->type == kOpFlush) {
    io_uring_prep_fsync(sqe, op->fd, IORING_FSYNC_DATASYNC);
  } else if (op->zero_range) {
    io_uring_prep_fallocate(
        sqe, op->fd,
        op->punch ? FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
                  : FALLOC_FL_ZERO_RANGE,
        op->offset, op->bytes);
  } else {
    const iovec* iov = op->iov.data();
    size_t n = op->iov.size();
    if (op->done > 0) {
      // Resume a short transfer: the iovecs past what is done.
      op->rest.clear();
      uint64_t skip = op->done;
      for (const iovec& v : op->iov) {
        if (skip >= v.iov_len) {
          skip -= v.iov_len;
          continue;
        }
        op->rest.push_back(
            {static_cast<uint8_t*>(v.iov_base) + skip, v.iov_len - skip});
        skip = 0;
      }
      iov = op->rest.data();
      n = op->rest.size();
    }
    if (op->type == kOpRead) {
      io_uring_prep_readv(sqe, op->fd, iov, n, op->offset + op->done);
      // A large read from the page cache is a long copy that io_uring
      // would do inline, in this thread's submit: the queue's thread then
      // copies one read after another while its CPU's peers idle, and
      // takes no completion meanwhile. On the ring's workers such reads
      // copy in parallel (as QEMU's thread pool does). Small reads stay
      // inline (a hand-off costs more than their copy), and so do O_DIRECT
      // reads, which the kernel runs asynchronously without a worker.
      // Once as many rings are busy as there are CPUs, each thread copies
      // its own (SetBusy).
      if (op->file->alignment() == 1 &&
          op->bytes - op->done >= kAsyncReadBytes &&
          BusyRings() < UsableCpus()) {
        io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
      }
    } else {
      io_uring_prep_writev(sqe, op->fd, iov, n, op->offset + op->done);
    }
  }
  io_uring_sqe_set_data(sqe, op);
  return true;
}

bool Ring::PrepPoll(int fd, void* data) {
  io_uring_sqe* sqe = GetSqe();
  if (sqe == nullptr) return false;
  io_uring_prep_poll_add(sqe, fd, POLLIN);
  io_uring_sqe_set_data(sqe, data);
  return true;
}

void Ring::Submit() {
  JoinSharedIoWorkers();
  io_uring_submit(&ring_);
}

bool Ring::Next(bool wait, void** data, int* res) {
  JoinSharedIoWorkers();
  io_uring_cqe* cqe = nullptr;
  int rc = wait ? io_uring_submit_and_wait(&ring_, 1) : 0;
  if (rc >= 0) rc = io_uring_peek_cqe(&ring_, &cqe);
  if (rc < 0 || cqe == nullptr) return false;
  *data = io_uring_cqe_get_data(cqe);
  *res = cqe->res;
  io_uring_cqe_seen(&ring_, cqe);
  return true;
}

bool Ring::HasCompletions() { return io_uring_cq_ready(&ring_) > 0; }

int BusyRings() { return busy_rings.load(std::memory_order_relaxed); }

// Counted once: the affinity mask at first use.
int UsableCpus() {
  static const int n = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      return CPU_COUNT(&set);
    }
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? static_cast<int>(online) : 1;
  }();
  return n;
}

void Ring::SetBusy(bool busy) {
  if (busy == busy_) return;
  busy_ = busy;
  busy_rings.fetch_add(busy ? 1 : -1, std::memory_order_relaxed);
}

int Ring::RegisterEventFd(int fd) {
  return io_uring_register_eventfd(&ring_, fd);
}

}  // namespace qcow2::internal
