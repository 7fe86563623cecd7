// SPDX-License-Identifier: Apache-2.0
// PosixFile's vectored calls: one preadv/pwritev over every segment,
// resumed after short transfers, split past IOV_MAX, zeros past the end
// of the file; unaligned segments under O_DIRECT go the slow way.
#include <sys/uio.h>

#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "qcow2/file.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::TempDir;

std::unique_ptr<File> OpenRw(const std::string& path, bool direct = false) {
  FileOptions fo;
  fo.read_only = false;
  fo.create = true;
  fo.direct = direct;
  auto f = OpenPosixFile(path, fo);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? std::move(*f) : nullptr;
}

// 1,500 segments of odd sizes (more than IOV_MAX, some empty) written
// with one call, read back with another, byte for byte.
TEST(PosixFileTest, VectoredWriteAndReadOfManySegments) {
  TempDir dir;
  auto file = OpenRw(dir.File("f"));
  ASSERT_NE(file, nullptr);
  std::vector<std::vector<uint8_t>> segs(1500);
  std::vector<iovec> iov;
  uint64_t total = 0;
  for (size_t i = 0; i < segs.size(); ++i) {
    segs[i].resize(i % 7 == 0 ? 0 : 1 + (i * 37) % 300);
    for (size_t j = 0; j < segs[i].size(); ++j) {
      segs[i][j] = static_cast<uint8_t>(i * 13 + j);
    }
    iov.push_back({segs[i].data(), segs[i].size()});
    total += segs[i].size();
  }
  ASSERT_OK(file->WritevAt(100, iov));
  ASSERT_OK_AND_ASSIGN(const uint64_t size, file->Size());
  EXPECT_EQ(size, 100 + total);

  std::vector<uint8_t> flat(total);
  ASSERT_OK(file->ReadAt(100, absl::MakeSpan(flat)));
  uint64_t pos = 0;
  for (const auto& s : segs) {
    for (uint8_t b : s) ASSERT_EQ(flat[pos++], b) << "byte " << pos - 1;
  }
  std::vector<std::vector<uint8_t>> back(segs.size());
  std::vector<iovec> riov;
  for (size_t i = 0; i < segs.size(); ++i) {
    back[i].assign(segs[i].size(), 0xee);
    riov.push_back({back[i].data(), back[i].size()});
  }
  ASSERT_OK(file->ReadvAt(100, riov));
  EXPECT_EQ(back, segs);
}

// A vectored read that runs past the end of the file reads zeros there.
TEST(PosixFileTest, VectoredReadPastTheEndReadsZeros) {
  TempDir dir;
  auto file = OpenRw(dir.File("f"));
  ASSERT_NE(file, nullptr);
  ASSERT_OK(file->WriteAt(0, std::vector<uint8_t>(1000, 0x11)));
  std::vector<uint8_t> a(600, 0xee), b(600, 0xee), c(600, 0xee);
  const std::vector<iovec> iov = {{a.data(), a.size()}, {b.data(), b.size()},
                                  {c.data(), c.size()}};
  ASSERT_OK(file->ReadvAt(0, iov));
  EXPECT_EQ(a, std::vector<uint8_t>(600, 0x11));
  for (size_t i = 0; i < 600; ++i) {
    ASSERT_EQ(b[i], i < 400 ? 0x11 : 0) << i;
  }
  EXPECT_EQ(c, std::vector<uint8_t>(600, 0));
}

// Under O_DIRECT, aligned segments go in one call and unaligned ones are
// bounced: both give the same bytes.
TEST(PosixFileTest, DirectVectoredAlignedAndUnaligned) {
  TempDir dir;
  const std::string path = dir.File("f");
  auto file = OpenRw(path, /*direct=*/true);
  if (file == nullptr) GTEST_SKIP() << "no O_DIRECT here";
  const size_t al = std::max<size_t>(file->alignment(), 4096);
  std::unique_ptr<uint8_t, decltype(&std::free)> mem(
      static_cast<uint8_t*>(std::aligned_alloc(al, 4 * 4096)), &std::free);
  uint8_t* const aligned = mem.get();
  for (size_t i = 0; i < 4 * 4096; ++i) aligned[i] = static_cast<uint8_t>(i);
  const std::vector<iovec> iov = {{aligned, 4096}, {aligned + 4096, 3 * 4096}};
  ASSERT_OK(file->WritevAt(0, iov));
  std::vector<uint8_t> odd(300, 0x77);
  const std::vector<iovec> iov2 = {{odd.data(), 100}, {odd.data() + 100, 200}};
  ASSERT_OK(file->WritevAt(1000, iov2));
  std::vector<uint8_t> back(4 * 4096);
  ASSERT_OK(file->ReadAt(0, absl::MakeSpan(back)));
  for (size_t i = 0; i < back.size(); ++i) {
    const uint8_t want = i >= 1000 && i < 1300 ? 0x77 : static_cast<uint8_t>(i);
    ASSERT_EQ(back[i], want) << "byte " << i;
  }
}

}  // namespace
}  // namespace qcow2
