// SPDX-License-Identifier: Apache-2.0
// A raw layer plans reads with no call to the file (issue 28): only block
// status and the copy-on-write decision ask SEEK_DATA, and a backing raw
// file's answers are cached per run. Reads and statuses stay those qemu-img
// gives.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "qcow2/file.h"
#include "qcow2/image.h"
#include "testing/forwarding_file.h"
#include "tests/util/json_lite.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::TempDir;

constexpr uint64_t kDisk = 8 << 20;
constexpr uint64_t kRun = 1 << 20;  // data in every other MiB

// POSIX files that count the status questions (SEEK_DATA/SEEK_HOLE) put to
// them, all files together.
class CountingFile : public testing::ForwardingFile {
 public:
  CountingFile(std::unique_ptr<File> inner, std::atomic<int>* data_runs)
      : ForwardingFile(std::move(inner)), data_runs_(data_runs) {}
  absl::StatusOr<bool> DataRun(uint64_t offset, uint64_t max_len,
                               uint64_t* len) override {
    ++*data_runs_;
    return ForwardingFile::DataRun(offset, max_len, len);
  }

 private:
  std::atomic<int>* data_runs_;
};

class CountingOpener : public FileOpener {
 public:
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const FileOptions& opts) override {
    auto f = OpenPosixFile(path, opts);
    if (!f.ok()) return f.status();
    return std::unique_ptr<File>(
        new CountingFile(std::move(f).value(), &data_runs));
  }
  std::atomic<int> data_runs{0};
};

// A sparse raw file of kDisk bytes: the odd MiBs hold 0x5a, the even ones
// are holes. Returns what it reads as.
std::vector<uint8_t> MakeSparseRaw(const std::string& path) {
  std::vector<uint8_t> want(kDisk, 0);
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, kDisk), 0);
  std::vector<uint8_t> run(kRun, 0x5a);
  for (uint64_t off = kRun; off < kDisk; off += 2 * kRun) {
    EXPECT_EQ(::pwrite(fd, run.data(), run.size(), off),
              static_cast<ssize_t>(run.size()));
    std::memset(want.data() + off, 0x5a, kRun);
  }
  ::close(fd);
  return want;
}

std::unique_ptr<Image> OpenCounting(const std::string& path,
                                    const std::string& format, bool rw,
                                    CountingOpener* opener) {
  OpenOptions o;
  o.format = format;
  o.read_write = rw;
  o.opener = opener;
  auto image = Image::Open(path, o);
  EXPECT_TRUE(image.ok()) << image.status();
  return image.ok() ? std::move(image).value() : nullptr;
}

// 4 KiB reads at 1,000 spread offsets, checked against `want`.
void ReadSpread(Image& image, const std::vector<uint8_t>& want) {
  std::vector<uint8_t> buf(4096);
  for (uint64_t i = 0; i < 1000; ++i) {
    const uint64_t off = (i * 7919 * 4096) % kDisk;
    ASSERT_OK(image.Read(off, absl::MakeSpan(buf)));
    ASSERT_EQ(std::memcmp(buf.data(), want.data() + off, buf.size()), 0)
        << "guest offset " << off;
  }
}

std::string CreateOverlay(const TempDir& dir, const std::string& base) {
  CreateOptions co;
  co.backing_file = base;
  co.backing_format = "raw";
  const std::string path = dir.File("top.qcow2");
  EXPECT_OK(CreateImage(path, co));
  return path;
}

TEST(RawLayerTest, ReadsOfARawImageAskNoStatus) {
  TempDir dir;
  const std::string raw = dir.File("disk.raw");
  const std::vector<uint8_t> want = MakeSparseRaw(raw);
  for (bool rw : {false, true}) {
    CountingOpener opener;
    auto image = OpenCounting(raw, "raw", rw, &opener);
    ASSERT_NE(image, nullptr);
    const int at_open = opener.data_runs.load();
    ReadSpread(*image, want);
    EXPECT_EQ(opener.data_runs.load(), at_open)
        << (rw ? "read-write" : "read-only");
    ASSERT_OK(image->Close());
  }
}

TEST(RawLayerTest, ReadsThroughARawBackingFileAskNoStatus) {
  TempDir dir;
  const std::string raw = dir.File("base.raw");
  const std::vector<uint8_t> want = MakeSparseRaw(raw);
  const std::string top = CreateOverlay(dir, raw);
  CountingOpener opener;
  auto image = OpenCounting(top, "qcow2", true, &opener);
  ASSERT_NE(image, nullptr);
  const int at_open = opener.data_runs.load();
  ReadSpread(*image, want);
  EXPECT_EQ(opener.data_runs.load(), at_open);
  ASSERT_OK(image->Close());
}

// Block status still tells holes from data, as qemu-img map does, and a
// backing file's runs are asked once each, when it is opened (with no lock
// held), however often the map is walked.
TEST(RawLayerTest, BlockStatusSeesHolesAndCachesABackingFilesRuns) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string raw = dir.File("base.raw");
  MakeSparseRaw(raw);
  const std::string top = CreateOverlay(dir, raw);
  CountingOpener opener;
  auto image = OpenCounting(top, "qcow2", false, &opener);
  ASSERT_NE(image, nullptr);
  auto walk = [&] {
    std::vector<std::pair<uint64_t, bool>> runs;  // start, data
    for (uint64_t off = 0; off < kDisk;) {
      auto bs = image->GetBlockStatus(off, kDisk - off);
      EXPECT_TRUE(bs.ok()) << bs.status();
      if (!bs.ok()) break;
      if (runs.empty() || runs.back().second != bs->data) {
        runs.push_back({off, bs->data});
      }
      off += bs->length;
    }
    return runs;
  };
  const int asked = opener.data_runs.load();
  // One per run (8 here; a file system may merge or split them).
  EXPECT_GE(asked, 2);
  EXPECT_LE(asked, static_cast<int>(kDisk / kRun)) << "one per run, at open";
  const auto first = walk();
  EXPECT_EQ(walk(), first);
  EXPECT_EQ(walk(), first);
  EXPECT_EQ(opener.data_runs.load(), asked) << "answers not cached";

  // What qemu-img map says of the same chain.
  testing::CommandResult map = testing::Run(
      {"qemu-img", "map", "-U", "--output=json", top});
  ASSERT_EQ(map.exit_code, 0) << map.err;
  std::vector<std::pair<uint64_t, bool>> qemu;
  auto parsed = testing::json::Parse(map.out);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  for (const testing::json::Value& e : parsed->array()) {
    const bool data = e["data"].as_bool();
    const uint64_t start = e["start"].as_uint64();
    if (qemu.empty() || qemu.back().second != data) qemu.push_back({start, data});
  }
  EXPECT_EQ(first, qemu);
  ASSERT_OK(image->Close());
}

// A small write into a fresh overlay over a hole of the raw file copies
// nothing (the range below reads as zeros); over data, it copies.
TEST(RawLayerTest, CopyOnWriteSkipsHolesOfARawBackingFile) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string raw = dir.File("base.raw");
  std::vector<uint8_t> want = MakeSparseRaw(raw);
  const std::string top = CreateOverlay(dir, raw);
  CountingOpener opener;
  auto image = OpenCounting(top, "qcow2", true, &opener);
  ASSERT_NE(image, nullptr);
  std::vector<uint8_t> block(4096, 0xc3);
  const IoStats s0 = image->GetStats();
  ASSERT_OK(image->Write(8192, block));  // in the hole at 0
  const IoStats s1 = image->GetStats().Since(s0);
  EXPECT_EQ(s1.cow_read_bytes, 0u);
  EXPECT_GE(s1.cow_skipped_zero, 1u);
  ASSERT_OK(image->Write(kRun + 8192, block));  // in the data at 1 MiB
  const IoStats s2 = image->GetStats().Since(s0);
  EXPECT_GT(s2.cow_read_bytes, 0u);
  // The raw file's runs were learnt at open: no lseek under the lock.
  EXPECT_EQ(s2.host_calls_under_lock, 0u);
  std::memset(want.data() + 8192, 0xc3, 4096);
  std::memset(want.data() + kRun + 8192, 0xc3, 4096);
  ASSERT_OK(image->Close());
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> qemu,
                       testing::QemuCheckedReadAll(top));
  EXPECT_TRUE(qemu == want) << "qemu-img reads other bytes";
}

}  // namespace
}  // namespace qcow2
