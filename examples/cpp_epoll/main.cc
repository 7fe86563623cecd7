// SPDX-License-Identifier: Apache-2.0
// What a C++ virtual machine monitor would write to serve a virtio-blk disk
// from a qcow2 chain with libqcow2 (qcow2/image.h, qcow2/queue.h):
//
//   1. create a chain: base.qcow2 with some data, overlay.qcow2 on top;
//   2. open the overlay, make a Queue, put Queue::EventFd() in epoll;
//   3. serve random scatter-gather requests (SubmitReadv, SubmitWritev,
//      SubmitFlush) as a virtqueue hands them over, blocking only in
//      epoll_wait;
//   4. check every read against what the disk must hold, and at the end
//      read the whole disk back.
//
//   cpp_epoll DIR      (DIR: a directory for the two images)
// Prints one line and exits 0 when every byte is right.
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "qcow2/image.h"
#include "qcow2/queue.h"
#include "qcow2/version.h"

namespace {

constexpr uint64_t kDiskSize = uint64_t{64} << 20;
constexpr uint64_t kSector = 512;
constexpr int kMaxSegs = 4;
constexpr int kDepth = 32;
constexpr int kRequests = 2000;

[[noreturn]] void Die(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "cpp_epoll: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

// One virtio-blk request: its segments, and for reads the bytes the disk
// held when it was submitted.
struct Request {
  enum Kind { kRead, kWrite, kFlush } kind = kRead;
  uint64_t offset = 0;
  std::vector<std::vector<uint8_t>> segs;
  std::vector<uint8_t> expect;
  bool busy = false;
};

class Server {
 public:
  Server(qcow2::Queue* queue, std::vector<uint8_t>* model)
      : queue_(queue), model_(*model), reqs_(kDepth) {}

  // Serves kRequests requests; returns the number that went wrong.
  int Run() {
    const int efd = queue_->EventFd();
    if (efd < 0) Die("EventFd", absl::InternalError(std::strerror(-efd)));
    const int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev) != 0) {
      Die("epoll", absl::InternalError(std::strerror(errno)));
    }
    while (done_ < kRequests) {
      for (Request& r : reqs_) {
        if (!r.busy && submitted_ < kRequests) Submit(&r);
      }
      epoll_event out;
      const int n = epoll_wait(ep, &out, 1, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n != 1) Die("epoll_wait", absl::InternalError(std::strerror(errno)));
      ++wakeups_;
      uint64_t count;
      if (read(efd, &count, sizeof count) < 0 && errno != EAGAIN) {
        Die("read eventfd", absl::InternalError(std::strerror(errno)));
      }
      // Callbacks run inside Poll; poll until nothing is left.
      while (queue_->Poll(0) > 0) {
      }
    }
    close(ep);
    return bad_;
  }
  int wakeups() const { return wakeups_; }

 private:
  void Submit(Request* r) {
    r->busy = true;
    ++submitted_;
    auto done = [this, r](absl::Status s) { Complete(r, s); };
    absl::Status s;
    if (rng_() % 16 == 0) {
      r->kind = Request::kFlush;
      s = queue_->SubmitFlush(done);
    } else {
      r->kind = rng_() % 2 ? Request::kWrite : Request::kRead;
      r->segs.resize(1 + rng_() % kMaxSegs);
      uint64_t len = 0;
      for (auto& seg : r->segs) {
        seg.resize(kSector * (1 + rng_() % 16));
        len += seg.size();
      }
      r->offset = rng_() % ((kDiskSize - len) / kSector) * kSector;
      std::vector<iovec> iov;
      uint64_t at = r->offset;
      r->expect.resize(len);
      for (auto& seg : r->segs) {
        if (r->kind == Request::kWrite) {
          for (auto& b : seg) b = static_cast<uint8_t>(rng_());
          // Overlapping requests run in the order submitted.
          std::memcpy(model_.data() + at, seg.data(), seg.size());
        } else {
          std::memset(seg.data(), 0xee, seg.size());
          std::memcpy(r->expect.data() + (at - r->offset),
                      model_.data() + at, seg.size());
        }
        iov.push_back({seg.data(), seg.size()});
        at += seg.size();
      }
      // The iovec array may go once the call returns; the segments stay
      // until the callback.
      s = r->kind == Request::kWrite
              ? queue_->SubmitWritev(r->offset, iov, done)
              : queue_->SubmitReadv(r->offset, iov, done);
    }
    if (!s.ok()) Die("submit", s);
  }

  void Complete(Request* r, const absl::Status& s) {
    r->busy = false;
    ++done_;
    if (!s.ok()) {
      std::fprintf(stderr, "cpp_epoll: request at %llu: %s\n",
                   static_cast<unsigned long long>(r->offset),
                   s.ToString().c_str());
      ++bad_;
      return;
    }
    if (r->kind != Request::kRead) return;
    uint64_t at = 0;
    for (const auto& seg : r->segs) {
      if (std::memcmp(seg.data(), r->expect.data() + at, seg.size()) != 0) {
        std::fprintf(stderr, "cpp_epoll: readv at %llu differs\n",
                     static_cast<unsigned long long>(r->offset));
        ++bad_;
        return;
      }
      at += seg.size();
    }
  }

  qcow2::Queue* queue_;
  std::vector<uint8_t>& model_;
  std::vector<Request> reqs_;
  std::mt19937_64 rng_{2024};
  int submitted_ = 0, done_ = 0, bad_ = 0, wakeups_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string base = std::string(argv[1]) + "/base.qcow2";
  const std::string top = std::string(argv[1]) + "/overlay.qcow2";
  unlink(base.c_str());
  unlink(top.c_str());
  std::vector<uint8_t> model(kDiskSize, 0);

  // 1. The chain: the base holds a pattern in its first 16 MiB.
  qcow2::CreateOptions co;
  co.size = kDiskSize;
  if (absl::Status s = qcow2::CreateImage(base, co); !s.ok()) {
    Die("create base", s);
  }
  qcow2::OpenOptions rw;
  rw.read_write = true;
  {
    auto img = qcow2::Image::Open(base, rw);
    if (!img.ok()) Die("open base", img.status());
    for (uint64_t i = 0; i < (16u << 20); ++i) model[i] = uint8_t(i / 4099);
    absl::Status s = (*img)->Write(
        0, absl::MakeConstSpan(model.data(), size_t{16} << 20));
    if (s.ok()) s = (*img)->Close();
    if (!s.ok()) Die("write base", s);
  }
  qcow2::CreateOptions oo;
  oo.backing_file = "base.qcow2";
  oo.backing_format = "qcow2";
  if (absl::Status s = qcow2::CreateImage(top, oo); !s.ok()) {
    Die("create overlay", s);
  }

  // 2. The overlay and a queue.
  auto img = qcow2::Image::Open(top, rw);
  if (!img.ok()) Die("open overlay", img.status());
  qcow2::QueueOptions qo;
  qo.depth = kDepth;
  auto queue = (*img)->CreateQueue(qo);
  if (!queue.ok()) Die("queue", queue.status());

  // 3. The request loop.
  Server server(queue->get(), &model);
  int bad = server.Run();

  // 4. Everything flushed, then the whole disk read back.
  absl::Status flushed = absl::UnknownError("not run");
  if (absl::Status s = (*queue)->SubmitFlush(
          [&](absl::Status r) { flushed = r; });
      !s.ok()) {
    Die("flush", s);
  }
  (*queue)->Drain();
  if (!flushed.ok()) Die("flush", flushed);
  const qcow2::IoStats st = (*queue)->stats();
  queue->reset();
  std::vector<uint8_t> all(kDiskSize);
  if (absl::Status s = (*img)->Read(0, absl::MakeSpan(all)); !s.ok()) {
    Die("read back", s);
  }
  if (all != model) {
    std::fprintf(stderr,
                 "cpp_epoll: the disk does not hold what was written\n");
    ++bad;
  }
  if (absl::Status s = (*img)->Close(); !s.ok()) Die("close", s);
  if (bad != 0) return 1;
  std::printf(
      "cpp_epoll: libqcow2 %s: %d requests (%llu reads, %llu writes, %llu "
      "flushes) from %d epoll wake-ups; data verified\n",
      qcow2::VersionString(), kRequests,
      static_cast<unsigned long long>(st.guest_read_ops),
      static_cast<unsigned long long>(st.guest_write_ops),
      static_cast<unsigned long long>(st.guest_flush_ops - 1),
      server.wakeups());
  return 0;
}
