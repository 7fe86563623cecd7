// SPDX-License-Identifier: Apache-2.0
// Completions that the kernel finishes on its own workers (buffered writes
// to tmpfs, which io_uring hands to a worker thread) reach the queue's
// thread without a forced interrupt (the ring runs cooperative task work):
// they must still wake a thread asleep on the notifier, and still arrive
// when the thread that submitted them is busy in user space or asleep
// while another thread polls. Any lost completion hangs a wait, which
// each test bounds with a timeout and reports.
#include <poll.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <linux/magic.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "qcow2/options.h"
#include "qcow2/queue.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

constexpr uint64_t kSize = 64 << 20;
constexpr uint64_t kWrite = 64 << 10;
constexpr int kDepth = 32;

// A raw-backed qcow2 image in a fresh directory on tmpfs, opened through
// the page cache, with an io_uring queue; skipped without tmpfs.
class TmpfsQueue {
 public:
  bool Open() {
    struct statfs fs;
    if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
      return false;
    }
    char tmpl[] = "/dev/shm/qcow2-wakeup-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return false;
    dir_ = tmpl;
    path_ = dir_ + "/a.qcow2";
    CreateOptions co;
    co.size = kSize;
    EXPECT_OK(CreateImage(path_, co));
    OpenOptions rw;
    rw.read_write = true;
    rw.direct_io = false;
    auto img = Image::Open(path_, rw);
    EXPECT_OK(img.status());
    if (!img.ok()) return false;
    img_ = std::move(img).value();
    QueueOptions qo;
    qo.use_io_uring = true;
    qo.depth = kDepth;
    auto q = img_->CreateQueue(qo);
    EXPECT_OK(q.status());
    if (!q.ok()) return false;
    queue_ = std::move(q).value();
    return true;
  }

  ~TmpfsQueue() {
    queue_.reset();
    if (img_ != nullptr) EXPECT_OK(img_->Close());
    img_.reset();
    if (!path_.empty()) ::unlink(path_.c_str());
    if (!dir_.empty()) ::rmdir(dir_.c_str());
  }

  Queue& queue() { return *queue_; }
  Image& image() { return *img_; }

 private:
  std::string dir_, path_;
  std::unique_ptr<Image> img_;
  std::unique_ptr<Queue> queue_;
};

// Submits `n` writes of kWrite bytes of `buf`, one after another in the
// image; each completion increments *done.
void SubmitWrites(Queue& q, const std::vector<uint8_t>& buf, int n,
                  uint64_t first, std::atomic<int>* done) {
  for (int i = 0; i < n; ++i) {
    const uint64_t off = (first + static_cast<uint64_t>(i) * kWrite) % kSize;
    ASSERT_OK(q.SubmitWrite(off, buf, [done](absl::Status s) {
      EXPECT_OK(s);
      done->fetch_add(1);
    }));
  }
}

// Waits on `fd` for up to `ms` milliseconds: whether it became readable.
bool WaitReadable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, ms);
  } while (rc < 0 && errno == EINTR);
  return rc == 1;
}

void Drain(int fd) {
  uint64_t v;
  while (::read(fd, &v, sizeof(v)) == static_cast<ssize_t>(sizeof(v))) {
  }
}

// The thread that submitted sleeps in poll() on the notifier only: each
// batch's completions wake it.
TEST(QueueWakeupTest, KernelWorkerCompletionsWakeAThreadAsleepOnTheNotifier) {
  TmpfsQueue t;
  if (!t.Open()) GTEST_SKIP() << "no tmpfs at /dev/shm";
  Queue& q = t.queue();
  const int fd = q.EventFd();
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> buf(kWrite, 0x5a);
  std::atomic<int> done{0};
  int expected = 0;
  for (int round = 0; round < 40; ++round) {
    ASSERT_NO_FATAL_FAILURE(
        SubmitWrites(q, buf, kDepth, static_cast<uint64_t>(round) * kDepth * kWrite, &done));
    expected += kDepth;
    while (done.load() < expected) {
      ASSERT_TRUE(WaitReadable(fd, 20000))
          << "round " << round << ": no wake-up in 20 s with "
          << expected - done.load() << " writes in flight";
      Drain(fd);
      while (q.Poll(0) > 0) {
      }
    }
  }
  EXPECT_EQ(q.in_flight(), 0);
}

// The queue changes hands: thread A submits, then spins in user space
// (no system call) or sleeps on a condition variable, while thread B
// polls the queue until everything completed. The completions are A's
// task work: they must arrive all the same.
TEST(QueueWakeupTest, CompletionsArriveWhileTheSubmitterSpinsOrSleeps) {
  TmpfsQueue t;
  if (!t.Open()) GTEST_SKIP() << "no tmpfs at /dev/shm";
  Queue& q = t.queue();
  std::vector<uint8_t> buf(kWrite, 0xa5);
  for (const bool spin : {true, false}) {
    SCOPED_TRACE(spin ? "submitter spins" : "submitter sleeps");
    std::atomic<int> done{0};
    std::atomic<bool> submitted{false}, finished{false};
    std::mutex mu;
    std::condition_variable cv;
    std::thread a([&] {
      SubmitWrites(q, buf, kDepth, 0, &done);
      submitted.store(true);
      if (spin) {
        // Bounded so that a lost completion fails below instead of hanging.
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (!finished.load(std::memory_order_relaxed) &&
               std::chrono::steady_clock::now() < end) {
        }
      } else {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, std::chrono::seconds(20), [&] { return finished.load(); });
      }
    });
    while (!submitted.load()) std::this_thread::yield();
    // B: the queue is B's from here on (A touches it no more).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (done.load() < kDepth && std::chrono::steady_clock::now() < deadline) {
      q.Poll(0);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(done.load(), kDepth) << "completions lost while the submitter "
                                   << (spin ? "spun" : "slept");
    {
      std::lock_guard<std::mutex> lock(mu);
      finished.store(true);
    }
    cv.notify_all();
    a.join();
    while (q.in_flight() > 0) q.Poll(1);
  }
  // What was written reads back.
  std::vector<uint8_t> back(kWrite);
  ASSERT_OK(t.image().Read(0, absl::MakeSpan(back)));
  EXPECT_EQ(back, buf);
}

}  // namespace
}  // namespace qcow2
