// SPDX-License-Identifier: Apache-2.0
// FileOptions::no_flush and OpenOptions::no_flush (qemu-img -t unsafe):
// Flush() makes no fdatasync, and a Queue still sends the file's writes
// through io_uring (no pwrite on the submitting thread), where a wrapping
// File would make every request of the queue synchronous.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/io/posix_file.h"
#include "qcow2/c.h"
#include "qcow2/file.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"
#include "testing/forwarding_file.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::TempDir;

constexpr uint64_t kSize = 4 << 20;
constexpr int kWrites = 64;
constexpr size_t kBlock = 4096;

// The calling thread's write system calls so far (/proc/thread-self/io's
// syscw: write, pwrite and their vectored forms; io_uring's writes,
// made in the kernel, are not counted). A queue's synchronous fallback
// runs on the thread that submits and polls.
uint64_t WriteSyscalls() {
  std::ifstream io("/proc/thread-self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "syscw:") return value;
  }
  return 0;
}

// Fdatasync fails on a pipe (EINVAL): a PosixFile over one shows whether
// Flush() made the call.
TEST(NoFlushTest, PosixFileFlushMakesNoCall) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  close(fds[0]);
  internal::PosixFile flushing(dup(fds[1]), "pipe", 1, /*no_flush=*/false);
  internal::PosixFile no_flush(fds[1], "pipe", 1, /*no_flush=*/true);
  absl::Status s = flushing.Flush();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("fdatasync of pipe"),
            std::string::npos)
      << s;
  EXPECT_TRUE(no_flush.no_flush());
  EXPECT_OK(no_flush.Flush());
}

TEST(NoFlushTest, OpenPosixFilePassesTheOption) {
  TempDir dir;
  FileOptions fo;
  fo.read_only = false;
  fo.create = true;
  fo.no_flush = true;
  ASSERT_OK_AND_ASSIGN(auto f, OpenPosixFile(dir.File("f"), fo));
  auto* pf = dynamic_cast<internal::PosixFile*>(f.get());
  ASSERT_NE(pf, nullptr);
  EXPECT_TRUE(pf->no_flush());
  f.reset();
  fo.no_flush = false;
  fo.create = false;
  ASSERT_OK_AND_ASSIGN(auto g, OpenPosixFile(dir.File("f"), fo));
  EXPECT_FALSE(dynamic_cast<internal::PosixFile*>(g.get())->no_flush());
}

// Writes kWrites blocks through a queue, then flushes; returns the write
// system calls the calling thread made meanwhile.
uint64_t WriteThroughQueue(Image& img, uint8_t seed) {
  auto queue = img.CreateQueue();
  EXPECT_TRUE(queue.ok()) << queue.status();
  if (!queue.ok()) return 0;
  std::vector<std::vector<uint8_t>> bufs(kWrites,
                                         std::vector<uint8_t>(kBlock));
  int done = 0;
  absl::Status first_error;
  auto note = [&](absl::Status s) {
    if (!s.ok() && first_error.ok()) first_error = s;
    ++done;
  };
  const uint64_t before = WriteSyscalls();
  for (int i = 0; i < kWrites; ++i) {
    std::fill(bufs[i].begin(), bufs[i].end(),
              static_cast<uint8_t>(seed + i));
    // Every other block, so that no two writes merge.
    EXPECT_OK((*queue)->SubmitWrite(2 * kBlock * i, bufs[i], note));
    (*queue)->Poll();
  }
  (*queue)->Drain();
  EXPECT_OK((*queue)->SubmitFlush(note));
  (*queue)->Drain();
  const uint64_t calls = WriteSyscalls() - before;
  EXPECT_EQ(done, kWrites + 1);
  EXPECT_OK(first_error);
  return calls;
}

void ExpectBlocks(const std::string& path, uint8_t seed) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> data(kSize);
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  for (int i = 0; i < kWrites; ++i) {
    EXPECT_EQ(static_cast<uint8_t>(data[2 * kBlock * i]),
              static_cast<uint8_t>(seed + i))
        << "block " << i;
    EXPECT_EQ(data[2 * kBlock * i + kBlock], 0) << "gap after block " << i;
  }
}

// The same raw image written through a queue, opened with no_flush and
// through a ForwardingFile: the first makes no write call of its own, the
// second one per write (which is what the no-flush wrapper of qemu-img's
// `-t unsafe` used to cost).
TEST(NoFlushTest, QueueWritesGoThroughTheRing) {
  TempDir dir;
  const std::string path = dir.File("disk.raw");
  CreateOptions co;
  co.format = ImageFormat::kRaw;
  co.size = kSize;
  ASSERT_OK(CreateImage(path, co));
  OpenOptions oo;
  oo.read_write = true;
  oo.format = "raw";
  oo.no_flush = true;
  {
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(path, oo));
    auto probe = img->CreateQueue();
    ASSERT_OK(probe.status());
    if (!(*probe)->uses_io_uring()) {
      GTEST_SKIP() << "io_uring is not available here";
    }
    probe->reset();
    // No data write; a few calls allowed for the queue's eventfd wake-ups
    // (8-byte writes, made when a request waits for another: under
    // AddressSanitizer's timing there were 3), far below one per write.
    EXPECT_LT(WriteThroughQueue(*img, 1), static_cast<uint64_t>(kWrites / 8));
    ASSERT_OK(img->Close());
  }
  ExpectBlocks(path, 1);

  FileOptions fo;
  fo.read_only = false;
  fo.no_flush = true;
  ASSERT_OK_AND_ASSIGN(auto file, OpenPosixFile(path, fo));
  ASSERT_OK_AND_ASSIGN(
      auto wrapped,
      Image::Open(std::make_unique<testing::ForwardingFile>(std::move(file)),
                  oo));
  EXPECT_GE(WriteThroughQueue(*wrapped, 101), static_cast<uint64_t>(kWrites));
  ASSERT_OK(wrapped->Close());
  ExpectBlocks(path, 101);
}

TEST(NoFlushTest, CApiKey) {
  TempDir dir;
  const std::string path = dir.File("disk.qcow2");
  char* err = nullptr;
  ASSERT_EQ(qcow2_image_create(path.c_str(), nullptr, kSize, nullptr, &err),
            0)
      << (err ? err : "");
  qcow2_image_t* img =
      qcow2_image_open_opts(path.c_str(), "read-only=off,no-flush=on", &err);
  ASSERT_NE(img, nullptr) << (err ? err : "");
  EXPECT_EQ(qcow2_image_flush(img, &err), 0) << (err ? err : "");
  EXPECT_EQ(qcow2_image_close(img, &err), 0) << (err ? err : "");
  EXPECT_EQ(qcow2_image_open_opts(path.c_str(), "no-flush=sometimes", &err),
            nullptr);
  ASSERT_NE(err, nullptr);
  EXPECT_NE(std::string(err).find("no-flush"), std::string::npos) << err;
  qcow2_free(err);
}

}  // namespace
}  // namespace qcow2
