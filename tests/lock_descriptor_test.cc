// SPDX-License-Identifier: Apache-2.0
// Image locks live on an open file description of their own (issue 48):
// never the one I/O and io_uring use, so that requests in flight in a
// killed process cannot keep them alive. A closed image drops them only
// once none of its requests can still write. tests/kill_lock_test.py kills
// real writers; these check the pieces.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/io/file_lock.h"
#include "lib/io/posix_file.h"
#include "qcow2/file.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::PosixFile;
using testing::ByteLocked;
using testing::OtherHoldsByte;
using testing::TempDir;

// The PosixFile OpenPosixFile made of `path` (null on failure).
std::unique_ptr<File> OpenPosix(const std::string& path, const FileOptions& fo,
                                PosixFile** posix) {
  auto f = OpenPosixFile(path, fo);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return nullptr;
  *posix = dynamic_cast<PosixFile*>(f->get());
  EXPECT_NE(*posix, nullptr);
  return *posix != nullptr ? std::move(*f) : nullptr;
}

// An empty file `name` in `dir`, made without locks; its path.
std::string MakeFile(const TempDir& dir, const std::string& name) {
  const std::string path = dir.File(name);
  FileOptions fo;
  fo.read_only = false;
  fo.create = true;
  fo.lock = false;
  auto f = OpenPosixFile(path, fo);
  EXPECT_TRUE(f.ok()) << f.status();
  return path;
}

TEST(LockDescriptorTest, LocksAreOnADescriptorOfTheirOwn) {
  TempDir dir;
  const std::string path = MakeFile(dir, "f");
  FileOptions fo;
  fo.read_only = false;
  PosixFile* posix = nullptr;
  std::unique_ptr<File> file = OpenPosix(path, fo, &posix);
  ASSERT_NE(file, nullptr);
  ASSERT_GE(posix->lock_fd(), 0);
  ASSERT_NE(posix->lock_fd(), posix->fd());
  // The same file...
  struct stat data, lock;
  ASSERT_EQ(::fstat(posix->fd(), &data), 0);
  ASSERT_EQ(::fstat(posix->lock_fd(), &lock), 0);
  EXPECT_EQ(data.st_dev, lock.st_dev);
  EXPECT_EQ(data.st_ino, lock.st_ino);
  // ...but another open file description: seen from the data descriptor
  // the write lock (byte 101) is someone else's, from the lock descriptor
  // it is its own.
  EXPECT_TRUE(OtherHoldsByte(posix->fd(), internal::kLockPermBase + 1));
  EXPECT_FALSE(OtherHoldsByte(posix->lock_fd(), internal::kLockPermBase + 1));
  // QEMU's bytes, as file_lock.h has them: read, write and resize held;
  // write and resize not shared.
  for (int byte : {100, 101, 103, 201, 203}) {
    EXPECT_TRUE(ByteLocked(path, byte)) << "byte " << byte;
  }
  for (int byte : {102, 200, 202}) {
    EXPECT_FALSE(ByteLocked(path, byte)) << "byte " << byte;
  }
  file.reset();
  EXPECT_FALSE(ByteLocked(path, 100));
}

TEST(LockDescriptorTest, NoLocksNoLockDescriptor) {
  TempDir dir;
  const std::string path = MakeFile(dir, "f");
  FileOptions fo;
  fo.lock = false;
  PosixFile* posix = nullptr;
  std::unique_ptr<File> file = OpenPosix(path, fo, &posix);
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(posix->lock_fd(), -1);
  EXPECT_FALSE(ByteLocked(path, 100));
}

// The lock must be on the file the data descriptor opened: a path
// replaced in between (a rename over it) is refused, not locked.
TEST(LockDescriptorTest, ReplacedPathIsRefused) {
  TempDir dir;
  const std::string path = MakeFile(dir, "f");
  const std::string other = MakeFile(dir, "g");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::rename(other.c_str(), path.c_str()), 0);
  absl::StatusOr<int> lock = internal::OpenLockDescriptor(path, fd);
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kAborted)
      << lock.status();
  EXPECT_NE(lock.status().message().find("replaced"), std::string::npos);
  ::close(fd);
  // Unchanged, the same call succeeds.
  const int again = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(again, 0);
  ASSERT_OK_AND_ASSIGN(const int ok, internal::OpenLockDescriptor(path, again));
  EXPECT_GE(ok, 0);
  ::close(ok);
  ::close(again);
}

// Every file of a chain locks on a descriptor of its own: the top's write
// lock and the backing file's read lock both go when the image closes.
TEST(LockDescriptorTest, EveryFileOfTheChain) {
  TempDir dir;
  CreateOptions base;
  base.size = 4 << 20;
  ASSERT_OK(CreateImage(dir.File("base.qcow2"), base));
  CreateOptions top;
  top.backing_file = "base.qcow2";
  top.backing_format = "qcow2";
  ASSERT_OK(CreateImage(dir.File("top.qcow2"), top));
  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image,
                       Image::Open(dir.File("top.qcow2"), oo));
  EXPECT_TRUE(ByteLocked(dir.File("top.qcow2"), 101));
  EXPECT_TRUE(ByteLocked(dir.File("base.qcow2"), 100));
  EXPECT_TRUE(ByteLocked(dir.File("base.qcow2"), 201));
  ASSERT_OK(image->Close());
  EXPECT_FALSE(ByteLocked(dir.File("top.qcow2"), 100));
  EXPECT_FALSE(ByteLocked(dir.File("base.qcow2"), 100));
}

// Close with requests still in flight on a queue (Close must not race
// them; a caller that breaks the rule) keeps the locks until the last of
// them finishes: an opener waiting for the lock never finds our writes
// still landing.
TEST(LockDescriptorTest, CloseKeepsLocksUntilRequestsInFlightFinish) {
  TempDir dir;
  const std::string path = dir.File("disk.qcow2");
  CreateOptions co;
  co.size = 16 << 20;
  ASSERT_OK(CreateImage(path, co));
  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image, Image::Open(path, oo));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Queue> queue,
                       image->CreateQueue(QueueOptions{}));
  if (!queue->uses_io_uring()) {
    GTEST_SKIP() << "no io_uring: requests finish inside Submit";
  }
  std::vector<uint8_t> data(64 << 10, 0x5a);
  int done = 0;
  for (int i = 0; i < 8; ++i) {
    ASSERT_OK(queue->SubmitWrite(static_cast<uint64_t>(i) << 20, data,
                                 [&](absl::Status) { ++done; }));
  }
  ASSERT_GT(queue->in_flight(), 0);
  image->Close().IgnoreError();
  EXPECT_TRUE(ByteLocked(path, 101)) << "locks dropped with requests in flight";
  queue->Drain();
  EXPECT_EQ(done, 8);
  EXPECT_FALSE(ByteLocked(path, 101));
  EXPECT_FALSE(ByteLocked(path, 100));
  queue.reset();
  image.reset();
}

}  // namespace
}  // namespace qcow2
