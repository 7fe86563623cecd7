// SPDX-License-Identifier: Apache-2.0
#include "lib/engine/queue_impl.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/io/data_cipher.h"
#include "lib/io/io_plan.h"
#include "lib/io/ring.h"
#include "lib/io/ring_file.h"

namespace qcow2::internal {

namespace {

uint8_t OpCode(Executor::OpType type) {
  switch (type) {
    case Executor::OpType::kRead: return kOpRead;
    case Executor::OpType::kWrite: return kOpWrite;
    case Executor::OpType::kFlush: return kOpFlush;
  }
  return kOpRead;
}

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

void Fail(Request* r, absl::Status s) {
  if (r->status.ok()) r->status = std::move(s);
}

// Past the end of the file: the rest of a read is zeros.
void ZeroRest(IoOp* op) {
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

}  // namespace

QueueImpl::QueueImpl(Engine* engine, const QueueOptions& opts)
    : engine_(engine), depth_(opts.depth > 0 ? opts.depth : 1) {
  event_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (opts.use_io_uring && event_fd_ >= 0) {
    unsigned entries = 64;
    while (entries < static_cast<unsigned>(depth_) * 2 && entries < 4096) {
      entries *= 2;
    }
    // (lib/io/ring.cc: with cooperative task work where the kernel has it)
    if (const int err = ring_.Init(entries); err == 0) {
      ArmEventFd();
    } else {
      WarnNoUring(err);
    }
  }
  engine_->stats().Register(this);
}

QueueImpl::~QueueImpl() {
  while (in_flight_ > 0) Poll(in_flight_);
  if (ring_.ok()) {
    // Complete the armed eventfd read before the ring goes away.
    closing_ = true;
    uint64_t one = 1;
    if (::write(event_fd_, &one, sizeof(one)) < 0) {
      // The read stays armed; exiting the ring cancels it.
    }
    ring_.Submit();
    while (event_armed_) ReapOne(true);
    ring_.Exit();
  }
  for (Request* r : spare_) delete r;
  for (auto& [p, size] : spare_bounces_) std::free(p);
  if (event_fd_ >= 0) ::close(event_fd_);
  if (const int fd = notify_fd_.load(); fd >= 0) ::close(fd);
  engine_->stats().Unregister(this);
}

absl::Status QueueImpl::Submit(std::unique_ptr<Request> r) {
  if (in_flight_ >= depth_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("queue is full (", in_flight_,
                     " requests in flight, depth ", depth_, ")"));
  }
  Request* req = r.get();
  req->owner = this;
  req->waiter = this;
  // Validated and begun in one hold of the engine's lock; a request that
  // fails the checks is refused here, its callback never called.
  absl::Status rejected;
  const bool ready = engine_->Begin(req, &rejected);
  if (!rejected.ok()) return rejected;
  r.release();
  if (++in_flight_ == 1) ring_.SetBusy(true);
  if (ready) Start(req);
  if (notify_fd_.load(std::memory_order_relaxed) >= 0) {
    // An event loop waits for the notifier, not in Poll: its I/O must
    // reach the kernel now. And a request that finished already (a read
    // of zeros, an error found while planning, I/O run synchronously)
    // has a callback for Poll(0) to run.
    PushToKernel();
    NotifyIfReady();
  }
  return absl::OkStatus();
}

int QueueImpl::EventFd() {
  if (const int fd = notify_fd_.load(); fd >= 0) return fd;
  const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return -errno;
  if (ring_.ok()) {
    // Every completion the kernel posts on the ring makes it readable,
    // whether the I/O finished before or after the embedder last polled.
    // (The ring's own wake-up, a poll on event_fd_, posts one too.)
    if (const int rc = ring_.RegisterEventFd(fd); rc < 0) {
      ::close(fd);
      return rc;
    }
  }
  notify_fd_.store(fd);
  // What is ready already.
  NotifyIfReady();
  return fd;
}

void QueueImpl::PushToKernel() {
  if (!ring_.ok()) return;
  SubmitBacklog();
  ring_.Submit();
}

void QueueImpl::Notify() {
  const int fd = notify_fd_.load(std::memory_order_acquire);
  if (fd < 0) return;
  uint64_t one = 1;
  if (::write(fd, &one, sizeof(one)) < 0) {
    // EAGAIN: the counter is at its maximum, so readable already.
  }
}

void QueueImpl::NotifyIfReady() {
  if (notify_fd_.load(std::memory_order_relaxed) < 0) return;
  bool ready = !done_.empty() || !backlog_.empty();
  if (!ready) {
    MutexLock lock(&wake_mu_);
    ready = !woken_.empty();
  }
  if (!ready && ring_.ok()) ready = ring_.HasCompletions();
  if (ready) Notify();
}

int QueueImpl::Poll(int min_complete) {
  int ran = 0;
  while (true) {
    DrainWoken();
    if (ring_.ok()) {
      // What the ring holds already, without a system call. New requests
      // reach the kernel below: with the wait, in one io_uring_enter, or
      // before returning. (At queue depth 1, one call per request.)
      SubmitBacklog();
      while (ReapOne(false)) {
      }
    }
    ran += RunCallbacks();
    if (ran >= min_complete || in_flight_ == 0) {
      // Ops issued while completions were handled go to the kernel now
      // (the caller may wait on the notifier next, not in Poll). Callbacks
      // may have submitted requests that finished at once, or completions
      // may wait that this pass did not reap: the embedder polls again.
      PushToKernel();
      NotifyIfReady();
      return ran;
    }
    if (!done_.empty()) continue;
    // Nothing finished yet: wait for the ring or for a wake-up.
    {
      // A wake-up whose eventfd signal was already consumed above.
      MutexLock lock(&wake_mu_);
      if (!woken_.empty()) continue;
    }
    if (ring_.ok()) {
      if (!event_armed_) ArmEventFd();
      ReapOne(true);  // submits what is queued, then waits: one call
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

void QueueImpl::Wake(Request* r) {
  {
    MutexLock lock(&wake_mu_);
    woken_.push_back(r);
  }
  uint64_t one = 1;
  if (::write(event_fd_, &one, sizeof(one)) < 0) {
    // The counter cannot overflow in practice; nothing to do.
  }
  // Told directly: the ring's poll on event_fd_ may not be armed in the
  // kernel right now.
  Notify();
}

IoStats QueueImpl::Snapshot() const {
  IoStats out;
  auto* f = reinterpret_cast<uint64_t*>(&out);
  for (size_t i = 0; i < kStatFields; ++i) {
    f[i] = stats_[i].load(std::memory_order_relaxed);
  }
  return out;
}

void QueueImpl::DrainWoken() {
  std::vector<Request*> woken;
  {
    MutexLock lock(&wake_mu_);
    woken.swap(woken_);
  }
  for (Request* r : woken) {
    engine_->Plan(r);
    Start(r);
  }
}

void QueueImpl::Start(Request* r) {
  r->stage = Stage::kPlanned;
  Advance(engine_, this, r);
}

void QueueImpl::Issue(Request* r, IoOp* op, OpType type) {
  op->request = r;
  op->type = OpCode(type);
  op->fd = -1;
  // Data of an encrypted file (data_cipher.h): a write goes on the ring
  // from an encrypted bounce (never the caller's buffer), a read is
  // decrypted when it completes (OnComplete); zero-range ops and what
  // cannot bounce run synchronously (RunOp encrypts them).
  const DataCipher* cipher = type == OpType::kFlush ? nullptr : CipherOf(*op);
  if (ring_.ok() && (cipher == nullptr || !op->zero_range)) {
    if (RingFile* rf = op->file->ring_file()) {
      // A no-flush file's flush is done at once, below.
      if (type == OpType::kFlush) {
        if (!rf->ring_skips_flush()) op->fd = rf->ring_fd();
      } else if (cipher != nullptr && type == OpType::kWrite) {
        if (StartBounce(op, std::max<uint32_t>(rf->ring_alignment(), 512))) {
          absl::Status s = cipher->Encrypt(
              op->offset,
              absl::MakeSpan(static_cast<uint8_t*>(op->bounce), op->bytes));
          if (!s.ok()) {
            EndBounce(op, false);
            Fail(r, std::move(s));
            return;
          }
          op->fd = rf->ring_fd();
        }
      } else if (AlignedFor(*op, rf->ring_alignment()) ||
                 StartBounce(op, rf->ring_alignment())) {
        op->fd = rf->ring_fd();
      }
    }
  }
  if (op->fd < 0) {
    absl::Status s = type == OpType::kFlush
                         ? op->file->Flush()
                         : RunOp(*op, type == OpType::kWrite);
    if (s.ok() && type != OpType::kFlush) {
      CountIo(*op, type == OpType::kWrite, &r->stats);
    }
    if (!s.ok()) Fail(r, std::move(s));
    return;
  }
  ++r->pending;
  Prep(op);
}

void QueueImpl::Prep(IoOp* op) {
  if (!ring_.Prep(op)) backlog_.push_back(op);
}

void QueueImpl::SubmitBacklog() {
  while (!backlog_.empty()) {
    if (!ring_.Prep(backlog_.front())) return;  // still full
    backlog_.pop_front();
  }
}

void QueueImpl::ArmEventFd() {
  // Tried again on the next completion when the ring is full.
  if (ring_.PrepPoll(event_fd_, &event_buf_)) event_armed_ = true;
}

bool QueueImpl::ReapOne(bool wait) {
  void* data = nullptr;
  int res = 0;
  if (!ring_.Next(wait, &data, &res)) return false;
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

void QueueImpl::OnComplete(IoOp* op, int res) {
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
    OpDone(r);
    return;
  }
  if (op->zero_range) {
    op->done = op->bytes;
    CountIo(*op, true, &r->stats);
    OpDone(r);
    return;
  }
  if (res < 0) {
    const char* what = op->type == kOpRead    ? "read at "
                       : op->type == kOpWrite ? "write at "
                                              : "fdatasync";
    const std::string where =
        op->type == kOpFlush ? std::string(what)
                             : absl::StrCat(what, op->offset + op->done);
    // Only a file that offers a RingFile has ops on the ring. Its error
    // names a full device's size.
    Fail(r, op->file->ring_file()->RingError(-res, where));
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
  bool copy_out = op->type == kOpRead && res >= 0;
  if (copy_out) {
    if (const DataCipher* c = CipherOf(*op)) {
      // In the bounce (one contiguous buffer) before it is copied out.
      absl::Status s =
          op->bounce != nullptr
              ? c->Decrypt(op->offset, absl::MakeSpan(
                                           static_cast<uint8_t*>(op->bounce),
                                           op->bytes))
              : DecryptIov(*c, op->offset, op->iov);
      if (!s.ok()) {
        Fail(r, std::move(s));
        copy_out = false;
      }
    }
  }
  EndBounce(op, copy_out);
  OpDone(r);
}

bool QueueImpl::StartBounce(IoOp* op, uint32_t align) {
  // Up to the largest NBD request and more; longer ones are rare enough
  // to go through the file.
  constexpr uint64_t kMaxBounce = 64ull << 20;
  if (op->zero_range || op->bytes == 0 || op->bytes > kMaxBounce ||
      op->offset % align != 0 || op->bytes % align != 0) {
    return false;
  }
  void* buf = nullptr;
  size_t size = 0;
  for (size_t i = spare_bounces_.size(); i-- > 0;) {
    if (spare_bounces_[i].second >= op->bytes) {
      std::tie(buf, size) = spare_bounces_[i];
      spare_bounce_bytes_ -= size;
      spare_bounces_[i] = spare_bounces_.back();
      spare_bounces_.pop_back();
      break;
    }
  }
  if (buf == nullptr) {
    size = (op->bytes + 4095) & ~size_t{4095};
    if (::posix_memalign(&buf, std::max<size_t>(align, 4096), size) != 0) {
      return false;  // the file's own bounce, synchronous
    }
  }
  if (op->type == kOpWrite) {
    uint8_t* dst = static_cast<uint8_t*>(buf);
    for (const iovec& v : op->iov) {
      std::memcpy(dst, v.iov_base, v.iov_len);
      dst += v.iov_len;
    }
  }
  op->bounce = buf;
  op->bounce_size = size;
  op->caller_iov.swap(op->iov);
  op->iov.assign(1, iovec{buf, op->bytes});
  return true;
}

void QueueImpl::EndBounce(IoOp* op, bool copy_out) {
  if (op->bounce == nullptr) return;
  if (copy_out) {
    const uint8_t* src = static_cast<const uint8_t*>(op->bounce);
    for (const iovec& v : op->caller_iov) {
      std::memcpy(v.iov_base, src, v.iov_len);
      src += v.iov_len;
    }
  }
  op->iov.swap(op->caller_iov);
  op->caller_iov.clear();
  // Kept for the next bounce: up to a buffer per request the queue
  // holds, and 8 MiB in all.
  constexpr size_t kMaxSpareBytes = 8u << 20;
  if (spare_bounces_.size() < static_cast<size_t>(depth_) &&
      spare_bounce_bytes_ + op->bounce_size <= kMaxSpareBytes) {
    spare_bounces_.emplace_back(op->bounce, op->bounce_size);
    spare_bounce_bytes_ += op->bounce_size;
  } else {
    std::free(op->bounce);
  }
  op->bounce = nullptr;
}

void QueueImpl::OpDone(Request* r) {
  if (--r->pending == 0) Advance(engine_, this, r);
}

void QueueImpl::Done(Request* r) {
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

int QueueImpl::RunCallbacks() {
  int n = static_cast<int>(done_.size());
  for (int i = 0; i < n; ++i) {
    Request* r = done_.front();
    done_.pop_front();
    Completion cb = std::move(r->done);
    absl::Status s = std::move(r->status);
    Recycle(r);
    if (--in_flight_ == 0) ring_.SetBusy(false);
    if (cb) cb(std::move(s));
  }
  return n;
}

namespace {
// Under AddressSanitizer every request is freed, so that a use after its
// end is caught rather than read from a reused object.
#if defined(__SANITIZE_ADDRESS__)
constexpr int kReuseRequests = 0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr int kReuseRequests = 0;
#else
constexpr int kReuseRequests = 1;
#endif
#else
constexpr int kReuseRequests = 1;
#endif
}  // namespace

std::unique_ptr<Request> QueueImpl::NewRequest() {
  if (spare_.empty()) return std::make_unique<Request>();
  Request* r = spare_.back();
  spare_.pop_back();
  return std::unique_ptr<Request>(r);
}

void QueueImpl::Recycle(Request* r) {
  if (kReuseRequests == 0 || spare_.size() >= static_cast<size_t>(depth_)) {
    delete r;
    return;
  }
  // A fresh object in the same memory: nothing of r survives.
  r->~Request();
  new (r) Request();
  spare_.push_back(r);
}

}  // namespace qcow2::internal
