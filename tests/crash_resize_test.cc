// SPDX-License-Identifier: Apache-2.0
// Power-cut sweep over resizes that change more than the header: a
// preallocated grow (Image::Resize with a Preallocation mode, `qcowtool
// resize --preallocation`) and a shrink (`resize --shrink`). The image
// lives on a simulated disk (testing/fault_file.h); for every file
// operation N of the resize the machine dies at N, the volatile writes are
// dropped (all, a random half, all but the newest), and then `qemu-img
// check` must find no corruption (leaks allowed), the size must be the old
// or the new one, the bytes both sizes share must read as before, and the
// rest as zeros (a grown range) or as before or zeros (a range a cut
// shrink was dropping), through libqcow2 and through qemu-img.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "qcow2/image.h"
#include "testing/fault_file.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::FaultFileSystem;

struct Config {
  std::string name;
  uint32_t cluster_size;
  bool extended_l2;
  Preallocation prealloc;
  uint64_t old_size;
  uint64_t new_size;
};

void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

constexpr char kPath[] = "/d/img.qcow2";

class CrashResizeTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    const Config& c = GetParam();
    CreateOptions co;
    co.size = c.old_size;
    co.cluster_size = c.cluster_size;
    co.extended_l2 = c.extended_l2;
    co.opener = &fs_;
    ASSERT_OK(CreateImage(kPath, co));
    OpenOptions oo;
    oo.read_write = true;
    oo.opener = &fs_;
    model_.assign(c.old_size, 0);
    {
      ASSERT_OK_AND_ASSIGN(auto img, Image::Open(kPath, oo));
      // Data at the start, a hole, data up to the old end (its partial
      // last cluster included), a freed cluster for the grow to reuse.
      Fill(*img, 0, c.old_size / 3, 0x11);
      Fill(*img, c.old_size - 3000, 3000, 0x22);
      Fill(*img, c.old_size / 2, c.cluster_size, 0x33);
      ASSERT_OK(img->Discard(c.old_size / 2, c.cluster_size));
      std::fill(model_.begin() + c.old_size / 2,
                model_.begin() + c.old_size / 2 + c.cluster_size, 0);
      ASSERT_OK(img->Close());
    }
    initial_ = fs_.Disk(kPath)->durable;
  }

  void Fill(Image& img, uint64_t offset, uint64_t len, uint8_t byte) {
    std::vector<uint8_t> buf(len, byte);
    ASSERT_OK(img.Write(offset, buf));
    std::fill(model_.begin() + offset, model_.begin() + offset + len, byte);
  }

  // Resizes a fresh copy of the image, the disk dying at op `die_at`
  // (0: never). Returns the resize's status.
  absl::Status RunResize(uint64_t die_at) {
    auto disk = fs_.Disk(kPath);
    disk->Reset(initial_, die_at);
    OpenOptions oo;
    oo.read_write = true;
    oo.opener = &fs_;
    auto img = Image::Open(kPath, oo);
    if (!img.ok()) return img.status();
    absl::Status s = GetParam().prealloc == Preallocation::kOff
                         ? (*img)->Resize(GetParam().new_size)
                         : (*img)->Resize(GetParam().new_size,
                                          GetParam().prealloc);
    absl::Status closed = (*img)->Close();
    return s.ok() ? closed : s;
  }

  // The survivor: old or new size, old bytes kept, zeros past them.
  void CheckSurvivor(const std::string& where, bool with_qemu) {
    auto disk = fs_.Disk(kPath);
    const std::string path = dir_.File("img.qcow2");
    ASSERT_OK(testing::WriteFileBytes(path, disk->current));
    if (with_qemu) {
      testing::CommandResult r = testing::QemuCheck(path);
      ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 3)
          << where << ": qemu-img check exit " << r.exit_code << "\n"
          << r.out << r.err;
    }
    OpenOptions ro;
    ro.opener = &fs_;
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(kPath, ro));
    const uint64_t size = img->size();
    ASSERT_TRUE(size == GetParam().old_size || size == GetParam().new_size)
        << where << ": size " << size;
    std::vector<uint8_t> got(size);
    ASSERT_OK(img->Read(0, absl::MakeSpan(got)));
    std::vector<uint8_t> want = model_;
    want.resize(size, 0);
    // A shrink cut before its header write: the dropped range reads as
    // before or as zeros.
    const uint64_t kept = std::min(GetParam().old_size, GetParam().new_size);
    for (uint64_t i = kept; i < size; ++i) {
      if (got[i] == 0) want[i] = 0;
    }
    ASSERT_TRUE(got == want) << where << ": contents differ from the model";
    if (with_qemu) {
      ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> q, testing::QemuReadAll(path));
      ASSERT_TRUE(q == want) << where << ": qemu-img reads other contents";
    }
  }

  testing::TempDir dir_;
  FaultFileSystem fs_;
  std::vector<uint8_t> model_;
  std::vector<uint8_t> initial_;
};

TEST_P(CrashResizeTest, PowerCutAtEveryStep) {
  SKIP_WITHOUT_QEMU();
  auto disk = fs_.Disk(kPath);
  ASSERT_OK(RunResize(0));
  const uint64_t total = disk->ops;
  ASSERT_GT(total, 3u);
  ASSERT_NO_FATAL_FAILURE(CheckSurvivor("no cut", true));
  {
    // Without a cut the grown range is preallocated: qemu-img check is
    // clean (no leaks) and the map shows it allocated.
    const std::string path = dir_.File("img.qcow2");
    testing::CommandResult r = testing::QemuCheck(path);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  std::mt19937 rng(99);
  const uint64_t stride = total > 300 ? total / 150 : 1;
  int cuts = 0;
  for (uint64_t cut = 1; cut <= total; ++cut) {
    if (cut % stride != 0 && cut > 20 && cut + 20 < total) continue;
    static const char* const kVariants[] = {
        "all dropped", "random half kept", "only the newest write kept"};
    for (int variant = 0; variant < 3; ++variant) {
      const std::string where = absl::StrCat(
          GetParam().name, " cut at op ", cut, " of ", total, ", ",
          kVariants[variant]);
      absl::Status s = RunResize(cut);
      EXPECT_FALSE(s.ok()) << where << ": the resize did not notice";
      if (variant < 2) {
        disk->PowerCut(variant ? &rng : nullptr);
      } else if (disk->PowerCutKeepingNewest() < 2) {
        continue;
      }
      ++cuts;
      ASSERT_NO_FATAL_FAILURE(
          CheckSurvivor(where, variant == 0 || cut % 4 == 0));
    }
  }
  printf("[power-cut] %s: %d cut points over %llu file operations\n",
         GetParam().name.c_str(), cuts,
         static_cast<unsigned long long>(total));
}

INSTANTIATE_TEST_SUITE_P(
    Configs, CrashResizeTest,
    ::testing::Values(
        // The L1 table grows too (512-byte clusters cover little).
        Config{"c512_metadata", 512, false, Preallocation::kMetadata,
               1000448, 3ull << 20},
        Config{"c4k_full", 4096, false, Preallocation::kFull, 1000448,
               5ull << 20},
        Config{"c64k_falloc", 65536, false, Preallocation::kFalloc,
               1000448, 8ull << 20},
        Config{"c64k_extl2_metadata", 65536, true, Preallocation::kMetadata,
               1ull << 20, 4ull << 20},
        // Shrinks (Image::Resize to a smaller size).
        Config{"c64k_shrink", 65536, false, Preallocation::kOff, 8ull << 20,
               1000448},
        Config{"c512_shrink", 512, false, Preallocation::kOff, 3ull << 20,
               1ull << 20},
        Config{"c64k_extl2_shrink", 65536, true, Preallocation::kOff,
               8ull << 20, 3ull << 20}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace qcow2
