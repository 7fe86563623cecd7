// SPDX-License-Identifier: Apache-2.0
// qcow2 on a block device (a loop device over a file full of junk), and on
// a file system that fills up (a small tmpfs): create formats the device
// in place, writes never assume unwritten device space reads as zeros,
// running out of room says "no space left on ..." and leaves an image
// that qemu-img check finds without errors, holding everything flushed.
//
// Needs root (losetup, mount); skipped with a message where the machine
// does not allow it.
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"
#include "tests/util/loop_device.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using ::testing::HasSubstr;
using testing::CommandResult;
using testing::LoopDevice;
using testing::TempDir;

constexpr uint64_t kDeviceBytes = 64ull << 20;
constexpr uint64_t kChunk = 1 << 20;

std::vector<uint8_t> Pattern(uint64_t i) {
  return std::vector<uint8_t>(kChunk, static_cast<uint8_t>(0x10 + i % 200));
}

// Writes 1 MiB chunks from offset 0 with a flush after each until a write
// or flush fails; returns the chunks whose flush succeeded and the error.
uint64_t FillUntilFull(Image* img, absl::Status* error) {
  uint64_t flushed = 0;
  for (uint64_t i = 0; i * kChunk < img->size(); ++i) {
    absl::Status s = img->Write(i * kChunk, Pattern(i));
    if (s.ok()) s = img->Flush();
    if (!s.ok()) {
      *error = s;
      return flushed;
    }
    flushed = i + 1;
  }
  *error = absl::OkStatus();
  return flushed;
}

// FillUntilFull through a Queue (io_uring): each chunk's write, then its
// flush, submitted and polled for.
uint64_t FillUntilFullQueued(Image* img, absl::Status* error) {
  QueueOptions qo;
  qo.depth = 4;
  auto q = img->CreateQueue(qo);
  if (!q.ok()) {
    *error = q.status();
    return 0;
  }
  uint64_t flushed = 0;
  for (uint64_t i = 0; i * kChunk < img->size(); ++i) {
    const std::vector<uint8_t> data = Pattern(i);
    absl::Status result;
    auto done = [&result](absl::Status st) { result = std::move(st); };
    absl::Status s = (*q)->SubmitWrite(i * kChunk, data, done);
    if (s.ok()) {
      (*q)->Drain();
      s = result;
    }
    if (s.ok()) s = (*q)->SubmitFlush(done);
    if (s.ok()) {
      (*q)->Drain();
      s = result;
    }
    if (!s.ok()) {
      *error = s;
      return flushed;
    }
    flushed = i + 1;
  }
  *error = absl::OkStatus();
  return flushed;
}

// qemu-img check finds no errors (leaks are allowed) and the chunks flushed
// read back through qemu-img.
void ExpectConsistent(const std::string& image, uint64_t flushed) {
  CommandResult check = testing::QemuCheck(image);
  EXPECT_TRUE(check.exit_code == 0 || check.exit_code == 3)
      << "qemu-img check " << image << " exit " << check.exit_code << "\n"
      << check.out << check.err;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> disk, testing::QemuReadAll(image));
  for (uint64_t i = 0; i < flushed; ++i) {
    std::vector<uint8_t> got(disk.begin() + i * kChunk,
                             disk.begin() + (i + 1) * kChunk);
    ASSERT_EQ(got, Pattern(i)) << "flushed chunk " << i << " of " << image;
  }
}

class BlockDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_QEMU();
    if (::geteuid() != 0) GTEST_SKIP() << "not root: no loop devices";
    loop_ = std::make_unique<LoopDevice>(dir_.File("backing.img"),
                                         kDeviceBytes);
    if (loop_->path().empty()) {
      GTEST_SKIP() << "no loop device here: " << loop_->why();
    }
    dev_ = loop_->path();
  }

  CommandResult Qcowtool(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {testing::QcowtoolPath()};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::Run(argv);
  }

  TempDir dir_;
  std::unique_ptr<LoopDevice> loop_;
  std::string dev_;
};

TEST_F(BlockDeviceTest, CreateFormatsTheDeviceInPlace) {
  CommandResult c = Qcowtool({"create", "-q", "-f", "qcow2", dev_, "1G"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  CommandResult check = testing::QemuCheck(dev_);
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  CommandResult info = testing::Run({"qemu-img", "info", dev_});
  EXPECT_THAT(info.out, HasSubstr("file format: qcow2"));
  EXPECT_THAT(info.out, HasSubstr("virtual size: 1 GiB"));
  // Without a size the image takes the whole device.
  c = Qcowtool({"create", "-q", "-f", "qcow2", dev_});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  info = testing::Run({"qemu-img", "info", dev_});
  EXPECT_THAT(info.out, HasSubstr("virtual size: 64 MiB"));
  // Still a device, never replaced by a file.
  struct stat st;
  ASSERT_EQ(::stat(dev_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISBLK(st.st_mode));
}

TEST_F(BlockDeviceTest, PartialWritesNeverExposeOldDeviceContents) {
  CommandResult c = Qcowtool({"create", "-q", "-f", "qcow2", dev_, "16M"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  {
    OpenOptions o;
    o.read_write = true;
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(dev_, o));
    // 4 KiB in the middle of fresh clusters: the rest of each cluster must
    // read as zeros, not as the 0xa5 junk the device held.
    for (uint64_t off : {uint64_t{12288}, uint64_t{5 << 20} + 512}) {
      ASSERT_OK(img->Write(off, std::vector<uint8_t>(4096, 0x77)));
    }
    ASSERT_OK(img->Close());
  }
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> disk, testing::QemuReadAll(dev_));
  std::vector<uint8_t> want(16 << 20, 0);
  for (uint64_t off : {uint64_t{12288}, uint64_t{5 << 20} + 512}) {
    std::fill(want.begin() + off, want.begin() + off + 4096, 0x77);
  }
  EXPECT_TRUE(disk == want) << "the image shows bytes nobody wrote";
  CommandResult check = testing::QemuCheck(dev_);
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
}

// Fills a 128 MiB disk on the 64 MiB device with `fill` (synchronous calls
// or a Queue): the failure names the device and its size, most of the
// device was used first, and the image stays consistent.
void ExpectNoSpaceAndConsistent(const std::string& dev,
                                uint64_t (*fill)(Image*, absl::Status*),
                                uint64_t* flushed) {
  OpenOptions o;
  o.read_write = true;
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(dev, o));
  absl::Status error;
  *flushed = fill(img.get(), &error);
  ASSERT_FALSE(error.ok()) << "a 64 MiB device held a 128 MiB disk";
  std::printf("the device filled up after %llu MiB: %s\n",
              static_cast<unsigned long long>(*flushed),
              std::string(error.message()).c_str());
  EXPECT_EQ(error.code(), absl::StatusCode::kResourceExhausted) << error;
  EXPECT_THAT(std::string(error.message()),
              HasSubstr(absl::StrCat("no space left on ", dev, " (64 MiB)")));
  EXPECT_GE(*flushed, 50u);
  img->Close().IgnoreError();
  ExpectConsistent(dev, *flushed);
}

TEST_F(BlockDeviceTest, RunningOutOfDeviceSaysNoSpaceAndStaysConsistent) {
  CommandResult c = Qcowtool({"create", "-q", "-f", "qcow2", dev_, "128M"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  uint64_t flushed = 0;
  ExpectNoSpaceAndConsistent(dev_, &FillUntilFull, &flushed);
  // The CLI says the same.
  CommandResult io = Qcowtool({"io", dev_, "-c", "write 100M 1M"});
  std::printf("qcowtool io: %s", io.err.c_str());
  EXPECT_EQ(io.exit_code, 2);
  EXPECT_THAT(io.err, HasSubstr(absl::StrCat("no space left on ", dev_)));
  ExpectConsistent(dev_, flushed);
}

// The same through a Queue: the io_uring executor's failure names the
// device and its size too.
TEST_F(BlockDeviceTest, RunningOutOfDeviceThroughAQueueSaysNoSpace) {
  CommandResult c = Qcowtool({"create", "-q", "-f", "qcow2", dev_, "128M"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  uint64_t flushed = 0;
  ExpectNoSpaceAndConsistent(dev_, &FillUntilFullQueued, &flushed);
}

TEST_F(BlockDeviceTest, ConvertOntoTheDeviceWritesTheZerosToo) {
  const std::string src = dir_.File("src.qcow2");
  ASSERT_EQ(Qcowtool({"create", "-q", src, "8M"}).exit_code, 0);
  ASSERT_EQ(Qcowtool({"io", src, "-c", "write -P 0x42 1M 64k"}).exit_code, 0);
  CommandResult c = Qcowtool({"convert", src, dev_});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> dev,
                       testing::ReadFileBytes(dev_));
  ASSERT_GE(dev.size(), 8u << 20);
  std::vector<uint8_t> want(8 << 20, 0);
  std::fill(want.begin() + (1 << 20), want.begin() + (1 << 20) + 65536, 0x42);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), dev.begin()))
      << "the device keeps junk where the disk reads as zeros";
  // Larger than the device: refused before anything is written.
  const std::string big = dir_.File("big.qcow2");
  ASSERT_EQ(Qcowtool({"create", "-q", big, "1G"}).exit_code, 0);
  c = Qcowtool({"convert", big, dev_});
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_THAT(c.err, HasSubstr("no space left on " + dev_));
}

TEST(FullFileSystemTest, RegularFileSaysNoSpaceAndStaysConsistent) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string mnt = dir.File("mnt");
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=24m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << ")";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount(path.c_str()); }
  } unmount{mnt};
  const std::string image = mnt + "/disk.qcow2";
  uint64_t flushed = 0;
  {
    CreateOptions co;
    co.size = 64ull << 20;
    ASSERT_OK(CreateImage(image, co));
    OpenOptions o;
    o.read_write = true;
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(image, o));
    absl::Status error;
    flushed = FillUntilFull(img.get(), &error);
    ASSERT_FALSE(error.ok());
    EXPECT_EQ(error.code(), absl::StatusCode::kResourceExhausted) << error;
    EXPECT_THAT(std::string(error.message()),
                HasSubstr("no space left on " + image));
    std::printf("the file system filled up after %llu MiB: %s\n",
                static_cast<unsigned long long>(flushed),
                std::string(error.message()).c_str());
    EXPECT_GE(flushed, 10u);
    img->Close().IgnoreError();
  }
  // Copy it off the full file system: qemu-img needs no room to check,
  // but the read-back does.
  const std::string copy = dir.File("copy.qcow2");
  CommandResult cp = testing::Run({"cp", "--sparse=always", image, copy});
  ASSERT_EQ(cp.exit_code, 0) << cp.err;
  ExpectConsistent(copy, flushed);
}

}  // namespace
}  // namespace qcow2
