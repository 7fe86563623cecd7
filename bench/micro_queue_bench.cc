// SPDX-License-Identifier: Apache-2.0
// Vectored requests through the Queue cost no copy: a write (or read) of
// 4 x 4 KiB segments against one of a single 16 KiB buffer, same run, same
// image (a file in $TMPDIR whose clusters are all allocated, so every
// request goes in place), on the io_uring queue (arg 1) and the
// synchronous one (arg 0). Each iteration submits one request and waits
// for it; the offsets rotate over 64 MiB of the page cache.
//
// BM_QueueDirectRead4KQD32: 4 KiB random reads at depth 32 on the image
// opened with direct_io (O_DIRECT), from buffers aligned to a page (arg
// 0) or 16 bytes past one (arg 16, as malloc gives): the queue carries
// the latter through bounce buffers of its own, still on the ring.
#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"

namespace qcow2::bench {
namespace {

constexpr uint64_t kSize = 64ull << 20;
constexpr size_t kSeg = 4096;
constexpr int kSegs = 4;

// A fully allocated image in $TMPDIR, removed when done.
class TempImage {
 public:
  TempImage() {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir != nullptr ? dir : "/tmp") +
            "/qcow2-queue-bench-XXXXXX";
    const int fd = mkstemp(path_.data());
    if (fd >= 0) ::close(fd);
    ::unlink(path_.c_str());
    CreateOptions co;
    co.size = kSize;
    status_ = CreateImage(path_, co);
    if (!status_.ok()) return;
    OpenOptions o;
    o.read_write = true;
    auto image = Image::Open(path_, o);
    if (!image.ok()) {
      status_ = image.status();
      return;
    }
    image_ = std::move(*image);
    const std::vector<uint8_t> fill(1 << 20, 0x5a);
    for (uint64_t off = 0; off < kSize && status_.ok(); off += fill.size()) {
      status_ = image_->Write(off, fill);
    }
  }
  ~TempImage() {
    image_.reset();
    ::unlink(path_.c_str());
  }
  const absl::Status& status() const { return status_; }
  Image* image() { return image_.get(); }
  // Closes the image and opens it again, read-only, with O_DIRECT.
  void ReopenDirect() {
    if (!status_.ok()) return;
    status_ = image_->Close();
    image_.reset();
    if (!status_.ok()) return;
    OpenOptions o;
    o.direct_io = true;
    auto image = Image::Open(path_, o);
    if (!image.ok()) {
      status_ = image.status();
      return;
    }
    image_ = std::move(*image);
  }

 private:
  std::string path_;
  absl::Status status_;
  std::unique_ptr<Image> image_;
};

// kind: 0 one 16 KiB buffer, 1 four 4 KiB segments; write or read.
void Run(benchmark::State& state, bool vectored, bool write) {
  TempImage img;
  if (!img.status().ok()) {
    state.SkipWithError(img.status().ToString().c_str());
    return;
  }
  QueueOptions qo;
  qo.use_io_uring = state.range(0) != 0;
  auto queue = img.image()->CreateQueue(qo);
  if (!queue.ok()) {
    state.SkipWithError(queue.status().ToString().c_str());
    return;
  }
  // The segments apart in memory, as a guest's pages are.
  std::vector<std::vector<uint8_t>> segs(kSegs,
                                         std::vector<uint8_t>(kSeg, 0x33));
  std::vector<uint8_t> whole(kSegs * kSeg, 0x33);
  std::vector<iovec> iov;
  for (auto& s : segs) iov.push_back({s.data(), s.size()});
  absl::Status result;
  auto done = [&result](absl::Status s) { result = s; };
  uint64_t off = 0;
  for (auto _ : state) {
    absl::Status s;
    if (vectored) {
      s = write ? (*queue)->SubmitWritev(off, iov, done)
                : (*queue)->SubmitReadv(off, iov, done);
    } else {
      s = write ? (*queue)->SubmitWrite(off, whole, done)
                : (*queue)->SubmitRead(off, absl::MakeSpan(whole), done);
    }
    if (s.ok()) {
      (*queue)->Drain();
      s = result;
    }
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    off = (off + 7 * kSegs * kSeg) % (kSize - kSegs * kSeg);
  }
  state.SetBytesProcessed(state.iterations() * kSegs * kSeg);
}

void BM_QueueDirectRead4KQD32(benchmark::State& state) {
  constexpr int kDepth = 32;
  const size_t shift = static_cast<size_t>(state.range(0));
  TempImage img;
  img.ReopenDirect();
  if (!img.status().ok()) {
    state.SkipWithError(img.status().ToString().c_str());
    return;
  }
  QueueOptions qo;
  qo.depth = kDepth;
  auto queue = img.image()->CreateQueue(qo);
  if (!queue.ok()) {
    state.SkipWithError(queue.status().ToString().c_str());
    return;
  }
  std::vector<void*> pages(kDepth);
  std::vector<uint8_t*> bufs;
  for (void*& p : pages) {
    if (posix_memalign(&p, 4096, 2 * kSeg) != 0) std::abort();
    bufs.push_back(static_cast<uint8_t*>(p) + shift);
  }
  std::vector<int> free_slots;
  for (int i = 0; i < kDepth; ++i) free_slots.push_back(i);
  absl::Status failed;
  int64_t completed = 0;
  uint64_t next = 1;
  for (auto _ : state) {
    while (!free_slots.empty() && failed.ok()) {
      const int slot = free_slots.back();
      free_slots.pop_back();
      next = next * 6364136223846793005ull + 1442695040888963407ull;
      const uint64_t off = (next >> 20) % (kSize / kSeg) * kSeg;
      absl::Status s = (*queue)->SubmitRead(
          off, absl::MakeSpan(bufs[slot], kSeg),
          [&, slot](absl::Status st) {
            if (!st.ok()) failed = st;
            free_slots.push_back(slot);
            ++completed;
          });
      if (!s.ok()) failed = s;
    }
    if (!failed.ok()) break;
    (*queue)->Poll(1);
  }
  (*queue)->Drain();
  for (void* p : pages) std::free(p);
  if (!failed.ok()) {
    state.SkipWithError(failed.ToString().c_str());
    return;
  }
  state.SetItemsProcessed(completed);
}
BENCHMARK(BM_QueueDirectRead4KQD32)->Arg(0)->Arg(16)->UseRealTime();

void BM_QueueWrite16K(benchmark::State& state) { Run(state, false, true); }
void BM_QueueWritev4x4K(benchmark::State& state) { Run(state, true, true); }
void BM_QueueRead16K(benchmark::State& state) { Run(state, false, false); }
void BM_QueueReadv4x4K(benchmark::State& state) { Run(state, true, false); }
BENCHMARK(BM_QueueWrite16K)->Arg(1)->Arg(0);
BENCHMARK(BM_QueueWritev4x4K)->Arg(1)->Arg(0);
BENCHMARK(BM_QueueRead16K)->Arg(1)->Arg(0);
BENCHMARK(BM_QueueReadv4x4K)->Arg(1)->Arg(0);

}  // namespace
}  // namespace qcow2::bench
