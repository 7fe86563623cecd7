// SPDX-License-Identifier: Apache-2.0
// Power cuts during internal snapshot operations. The image (two snapshots
// made by qemu-img, different data in each and in the active disk) lives
// on a FaultDisk; create, apply and delete each run once to count their
// file operations, then again with the machine dying at each operation in
// turn, the unflushed writes dropped (all, a random half, or all but the
// newest). After each cut QEMU judges the durable image:
//  - `qemu-img check` finds no corruption: leaks are allowed, and so are
//    COPIED flags missing on clusters whose refcount is 1 (a cluster owned
//    alone that says it is shared: the window between a refcount drop and
//    the flag fix, which QEMU's own order has too; writes then copy a
//    cluster they could have written in place). A COPIED flag on a shared
//    cluster, or a refcount below the references, fails the test;
//  - the active disk reads as before the operation or as after it;
//  - every snapshot the table still lists reads its own data.
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "testing/fault_file.h"
#include "tests/util/json_lite.h"
#include "tests/util/power_cut_sweep.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::FaultDisk;
using internal::FaultFileSystem;
using testing::CommandResult;

using testing::Qcow2Spec;

// kDeleteOld drops s1, whose clusters s2 still shares; kDeleteNew drops
// s2, whose clusters the active disk then owns alone (COPIED flags set).
enum class Action { kCreate, kApply, kDeleteOld, kDeleteNew };

// Whether every corruption qemu-img check reports is a COPIED flag missing
// on a cluster with refcount 1 (see the file comment).
bool OnlyMissingCopiedFlags(const std::string& err, std::string* bad) {
  for (absl::string_view line : absl::StrSplit(err, '\n')) {
    if (!absl::StrContains(line, "ERROR")) continue;
    const size_t entry = line.find("_entry=");
    const size_t rc = line.find("refcount=");
    uint64_t value = 0, refcount = 0;
    if (absl::StrContains(line, "OFLAG_COPIED") && entry != line.npos &&
        rc != line.npos &&
        absl::SimpleHexAtoi(
            line.substr(entry + 7, line.find(' ', entry) - entry - 7),
            &value) &&
        absl::SimpleAtoi(line.substr(rc + 9), &refcount) &&
        (value >> 63) == 0 && refcount == 1) {
      continue;
    }
    *bad = std::string(line);
    return false;
  }
  return true;
}

class CrashSnapshotTest
    : public ::testing::TestWithParam<testing::QemuImageSpec> {
 protected:
  void SetUp() override {
    if (!testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
    testing::QemuImageSpec spec = GetParam();
    const std::string path = dir_.File("img.qcow2");
    spec.size = 2 << 20;
    ASSERT_OK(testing::QemuCreate(path, spec));
    ASSERT_OK(testing::QemuIo(
        path, {"write -P 0x11 0 300k", "write -c -P 0x12 1m 64k"}));
    ASSERT_EQ(
        testing::Run({"qemu-img", "snapshot", "-c", "s1", path}).exit_code, 0);
    ASSERT_OK(testing::QemuIo(
        path, {"write -P 0x21 64k 100k", "write -P 0x22 1536k 80k"}));
    ASSERT_EQ(
        testing::Run({"qemu-img", "snapshot", "-c", "s2", path}).exit_code, 0);
    ASSERT_OK(
        testing::QemuIo(path, {"write -P 0x31 0 20k", "write -P 0x32 1m 4k"}));
    ASSERT_OK_AND_ASSIGN(initial_, testing::ReadFileBytes(path));
    ASSERT_OK_AND_ASSIGN(active_before_, testing::QemuReadAll(path));
    for (const char* id : {"1", "2"}) {
      ASSERT_OK_AND_ASSIGN(snapshot_data_[id],
                           testing::QemuReadSnapshot(path, id));
    }
  }


  absl::Status RunAction(Image* img, Action a) {
    switch (a) {
      case Action::kCreate:
        return img->CreateSnapshot("new").status();
      case Action::kApply:
        return img->ApplySnapshot("s1");
      case Action::kDeleteOld:
        return img->DeleteSnapshot("s1");
      case Action::kDeleteNew:
        return img->DeleteSnapshot("s2");
    }
    return absl::OkStatus();
  }

  // Resets the disk, opens the image and runs `a`, the machine dying at
  // the action's `die_after`-th file operation (0: never). Returns how many
  // operations the action made.
  uint64_t Run(Action a, uint64_t die_after) {
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
    absl::Status s = RunAction(img->get(), a);
    uint64_t end = 0;
    {
      std::lock_guard<std::mutex> lock(disk->mu);
      end = disk->ops;
    }
    // A death may pass unnoticed (the last operation can be an advisory
    // discard of freed clusters): only the disk tells.
    if (die_after == 0) {
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_TRUE((*img)->Close().ok());
    }
    img->reset();
    return end - start;
  }

  // QEMU's judgement of the durable image after a cut.
  void Judge(Action a, const std::string& where) {
    SCOPED_TRACE(where);
    auto disk = fs_.Disk("/d/img.qcow2");
    const std::string path = dir_.File("cut.qcow2");
    ASSERT_OK(testing::WriteFileBytes(path, disk->durable));
    CommandResult check = testing::Run({"qemu-img", "check", path});
    if (check.exit_code != 0 && check.exit_code != 3) {
      std::string bad;
      ASSERT_TRUE(check.exit_code == 2 &&
                  OnlyMissingCopiedFlags(check.out + check.err, &bad))
          << "qemu-img check exit " << check.exit_code << ": " << bad << "\n"
          << check.out << check.err;
      ++copied_windows_;
    }
    ASSERT_OK_AND_ASSIGN(auto active, testing::QemuReadAll(path));
    EXPECT_TRUE(active == active_before_ || active == active_after_[a])
        << "the active disk reads neither as before nor as after";
    CommandResult info =
        testing::Run({"qemu-img", "info", "-U", "--output=json", path});
    ASSERT_EQ(info.exit_code, 0) << info.err;
    ASSERT_OK_AND_ASSIGN(auto v, testing::json::Parse(info.out));
    const auto& list = v["snapshots"];
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string id = list[i]["id"].as_string();
      ASSERT_OK_AND_ASSIGN(auto data, testing::QemuReadSnapshot(path, id));
      // The new snapshot (id 3) holds the active disk as it was.
      const std::vector<uint8_t>& want =
          id == "3" ? active_before_ : snapshot_data_[id];
      EXPECT_TRUE(data == want) << "snapshot id " << id << " lost its data";
    }
  }

  testing::TempDir dir_;
  FaultFileSystem fs_;
  std::vector<uint8_t> initial_;
  std::vector<uint8_t> active_before_;
  std::map<Action, std::vector<uint8_t>> active_after_;
  std::map<std::string, std::vector<uint8_t>> snapshot_data_;
  int copied_windows_ = 0;  // cuts that left COPIED flags to fix
};

TEST_P(CrashSnapshotTest, PowerCutAtEveryStep) {
  std::mt19937 rng(99);
  int cut_points = 0;
  for (Action a : {Action::kCreate, Action::kApply, Action::kDeleteOld,
                   Action::kDeleteNew}) {
    const char* name = a == Action::kCreate      ? "create"
                       : a == Action::kApply     ? "apply"
                       : a == Action::kDeleteOld ? "delete s1"
                                                 : "delete s2";
    const uint64_t total = Run(a, 0);
    ASSERT_GT(total, 3u) << name;
    {
      auto disk = fs_.Disk("/d/img.qcow2");
      const std::string path = dir_.File("after.qcow2");
      ASSERT_OK(testing::WriteFileBytes(path, disk->durable));
      CommandResult check = testing::QemuCheck(path);
      ASSERT_EQ(check.exit_code, 0) << name << check.out << check.err;
      ASSERT_OK_AND_ASSIGN(active_after_[a], testing::QemuReadAll(path));
    }
    for (uint64_t cut = 1; cut <= total; ++cut) {
      static const char* const kVariants[] = {"all dropped", "random half kept",
                                              "only the newest write kept"};
      const int variants = testing::CutAllVariants(cut, total) ? 3 : 1;
      for (int variant = 0; variant < variants; ++variant) {
        Run(a, cut);
        auto disk = fs_.Disk("/d/img.qcow2");
        if (variant < 2) {
          disk->PowerCut(variant ? &rng : nullptr);
        } else if (disk->PowerCutKeepingNewest() < 2) {
          continue;  // the same as dropping all
        }
        ASSERT_NO_FATAL_FAILURE(
            Judge(a, absl::StrCat(name, " cut at op ", cut, " of ", total, ", ",
                                  kVariants[variant])));
        ++cut_points;
      }
    }
    printf(
        "[power-cut] %s %s: %llu file operations, %d cut points, %d "
        "with COPIED flags still to fix\n",
        GetParam().Token().c_str(), name,
        static_cast<unsigned long long>(total), cut_points, copied_windows_);
    cut_points = 0;
    copied_windows_ = 0;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, CrashSnapshotTest,
                         ::testing::Values(Qcow2Spec("1.1", 65536),
                                           Qcow2Spec("0.10", 4096),
                                           Qcow2Spec("1.1", 32768, true)),
                         [](const auto& info) { return info.param.Token(); });

}  // namespace
}  // namespace qcow2
