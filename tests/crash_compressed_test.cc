// SPDX-License-Identifier: Apache-2.0
// Power cuts during compressed writes (Image::WriteCompressed). The image
// (made by qemu-img, with a plain and a compressed cluster of its own)
// lives on a FaultDisk; a fixed sequence of compressed writes and flushes
// (new clusters packed together, an incompressible one, overwrites of
// qemu's compressed and plain clusters and of our own) runs once to count
// its file operations, then again with the machine dying at each operation
// in turn, the unflushed writes dropped (all, a random half, or all but the
// newest). After each cut QEMU judges the durable image:
//  - `qemu-img check` finds nothing worse than leaks (exit 0 or 3);
//  - each cluster reads as it did at the last flush that completed, or as
//    a later write made it (a cluster is never torn, never lost once
//    flushed), and the rest of the disk as before.
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "testing/fault_file.h"
#include "tests/util/power_cut_sweep.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::FaultFileSystem;
using testing::CommandResult;
using testing::Qcow2Spec;

constexpr uint64_t kDiskBytes = 2 << 20;

// One step: a compressed write of cluster `cluster` (of bytes made from
// `seed`; incompressible when `random`), or a flush (cluster < 0).
struct Step {
  int64_t cluster;
  uint64_t seed = 0;
  bool random = false;
};

class CrashCompressedTest
    : public ::testing::TestWithParam<testing::QemuImageSpec> {
 protected:
  void SetUp() override {
    if (!testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
    testing::QemuImageSpec spec = GetParam();
    spec.size = kDiskBytes;
    cs_ = spec.cluster_size;
    const std::string path = dir_.File("img.qcow2");
    ASSERT_OK(testing::QemuCreate(path, spec));
    // qemu's own plain cluster 0.. and compressed cluster at 1 MiB.
    ASSERT_OK(testing::QemuIo(
        path, {absl::StrCat("write -P 0x11 0 ", cs_),
               absl::StrCat("write -c -P 0x12 1m ", cs_)}));
    ASSERT_OK_AND_ASSIGN(initial_, testing::ReadFileBytes(path));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> disk,
                         testing::QemuReadAll(path));
    const int64_t mib = static_cast<int64_t>((1 << 20) / cs_);
    steps_ = {{3, 1},   {4, 2},      {5, 3, true}, {-1},     {mib, 4},
              {0, 5},   {3, 6},      {-1},         {6, 7},   {7, 8},
              {4, 9, true}};
    states_.push_back(disk);
    for (const Step& st : steps_) {
      if (st.cluster >= 0) {
        std::vector<uint8_t> data = Data(st);
        std::copy(data.begin(), data.end(), disk.begin() + st.cluster * cs_);
      }
      states_.push_back(disk);
    }
  }

  std::vector<uint8_t> Data(const Step& st) const {
    if (!st.random) return testing::CompressibleBytes(st.seed, cs_);
    std::mt19937_64 rng(st.seed);
    std::vector<uint8_t> v(cs_);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
  }

  // Resets the disk, opens the image and runs the steps, the machine dying
  // at the `die_after`-th file operation (0: never). Returns how many
  // operations they made; *flushed is the number of steps up to and
  // including the last flush that succeeded (0: none).
  uint64_t Run(uint64_t die_after, size_t* flushed) {
    auto disk = fs_.Disk("/d/img.qcow2");
    disk->Reset(initial_);
    OpenOptions oo;
    oo.read_write = true;
    oo.opener = &fs_;
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
      if (st.cluster < 0) {
        s = (*img)->Flush();
        if (s.ok()) *flushed = i + 1;
      } else {
        const std::vector<uint8_t> data = Data(st);
        s = (*img)->WriteCompressed(st.cluster * cs_, data);
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

  // QEMU's judgement of the durable image after a cut.
  void Judge(size_t flushed, const std::string& where) {
    SCOPED_TRACE(where);
    auto disk = fs_.Disk("/d/img.qcow2");
    const std::string path = dir_.File("cut.qcow2");
    ASSERT_OK(testing::WriteFileBytes(path, disk->durable));
    CommandResult check = testing::Run({"qemu-img", "check", path});
    ASSERT_TRUE(check.exit_code == 0 || check.exit_code == 3)
        << "qemu-img check exit " << check.exit_code << "\n"
        << check.out << check.err;
    if (check.exit_code == 3) ++leaky_;
    ASSERT_OK_AND_ASSIGN(auto got, testing::QemuReadAll(path));
    ASSERT_EQ(got.size(), kDiskBytes);
    for (uint64_t c = 0; c < kDiskBytes / cs_; ++c) {
      auto cluster = [&](const std::vector<uint8_t>& v) {
        return std::vector<uint8_t>(v.begin() + c * cs_,
                                    v.begin() + (c + 1) * cs_);
      };
      const std::vector<uint8_t> mine = cluster(got);
      bool ok = mine == cluster(states_[flushed]);
      for (size_t j = flushed + 1; !ok && j < states_.size(); ++j) {
        ok = mine == cluster(states_[j]);
      }
      EXPECT_TRUE(ok) << "cluster " << c << " reads as no state at or after "
                      << "step " << flushed;
    }
  }

  testing::TempDir dir_;
  FaultFileSystem fs_;
  uint64_t cs_ = 0;
  std::vector<uint8_t> initial_;
  std::vector<Step> steps_;
  // states_[k]: the guest disk after the first k steps.
  std::vector<std::vector<uint8_t>> states_;
  int leaky_ = 0;
};

TEST_P(CrashCompressedTest, PowerCutAtEveryStep) {
  size_t flushed = 0;
  const uint64_t total = Run(0, &flushed);
  ASSERT_GT(total, 5u);
  {
    auto disk = fs_.Disk("/d/img.qcow2");
    const std::string path = dir_.File("after.qcow2");
    ASSERT_OK(testing::WriteFileBytes(path, disk->durable));
    CommandResult check = testing::QemuCheck(path);
    ASSERT_EQ(check.exit_code, 0) << check.out << check.err;
    ASSERT_OK_AND_ASSIGN(auto got, testing::QemuReadAll(path));
    ASSERT_TRUE(got == states_.back()) << "the finished image reads wrong";
  }
  std::mt19937 rng(7);
  int cut_points = 0;
  for (uint64_t cut = 1; cut <= total; ++cut) {
    static const char* const kVariants[] = {"all dropped", "random half kept",
                                            "only the newest write kept"};
    const int variants = testing::CutAllVariants(cut, total) ? 3 : 1;
    for (int variant = 0; variant < variants; ++variant) {
      Run(cut, &flushed);
      auto disk = fs_.Disk("/d/img.qcow2");
      if (variant < 2) {
        disk->PowerCut(variant ? &rng : nullptr);
      } else if (disk->PowerCutKeepingNewest() < 2) {
        continue;  // the same as dropping all
      }
      ASSERT_NO_FATAL_FAILURE(
          Judge(flushed, absl::StrCat("cut at op ", cut, " of ", total, ", ",
                                      kVariants[variant])));
      ++cut_points;
    }
  }
  printf("[power-cut] %s: %llu file operations, %d cut points, %d leaky\n",
         GetParam().Token().c_str(), static_cast<unsigned long long>(total),
         cut_points, leaky_);
}

testing::QemuImageSpec Zstd(testing::QemuImageSpec s) {
  s.compression_type = "zstd";
  return s;
}

INSTANTIATE_TEST_SUITE_P(Configs, CrashCompressedTest,
                         ::testing::Values(Qcow2Spec("1.1", 65536),
                                           Qcow2Spec("0.10", 4096),
                                           Zstd(Qcow2Spec("1.1", 32768, true)),
                                           Zstd(Qcow2Spec("1.1", 512))),
                         [](const auto& info) { return info.param.Token(); });

}  // namespace
}  // namespace qcow2
