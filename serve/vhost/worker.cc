// SPDX-License-Identifier: Apache-2.0
#include "serve/vhost/worker.h"

#include <linux/virtio_blk.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace qcow2::vhost {
namespace {

constexpr uint64_t kOne = 1;

// Bounds of one merged write: the iovecs a writev takes (IOV_MAX), and
// bytes enough that a hand-off per write costs little beside the copy.
constexpr size_t kMaxMergedIov = 1024;
constexpr uint64_t kMaxMergedBytes = 4 << 20;

uint64_t Tag(uint8_t kind, int index = 0, uint32_t gen = 0) {
  return (uint64_t{kind} << 56) | (uint64_t(index & 0xffff) << 32) | gen;
}

}  // namespace

Worker::Worker(Image* image, DeviceShared* shared, int queue_depth)
    : image_(image), shared_(shared), depth_(queue_depth) {}

Worker::~Worker() {
  if (thread_.joinable()) {
    Call([this] { quit_ = true; });
    thread_.join();
  }
  queue_.reset();
  if (ring_ready_) io_uring_queue_exit(&ring_);
  if (mailbox_fd_ >= 0) ::close(mailbox_fd_);
}

absl::Status Worker::Start() {
  QueueOptions qo;
  qo.depth = depth_;
  auto q = image_->CreateQueue(qo);
  if (!q.ok()) return q.status();
  queue_ = std::move(*q);
  const int qfd = queue_->EventFd();
  if (qfd < 0) return absl::ErrnoToStatus(-qfd, "queue notifier");
  mailbox_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (mailbox_fd_ < 0) return absl::ErrnoToStatus(errno, "eventfd");
  // Cooperative task work, as the library's rings have (lib/io/ring.cc):
  // a kick's or the queue notifier's poll that fires while this loop runs
  // is handled when the loop next enters the kernel, which it does after
  // every batch, instead of by an inter-processor interrupt per event
  // (in a VM, an exit on both vCPUs). A loop asleep in the wait is still
  // woken. Kernels before 5.19 take neither flag.
  int rc = io_uring_queue_init(
      256, &ring_, IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG);
  if (rc == -EINVAL) rc = io_uring_queue_init(256, &ring_, 0);
  if (rc < 0) return absl::ErrnoToStatus(-rc, "io_uring_queue_init");
  ring_ready_ = true;
  ArmPoll(mailbox_fd_, Tag(kMailbox));
  ArmPoll(qfd, Tag(kQueueNotify));
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void Worker::Call(std::function<void()> fn) {
  std::promise<void> done;
  {
    std::lock_guard<std::mutex> l(mu_);
    mailbox_.push_back([&] {
      fn();
      done.set_value();
    });
  }
  (void)!::write(mailbox_fd_, &kOne, sizeof kOne);
  done.get_future().wait();
}

absl::Status Worker::StartVq(const VqStart& v) {
  absl::Status result;
  Call([&] {
    Vq& q = vqs_[v.index];
    auto ring = SplitRing::Create(v.mem.get(), v.ring);
    if (!ring.ok()) {
      result = ring.status();
      return;
    }
    q.ring = *ring;
    q.mem = v.mem;
    q.kick_fd = v.kick_fd;
    q.call_fd = v.call_fd;
    q.running = true;
    q.broken = q.dirty = q.full = false;
    ++q.gen;
    ArmPoll(q.kick_fd, Tag(kKick, v.index, q.gen));
    // Chains may have been queued before the kick fd came.
    ProcessVq(v.index);
    Notify();
  });
  return result;
}

uint16_t Worker::StopVq(int index) {
  std::promise<uint16_t> stopped;
  std::future<uint16_t> f = stopped.get_future();
  Call([&] {
    Vq& q = vqs_[index];
    if (!q.running) {
      stopped.set_value(q.ring.last_avail());
      return;
    }
    q.running = false;
    // The pending kick read: cancelled (its completion is recognised as
    // stale by the generation).
    io_uring_sqe* sqe = Sqe();
    io_uring_prep_poll_remove(sqe, Tag(kKick, index, q.gen));
    io_uring_sqe_set_data64(sqe, Tag(kCancel));
    q.stopped = &stopped;
    MaybeStopped(index);
  });
  return f.get();
}

void Worker::SetCall(int index, int call_fd) {
  Call([&] { vqs_[index].call_fd = call_fd; });
}

io_uring_sqe* Worker::Sqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  while (sqe == nullptr) {
    io_uring_submit(&ring_);
    sqe = io_uring_get_sqe(&ring_);
  }
  return sqe;
}

// A poll, not a read: the eventfds (QEMU's too) are non-blocking, and a
// read of one on the ring would end at once with -EAGAIN.
void Worker::ArmPoll(int fd, uint64_t tag) {
  io_uring_sqe* sqe = Sqe();
  io_uring_prep_poll_add(sqe, fd, POLLIN);
  io_uring_sqe_set_data64(sqe, tag);
}

// Resets an eventfd the poll found readable.
void Worker::Reset(int fd) {
  uint64_t n;
  (void)!::read(fd, &n, sizeof n);
}

void Worker::Run() {
  // Before this thread's first io_uring call (its ring's first submit).
  PrepareIoThread();
  while (!quit_) {
    io_uring_submit_and_wait(&ring_, 1);
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      HandleCqe(cqe);
      ++seen;
    }
    io_uring_cq_advance(&ring_, seen);
    // Slots freed by completions: go on with virtqueues that waited.
    for (int i = 0; i < kMaxQueues; ++i) {
      if (vqs_[i].running && vqs_[i].full) ProcessVq(i);
    }
    Notify();
  }
  queue_->Drain();
}

void Worker::HandleCqe(const io_uring_cqe* cqe) {
  const uint64_t tag = io_uring_cqe_get_data64(cqe);
  const uint8_t kind = tag >> 56;
  const int index = (tag >> 32) & 0xffff;
  const uint32_t gen = static_cast<uint32_t>(tag);
  switch (kind) {
    case kMailbox:
      Reset(mailbox_fd_);
      ArmPoll(mailbox_fd_, Tag(kMailbox));
      RunMailbox();
      break;
    case kQueueNotify:
      Reset(queue_->EventFd());
      ArmPoll(queue_->EventFd(), Tag(kQueueNotify));
      while (queue_->Poll(0) > 0) {
      }
      break;
    case kKick: {
      Vq& q = vqs_[index];
      if (!q.running || q.gen != gen) break;  // stale: stopped meanwhile
      if (cqe->res < 0) {
        Fail(index, absl::ErrnoToStatus(-cqe->res, "polling the kick eventfd"));
        break;
      }
      Reset(q.kick_fd);
      ArmPoll(q.kick_fd, Tag(kKick, index, q.gen));
      ProcessVq(index);
      break;
    }
    case kCall:
      if (cqe->res < 0) {
        std::fprintf(stderr, "qcowtool: vhost-user-blk: queue %d: writing the "
                     "call eventfd: %s\n", index, std::strerror(-cqe->res));
      }
      break;
    default:
      break;
  }
}

void Worker::RunMailbox() {
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> l(mu_);
    work.swap(mailbox_);
  }
  for (auto& fn : work) fn();
}

void Worker::ProcessVq(int index) {
  Vq& q = vqs_[index];
  q.full = false;
  // Whatever way the pass ends, the writes it gathered go out.
  struct SendMerged {
    Worker* w;
    ~SendMerged() { w->SubmitMerged(); }
  } send_merged{this};
  while (q.running && !q.broken) {
    // A gathered write takes a slot of the Queue too.
    if (queue_->in_flight() + !merged_.parts.empty() >= queue_->depth()) {
      q.full = true;
      return;
    }
    absl::StatusOr<bool> pending = q.ring.HasPending();
    if (pending.ok() && !*pending) pending = q.ring.ArmKick();
    if (!pending.ok()) return Fail(index, pending.status());
    if (!*pending) return;
    if (absl::Status s = q.ring.Pop(&chain_); !s.ok()) return Fail(index, s);
    Submit(index, chain_);
  }
}

void Worker::Submit(int index, const Chain& chain) {
  absl::StatusOr<BlkRequest> parsed = ParseBlkRequest(chain);
  if (!parsed.ok()) return Fail(index, parsed.status());
  const BlkRequest& r = *parsed;
  Vq& q = vqs_[index];
  ++q.in_flight;
  const bool writeback = shared_->writeback.load(std::memory_order_relaxed);
  if (r.type != VIRTIO_BLK_T_OUT || !writeback) SubmitMerged();
  const uint16_t head = chain.head;
  uint8_t* status = r.status;
  const BlkGeometry& g = shared_->geometry;
  auto done = [this, index, head, status](uint32_t written) {
    return [this, index, head, status, written](absl::Status s) {
      Finish(index, head, status, s.ok() ? VIRTIO_BLK_S_OK : VIRTIO_BLK_S_IOERR,
             written);
    };
  };
  auto fail = [&](uint8_t value) { Finish(index, head, status, value, 1); };
  // A data range: whole sectors inside the disk.
  auto in_range = [&](uint64_t sector, uint64_t bytes) {
    return bytes % kSectorSize == 0 && sector <= g.capacity_bytes / kSectorSize &&
           bytes <= g.capacity_bytes - sector * kSectorSize;
  };
  absl::Status s;
  switch (r.type) {
    case VIRTIO_BLK_T_IN:
      if (!in_range(r.sector, r.data_bytes)) return fail(VIRTIO_BLK_S_IOERR);
      s = queue_->SubmitReadv(r.sector * kSectorSize, r.data,
                              done(static_cast<uint32_t>(r.data_bytes + 1)));
      break;
    case VIRTIO_BLK_T_OUT: {
      if (g.read_only || !in_range(r.sector, r.data_bytes)) {
        return fail(VIRTIO_BLK_S_IOERR);
      }
      if (writeback) {
        return AddWrite(index, chain.head, status, r.sector * kSectorSize, r);
      }
      // Write-through: the guest sees the write once it is durable.
      Completion cb = [this, cb = done(1)](absl::Status st) {
        if (st.ok()) st = image_->Flush();
        cb(st);
      };
      s = queue_->SubmitWritev(r.sector * kSectorSize, r.data, std::move(cb));
      break;
    }
    case VIRTIO_BLK_T_FLUSH:
      s = queue_->SubmitFlush(done(1));
      break;
    case VIRTIO_BLK_T_GET_ID: {
      char id[kIdBytes] = {};
      std::memcpy(id, shared_->serial.data(),
                  std::min(shared_->serial.size(), kIdBytes));
      const size_t n = CopyToIov(r.data, id, kIdBytes);
      return Finish(index, head, status, VIRTIO_BLK_S_OK,
                    static_cast<uint32_t>(n + 1));
    }
    case VIRTIO_BLK_T_DISCARD:
    case VIRTIO_BLK_T_WRITE_ZEROES: {
      if (g.read_only || !g.discard) return fail(VIRTIO_BLK_S_UNSUPP);
      std::vector<BlkRange> ranges;
      if (!ParseRanges(r, &ranges) || ranges.size() != 1) {
        return fail(VIRTIO_BLK_S_UNSUPP);
      }
      const BlkRange& d = ranges[0];
      const bool zeroes = r.type == VIRTIO_BLK_T_WRITE_ZEROES;
      const uint32_t max = zeroes ? kMaxWriteZeroesSectors : kMaxDiscardSectors;
      const uint32_t allowed = zeroes ? VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP : 0;
      if ((d.flags & ~allowed) != 0) return fail(VIRTIO_BLK_S_UNSUPP);
      if (d.num_sectors > max ||
          !in_range(d.sector, uint64_t{d.num_sectors} * kSectorSize)) {
        return fail(VIRTIO_BLK_S_IOERR);
      }
      uint64_t off = d.sector * kSectorSize;
      uint64_t len = uint64_t{d.num_sectors} * kSectorSize;
      if (zeroes) {
        s = queue_->SubmitWriteZeroes(
            off, len, d.flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP, done(1));
        break;
      }
      // A discard is advice: only whole clusters are dropped, the rest
      // keeps its data (as QEMU's qcow2 driver does; the library would
      // zero the partial clusters, which costs writes and says nothing
      // the guest asked for).
      const uint64_t g = shared_->discard_granularity;
      const uint64_t first = (off + g - 1) / g * g;
      const uint64_t end = (off + len) / g * g;
      if (end <= first) return Finish(index, head, status, VIRTIO_BLK_S_OK, 1);
      s = queue_->SubmitDiscard(first, end - first, done(1));
      break;
    }
    default:
      return fail(VIRTIO_BLK_S_UNSUPP);
  }
  if (!s.ok()) fail(VIRTIO_BLK_S_IOERR);
}

void Worker::AddWrite(int index, uint16_t head, uint8_t* status,
                      uint64_t offset, const BlkRequest& r) {
  MergedWrite& m = merged_;
  if (!m.parts.empty() &&
      (m.index != index || offset != m.offset + m.bytes ||
       m.iov.size() + r.data.size() > kMaxMergedIov ||
       m.bytes + r.data_bytes > kMaxMergedBytes)) {
    SubmitMerged();
  }
  if (m.parts.empty()) {
    m.index = index;
    m.offset = offset;
    m.bytes = 0;
  }
  m.iov.insert(m.iov.end(), r.data.begin(), r.data.end());
  m.bytes += r.data_bytes;
  m.parts.push_back({head, status});
}

void Worker::SubmitMerged() {
  MergedWrite& m = merged_;
  if (m.parts.empty()) return;
  const int index = m.index;
  std::vector<MergedWrite::Part> parts;
  parts.swap(m.parts);
  // One part: the callback carries it alone, with no vector to copy.
  const MergedWrite::Part one = parts[0];
  auto finish = [this, index](const std::vector<MergedWrite::Part>& ps,
                              uint8_t value) {
    for (const MergedWrite::Part& p : ps) Finish(index, p.head, p.status, value, 1);
  };
  absl::Status s;
  if (parts.size() == 1) {
    s = queue_->SubmitWritev(m.offset, m.iov, [this, index, one](absl::Status st) {
      Finish(index, one.head, one.status,
             st.ok() ? VIRTIO_BLK_S_OK : VIRTIO_BLK_S_IOERR, 1);
    });
  } else {
    s = queue_->SubmitWritev(
        m.offset, m.iov, [finish, parts](absl::Status st) {
          finish(parts, st.ok() ? VIRTIO_BLK_S_OK : VIRTIO_BLK_S_IOERR);
        });
  }
  m.iov.clear();
  if (!s.ok()) finish(parts, VIRTIO_BLK_S_IOERR);
}

void Worker::Finish(int index, uint16_t head, uint8_t* status, uint8_t value,
                    uint32_t written) {
  Vq& q = vqs_[index];
  *status = value;
  q.ring.PushUsed(head, written);
  q.dirty = true;
  --q.in_flight;
  MaybeStopped(index);
}

void Worker::MaybeStopped(int index) {
  Vq& q = vqs_[index];
  if (q.stopped == nullptr || q.in_flight > 0) return;
  if (q.dirty) {
    q.dirty = false;
    if (q.ring.PublishUsed() && q.call_fd >= 0) {
      (void)!::write(q.call_fd, &kOne, sizeof kOne);
    }
  }
  q.mem.reset();
  q.stopped->set_value(q.ring.last_avail());
  q.stopped = nullptr;
}

void Worker::Fail(int index, const absl::Status& why) {
  Vq& q = vqs_[index];
  if (q.broken) return;
  q.broken = true;
  std::fprintf(stderr, "qcowtool: vhost-user-blk: queue %d: %s; closing the "
               "connection\n", index, std::string(why.message()).c_str());
  (void)!::write(shared_->error_fd, &kOne, sizeof kOne);
}

void Worker::Notify() {
  for (int i = 0; i < kMaxQueues; ++i) {
    Vq& q = vqs_[i];
    if (!q.dirty || q.mem == nullptr) continue;
    q.dirty = false;
    if (q.ring.PublishUsed() && q.call_fd >= 0) {
      io_uring_sqe* sqe = Sqe();
      io_uring_prep_write(sqe, q.call_fd, &kOne, sizeof kOne, 0);
      io_uring_sqe_set_data64(sqe, Tag(kCall, i));
    }
  }
}

}  // namespace qcow2::vhost
