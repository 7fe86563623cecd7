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
//
// Then power cuts during key-slot amends (AmendImage with encrypt.*):
// adding a slot, erasing slots by secret and by number, overwriting the
// only active slot (--force). After each cut every secret that opened the
// image before and is not being erased still opens it (through libqcow2
// at every cut; through `qemu-img check`, which must find nothing worse
// than leaks, on the cuts that drop all unflushed writes), and the image
// always opens with some secret. The sweep is tests/util/
// power_cut_sweep.h's.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "qcow2/amend.h"
#include "qcow2/image.h"
#include "testing/fault_file.h"
#include "tests/util/power_cut_sweep.h"
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

// An encrypted kDisk image, kPass in key slot 0 (PBKDF2 kept cheap).
absl::Status CreateLuksImage(const std::string& path) {
  CreateOptions co;
  co.size = kDisk;
  co.encrypt.format = "luks";
  co.encrypt.key_secret = kPass;
  co.encrypt.iterations = 1000;
  return CreateImage(path, co);
}

// qemu-img's arguments that open `path` with `pass`.
std::vector<std::string> QemuSecretArgs(const std::string& path,
                                        const std::string& pass) {
  return {"--object", absl::StrCat("secret,id=s0,data=", pass), "--image-opts",
          absl::StrCat("driver=qcow2,file.filename=", path,
                       ",encrypt.key-secret=s0")};
}

// `qemu-img check` of `path` opened with `pass`.
CommandResult QemuCheckWith(const std::string& path, const std::string& pass) {
  std::vector<std::string> argv = {"qemu-img", "check"};
  for (const std::string& a : QemuSecretArgs(path, pass)) argv.push_back(a);
  return testing::Run(argv);
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
    ASSERT_OK(CreateLuksImage(path));
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

  void Judge(size_t flushed, const std::string& where, bool want_clean) {
    SCOPED_TRACE(where);
    auto disk = fs_.Disk("/d/img.qcow2");
    ASSERT_OK(testing::WriteFileBytes(dir_.File("cut.qcow2"), disk->durable));
    CommandResult check = QemuCheckWith(dir_.File("cut.qcow2"), kPass);
    if (want_clean) {
      ASSERT_EQ(check.exit_code, 0) << check.out << check.err;
    } else {
      ASSERT_TRUE(check.exit_code == 0 || check.exit_code == 3)
          << "qemu-img check exit " << check.exit_code << "\n"
          << check.out << check.err;
    }
    const std::string raw = dir_.File("cut.raw");
    std::vector<std::string> argv = {"qemu-img", "convert", "-O", "raw"};
    for (const std::string& a : QemuSecretArgs(dir_.File("cut.qcow2"), kPass)) {
      argv.push_back(a);
    }
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

// A key-slot amend: the slots before (secret per slot, slot 0 first),
// the amendment, the secrets that must open after every cut, and those of
// which at least one must.
struct SlotCase {
  const char* name;
  std::vector<std::pair<size_t, std::string>> slots;  // beyond slot 0
  KeySlotAmendment change;
  bool force = false;
  std::vector<std::string> keep;    // open at every cut
  std::vector<std::string> any_of;  // one of them opens at every cut
  std::vector<std::string> gone;    // open no more once done
};

void PrintTo(const SlotCase& c, std::ostream* os) { *os << c.name; }

class CrashLuksAmendTest : public ::testing::TestWithParam<SlotCase> {
 protected:
  void SetUp() override {
    if (!testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
    const std::string path = dir_.File("img.qcow2");
    ASSERT_OK(CreateLuksImage(path));
    OpenOptions oo;
    oo.read_write = true;
    oo.key_secret = kPass;
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(path, oo));
    ASSERT_OK(img->Write(0, std::vector<uint8_t>(kCs, 0x5a)));
    ASSERT_OK(img->Close());
    for (const auto& [slot, pass] : GetParam().slots) {
      AmendOptions ao;
      ao.key_secret = kPass;
      ao.encrypt = KeySlotAmendment{"active", pass};
      ao.encrypt->keyslot = static_cast<int64_t>(slot);
      ao.encrypt->iterations = 1000;
      ASSERT_OK(AmendImage(path, ao));
    }
    ASSERT_OK_AND_ASSIGN(initial_, testing::ReadFileBytes(path));
  }

  // The amend on a fresh disk, the machine dying at its `die_after`-th file
  // operation (0: never).
  absl::Status Run(uint64_t die_after) {
    fs_.Disk(kPath)->Reset(initial_, die_after);
    AmendOptions ao;
    ao.opener = &fs_;
    ao.key_secret = kPass;
    ao.encrypt = GetParam().change;
    ao.encrypt->iterations = 1000;
    ao.force = GetParam().force;
    return AmendImage(kPath, ao);
  }

  // Whether libqcow2 opens the durable image with `pass` (and reads the
  // data); a failure other than a refused secret fails the test.
  bool Opens(const std::string& pass) {
    OpenOptions oo;
    oo.key_secret = pass;
    auto img = Image::Open(dir_.File("cut.qcow2"), oo);
    if (!img.ok()) {
      EXPECT_EQ(img.status().code(), absl::StatusCode::kPermissionDenied)
          << img.status();
      return false;
    }
    std::vector<uint8_t> buf(kCs);
    EXPECT_OK((*img)->Read(0, absl::MakeSpan(buf)));
    EXPECT_EQ(buf, std::vector<uint8_t>(kCs, 0x5a));
    return true;
  }

  void Judge(const std::string& where, bool with_qemu) {
    SCOPED_TRACE(where);
    with_qemu = with_qemu && (LongTests() || where.find("all dropped") !=
                                                 std::string::npos);
    auto disk = fs_.Disk(kPath);
    ASSERT_OK(testing::WriteFileBytes(dir_.File("cut.qcow2"), disk->durable));
    const SlotCase& c = GetParam();
    std::string opener;
    for (const std::string& pass : c.keep) {
      EXPECT_TRUE(Opens(pass)) << "secret " << pass << " no longer opens";
      opener = pass;
    }
    if (!c.any_of.empty()) {
      for (const std::string& pass : c.any_of) {
        if (Opens(pass)) opener = pass;
      }
      EXPECT_FALSE(opener.empty()) << "no secret opens the image";
    }
    if (with_qemu && !opener.empty()) {
      CommandResult check = QemuCheckWith(dir_.File("cut.qcow2"), opener);
      EXPECT_TRUE(check.exit_code == 0 || check.exit_code == 3)
          << "qemu-img check exit " << check.exit_code << "\n"
          << check.out << check.err;
    }
  }

  static constexpr char kPath[] = "/d/img.qcow2";
  testing::TempDir dir_;
  FaultFileSystem fs_;
  std::vector<uint8_t> initial_;
};

TEST_P(CrashLuksAmendTest, PowerCutAtEveryStep) {
  const SlotCase& c = GetParam();
  ASSERT_OK(Run(0));
  uint64_t total = 0;
  {
    auto disk = fs_.Disk(kPath);
    std::lock_guard<std::mutex> lock(disk->mu);
    total = disk->ops;
  }
  ASSERT_GT(total, 3u);
  {
    auto disk = fs_.Disk(kPath);
    ASSERT_OK(testing::WriteFileBytes(dir_.File("cut.qcow2"), disk->durable));
    for (const std::string& pass : c.gone) {
      EXPECT_FALSE(Opens(pass)) << "secret " << pass << " still opens";
      CommandResult check = QemuCheckWith(dir_.File("cut.qcow2"), pass);
      EXPECT_NE(check.exit_code, 0) << "qemu-img opens with " << pass;
    }
    for (const std::string& pass : c.any_of) {
      if (std::find(c.gone.begin(), c.gone.end(), pass) != c.gone.end()) {
        continue;
      }
      CommandResult check = QemuCheckWith(dir_.File("cut.qcow2"), pass);
      EXPECT_EQ(check.exit_code, 0) << pass << ": " << check.out << check.err;
    }
  }
  // qemu-img on the "all dropped" cuts only (every 4th of the others
  // too with QCOW2_LONG_TESTS=1): it is the slow part.
  const int cut_points = testing::SweepPowerCuts(
      c.name, total, {fs_.Disk(kPath)},
      [this](uint64_t cut) { return Run(cut); },
      [this](const std::string& where, bool with_qemu) {
        Judge(where, with_qemu);
      });
  printf("[power-cut] luks amend %s: %llu file operations, %d cut points\n",
         c.name, static_cast<unsigned long long>(total), cut_points);
}

KeySlotAmendment Change(const char* state,
                        std::optional<std::string> new_secret,
                        std::optional<std::string> old_secret,
                        std::optional<int64_t> slot) {
  KeySlotAmendment k;
  k.state = state;
  k.new_secret = std::move(new_secret);
  k.old_secret = std::move(old_secret);
  k.keyslot = slot;
  return k;
}

// add_slot_6 and erase_slot_0 with QCOW2_LONG_TESTS=1 only (the default
// suite keeps its time).
std::vector<SlotCase> SlotCases() {
  std::vector<SlotCase> all = {
      SlotCase{
          "add", {}, Change("active", "p1", {}, {}), false, {kPass}, {}, {}},
      // Slot 6's fields straddle the header's first sector boundary.
      SlotCase{"add_slot_6",
               {{3, "p3"}},
               Change("active", "p1", {}, 6),
               false,
               {kPass, "p3"},
               {},
               {}},
      SlotCase{"erase_by_secret",
               {{1, "p1"}, {2, "p2"}, {6, "p1"}},
               Change("inactive", {}, "p1", {}),
               false,
               {kPass, "p2"},
               {},
               {"p1"}},
      SlotCase{"erase_slot_0",
               {{1, "p1"}},
               Change("inactive", {}, {}, 0),
               false,
               {"p1"},
               {},
               {kPass}},
      // The only slot overwritten (--force): one of the two always opens.
      SlotCase{"overwrite_only_slot",
               {},
               Change("active", "p1", {}, 0),
               true,
               {},
               {kPass, "p1"},
               {kPass}}};
  if (LongTests()) return all;
  std::vector<SlotCase> some;
  for (SlotCase& c : all) {
    if (std::string(c.name) != "add_slot_6" &&
        std::string(c.name) != "erase_slot_0") {
      some.push_back(std::move(c));
    }
  }
  return some;
}

INSTANTIATE_TEST_SUITE_P(Slots, CrashLuksAmendTest,
                         ::testing::ValuesIn(SlotCases()),
                         [](const auto& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace qcow2
