// SPDX-License-Identifier: Apache-2.0
// Power cuts during writes to a LUKS-encrypted image: allocating writes,
// copy-on-write inside new clusters, rewrites in place, write-zeroes and
// flushes run once to count their file operations, then again with the
// machine dying at each operation in turn and the unflushed writes
// dropped. After each cut QEMU, with the secret, judges the durable image:
//  - `qemu-img check` finds nothing worse than leaks (exit 0 or 3);
//  - each 512-byte sector reads (through qemu-img convert, decrypted) as
//    it did at the last flush that completed or as a later step made it:
//    a flushed write is never lost, and nothing reads as ciphertext of the
//    wrong sector.
// Default: every cut point, the unflushed writes all dropped. With
// QCOW2_LONG_TESTS=1 also a random half kept and only the newest kept.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "testing/fault_file.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::FaultFileSystem;
using testing::CommandResult;

constexpr uint64_t kDisk = 1 << 20;
constexpr uint64_t kCs = 65536;
constexpr char kPass[] = "cut-PASS";

bool LongTests() {
  const char* v = getenv("QCOW2_LONG_TESTS");
  return v != nullptr && std::string(v) == "1";
}

// A write of `len` bytes from `seed` at `off`, write-zeroes (seed 0), or a
// flush (len 0).
struct Step {
  uint64_t off = 0;
  uint64_t len = 0;
  uint8_t seed = 0;
};

std::vector<uint8_t> Bytes(const Step& st) {
  std::vector<uint8_t> v(st.len);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<uint8_t>(st.seed * 37 + i * 13 + (i >> 9));
  }
  return v;
}

class CrashLuksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
    const std::string path = dir_.File("img.qcow2");
    CreateOptions co;
    co.size = kDisk;
    co.encrypt.format = "luks";
    co.encrypt.key_secret = kPass;
    co.encrypt.iterations = 1000;
    ASSERT_OK(CreateImage(path, co));
    ASSERT_OK_AND_ASSIGN(initial_, testing::ReadFileBytes(path));
    steps_ = {{0, kCs, 1},            // allocating, whole cluster
              {3 * kCs + 4096, 8192, 2},  // copy-on-write of zeros
              {},                     // flush
              {kCs - 1024, 4096, 3},  // the end of one, a new one
              {512, 4096, 4},         // in place
              {},
              {3 * kCs, kCs, 0},      // write-zeroes over data
              {5 * kCs + 1024, 2048, 5}};
    std::vector<uint8_t> disk(kDisk, 0);
    states_.push_back(disk);
    for (const Step& st : steps_) {
      if (st.len != 0) {
        std::vector<uint8_t> d = st.seed ? Bytes(st) : std::vector<uint8_t>(st.len, 0);
        std::copy(d.begin(), d.end(), disk.begin() + st.off);
      }
      states_.push_back(disk);
    }
  }

  // As crash_compressed_test.cc's Run: the steps, the machine dying at
  // the `die_after`-th file operation (0: never).
  uint64_t Run(uint64_t die_after, size_t* flushed) {
    auto disk = fs_.Disk("/d/img.qcow2");
    disk->Reset(initial_);
    OpenOptions oo;
    oo.read_write = true;
    oo.opener = &fs_;
    oo.key_secret = kPass;
    auto img = Image::Open("/d/img.qcow2", oo);
    EXPECT_TRUE(img.ok()) << img.status();
    if (!img.ok()) return 0;
    uint64_t start = 0;
    {
      std::lock_guard<std::mutex> lock(disk->mu);
      start = disk->ops;
      if (die_after != 0) disk->die_at = start + die_after;
    }
    *flushed = 0;
    bool all_ok = true;
    for (size_t i = 0; i < steps_.size(); ++i) {
      const Step& st = steps_[i];
      absl::Status s;
      if (st.len == 0) {
        s = (*img)->Flush();
        if (s.ok()) *flushed = i + 1;
      } else if (st.seed == 0) {
        s = (*img)->WriteZeroes(st.off, st.len);
      } else {
        s = (*img)->Write(st.off, Bytes(st));
      }
      all_ok = all_ok && s.ok();
    }
    if (die_after == 0) {
      EXPECT_TRUE(all_ok);
      EXPECT_OK((*img)->Close());
      *flushed = steps_.size();
    }
    uint64_t end = 0;
    {
      std::lock_guard<std::mutex> lock(disk->mu);
      end = disk->ops;
    }
    img->reset();
    return end - start;
  }

  std::vector<std::string> Secret() const {
    return {"--object", absl::StrCat("secret,id=s0,data=", kPass), "--image-opts",
            absl::StrCat("driver=qcow2,file.filename=", dir_.File("cut.qcow2"),
                         ",encrypt.key-secret=s0")};
  }

  void Judge(size_t flushed, const std::string& where, bool want_clean) {
    SCOPED_TRACE(where);
    auto disk = fs_.Disk("/d/img.qcow2");
    ASSERT_OK(testing::WriteFileBytes(dir_.File("cut.qcow2"), disk->durable));
    std::vector<std::string> argv = {"qemu-img", "check"};
    for (const std::string& a : Secret()) argv.push_back(a);
    CommandResult check = testing::Run(argv);
    if (want_clean) {
      ASSERT_EQ(check.exit_code, 0) << check.out << check.err;
    } else {
      ASSERT_TRUE(check.exit_code == 0 || check.exit_code == 3)
          << "qemu-img check exit " << check.exit_code << "\n"
          << check.out << check.err;
    }
    const std::string raw = dir_.File("cut.raw");
    argv = {"qemu-img", "convert", "-O", "raw"};
    for (const std::string& a : Secret()) argv.push_back(a);
    argv.push_back(raw);
    CommandResult conv = testing::Run(argv);
    ASSERT_EQ(conv.exit_code, 0) << conv.err;
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, testing::ReadFileBytes(raw));
    ASSERT_EQ(got.size(), kDisk);
    int bad = 0;
    for (uint64_t s = 0; s < kDisk / 512 && bad < 3; ++s) {
      auto sector = [&](const std::vector<uint8_t>& v) {
        return std::vector<uint8_t>(v.begin() + s * 512, v.begin() + (s + 1) * 512);
      };
      const std::vector<uint8_t> mine = sector(got);
      bool ok = false;
      for (size_t j = flushed; !ok && j < states_.size(); ++j) {
        ok = mine == sector(states_[j]);
      }
      if (!ok) {
        ++bad;
        ADD_FAILURE() << "sector " << s << " reads as no state at or after step "
                      << flushed;
      }
    }
  }

  testing::TempDir dir_;
  FaultFileSystem fs_;
  std::vector<uint8_t> initial_;
  std::vector<Step> steps_;
  std::vector<std::vector<uint8_t>> states_;  // after the first k steps
};

TEST_F(CrashLuksTest, PowerCutAtEveryStep) {
  size_t flushed = 0;
  const uint64_t total = Run(0, &flushed);
  ASSERT_GT(total, 5u);
  ASSERT_NO_FATAL_FAILURE(Judge(steps_.size(), "no cut", /*want_clean=*/true));
  std::mt19937 rng(11);
  const int variants = LongTests() ? 3 : 1;
  int cut_points = 0;
  for (uint64_t cut = 1; cut <= total; ++cut) {
    for (int variant = 0; variant < variants; ++variant) {
      Run(cut, &flushed);
      auto disk = fs_.Disk("/d/img.qcow2");
      if (variant < 2) {
        disk->PowerCut(variant ? &rng : nullptr);
      } else if (disk->PowerCutKeepingNewest() < 2) {
        continue;
      }
      ASSERT_NO_FATAL_FAILURE(Judge(
          flushed, absl::StrCat("cut at op ", cut, " of ", total, ", variant ", variant),
          /*want_clean=*/false));
      ++cut_points;
    }
  }
  printf("[power-cut] luks: %llu file operations, %d cut points\n",
         static_cast<unsigned long long>(total), cut_points);
}

}  // namespace
}  // namespace qcow2
