// SPDX-License-Identifier: Apache-2.0
// The file of a qcow2 image is grown ahead of its allocations in steps
// (Qcow2Layer::GrowAhead). The step is reserved (fallocate) by the
// executor of the write that needs it, with no lock held: a reserve of
// 256 MiB takes tens of milliseconds, and other requests go on meanwhile.
// A file that cannot reserve is grown by a size change under the lock.
#include <linux/magic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/io/posix_file.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"
#include "testing/gate_file.h"
#include "testing/model.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::TempDir;

constexpr uint64_t kCluster = 65536;

std::vector<uint8_t> Filled(uint64_t seed, size_t len) {
  std::vector<uint8_t> v(len);
  testing::FillPseudoRandom(seed, absl::MakeSpan(v));
  return v;
}

// An empty 64 MiB image with 64 KiB clusters, open read-write through
// `opener`, with cluster 0 written (which grows the file by its first
// step, 1 MiB).
class Grow : public ::testing::Test {
 protected:
  void Open(testing::GateSpec spec) {
    path_ = dir_.File("img.qcow2");
    CreateOptions co;
    co.size = 64 << 20;
    co.cluster_size = kCluster;
    ASSERT_OK(CreateImage(path_, co));
    created_ = std::filesystem::file_size(path_);
    opener_ = std::make_unique<testing::GateOpener>(spec);
    OpenOptions oo;
    oo.read_write = true;
    oo.opener = opener_.get();
    ASSERT_OK_AND_ASSIGN(image_, Image::Open(path_, oo));
    ASSERT_OK(image_->Write(0, first_));
    EXPECT_GE(std::filesystem::file_size(path_), created_ + (1 << 20));
  }

  // Reads cluster 0 back, and writes 4 KiB of it again in place: neither
  // allocates.
  absl::Status ReadAndWriteInPlace() {
    std::vector<uint8_t> r(kCluster);
    absl::Status s = image_->Read(0, absl::MakeSpan(r));
    if (s.ok() && r != first_) s = absl::InternalError("read other bytes");
    if (s.ok()) {
      s = image_->Write(4096, absl::MakeConstSpan(first_.data() + 4096, 4096));
    }
    return s;
  }

  // Runs `write_big` (the write of big_ at kAt, which grows the file) until
  // its reserve is held at the gate; meanwhile a read and an in-place
  // write complete. Then no host call was made under the lock, the file
  // reaches past the new clusters, and qemu-img agrees (CloseAndCheck).
  void ExpectGrowsWithoutTheLock(std::function<void()> write_big,
                                 const char* what) {
    testing::HoldAndExpectGoesOn(opener_->last(), std::move(write_big),
                                 [&] { return ReadAndWriteInPlace(); }, what);
    EXPECT_EQ(image_->GetStats().host_calls_under_lock, 0u);
    EXPECT_GE(std::filesystem::file_size(path_),
              created_ + kCluster + big_.size());
    CloseAndCheck();
  }

  // Closes the image; qemu-img finds it clean and reads `big` at 8 MiB.
  void CloseAndCheck() {
    ASSERT_OK(image_->Close());
    if (!testing::HaveQemu()) return;
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                         testing::QemuCheckedReadAll(path_));
    EXPECT_TRUE(std::equal(first_.begin(), first_.end(), all.begin()));
    EXPECT_TRUE(std::equal(big_.begin(), big_.end(), all.begin() + kAt));
  }

  static constexpr uint64_t kAt = 8 << 20;
  TempDir dir_;
  std::string path_;
  uint64_t created_ = 0;
  std::unique_ptr<testing::GateOpener> opener_;
  std::unique_ptr<Image> image_;
  const std::vector<uint8_t> first_ = Filled(1, kCluster);
  // 2 MiB of new clusters: past the first step.
  const std::vector<uint8_t> big_ = Filled(2, 2 << 20);
};

// While the write that needs the file grown reserves the step, a read
// and an in-place write complete. Before, the file grew while the write
// was planned, under the lock.
TEST_F(Grow, TheStepIsReservedWithoutTheLock) {
  Open({.grow = true});
  ExpectGrowsWithoutTheLock([&] { ASSERT_OK(image_->Write(kAt, big_)); },
                            "another write's growth");
}

// The same through a queue: its executor reserves the step.
TEST_F(Grow, AQueueReservesTheStepWithoutTheLock) {
  Open({.grow = true});
  ExpectGrowsWithoutTheLock(
      [&] {
        ASSERT_OK_AND_ASSIGN(auto q, image_->CreateQueue());
        absl::Status done = absl::UnknownError("not completed");
        ASSERT_OK(q->SubmitWrite(kAt, big_,
                                 [&done](absl::Status s) { done = s; }));
        q->Drain();
        ASSERT_OK(done);
      },
      "a queue's growth");
}

// A file that cannot reserve (no room, or no fallocate at all) still
// grows by whole steps, by a size change: a cluster whose tail is never
// written lies inside the file all the same.
TEST_F(Grow, AFileThatCannotReserveGrowsBySize) {
  for (absl::StatusCode code : {absl::StatusCode::kResourceExhausted,
                                absl::StatusCode::kUnimplemented}) {
    SCOPED_TRACE(absl::StatusCodeToString(code));
    Open({.reserve_error = code});
    EXPECT_GE(std::filesystem::file_size(path_), created_ + (1 << 20));
    ASSERT_OK(image_->Write(kAt, big_));
    // 4 KiB into a fresh cluster: the file grows by a whole step, not to
    // the end of what was written.
    const uint64_t before = std::filesystem::file_size(path_);
    ASSERT_OK(image_->Write(32 << 20, Filled(3, 4096)));
    EXPECT_GE(std::filesystem::file_size(path_), before + (1 << 20));
    // With no room to reserve, each size change is made under the lock;
    // with no fallocate at all, every later step too (File::Extend).
    EXPECT_GT(image_->GetStats().host_calls_under_lock, 0u);
    CloseAndCheck();
    image_.reset();
    std::filesystem::remove(path_);
  }
}

// On tmpfs a reserve only lengthens the file: fallocate there would
// allocate and zero every page of the step, for the writes to fill them
// again (in a page-cache workload, 8 writers ran at 0.8 of raw files).
TEST(PageCacheFileSystem, ReserveLengthensWithoutAllocating) {
  struct statfs fs;
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
    GTEST_SKIP() << "no tmpfs at /dev/shm";
  }
  char path[] = "/dev/shm/qcow2-reserve-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::unlink(path);
  internal::PosixFile file(fd, path, 1);
  ASSERT_OK(file.Reserve(1 << 20, 8 << 20));
  EXPECT_EQ(file.Size().value_or(0), uint64_t{9} << 20);
  struct stat st;
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(st.st_blocks, 0) << "the reserve allocated pages";
  // Never shorter: a reserve below the end, then an extension.
  ASSERT_OK(file.Reserve(0, 4096));
  ASSERT_OK(file.Extend(9 << 20, 10 << 20));
  EXPECT_EQ(file.Size().value_or(0), uint64_t{10} << 20);
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(st.st_blocks, 0);
}

}  // namespace
}  // namespace qcow2
