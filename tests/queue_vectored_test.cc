// SPDX-License-Identifier: Apache-2.0
// Queue::SubmitReadv / SubmitWritev and Queue::EventFd: vectored requests
// over a backing chain, read back by qemu-img; the file sees the caller's
// own segments (no copy); the notifier fd drives an event loop with no
// lost wake-up, synchronous completions included.
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "lib/io/ring.h"
#include "testing/forwarding_file.h"
#include "qcow2/c.h"
#include "qcow2/file.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"
#include "qcow2/version.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::TempDir;

constexpr uint64_t kSize = 8 << 20;
constexpr uint32_t kCluster = 64 << 10;

uint8_t Pattern(uint64_t pos, uint8_t seed) {
  return static_cast<uint8_t>((pos * 131 + seed) ^ (pos >> 9));
}

// A chain: base.qcow2 with data in its first half, top.qcow2 over it.
// `model` is what the top reads as.
void MakeChain(const TempDir& dir, std::vector<uint8_t>* model) {
  CreateOptions base;
  base.size = kSize;
  base.cluster_size = kCluster;
  ASSERT_OK(CreateImage(dir.File("base.qcow2"), base));
  model->assign(kSize, 0);
  {
    OpenOptions rw;
    rw.read_write = true;
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(dir.File("base.qcow2"), rw));
    std::vector<uint8_t> data(kSize / 2);
    for (uint64_t i = 0; i < data.size(); ++i) data[i] = Pattern(i, 7);
    ASSERT_OK(img->Write(0, data));
    std::copy(data.begin(), data.end(), model->begin());
    ASSERT_OK(img->Close());
  }
  CreateOptions top;
  top.cluster_size = kCluster;
  top.backing_file = "base.qcow2";
  top.backing_format = "qcow2";
  ASSERT_OK(CreateImage(dir.File("top.qcow2"), top));
}

// Cuts [0, len) of `buf` into segments of random lengths (some empty).
std::vector<iovec> Cut(uint8_t* buf, size_t len, std::mt19937_64& rng) {
  std::vector<iovec> iov;
  size_t pos = 0;
  while (pos < len) {
    size_t n = std::min<size_t>(len - pos, 1 + rng() % 9000);
    if (rng() % 8 == 0) iov.push_back({buf + pos, 0});
    iov.push_back({buf + pos, n});
    pos += n;
  }
  return iov;
}

// The chain of MakeChain with its top open read-write and a queue on it
// (io_uring or not).
struct OpenChain {
  TempDir dir;
  std::vector<uint8_t> model;
  std::unique_ptr<Image> img;
  std::unique_ptr<Queue> queue;
};

void Open(OpenChain* c, bool io_uring, int depth) {
  MakeChain(c->dir, &c->model);
  OpenOptions rw;
  rw.read_write = true;
  ASSERT_OK_AND_ASSIGN(c->img, Image::Open(c->dir.File("top.qcow2"), rw));
  QueueOptions qo;
  qo.use_io_uring = io_uring;
  qo.depth = depth;
  ASSERT_OK_AND_ASSIGN(c->queue, c->img->CreateQueue(qo));
}

// Closes the chain; then qemu-img check must be clean and qemu-img must
// read the model's bytes.
void CloseAndCompareWithQemu(OpenChain* c) {
  c->queue.reset();
  ASSERT_OK(c->img->Close());
  c->img.reset();  // its files, and their locks, go
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> qemu,
                       testing::QemuCheckedReadAll(c->dir.File("top.qcow2")));
  ASSERT_TRUE(qemu == c->model) << "qemu-img reads other bytes";
}

class QueueVectoredTest : public ::testing::TestWithParam<bool> {};

// Random vectored writes and reads (unaligned segments, across the backing
// boundary) against a model, on io_uring and synchronous queues; then
// qemu-img check is clean and qemu-img reads the model's bytes.
TEST_P(QueueVectoredTest, RandomVectoredIoMatchesModelAndQemu) {
  SKIP_WITHOUT_QEMU();
  OpenChain c;
  ASSERT_NO_FATAL_FAILURE(Open(&c, GetParam(), 128));
  std::vector<uint8_t>& model = c.model;
  Queue* queue = c.queue.get();
  std::mt19937_64 rng(23);
  for (int round = 0; round < 60; ++round) {
    const uint64_t len = 1 + rng() % (3 * kCluster);
    // Around the middle (the end of the base's data) half of the time.
    const uint64_t off = rng() % 2 ? kSize / 2 - len / 2 - rng() % 4096
                                   : rng() % (kSize - len);
    std::vector<uint8_t> data(len);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    std::vector<iovec> iov = Cut(data.data(), len, rng);
    bool done = false;
    absl::Status result;
    ASSERT_OK(queue->SubmitWritev(off, iov, [&](absl::Status s) {
      done = true;
      result = s;
    }));
    iov.clear();  // the array may go at once; the bytes may not
    queue->Drain();
    ASSERT_TRUE(done);
    ASSERT_OK(result);
    std::copy(data.begin(), data.end(), model.begin() + off);

    // Read back a range around it, cut differently.
    const uint64_t roff = off > 5000 ? off - 5000 : 0;
    const uint64_t rlen = std::min<uint64_t>(len + 10000, kSize - roff);
    std::vector<uint8_t> back(rlen, 0xee);
    std::vector<iovec> riov = Cut(back.data(), rlen, rng);
    done = false;
    ASSERT_OK(queue->SubmitReadv(roff, riov, [&](absl::Status s) {
      done = true;
      result = s;
    }));
    queue->Drain();
    ASSERT_TRUE(done);
    ASSERT_OK(result);
    ASSERT_EQ(0, std::memcmp(back.data(), model.data() + roff, rlen))
        << "round " << round << " read at " << roff;
  }
  // A whole-disk readv of 1-byte-to-64-KiB segments.
  std::vector<uint8_t> all(kSize, 0xee);
  std::vector<iovec> iov = Cut(all.data(), kSize, rng);
  ASSERT_OK(queue->SubmitReadv(0, iov, [](absl::Status s) { ASSERT_OK(s); }));
  queue->Drain();
  ASSERT_TRUE(all == model);
  bool flushed = false;
  ASSERT_OK(queue->SubmitFlush([&](absl::Status s) {
    EXPECT_OK(s);
    flushed = true;
  }));
  queue->Drain();
  ASSERT_TRUE(flushed);
  CloseAndCompareWithQemu(&c);
}

INSTANTIATE_TEST_SUITE_P(Backends, QueueVectoredTest,
                         ::testing::Values(true, false),
                         [](const auto& info) {
                           return info.param ? "IoUring" : "Sync";
                         });

// O_DIRECT with the caller's memory unaligned (offsets and lengths in 4
// KiB units, segments at odd addresses and of odd lengths): the queue
// carries such requests on the ring through a bounce buffer of its own,
// many in flight at once. Reads and writes must land exactly, in the
// top and through to the backing file, and qemu-img must agree.
TEST(QueueDirectBounceTest, UnalignedMemoryOnDirectIoMatchesModelAndQemu) {
  SKIP_WITHOUT_QEMU();
  OpenChain c;
  MakeChain(c.dir, &c.model);
  OpenOptions rw;
  rw.read_write = true;
  rw.direct_io = true;
  ASSERT_OK_AND_ASSIGN(c.img, Image::Open(c.dir.File("top.qcow2"), rw));
  constexpr int kDepth = 32;
  QueueOptions qo;
  qo.depth = kDepth;
  ASSERT_OK_AND_ASSIGN(c.queue, c.img->CreateQueue(qo));
  std::vector<uint8_t>& model = c.model;
  std::mt19937_64 rng(41);
  constexpr uint64_t kUnit = 4096;
  for (int round = 0; round < 20; ++round) {
    // kDepth writes to disjoint ranges at once, each from memory one byte
    // past an aligned address, half of them cut into segments.
    std::vector<std::vector<uint8_t>> bufs(kDepth);
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    int done = 0;
    const uint64_t slot = kSize / kDepth;
    for (int i = 0; i < kDepth; ++i) {
      const uint64_t len = (1 + rng() % 20) * kUnit;
      const uint64_t off =
          i * slot + (rng() % ((slot - len) / kUnit + 1)) * kUnit;
      bufs[i].resize(len + 1);
      for (auto& b : bufs[i]) b = static_cast<uint8_t>(rng());
      uint8_t* p = bufs[i].data() + 1;
      std::copy(p, p + len, model.begin() + off);
      ranges.emplace_back(off, len);
      auto cb = [&done](absl::Status s) {
        EXPECT_OK(s);
        ++done;
      };
      if (i % 2 == 0) {
        ASSERT_OK(c.queue->SubmitWrite(off, absl::MakeConstSpan(p, len), cb));
      } else {
        ASSERT_OK(c.queue->SubmitWritev(off, Cut(p, len, rng), cb));
      }
    }
    c.queue->Drain();
    ASSERT_EQ(done, kDepth);
    // Read them back the same way, each range widened by a unit each side
    // (into the backing file's data or its zeros), into fresh memory.
    std::vector<std::vector<uint8_t>> back(kDepth);
    done = 0;
    for (int i = 0; i < kDepth; ++i) {
      const uint64_t off = ranges[i].first >= kUnit ? ranges[i].first - kUnit
                                                    : ranges[i].first;
      const uint64_t len =
          std::min(ranges[i].first + ranges[i].second + kUnit, kSize) - off;
      back[i].assign(len + 3, 0xee);
      uint8_t* p = back[i].data() + 3;
      auto cb = [&done, &model, p, off, len, i, round](absl::Status s) {
        EXPECT_OK(s);
        EXPECT_EQ(0, std::memcmp(p, model.data() + off, len))
            << "round " << round << " read " << i << " at " << off;
        ++done;
      };
      if (i % 2 == 1) {
        ASSERT_OK(c.queue->SubmitRead(off, absl::MakeSpan(p, len), cb));
      } else {
        ASSERT_OK(c.queue->SubmitReadv(off, Cut(p, len, rng), cb));
      }
    }
    c.queue->Drain();
    ASSERT_EQ(done, kDepth);
  }
  CloseAndCompareWithQemu(&c);
}

// A File that records the buffers it is handed (then does the I/O on the
// real file): queues drive such files synchronously, from the same plan
// they put on the ring.
class RecordingFile : public testing::ForwardingFile {
 public:
  struct Call {
    bool write;
    uint64_t offset;
    std::vector<iovec> iov;
  };
  RecordingFile(std::unique_ptr<File> inner, std::vector<Call>* calls,
                std::mutex* mu)
      : ForwardingFile(std::move(inner)), calls_(calls), mu_(mu) {}
  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) override {
    Note(false, offset, {{buf.data(), buf.size()}});
    return ForwardingFile::ReadAt(offset, buf);
  }
  absl::Status WriteAt(uint64_t offset,
                       absl::Span<const uint8_t> data) override {
    Note(true, offset, {{const_cast<uint8_t*>(data.data()), data.size()}});
    return ForwardingFile::WriteAt(offset, data);
  }
  absl::Status ReadvAt(uint64_t offset, absl::Span<const iovec> iov) override {
    Note(false, offset, {iov.begin(), iov.end()});
    return ForwardingFile::ReadvAt(offset, iov);
  }
  absl::Status WritevAt(uint64_t offset,
                        absl::Span<const iovec> iov) override {
    Note(true, offset, {iov.begin(), iov.end()});
    return ForwardingFile::WritevAt(offset, iov);
  }
  // As File's defaults: no reservation, no zeroing fast path (the queue
  // then runs these itself), the inner file's data runs not asked.
  absl::Status Reserve(uint64_t o, uint64_t n) override {
    return File::Reserve(o, n);
  }
  absl::Status Allocate(uint64_t o, uint64_t n) override {
    return File::Allocate(o, n);
  }
  absl::StatusOr<bool> DataRun(uint64_t o, uint64_t max_len,
                               uint64_t* len) override {
    return File::DataRun(o, max_len, len);
  }
  uint32_t alignment() const override { return 1; }

 private:
  void Note(bool write, uint64_t offset, std::vector<iovec> iov) {
    std::lock_guard<std::mutex> lock(*mu_);
    calls_->push_back({write, offset, std::move(iov)});
  }
  std::vector<Call>* calls_;
  std::mutex* mu_;
};

class RecordingOpener : public FileOpener {
 public:
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const FileOptions& opts) override {
    auto f = DefaultFileOpener()->Open(path, opts);
    if (!f.ok()) return f.status();
    return std::unique_ptr<File>(
        new RecordingFile(std::move(*f), &calls, &mu));
  }
  std::vector<RecordingFile::Call> Take() {
    std::lock_guard<std::mutex> lock(mu);
    return std::exchange(calls, {});
  }
  std::mutex mu;
  std::vector<RecordingFile::Call> calls;
};

// The bytes of `calls` that went to or from memory inside `segs`, and
// those elsewhere (a copy).
void Classify(const std::vector<RecordingFile::Call>& calls, bool write,
              const std::vector<iovec>& segs, uint64_t* inside,
              uint64_t* outside) {
  *inside = *outside = 0;
  for (const auto& c : calls) {
    if (c.write != write) continue;
    for (const iovec& v : c.iov) {
      auto* p = static_cast<uint8_t*>(v.iov_base);
      bool in = false;
      for (const iovec& s : segs) {
        auto* b = static_cast<uint8_t*>(s.iov_base);
        if (p >= b && p + v.iov_len <= b + s.iov_len) in = true;
      }
      (in ? *inside : *outside) += v.iov_len;
    }
  }
}

// Vectored reads and writes of allocated clusters hand the file the
// caller's own segments: no byte goes through another buffer.
TEST(QueueVectoredNoCopyTest, AllocatedClustersMoveStraightFromSegments) {
  TempDir dir;
  std::vector<uint8_t> model;
  MakeChain(dir, &model);
  RecordingOpener opener;
  OpenOptions rw;
  rw.read_write = true;
  rw.opener = &opener;
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(dir.File("top.qcow2"), rw));
  ASSERT_OK_AND_ASSIGN(auto queue, img->CreateQueue());
  // Allocate clusters 2..5 of the top first.
  std::vector<uint8_t> fill(4 * kCluster, 0x5a);
  ASSERT_OK(img->Write(2 * kCluster, fill));
  opener.Take();

  // 4 x 4 KiB into an allocated cluster, then 3 segments of odd sizes
  // across two clusters, and 1500 segments of 128 bytes (more than
  // IOV_MAX in one op: split into several calls).
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<iovec> segs;
  struct Case {
    uint64_t offset;
    std::vector<size_t> lens;
  };
  std::vector<size_t> many(1500, 128);
  const Case cases[] = {
      {2 * kCluster + 8192, {4096, 4096, 4096, 4096}},
      {3 * kCluster - 1000, {777, 1223, 65000}},
      {2 * kCluster, many},
  };
  std::mt19937_64 rng(5);
  for (const Case& c : cases) {
    bufs.clear();
    segs.clear();
    uint64_t total = 0;
    for (size_t n : c.lens) {
      bufs.emplace_back(n);
      for (auto& b : bufs.back()) b = static_cast<uint8_t>(rng());
      total += n;
    }
    for (auto& b : bufs) segs.push_back({b.data(), b.size()});
    const IoStats before = queue->stats();
    absl::Status result = absl::UnknownError("not run");
    ASSERT_OK(queue->SubmitWritev(c.offset, segs,
                                  [&](absl::Status s) { result = s; }));
    queue->Drain();
    ASSERT_OK(result);
    const IoStats after = queue->stats();
    EXPECT_EQ(after.host_data_write_bytes - before.host_data_write_bytes,
              total);
    EXPECT_EQ(after.cow_write_bytes, before.cow_write_bytes);
    uint64_t inside, outside;
    Classify(opener.Take(), true, segs, &inside, &outside);
    EXPECT_EQ(inside, total) << "write at " << c.offset;
    EXPECT_EQ(outside, 0u) << "write at " << c.offset;

    // Read into fresh segments of the same shapes.
    std::vector<std::vector<uint8_t>> rbufs;
    std::vector<iovec> rsegs;
    for (size_t n : c.lens) rbufs.emplace_back(n, 0);
    for (auto& b : rbufs) rsegs.push_back({b.data(), b.size()});
    ASSERT_OK(queue->SubmitReadv(c.offset, rsegs,
                                 [&](absl::Status s) { result = s; }));
    queue->Drain();
    ASSERT_OK(result);
    Classify(opener.Take(), false, rsegs, &inside, &outside);
    EXPECT_EQ(inside, total) << "read at " << c.offset;
    EXPECT_EQ(outside, 0u) << "read at " << c.offset;
    EXPECT_TRUE(rbufs == bufs) << "read at " << c.offset;
  }
  queue.reset();
  ASSERT_OK(img->Close());
}

// Reads of 256 KiB and more from the page cache run on io_uring's
// workers, so they finish out of order: many in flight at once, over an
// allocated top, its qcow2 backing and a raw file under that which ends
// in an odd tail (the disk reads zeros past it). Each segment gets its
// own bytes, as qemu-img reads them. Then again with a busy ring for every
// CPU, when the queue's thread copies them itself.
TEST(QueueVectoredLargeReadTest, ManyLargeReadsInFlightMatchQemu) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  constexpr uint64_t kDisk = 12 << 20;
  std::vector<uint8_t> raw((5 << 20) + 1000);
  for (uint64_t i = 0; i < raw.size(); ++i) raw[i] = Pattern(i, 3);
  ASSERT_OK(testing::WriteFileBytes(dir.File("raw.img"), raw));
  CreateOptions mid;
  mid.size = kDisk;
  mid.backing_file = "raw.img";
  mid.backing_format = "raw";
  ASSERT_OK(CreateImage(dir.File("mid.qcow2"), mid));
  CreateOptions top;
  top.backing_file = "mid.qcow2";
  top.backing_format = "qcow2";
  ASSERT_OK(CreateImage(dir.File("top.qcow2"), top));
  OpenOptions rw;
  rw.read_write = true;
  {
    // Data in the middle layer (4-7 MiB) and in the top (2-3 MiB).
    ASSERT_OK_AND_ASSIGN(auto m, Image::Open(dir.File("mid.qcow2"), rw));
    std::vector<uint8_t> d(3 << 20);
    for (uint64_t i = 0; i < d.size(); ++i) d[i] = Pattern(i, 11);
    ASSERT_OK(m->Write(4 << 20, d));
    ASSERT_OK(m->Close());
  }
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(dir.File("top.qcow2"), rw));
  std::vector<uint8_t> d(1 << 20);
  for (uint64_t i = 0; i < d.size(); ++i) d[i] = Pattern(i, 19);
  ASSERT_OK(img->Write(2 << 20, d));
  ASSERT_OK(img->Flush());  // for qemu-img's eyes
  ASSERT_OK_AND_ASSIGN(auto queue, img->CreateQueue());
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> want,
                       testing::QemuCheckedReadAll(dir.File("top.qcow2")));
  ASSERT_EQ(want.size(), kDisk);
  std::mt19937_64 rng(59);
  constexpr int kInFlight = 16;
  const int idle_rings = internal::BusyRings();
  std::vector<std::unique_ptr<internal::Ring>> busy;
  for (int round = 0; round < 8; ++round) {
    if (round == 4) {
      // Rounds 4-7: the inline copy.
      while (internal::BusyRings() < internal::UsableCpus()) {
        busy.push_back(std::make_unique<internal::Ring>());
        busy.back()->SetBusy(true);
      }
    }
    std::vector<std::vector<uint8_t>> bufs(kInFlight);
    std::vector<uint64_t> offs(kInFlight);
    int done = 0;
    for (int i = 0; i < kInFlight; ++i) {
      const uint64_t len = (256 << 10) + rng() % (2 << 20);
      offs[i] = rng() % (kDisk - len);
      bufs[i].assign(len, 0xee);
      std::vector<iovec> iov = Cut(bufs[i].data(), len, rng);
      if (i % 2 == 0) iov = {{bufs[i].data(), len}};
      ASSERT_OK(queue->SubmitReadv(offs[i], iov, [&](absl::Status s) {
        EXPECT_OK(s);
        ++done;
      }));
    }
    queue->Drain();
    ASSERT_EQ(done, kInFlight);
    for (int i = 0; i < kInFlight; ++i) {
      ASSERT_EQ(0, std::memcmp(bufs[i].data(), want.data() + offs[i],
                               bufs[i].size()))
          << "round " << round << " read at " << offs[i];
    }
  }
  busy.clear();  // a ring gone is no longer busy
  EXPECT_EQ(internal::BusyRings(), idle_rings);
  queue.reset();
  ASSERT_OK(img->Close());
}

// Vectored reads of compressed clusters (qemu-img convert -c), cut at
// arbitrary points: each segment gets its part of the decompressed data.
TEST_P(QueueVectoredTest, ReadvOfCompressedClusters) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  std::vector<uint8_t> raw(kSize / 4);
  for (uint64_t i = 0; i < raw.size(); ++i) raw[i] = Pattern(i / 3, 11);
  ASSERT_OK(testing::WriteFileBytes(dir.File("disk.raw"), raw));
  ASSERT_EQ(0, testing::Run({"qemu-img", "convert", "-c", "-f", "raw", "-O",
                             "qcow2", dir.File("disk.raw"),
                             dir.File("c.qcow2")})
                   .exit_code);
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(dir.File("c.qcow2"), {}));
  ASSERT_OK_AND_ASSIGN(BlockStatus bs, img->GetBlockStatus(0, kCluster));
  ASSERT_TRUE(bs.compressed) << "qemu-img did not compress";
  QueueOptions qo;
  qo.use_io_uring = GetParam();
  ASSERT_OK_AND_ASSIGN(auto queue, img->CreateQueue(qo));
  std::mt19937_64 rng(3);
  for (int round = 0; round < 20; ++round) {
    const uint64_t len = 1 + rng() % (3 * kCluster);
    const uint64_t off = rng() % (raw.size() - len);
    std::vector<uint8_t> back(len, 0xee);
    std::vector<iovec> iov = Cut(back.data(), len, rng);
    absl::Status result = absl::UnknownError("not run");
    ASSERT_OK(
        queue->SubmitReadv(off, iov, [&](absl::Status s) { result = s; }));
    queue->Drain();
    ASSERT_OK(result);
    ASSERT_EQ(0, std::memcmp(back.data(), raw.data() + off, len))
        << "round " << round << " at " << off;
  }
  EXPECT_GT(img->GetStats().guest_read_ops, 0u);
}

bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

void Reset(int fd) {
  uint64_t v;
  while (::read(fd, &v, sizeof(v)) == sizeof(v)) {
  }
}

// The notifier is readable when a request finished inside Submit (a read
// of unallocated clusters on a synchronous queue, an error), and not when
// nothing is left to reap.
TEST_P(QueueVectoredTest, EventFdSignalsSynchronousCompletions) {
  TempDir dir;
  CreateOptions co;
  co.size = kSize;
  ASSERT_OK(CreateImage(dir.File("a.qcow2"), co));
  OpenOptions rw;
  rw.read_write = true;
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(dir.File("a.qcow2"), rw));
  QueueOptions qo;
  qo.use_io_uring = GetParam();
  ASSERT_OK_AND_ASSIGN(auto queue, img->CreateQueue(qo));
  const int fd = queue->EventFd();
  ASSERT_GE(fd, 0);
  EXPECT_EQ(fd, queue->EventFd());
  EXPECT_FALSE(Readable(fd));
  // Unallocated: zeros, planned and finished inside the Submit call.
  std::vector<uint8_t> a(4096, 1), b(4096, 1);
  iovec iov[2] = {{a.data(), a.size()}, {b.data(), b.size()}};
  int calls = 0;
  ASSERT_OK(queue->SubmitReadv(kCluster, iov, [&](absl::Status s) {
    EXPECT_OK(s);
    ++calls;
  }));
  ASSERT_TRUE(Readable(fd)) << "a request finished in Submit left the "
                               "notifier unreadable";
  Reset(fd);
  while (queue->Poll(0) > 0) {
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(a, std::vector<uint8_t>(4096, 0));
  EXPECT_FALSE(Readable(fd));
  EXPECT_EQ(queue->in_flight(), 0);
  // Nothing from a rejected request.
  EXPECT_FALSE(queue->SubmitReadv(kSize - 100, iov, [](absl::Status) {}).ok());
  EXPECT_FALSE(Readable(fd));
}

// An event loop that only ever blocks in epoll_wait on the notifier
// serves random overlapping vectored reads and writes and flushes to the
// end: any wake-up lost would hang it (ctest's timeout). The notifier is
// not a descriptor the queue reads: polling the queue never consumes it.
TEST_P(QueueVectoredTest, EpollLoopOverEventFdLosesNoWakeUp) {
  SKIP_WITHOUT_QEMU();
  OpenChain c;
  constexpr int kDepth = 16;
  ASSERT_NO_FATAL_FAILURE(Open(&c, GetParam(), kDepth));
  std::vector<uint8_t>& model = c.model;
  Queue* queue = c.queue.get();
  const int efd = queue->EventFd();
  ASSERT_GE(efd, 0);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(ep, 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ASSERT_EQ(0, ::epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev));

  // Writes go to disjoint slots (so the model does not depend on their
  // order); reads overlap them and check only settled slots.
  constexpr int kSlots = 48;
  constexpr uint64_t kSlot = 20000;  // not cluster aligned
  struct Slot {
    std::vector<uint8_t> data;
    bool busy = false;
  };
  std::vector<Slot> slots(kSlots);
  std::mt19937_64 rng(99);
  int to_submit = 400, outstanding = 0, wakeups = 0, wrong = 0;
  std::vector<std::unique_ptr<std::vector<uint8_t>>> live;
  auto submit_one = [&]() -> absl::Status {
    const int k = static_cast<int>(rng() % kSlots);
    const uint64_t off = kSize / 2 - kSlots / 2 * kSlot + k * kSlot;
    if (rng() % 10 == 0) {
      ++outstanding;
      return queue->SubmitFlush([&](absl::Status s) {
        EXPECT_OK(s);
        --outstanding;
      });
    }
    auto buf = std::make_unique<std::vector<uint8_t>>(kSlot);
    std::vector<iovec> iov = Cut(buf->data(), kSlot, rng);
    auto* raw = buf.get();
    live.push_back(std::move(buf));
    ++outstanding;
    if (!slots[k].busy && rng() % 2) {
      for (auto& b : *raw) b = static_cast<uint8_t>(rng());
      slots[k].busy = true;
      return queue->SubmitWritev(off, iov, [&, k, raw, off](absl::Status s) {
        EXPECT_OK(s);
        std::copy(raw->begin(), raw->end(), model.begin() + off);
        slots[k].busy = false;
        --outstanding;
      });
    }
    const bool settled = !slots[k].busy;
    return queue->SubmitReadv(off, iov, [&, raw, off, settled](absl::Status s) {
      EXPECT_OK(s);
      if (settled && std::memcmp(raw->data(), model.data() + off, kSlot) != 0) {
        ++wrong;
      }
      --outstanding;
    });
  };
  while (to_submit > 0 || outstanding > 0) {
    while (to_submit > 0 && queue->in_flight() < kDepth) {
      ASSERT_OK(submit_one());
      --to_submit;
    }
    epoll_event out;
    const int n = ::epoll_wait(ep, &out, 1, -1);
    if (n < 0 && errno == EINTR) continue;
    ASSERT_EQ(n, 1) << std::strerror(errno);
    ++wakeups;
    uint64_t v;
    ASSERT_EQ(::read(efd, &v, sizeof(v)), static_cast<ssize_t>(sizeof(v)));
    while (queue->Poll(0) > 0) {
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(wakeups, 0);
  ::close(ep);
  CloseAndCompareWithQemu(&c);
}

int OpenDescriptors() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd) n += ::fcntl(fd, F_GETFD) != -1;
  return n;
}

// Threads that join the process's shared io_uring workers (PrepareIoThread,
// also done by every queue's first I/O) write through queues of their own
// at once, buffered: their writes to the one image file now wait for each
// other in io_uring. Every write lands (qemu-img reads them all), and the
// joining leaves no descriptor behind in the threads that called it more
// than once.
TEST(QueueVectoredThreadsTest, ThreadsSharingIoWorkersWriteOneFile) {
  OpenChain c;
  ASSERT_NO_FATAL_FAILURE(Open(&c, /*io_uring=*/true, 32));
  if (!c.queue->uses_io_uring()) GTEST_SKIP() << "no io_uring here";
  PrepareIoThread();  // this thread's anchor ring is set up by now
  const int before = OpenDescriptors();
  constexpr int kThreads = 4;
  constexpr uint64_t kSpan = kSize / kThreads;
  std::vector<absl::Status> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      PrepareIoThread();
      PrepareIoThread();
      QueueOptions qo;
      qo.depth = 8;
      auto q = c.img->CreateQueue(qo);
      if (!q.ok()) {
        failures[t] = q.status();
        return;
      }
      // 256 KiB writes, eight in flight, over this thread's quarter.
      std::vector<uint8_t> buf(kSpan);
      for (uint64_t i = 0; i < kSpan; ++i) buf[i] = Pattern(t * kSpan + i, 3);
      for (uint64_t off = 0; off < kSpan; off += 256 << 10) {
        absl::Status s = (*q)->SubmitWrite(
            t * kSpan + off, absl::MakeSpan(buf).subspan(off, 256 << 10),
            [&, t](absl::Status r) {
              if (!r.ok()) failures[t] = r;
            });
        if (!s.ok()) {
          failures[t] = s;
          break;
        }
        while ((*q)->in_flight() >= 8) (*q)->Poll(1);
      }
      (*q)->Drain();
    });
  }
  for (std::thread& th : threads) th.join();
  for (const absl::Status& s : failures) ASSERT_OK(s);
  EXPECT_EQ(OpenDescriptors(), before);
  for (uint64_t i = 0; i < kSize; ++i) c.model[i] = Pattern(i, 3);
  CloseAndCompareWithQemu(&c);
}

// The C header compiles as C++ (tests/c_api_test.c compiles it as C11).
TEST(QueueVectoredCHeaderTest, CHeaderIsCxxClean) {
  qcow2_completion_t c{nullptr, 0};
  qcow2_stats_t st{};
  st.size = sizeof(st);
  EXPECT_EQ(c.result, 0);
  EXPECT_STREQ(qcow2_version_string(), QCOW2_VERSION_STRING);
}

}  // namespace
}  // namespace qcow2
