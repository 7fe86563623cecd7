// Queue: the asynchronous executor. One io_uring ring per queue; requests
// are planned by the chain (lib/engine/chain_engine.cc) and their I/O runs
// on the ring with no lock held. Files that are not the library's own
// PosixFile, and I/O the ring cannot take as is (unaligned O_DIRECT), run
// synchronously on the calling thread.
#include <linux/falloc.h>
#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/meta/write_back_file.h"
#include "lib/chain/chain.h"
#include "lib/engine/request.h"
#include "lib/io/posix_file.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"

namespace qcow2 {
namespace internal {

namespace {

constexpr size_t kStatFields = sizeof(IoStats) / sizeof(uint64_t);
constexpr uint8_t kOpRead = 0, kOpWrite = 1, kOpFlush = 2;
// Request::phase while a deferred metadata miss is being read.
constexpr int kPhaseMiss = -1;

void WarnNoUring(int err) {
  static std::once_flag once;
  std::call_once(once, [err] {
    std::fprintf(stderr,
                 "libqcow2: io_uring is not available (%s); queues run "
                 "requests synchronously\n",
                 std::strerror(err));
  });
}

bool AlignedFor(const IoOp& op, uint32_t align) {
  if (align <= 1) return true;
  if (op.offset % align != 0) return false;
  for (const iovec& v : op.iov) {
    if (reinterpret_cast<uintptr_t>(v.iov_base) % align != 0 ||
        v.iov_len % align != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace

class QueueImpl final : public Waiter, public Chain::StatsSource {
 public:
  QueueImpl(Chain* chain, const QueueOptions& opts)
      : chain_(chain), depth_(opts.depth > 0 ? opts.depth : 1) {
    event_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (opts.use_io_uring && event_fd_ >= 0) {
      unsigned entries = 64;
      while (entries < static_cast<unsigned>(depth_) * 2 && entries < 4096) {
        entries *= 2;
      }
      int rc = io_uring_queue_init(entries, &ring_, 0);
      if (rc == 0) {
        ring_ok_ = true;
        ArmEventFd();
      } else {
        WarnNoUring(-rc);
      }
    }
    chain_->Register(this);
  }

  ~QueueImpl() override {
    while (in_flight_ > 0) Poll(in_flight_);
    if (ring_ok_) {
      // Complete the armed eventfd read before the ring goes away.
      closing_ = true;
      uint64_t one = 1;
      if (::write(event_fd_, &one, sizeof(one)) < 0) {
        // The read stays armed; exiting the ring cancels it.
      }
      io_uring_submit(&ring_);
      while (event_armed_) ReapOne(true);
      io_uring_queue_exit(&ring_);
    }
    if (event_fd_ >= 0) ::close(event_fd_);
    chain_->Unregister(this);
  }

  bool uses_io_uring() const { return ring_ok_; }
  int depth() const { return depth_; }
  int in_flight() const { return in_flight_; }

  absl::Status Submit(std::unique_ptr<Request> r) {
    if (in_flight_ >= depth_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "queue is full (", in_flight_, " requests in flight, depth ",
          depth_, ")"));
    }
    if (absl::Status s = chain_->Validate(*r); !s.ok()) return s;
    Request* req = r.release();
    req->owner = this;
    req->waiter = this;
    ++in_flight_;
    if (chain_->Begin(req)) {
      Start(req);
    } else {
      ++parked_;
    }
    return absl::OkStatus();
  }

  int Poll(int min_complete) {
    int ran = 0;
    while (true) {
      DrainWoken();
      if (ring_ok_) {
        SubmitBacklog();
        io_uring_submit(&ring_);
        while (ReapOne(false)) {
        }
      }
      ran += RunCallbacks();
      if (ran >= min_complete || in_flight_ == 0) return ran;
      if (!done_.empty()) continue;
      // Nothing finished yet: wait for the ring or for a wake-up.
      {
        // A wake-up whose eventfd signal was already consumed above.
        std::lock_guard<std::mutex> lock(wake_mu_);
        if (!woken_.empty()) continue;
      }
      if (ring_ok_) {
        if (!event_armed_) {
          ArmEventFd();
          io_uring_submit(&ring_);
        }
        ReapOne(true);
      } else {
        pollfd pfd{event_fd_, POLLIN, 0};
        ::poll(&pfd, 1, -1);
        uint64_t v;
        if (::read(event_fd_, &v, sizeof(v)) < 0) {
          // EAGAIN: a spurious wake-up; look again.
        }
      }
    }
  }

  // Waiter: any thread, with the chain's metadata lock held.
  void Wake(Request* r) override {
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      woken_.push_back(r);
    }
    uint64_t one = 1;
    if (::write(event_fd_, &one, sizeof(one)) < 0) {
      // The counter cannot overflow in practice; nothing to do.
    }
  }

  IoStats Snapshot() const override {
    IoStats out;
    auto* f = reinterpret_cast<uint64_t*>(&out);
    for (size_t i = 0; i < kStatFields; ++i) {
      f[i] = stats_[i].load(std::memory_order_relaxed);
    }
    return out;
  }

 private:
  void DrainWoken() {
    std::vector<Request*> woken;
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      woken.swap(woken_);
    }
    for (Request* r : woken) {
      --parked_;
      chain_->Plan(r);
      Start(r);
    }
  }

  void Start(Request* r) {
    r->phase = 0;
    if (r->parked) {
      ++parked_;  // woken when its miss is in, or its widened range free
      return;
    }
    if (r->miss_cache != nullptr) IssueMiss(r);
    Advance(r);
  }

  // Planning stopped at a metadata cache miss: read the entry on the ring.
  void IssueMiss(Request* r) {
    r->phase = kPhaseMiss;
    Issue(r, &r->miss_op, kOpRead);
  }

  // After the chain planned r again (a new round, or r itself after its
  // fill): its phases start over. False if it is parked.
  bool Replanned(Request* r) {
    r->phase = 0;
    if (r->parked) {
      ++parked_;
      return false;
    }
    if (r->miss_cache != nullptr) IssueMiss(r);
    return true;
  }

  // Runs the request's phases while nothing of it is in flight.
  void Advance(Request* r) {
    while (r->pending == 0) {
      if (r->phase == kPhaseMiss) {
        chain_->LoadMiss(r);  // plans again
        if (r->parked) {
          ++parked_;
          return;
        }
        if (r->miss_cache != nullptr) {
          IssueMiss(r);
        } else {
          r->phase = 0;
        }
        continue;
      }
      switch (r->phase++) {
        case 0:
          chain_->Grow(r);  // blocking, no lock held (rarely: in steps)
          if (r->filling) {
            // A flush's fill of pending clusters (deferred copy-on-write):
            // blocking I/O on this thread, with no lock held, so that a
            // flush that waits for it never waits for this queue to be
            // polled. FinishFill then plans the flush proper.
            if (r->status.ok()) r->status = RunPlanIo(r->plan, &r->stats);
            chain_->FinishFill(r);
            // The fill a write, write-zeroes or discard needed first: the
            // request itself is planned now.
            if (r->kind != Request::kFlush && r->status.ok()) {
              if (!Replanned(r)) return;
              continue;
            }
          }
          // A flush records (or finds recorded) its metadata write-back:
          // blocking, as it may wait for another flush's log.
          if (r->status.ok() && r->record_flush) chain_->RecordFlush(r);
          if (r->status.ok() && r->write_back_file != nullptr) {
            // Metadata writes recorded while it was planned (a flush's
            // write-back, evictions): blocking I/O on this thread, in
            // their turn among other requests' (no lock held).
            r->status = r->write_back_file->WriteBack(r->write_back_ticket);
          }
          if (!r->status.ok()) break;
          for (IoOp& op : r->plan.reads) Issue(r, &op, kOpRead);
          break;
        case 1:
          if (!r->status.ok()) break;
          for (auto& step : r->plan.after_reads) {
            r->status = step();
            if (!r->status.ok()) break;
          }
          if (!r->status.ok()) break;
          for (IoOp& op : r->plan.writes) Issue(r, &op, kOpWrite);
          break;
        case 2:
          if (r->status.ok() && r->kind == Request::kFlush &&
              r->flush_file != nullptr) {
            r->stats.host_flushes++;
            r->flush_op.file = r->flush_file;
            Issue(r, &r->flush_op, kOpFlush);
          }
          break;
        default:
          if (r->zero_more && r->status.ok()) {
            // One round of a long write-zeroes or discard is done: commit
            // it and plan the next, which runs its phases from the start.
            chain_->NextRound(r);
            if (r->status.ok()) {
              if (!Replanned(r)) return;
              continue;
            }
          }
          Complete(r);
          return;
      }
    }
  }

  void Fail(Request* r, absl::Status s) {
    if (r->status.ok()) r->status = std::move(s);
  }

  void Issue(Request* r, IoOp* op, uint8_t type) {
    op->request = r;
    op->type = type;
    op->fd = -1;
    if (ring_ok_) {
      if (auto* pf = dynamic_cast<PosixFile*>(op->file)) {
        if (type == kOpFlush || AlignedFor(*op, pf->alignment())) {
          op->fd = pf->fd();
        }
      }
    }
    if (op->fd < 0) {
      absl::Status s = type == kOpFlush ? op->file->Flush()
                                        : RunOp(*op, type == kOpWrite);
      if (s.ok() && type != kOpFlush) CountIo(*op, type == kOpWrite, &r->stats);
      if (!s.ok()) Fail(r, std::move(s));
      return;
    }
    ++r->pending;
    Prep(op);
  }

  void Prep(IoOp* op) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    if (sqe == nullptr) {
      backlog_.push_back(op);
      return;
    }
    if (op->type == kOpFlush) {
      io_uring_prep_fsync(sqe, op->fd, IORING_FSYNC_DATASYNC);
    } else if (op->zero_range) {
      io_uring_prep_fallocate(sqe, op->fd, FALLOC_FL_ZERO_RANGE, op->offset,
                              op->bytes);
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
      } else {
        io_uring_prep_writev(sqe, op->fd, iov, n, op->offset + op->done);
      }
    }
    io_uring_sqe_set_data(sqe, op);
  }

  void SubmitBacklog() {
    while (!backlog_.empty()) {
      if (io_uring_sq_space_left(&ring_) == 0) {
        io_uring_submit(&ring_);
        if (io_uring_sq_space_left(&ring_) == 0) return;
      }
      IoOp* op = backlog_.front();
      backlog_.pop_front();
      Prep(op);
    }
  }

  void ArmEventFd() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    if (sqe == nullptr) return;  // tried again on the next completion
    io_uring_prep_poll_add(sqe, event_fd_, POLLIN);
    io_uring_sqe_set_data(sqe, &event_buf_);
    event_armed_ = true;
  }

  // Handles one completion; with `wait`, blocks for it. Returns false when
  // none was there.
  bool ReapOne(bool wait) {
    io_uring_cqe* cqe = nullptr;
    int rc = wait ? io_uring_submit_and_wait(&ring_, 1) : 0;
    if (rc >= 0) rc = io_uring_peek_cqe(&ring_, &cqe);
    if (rc < 0 || cqe == nullptr) return false;
    void* data = io_uring_cqe_get_data(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    if (data == &event_buf_) {
      event_armed_ = false;
      if (::read(event_fd_, &event_buf_, sizeof(event_buf_)) < 0) {
        // EAGAIN: already consumed.
      }
      if (!closing_) ArmEventFd();
      return true;
    }
    OnComplete(static_cast<IoOp*>(data), res);
    return true;
  }

  void OnComplete(IoOp* op, int res) {
    auto* r = static_cast<Request*>(op->request);
    if (res == -EINTR || res == -EAGAIN) {
      Prep(op);
      return;
    }
    if (op->zero_range && res < 0) {
      // No zero-range here (EOPNOTSUPP, EINVAL): the File's own fallbacks.
      absl::Status s = RunOp(*op, true);
      if (s.ok()) {
        CountIo(*op, true, &r->stats);
      } else {
        Fail(r, std::move(s));
      }
      if (--r->pending == 0) Advance(r);
      return;
    }
    if (op->zero_range) {
      op->done = op->bytes;
      CountIo(*op, true, &r->stats);
      if (--r->pending == 0) Advance(r);
      return;
    }
    if (res < 0) {
      const char* what = op->type == kOpRead    ? "read at "
                         : op->type == kOpWrite ? "write at "
                                                : "fdatasync";
      Fail(r, ErrnoError(-res,
                         op->type == kOpFlush
                             ? std::string(what) + " of"
                             : absl::StrCat(what, op->offset + op->done, " of"),
                         op->file->name()));
    } else if (op->type != kOpFlush) {
      op->done += static_cast<uint64_t>(res);
      if (op->done < op->bytes) {
        if (op->type == kOpRead && res == 0) {
          ZeroRest(op);  // past the end of the file: zeros
        } else if (res == 0) {
          Fail(r, absl::DataLossError(absl::StrCat(
                      "write at ", op->offset + op->done, " of ",
                      op->file->name(), " wrote nothing")));
        } else {
          Prep(op);  // short transfer: the rest
          return;
        }
      }
      if (r->status.ok()) CountIo(*op, op->type == kOpWrite, &r->stats);
    }
    if (--r->pending == 0) Advance(r);
  }

  static void ZeroRest(IoOp* op) {
    uint64_t skip = op->done;
    for (const iovec& v : op->iov) {
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      std::memset(static_cast<uint8_t*>(v.iov_base) + skip, 0,
                  v.iov_len - skip);
      skip = 0;
    }
    op->done = op->bytes;
  }

  void Complete(Request* r) {
    chain_->Finish(r);
    const auto* f = reinterpret_cast<const uint64_t*>(&r->stats);
    for (size_t i = 0; i < kStatFields; ++i) {
      if (f[i] != 0) {
        stats_[i].store(stats_[i].load(std::memory_order_relaxed) + f[i],
                        std::memory_order_relaxed);
      }
    }
    r->plan.Clear();
    done_.push_back(r);
  }

  int RunCallbacks() {
    int n = static_cast<int>(done_.size());
    for (int i = 0; i < n; ++i) {
      Request* r = done_.front();
      done_.pop_front();
      Completion cb = std::move(r->done);
      absl::Status s = std::move(r->status);
      delete r;
      --in_flight_;
      if (cb) cb(std::move(s));
    }
    return n;
  }

  Chain* const chain_;
  const int depth_;
  io_uring ring_{};
  bool ring_ok_ = false;
  int event_fd_ = -1;
  uint64_t event_buf_ = 0;
  bool event_armed_ = false;
  bool closing_ = false;
  int in_flight_ = 0;  // submitted, callback not yet run
  int parked_ = 0;     // waiting for overlapping requests
  std::deque<IoOp*> backlog_;  // ops waiting for a free SQE
  std::deque<Request*> done_;
  std::mutex wake_mu_;
  std::vector<Request*> woken_;
  std::array<std::atomic<uint64_t>, kStatFields> stats_{};
};

}  // namespace internal

using internal::Request;

Queue::Queue(std::unique_ptr<internal::QueueImpl> impl)
    : impl_(std::move(impl)) {}
Queue::~Queue() = default;

absl::Status Queue::SubmitRead(uint64_t offset, absl::Span<uint8_t> buf,
                               Completion done) {
  auto r = std::make_unique<Request>();
  r->kind = Request::kRead;
  r->offset = offset;
  r->len = buf.size();
  r->rbuf = buf.data();
  r->done = std::move(done);
  return impl_->Submit(std::move(r));
}

absl::Status Queue::SubmitWrite(uint64_t offset, absl::Span<const uint8_t> data,
                                Completion done) {
  auto r = std::make_unique<Request>();
  r->kind = Request::kWrite;
  r->offset = offset;
  r->len = data.size();
  r->wbuf = data.data();
  r->done = std::move(done);
  return impl_->Submit(std::move(r));
}

absl::Status Queue::SubmitWriteZeroes(uint64_t offset, uint64_t len,
                                      bool unmap, Completion done) {
  auto r = std::make_unique<Request>();
  r->kind = Request::kWriteZeroes;
  r->offset = offset;
  r->len = len;
  r->unmap = unmap;
  r->done = std::move(done);
  return impl_->Submit(std::move(r));
}

absl::Status Queue::SubmitDiscard(uint64_t offset, uint64_t len,
                                  Completion done) {
  auto r = std::make_unique<Request>();
  r->kind = Request::kDiscard;
  r->offset = offset;
  r->len = len;
  r->done = std::move(done);
  return impl_->Submit(std::move(r));
}

absl::Status Queue::SubmitFlush(Completion done) {
  auto r = std::make_unique<Request>();
  r->kind = Request::kFlush;
  r->done = std::move(done);
  return impl_->Submit(std::move(r));
}

int Queue::Poll(int min_complete) { return impl_->Poll(min_complete); }
void Queue::Drain() {
  while (impl_->in_flight() > 0) impl_->Poll(impl_->in_flight());
}
int Queue::in_flight() const { return impl_->in_flight(); }
int Queue::depth() const { return impl_->depth(); }
bool Queue::uses_io_uring() const { return impl_->uses_io_uring(); }
IoStats Queue::stats() const { return impl_->Snapshot(); }

absl::StatusOr<std::unique_ptr<Queue>> Image::CreateQueue(
    const QueueOptions& opts) {
  if (absl::Status s = chain_->Validate(internal::Request{}); !s.ok()) {
    return s;
  }
  return std::unique_ptr<Queue>(
      new Queue(std::make_unique<internal::QueueImpl>(chain_.get(), opts)));
}

IoStats Image::GetStats() const { return chain_->Stats(); }

}  // namespace qcow2
