// SPDX-License-Identifier: Apache-2.0
// Power cuts during writes to a qcow2 image with an external data file
// (raw and not raw, and LUKS-encrypted with one that is not raw): allocating writes (guest cluster 0 too, whose data
// sits at data file offset 0), copy-on-write inside new clusters, rewrites
// in place, write-zeroes, discard (and a write after it into a punched
// cluster) and flushes, run once to count the file
// operations of both files together, then again with the machine dying at
// each operation in turn and the unflushed writes of both files dropped.
// After each cut QEMU judges the durable pair:
//  - `qemu-img check` finds nothing worse than leaks (exit 0 or 3);
//  - each 512-byte sector reads (through qemu-img convert) as it did at
//    the last flush that completed or as a later step made it: a flushed
//    write is never lost, and an L2 entry never names data that did not
//    reach the data file.
// Default: every cut point, all unflushed writes dropped, and at every
// other point (SweepPowerCuts' rule) a random half kept and only the
// newest kept; QCOW2_LONG_TESTS=1 tries all three everywhere.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "qcow2/amend.h"
#include "qcow2/image.h"
#include "testing/fault_file.h"
#include "tests/util/power_cut_sweep.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::FaultDisk;
using internal::FaultFileSystem;
using testing::CommandResult;

constexpr uint64_t kDisk = 1 << 20;
constexpr uint64_t kCs = 65536;

// A write of `len` bytes from `seed` at `off`, write-zeroes (seed 0), a
// discard, or a flush (len 0).
struct Step {
  uint64_t off = 0;
  uint64_t len = 0;
  uint8_t seed = 0;
  bool discard = false;
};

std::vector<uint8_t> Bytes(const Step& st) {
  std::vector<uint8_t> v(st.len);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<uint8_t>(st.seed * 37 + i * 13 + (i >> 9));
  }
  return v;
}

bool LongTests() {
  const char* v = getenv("QCOW2_LONG_TESTS");
  return v != nullptr && std::string(v) == "1";
}

// The variants: a raw data file or not, and LUKS-encrypted (not raw: a
// raw one's unwritten clusters decrypt its zeros into noise).
enum Variant { kNotRaw, kRaw, kLuksNotRaw };
constexpr char kPass[] = "crash-data-pass";

class CrashDataFileTest : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    if (!testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
    // A raw data file is mapped whole from the start: its writes are in
    // place, the not-raw case's allocating ones cover more. Long runs only.
    if (GetParam() == kRaw && !LongTests()) {
      GTEST_SKIP() << "QCOW2_LONG_TESTS=1";
    }
    if (luks()) {
      // Ours, PBKDF2 kept cheap; the data file named by its full path.
      CreateOptions co;
      co.size = kDisk;
      co.data_file = dir_.File("img.data");
      co.encrypt.format = "luks";
      co.encrypt.key_secret = kPass;
      co.encrypt.iterations = 1000;
      ASSERT_OK(CreateImage(dir_.File("img.qcow2"), co));
    } else {
      // qemu-img makes the pair (a raw one mapped whole from the start).
      std::string o = "data_file=img.data";
      if (GetParam() == kRaw) o += ",data_file_raw=on";
      CommandResult r = InDir({"qemu-img", "create", "-q", "-f", "qcow2",
                               "-o", o, "img.qcow2", absl::StrCat(kDisk)});
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    for (const char* f : {"img.qcow2", "img.data"}) {
      ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes,
                           testing::ReadFileBytes(dir_.File(f)));
      initial_.push_back(std::move(bytes));
      disks_.push_back(fs_.Disk(absl::StrCat("/d/", f)));
    }
    steps_ = {{0, 4096, 1},               // guest cluster 0, allocating
              {3 * kCs + 4096, 8192, 2},  // copy-on-write of zeros
              {},                         // flush
              {kCs - 1024, 4096, 3},      // the end of one, a new one
              {512, 4096, 4},             // in place
              {},
              {3 * kCs, kCs, 0},          // write-zeroes over data
              {5 * kCs + 1024, 2048, 5},
              {},
              // Flushed clusters discarded (a not-raw data file's are
              // punched out), then one of them written again at the same
              // data file offset.
              {0, 2 * kCs, 0, true},
              {kCs + 512, 4096, 7},
              {},
              {8 * kCs, 2 * kCs, 6}};     // whole clusters, unflushed
    std::vector<uint8_t> disk(kDisk, 0);
    states_.push_back(disk);
    for (const Step& st : steps_) {
      if (st.len != 0) {
        std::vector<uint8_t> d =
            st.seed ? Bytes(st) : std::vector<uint8_t>(st.len, 0);
        std::copy(d.begin(), d.end(), disk.begin() + st.off);
      }
      states_.push_back(disk);
    }
  }

  // The steps on fresh disks, the machine dying at file operation `cut`
  // of both files together (0: never). Returns the operations made.
  uint64_t Run(uint64_t cut, size_t* flushed) {
    uint64_t count = 0;
    for (size_t i = 0; i < disks_.size(); ++i) {
      FaultDisk* d = disks_[i].get();
      d->Reset(initial_[i]);
      std::lock_guard<std::mutex> lock(d->mu);
      d->on_op = [this, d, cut, &count](uint64_t op, const char*) {
        if (++count != cut) return;
        for (auto& other : disks_) {
          if (other.get() != d) other->die_at = 1;  // next op dies
        }
        d->die_at = op;
      };
    }
    *flushed = 0;
    {
      OpenOptions oo;
      oo.read_write = true;
      oo.opener = &fs_;
      // The stored name is relative (QEMU opens it from its working
      // directory): named here on the simulated disks.
      oo.data_file = "/d/img.data";
      if (luks()) oo.key_secret = kPass;
      auto img = Image::Open("/d/img.qcow2", oo);
      EXPECT_TRUE(img.ok()) << img.status();
      bool all_ok = img.ok();
      for (size_t i = 0; img.ok() && i < steps_.size(); ++i) {
        const Step& st = steps_[i];
        absl::Status s;
        if (st.len == 0) {
          s = (*img)->Flush();
          if (s.ok()) *flushed = i + 1;
        } else if (st.discard) {
          s = (*img)->Discard(st.off, st.len);
        } else if (st.seed == 0) {
          s = (*img)->WriteZeroes(st.off, st.len);
        } else {
          s = (*img)->Write(st.off, Bytes(st));
        }
        all_ok = all_ok && s.ok();
      }
      if (cut == 0 && img.ok()) {
        EXPECT_TRUE(all_ok);
        EXPECT_OK((*img)->Close());
        *flushed = steps_.size();
      }
    }
    for (auto& d : disks_) d->on_op = nullptr;
    return count;
  }

  void Judge(size_t flushed, const std::string& where, bool want_clean) {
    SCOPED_TRACE(where);
    ASSERT_OK(testing::WriteFileBytes(dir_.File("img.qcow2"),
                                      disks_[0]->durable));
    ASSERT_OK(testing::WriteFileBytes(dir_.File("img.data"),
                                      disks_[1]->durable));
    CommandResult check = InDir(Qemu({"qemu-img", "check"}, {}));
    if (want_clean) {
      ASSERT_EQ(check.exit_code, 0) << check.out << check.err;
    } else {
      ASSERT_TRUE(check.exit_code == 0 || check.exit_code == 3)
          << "qemu-img check exit " << check.exit_code << "\n"
          << check.out << check.err;
    }
    const std::string raw = dir_.File("cut.raw");
    CommandResult conv =
        InDir(Qemu({"qemu-img", "convert", "-O", "raw"}, {raw}));
    ASSERT_EQ(conv.exit_code, 0) << conv.err;
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got,
                         testing::ReadFileBytes(raw));
    ASSERT_EQ(got.size(), kDisk);
    int bad = 0;
    for (uint64_t s = 0; s < kDisk / 512 && bad < 3; ++s) {
      auto sector = [&](const std::vector<uint8_t>& v) {
        return std::vector<uint8_t>(v.begin() + s * 512,
                                    v.begin() + (s + 1) * 512);
      };
      const std::vector<uint8_t> mine = sector(got);
      bool ok = false;
      for (size_t j = flushed; !ok && j < states_.size(); ++j) {
        ok = mine == sector(states_[j]);
      }
      if (!ok) {
        ++bad;
        ADD_FAILURE() << "sector " << s
                      << " reads as no state at or after step " << flushed;
      }
    }
  }

  bool luks() const { return GetParam() == kLuksNotRaw; }

  // `head`, the image (with its secret when encrypted), then `tail`.
  std::vector<std::string> Qemu(std::vector<std::string> head,
                                const std::vector<std::string>& tail) const {
    if (luks()) {
      for (const char* a :
           {"--object", "secret,id=s0,data=crash-data-pass", "--image-opts",
            "driver=qcow2,file.filename=img.qcow2,encrypt.key-secret=s0"}) {
        head.push_back(a);
      }
    } else {
      head.push_back("img.qcow2");
    }
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  }

  // Runs `argv` from the test's directory, where the image's relative
  // data file name resolves (for QEMU, from its working directory).
  CommandResult InDir(const std::vector<std::string>& argv) const {
    std::string cmd = absl::StrCat("cd '", dir_.File(""), "' &&");
    for (const std::string& a : argv) absl::StrAppend(&cmd, " '", a, "'");
    return testing::RunShell(cmd);
  }

  testing::TempDir dir_;
  FaultFileSystem fs_;
  std::vector<std::shared_ptr<FaultDisk>> disks_;  // image, data file
  std::vector<std::vector<uint8_t>> initial_;
  std::vector<Step> steps_;
  std::vector<std::vector<uint8_t>> states_;  // after the first k steps
};

TEST_P(CrashDataFileTest, PowerCutAtEveryStep) {
  size_t flushed = 0;
  const uint64_t total = Run(0, &flushed);
  ASSERT_GT(total, 5u);
  ASSERT_NO_FATAL_FAILURE(Judge(steps_.size(), "no cut", /*want_clean=*/true));
  int cut_points = 0;
  const bool long_tests = LongTests();
  for (uint64_t cut = 1; cut <= total; ++cut) {
    // Default: every cut within 8 operations of either end, every third
    // one between, all unflushed writes dropped (qemu-img judges each
    // cut: about 80 ms). QCOW2_LONG_TESTS: every cut, every variant.
    const bool near_end = cut <= 8 || cut + 8 > total;
    if (!long_tests && !near_end && cut % 3 != 0) continue;
    const int variants = long_tests ? 3 : 1;
    std::mt19937 rng(static_cast<uint32_t>(cut));
    for (int variant = 0; variant < variants; ++variant) {
      Run(cut, &flushed);
      for (auto& d : disks_) {
        if (variant < 2) {
          d->PowerCut(variant ? &rng : nullptr);
        } else {
          d->PowerCutKeepingNewest();
        }
      }
      ASSERT_NO_FATAL_FAILURE(Judge(
          flushed,
          absl::StrCat("cut at op ", cut, " of ", total, ", variant ",
                       variant),
          /*want_clean=*/false));
      ++cut_points;
    }
  }
  printf("[power-cut] data file (%s): %llu file operations, %d cuts\n",
         GetParam() == kRaw ? "raw" : luks() ? "luks, not raw" : "not raw",
         static_cast<unsigned long long>(total), cut_points);
}

INSTANTIATE_TEST_SUITE_P(Raw, CrashDataFileTest,
                         ::testing::Values(kNotRaw, kRaw, kLuksNotRaw),
                         [](const auto& info) {
                           return std::string(info.param == kRaw ? "Raw"
                                              : info.param == kNotRaw
                                                  ? "NotRaw"
                                                  : "LuksNotRaw");
                         });

// Power cuts during `amend -o lazy_refcounts=on,data_file=moved.data`
// (two header writes: the fields, then cluster 0 with the new name): after
// each cut qemu-img finds the image clean, naming the old data file or
// the new one (both hold the data), and reading its data.
TEST(CrashDataFileAmendTest, OldOrNewHeader) {
  if (!testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
  testing::TempDir dir;
  auto in_dir = [&](const std::string& cmd) {
    return testing::RunShell(absl::StrCat("cd '", dir.File(""), "' && ", cmd));
  };
  CommandResult r = in_dir(
      "qemu-img create -q -f qcow2 -o data_file=img.data img.qcow2 1M && "
      "qemu-io -f qcow2 -c 'write -P 0x5a 0 64k' img.qcow2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> image,
                       testing::ReadFileBytes(dir.File("img.qcow2")));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> data,
                       testing::ReadFileBytes(dir.File("img.data")));
  FaultFileSystem fs;
  std::shared_ptr<FaultDisk> disk = fs.Disk("/d/img.qcow2");
  // The stored name is relative, opened as given (QEMU's working
  // directory): named so on the simulated disks.
  fs.Disk("img.data")->Reset(data);
  AmendOptions opts;
  opts.lazy_refcounts = true;
  opts.data_file = "moved.data";
  opts.opener = &fs;
  auto run = [&](uint64_t die_after) {
    disk->Reset(image, die_after);
    absl::Status s = AmendImage("/d/img.qcow2", opts);
    if (die_after == 0) EXPECT_OK(s);
    std::lock_guard<std::mutex> lock(disk->mu);
    return disk->ops;
  };
  const uint64_t total = run(0);
  ASSERT_GE(total, 2u);
  std::set<std::string> seen;
  // Every header write is flushed before the next one: at most one write
  // is ever pending, so dropping it at each cut (and keeping it, which is
  // the next cut's state) covers every outcome.
  for (uint64_t cut = 1; cut <= total + 1; ++cut) {
    {
      SCOPED_TRACE(absl::StrCat("cut at op ", cut, " of ", total));
      run(cut > total ? 0 : cut);
      disk->PowerCut();
      ASSERT_OK(testing::WriteFileBytes(dir.File("cut.qcow2"), disk->durable));
      ASSERT_OK(testing::WriteFileBytes(dir.File("moved.data"), data));
      CommandResult check = in_dir("qemu-img check cut.qcow2");
      EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
      CommandResult info = in_dir(
          "qemu-img info --output=json cut.qcow2 | grep -E "
          "'\"(data-file|lazy-refcounts)\"' | tr -d ' \n'");
      EXPECT_THAT(info.out,
                  ::testing::AnyOf("\"lazy-refcounts\":false,\"data-file\":"
                                   "\"img.data\",",
                                   "\"lazy-refcounts\":true,\"data-file\":"
                                   "\"img.data\",",
                                   "\"lazy-refcounts\":true,\"data-file\":"
                                   "\"moved.data\","));
      seen.insert(info.out);
      CommandResult io = in_dir(
          "qemu-io -f qcow2 -c 'read -P 0x5a 0 64k' cut.qcow2");
      EXPECT_EQ(io.exit_code, 0) << io.out << io.err;
      EXPECT_EQ(io.out.find("verification failed"), std::string::npos);
    }
  }
  EXPECT_EQ(seen.size(), 3u);  // every state met once or more
}

}  // namespace
}  // namespace qcow2
