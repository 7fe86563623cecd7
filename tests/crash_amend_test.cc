// SPDX-License-Identifier: Apache-2.0
// Power cuts during `amend` (qcow2::AmendImage). The image (made by
// qemu-img: a backing file, data, zero clusters over backing data, a
// compressed cluster, two internal snapshots sharing clusters) lives on a
// FaultDisk; each amend runs once to count its file operations, then
// again with the machine dying at each operation in turn, the unflushed
// writes dropped (all, a random half, or all but the newest). After each
// cut QEMU judges the durable image:
//  - `qemu-img check` finds no corruption (leaks are allowed);
//  - the active disk and every snapshot read as before the amend;
//  - the header is the old one or the new one for the option amended
//    (compat, refcount bits, lazy refcounts), never something else.
#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "qcow2/amend.h"
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

struct AmendCase {
  const char* name;
  std::string create_opts;  // qemu-img create -o for the overlay
  AmendOptions opts;
  // The info field that tells old from new, and its value after.
  const char* field;
  std::string after;
};

void PrintTo(const AmendCase& c, std::ostream* os) { *os << c.name; }

AmendCase Make(const char* name, std::string create_opts, const char* field,
               std::string after, void (*set)(AmendOptions*)) {
  AmendCase c{name, std::move(create_opts), {}, field, std::move(after)};
  set(&c.opts);
  return c;
}

// `got` is `want`, or (after a grow, which qemu-img reads snapshots at
// too) `want` followed by zeros.
bool SameZeroExtended(const std::vector<uint8_t>& got,
                      const std::vector<uint8_t>& want) {
  return got.size() >= want.size() &&
         std::equal(want.begin(), want.end(), got.begin()) &&
         std::all_of(got.begin() + want.size(), got.end(),
                     [](uint8_t x) { return x == 0; });
}

class CrashAmendTest : public ::testing::TestWithParam<AmendCase> {
 protected:
  void SetUp() override {
    if (!testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
    const std::string base = dir_.File("base.qcow2");
    const std::string path = dir_.File("img.qcow2");
    auto run = [](const std::vector<std::string>& argv) {
      CommandResult r = testing::Run(argv);
      ASSERT_EQ(r.exit_code, 0) << testing::FormatCommand(argv) << r.err;
    };
    ASSERT_NO_FATAL_FAILURE(
        run({"qemu-img", "create", "-q", "-f", "qcow2", base, "2M"}));
    ASSERT_NO_FATAL_FAILURE(
        run({"qemu-io", "-f", "qcow2", "-c", "write -P 0x41 0 2M", base}));
    ASSERT_NO_FATAL_FAILURE(run({"qemu-img", "create", "-q", "-f", "qcow2",
                                 "-b", base, "-F", "qcow2", "-o",
                                 GetParam().create_opts, path}));
    ASSERT_NO_FATAL_FAILURE(run({"qemu-io", "-f", "qcow2", "-c",
                                 "write -P 0x11 0 200k", "-c",
                                 "write -z 256k 128k", "-c",
                                 "write -c -P 0x12 1m 64k", path}));
    ASSERT_NO_FATAL_FAILURE(run({"qemu-img", "snapshot", "-c", "s1", path}));
    ASSERT_NO_FATAL_FAILURE(run({"qemu-io", "-f", "qcow2", "-c",
                                 "write -P 0x21 64k 64k", "-c",
                                 "write -z 1536k 64k", path}));
    ASSERT_NO_FATAL_FAILURE(run({"qemu-img", "snapshot", "-c", "s2", path}));
    ASSERT_NO_FATAL_FAILURE(
        run({"qemu-io", "-f", "qcow2", "-c", "write -P 0x31 0 4k", path}));
    ASSERT_OK_AND_ASSIGN(initial_, testing::ReadFileBytes(path));
    ASSERT_OK_AND_ASSIGN(active_, testing::QemuReadAll(path));
    for (const char* id : {"1", "2"}) {
      ASSERT_OK_AND_ASSIGN(snapshots_[id],
                           testing::QemuReadSnapshot(path, id));
    }
    ASSERT_OK_AND_ASSIGN(before_, Field(path));
  }


  // The case's format-specific field of `path`, as text.
  absl::StatusOr<std::string> Field(const std::string& path) {
    CommandResult info =
        testing::Run({"qemu-img", "info", "-U", "--output=json", path});
    if (info.exit_code != 0) return absl::InternalError(info.err);
    auto v = testing::json::Parse(info.out);
    if (!v.ok()) return v.status();
    return (*v)["format-specific"]["data"][GetParam().field].ToString();
  }

  // Resets the disk and amends, the machine dying at the amend's
  // `die_after`-th file operation (0: never). Returns the operations made.
  uint64_t Run(uint64_t die_after) {
    auto disk = fs_.Disk(kPath);
    disk->Reset(initial_, die_after);
    AmendOptions opts = GetParam().opts;
    opts.opener = &fs_;
    absl::Status s = AmendImage(kPath, opts);
    if (die_after == 0) {
      EXPECT_TRUE(s.ok()) << s;
    }
    std::lock_guard<std::mutex> lock(disk->mu);
    return disk->ops;
  }

  void Judge(const std::string& where) {
    SCOPED_TRACE(where);
    auto disk = fs_.Disk(kPath);
    const std::string path = dir_.File("cut.qcow2");
    ASSERT_OK(testing::WriteFileBytes(path, disk->durable));
    CommandResult check = testing::Run({"qemu-img", "check", path});
    ASSERT_TRUE(check.exit_code == 0 || check.exit_code == 3)
        << "qemu-img check exit " << check.exit_code << "\n"
        << check.out << check.err;
    leaks_ += check.exit_code == 3;
    ASSERT_OK_AND_ASSIGN(auto active, testing::QemuReadAll(path));
    EXPECT_TRUE(SameZeroExtended(active, active_))
        << "the active disk reads differently";
    for (const auto& [id, want] : snapshots_) {
      ASSERT_OK_AND_ASSIGN(auto data, testing::QemuReadSnapshot(path, id));
      EXPECT_TRUE(SameZeroExtended(data, want))
          << "snapshot id " << id << " lost its data";
    }
    ASSERT_OK_AND_ASSIGN(const std::string field, Field(path));
    EXPECT_TRUE(field == before_ || field == GetParam().after)
        << GetParam().field << " is " << field;
  }

  static constexpr char kPath[] = "/d/img.qcow2";
  testing::TempDir dir_;
  FaultFileSystem fs_;
  std::vector<uint8_t> initial_;
  std::vector<uint8_t> active_;
  std::map<std::string, std::vector<uint8_t>> snapshots_;
  std::string before_;
  int leaks_ = 0;
};

TEST_P(CrashAmendTest, PowerCutAtEveryStep) {
  std::mt19937 rng(7);
  const uint64_t total = Run(0);
  ASSERT_GT(total, 1u);
  {
    auto disk = fs_.Disk(kPath);
    const std::string path = dir_.File("after.qcow2");
    ASSERT_OK(testing::WriteFileBytes(path, disk->durable));
    CommandResult check = testing::QemuCheck(path);
    ASSERT_EQ(check.exit_code, 0) << check.out << check.err;
    ASSERT_OK_AND_ASSIGN(const std::string field, Field(path));
    ASSERT_EQ(field, GetParam().after);
  }
  int cut_points = 0;
  for (uint64_t cut = 1; cut <= total; ++cut) {
    static const char* const kVariants[] = {"all dropped", "random half kept",
                                            "only the newest write kept"};
    const int variants = testing::CutAllVariants(cut, total) ? 3 : 1;
    for (int variant = 0; variant < variants; ++variant) {
      Run(cut);
      auto disk = fs_.Disk(kPath);
      if (variant < 2) {
        disk->PowerCut(variant ? &rng : nullptr);
      } else if (disk->PowerCutKeepingNewest() < 2) {
        continue;  // the same as dropping all
      }
      ASSERT_NO_FATAL_FAILURE(Judge(absl::StrCat(
          "cut at op ", cut, " of ", total, ", ", kVariants[variant])));
      ++cut_points;
    }
  }
  printf("[power-cut] amend %s: %llu file operations, %d cut points, %d "
         "leaving leaks\n",
         GetParam().name, static_cast<unsigned long long>(total), cut_points,
         leaks_);
}

INSTANTIATE_TEST_SUITE_P(
    Amend, CrashAmendTest,
    ::testing::Values(
        Make("refcount_bits_8_c4k", "cluster_size=4096", "refcount-bits", "8",
             [](AmendOptions* o) { o->refcount_bits = 8; }),
        Make("refcount_bits_64", "cluster_size=65536", "refcount-bits", "64",
             [](AmendOptions* o) { o->refcount_bits = 64; }),
        Make("refcount_bits_8_from_64", "refcount_bits=64,cluster_size=512",
             "refcount-bits", "8",
             [](AmendOptions* o) { o->refcount_bits = 8; }),
        Make("downgrade", "compat=1.1,cluster_size=32768", "compat",
             "\"0.10\"", [](AmendOptions* o) { o->compat = "0.10"; }),
        Make("downgrade_lazy_rb8", "lazy_refcounts=on,refcount_bits=8",
             "compat", "\"0.10\"",
             [](AmendOptions* o) {
               o->compat = "0.10";
               o->refcount_bits = 16;
             }),
        Make("upgrade", "compat=0.10", "compat", "\"1.1\"",
             [](AmendOptions* o) { o->compat = "1.1"; }),
        Make("lazy_on", "compat=1.1", "lazy-refcounts", "true",
             [](AmendOptions* o) { o->lazy_refcounts = true; }),
        Make("upgrade_rb8_lazy", "compat=0.10,cluster_size=16384",
             "refcount-bits", "8",
             [](AmendOptions* o) {
               o->compat = "1.1";
               o->refcount_bits = 8;
               o->lazy_refcounts = true;
             }),
        Make("grow_and_rb64", "compat=1.1", "refcount-bits", "64",
             [](AmendOptions* o) {
               o->size = 3 << 20;
               o->refcount_bits = 64;
             })),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace qcow2
