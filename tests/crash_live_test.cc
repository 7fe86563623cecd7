// SPDX-License-Identifier: Apache-2.0
// Power-cut sweep over live stream, live commit and active commit
// (Image::LiveStream, Image::LiveCommit, Image::LiveActiveCommit): a chain base <- mid <- top on simulated disks
// (testing/fault_file.h), opened read-write, given guest writes and a
// flush, and then, with the job's every file operation (on any of the
// files, the switch's header write included) counted from there, the
// machine dies at operation N for every N: every file's volatile writes
// are dropped (all, a random half, all but the newest). Then every qcow2
// file must pass `qemu-img check` (leaks allowed), and the top, opened
// afresh through whatever chain its header names, must read the disk the
// guest had flushed, through libqcow2 and through qemu-img. A finished
// active commit leaves the base reading it too (it is the top then).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "qcow2/image.h"
#include "qcow2/live.h"
#include "testing/fault_file.h"
#include "testing/model.h"
#include "tests/util/power_cut_sweep.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::FaultDisk;
using internal::FaultFileSystem;

enum class Job { kStreamMid, kStreamAll, kCommitMid, kActiveMid, kActiveBase };

struct Config {
  bool raw_base;
  Job job;
};

std::string Name(const Config& c) {
  const char* job = c.job == Job::kStreamMid    ? "stream_mid"
                    : c.job == Job::kStreamAll  ? "stream_all"
                    : c.job == Job::kCommitMid  ? "commit_mid"
                    : c.job == Job::kActiveMid  ? "active_mid"
                                                : "active_base";
  return absl::StrCat(c.raw_base ? "raw" : "qcow2", "_", job);
}
void PrintTo(const Config& c, std::ostream* os) { *os << Name(c); }

constexpr uint64_t kSize = 2 << 20;
constexpr char kDir[] = "/d/";
const char* const kLayers[] = {"top", "mid", "base"};  // depth order

class CrashLiveTest : public ::testing::TestWithParam<Config> {
 protected:
  std::string Leaf(int depth) const {
    return absl::StrCat(kLayers[depth],
                        depth == 2 && GetParam().raw_base ? ".raw" : ".qcow2");
  }
  std::string Path(int depth) const { return absl::StrCat(kDir, Leaf(depth)); }
  std::string Real(int depth) const { return dir_.File(Leaf(depth)); }
  bool Qcow2(int depth) const { return depth < 2 || !GetParam().raw_base; }

  absl::StatusOr<std::unique_ptr<Image>> Open(int depth, bool rw) {
    OpenOptions oo;
    oo.read_write = rw;
    oo.opener = &fs_;
    return Image::Open(Path(depth), oo);
  }

  // Writes seeded data, zeroes and discards over [0, kSize) of `img`.
  static absl::Status Scribble(Image* img, uint32_t seed, bool data_only,
                               std::vector<uint8_t>* model) {
    std::mt19937 rng(seed);
    for (int i = 0; i < 10; ++i) {
      const uint64_t len = 512 * (1 + rng() % 500);
      const uint64_t off = 512 * (rng() % ((kSize - len) / 512));
      const int kind = data_only ? 0 : static_cast<int>(rng() % 4);
      absl::Status s;
      std::vector<uint8_t> buf(len, 0);
      if (kind == 2) {
        s = img->WriteZeroes(off, len);
      } else if (kind == 3) {
        s = img->Discard(off, len);
      } else {
        testing::FillPseudoRandom(seed * 64 + i, absl::MakeSpan(buf));
        s = img->Write(off, buf);
      }
      if (!s.ok()) return s;
      if (model != nullptr) {
        std::copy(buf.begin(), buf.end(), model->begin() + off);
      }
    }
    return absl::OkStatus();
  }

  // base (64 KiB clusters, or raw), mid (32 KiB, extended L2), top (4 KiB),
  // each scribbled on while it was the top.
  void SetUp() override {
    const uint32_t clusters[] = {4096, 32768, 65536};
    for (int depth = 2; depth >= 0; --depth) {
      CreateOptions co;
      co.size = kSize;
      co.opener = &fs_;
      if (Qcow2(depth)) {
        co.cluster_size = clusters[depth];
        co.extended_l2 = depth == 1;
      } else {
        co.format = ImageFormat::kRaw;
      }
      if (depth < 2) {
        co.backing_file = Leaf(depth + 1);
        co.backing_format = Qcow2(depth + 1) ? "qcow2" : "raw";
      }
      ASSERT_OK(CreateImage(Path(depth), co));
      ASSERT_OK_AND_ASSIGN(auto img, Open(depth, true));
      ASSERT_OK(Scribble(img.get(), 1 + depth, !Qcow2(depth), nullptr));
      ASSERT_OK(img->Close());
    }
    for (int depth = 0; depth < 3; ++depth) {
      disks_.push_back(fs_.Disk(Path(depth)));
      initial_.push_back(disks_.back()->durable);
    }
    ASSERT_OK_AND_ASSIGN(model_, ReadTop());
    // The guest's flushed writes, made before the job on every run.
    ASSERT_OK_AND_ASSIGN(auto img, Open(0, true));
    ASSERT_OK(Scribble(img.get(), 9, true, &model_));
    ASSERT_OK(img->Close());
  }

  absl::StatusOr<std::vector<uint8_t>> ReadTop(int depth = 0) {
    auto img = Open(depth, false);
    if (!img.ok()) return img.status();
    std::vector<uint8_t> got(kSize);
    absl::Status s = (*img)->Read(0, absl::MakeSpan(got));
    if (!s.ok()) return s;
    return got;
  }

  // On fresh disks: opens the top, makes the guest's writes and flushes,
  // then runs the job with the machine dying at its operation `cut` (0:
  // never). Returns the job's operation count and status.
  std::pair<uint64_t, absl::Status> RunJob(uint64_t cut) {
    for (size_t i = 0; i < disks_.size(); ++i) disks_[i]->Reset(initial_[i]);
    auto img = Open(0, true);
    if (!img.ok()) return {0, img.status()};
    absl::Status s = Scribble(img->get(), 9, true, nullptr);
    if (s.ok()) s = (*img)->Flush();
    if (!s.ok()) return {0, s};
    uint64_t count = 0;
    bool counting = true;  // the job's operations only, not the close's
    for (auto& disk : disks_) {
      FaultDisk* d = disk.get();
      std::lock_guard<std::mutex> lock(d->mu);
      d->on_op = [this, d, cut, &count, &counting](uint64_t op, const char*) {
        if (!counting || ++count != cut) return;
        for (auto& other : disks_) {
          if (other.get() != d) other->die_at = 1;  // next op dies
        }
        d->die_at = op;
      };
    }
    LiveJobOptions jo;
    jo.chunk = 128 << 10;
    jo.depth = 1;  // one thread: the same operations in the same order
    switch (GetParam().job) {
      case Job::kStreamMid: s = (*img)->LiveStream(2, jo); break;
      case Job::kStreamAll: s = (*img)->LiveStream(3, jo); break;
      case Job::kCommitMid: s = (*img)->LiveCommit(2, jo); break;
      case Job::kActiveMid: s = (*img)->LiveActiveCommit(1, jo); break;
      case Job::kActiveBase: s = (*img)->LiveActiveCommit(2, jo); break;
    }
    counting = false;
    img->reset();  // closed by a dead machine: its errors are lost
    for (auto& d : disks_) {
      std::lock_guard<std::mutex> lock(d->mu);
      d->on_op = nullptr;
    }
    return {count, s};
  }

  void CheckSurvivor(const std::string& where, bool with_qemu) {
    for (int depth = 0; depth < 3; ++depth) {
      ASSERT_OK(testing::WriteFileBytes(Real(depth), disks_[depth]->current));
    }
    for (int depth = 0; with_qemu && depth < 3; ++depth) {
      if (!Qcow2(depth)) continue;
      testing::CommandResult r = testing::QemuCheck(Real(depth));
      ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 3)
          << where << ": " << Leaf(depth) << ": qemu-img check exit "
          << r.exit_code << "\n" << r.out << r.err;
    }
    testing::ExpectTopReads(where, ReadTop(), Real(0), with_qemu, model_);
  }

  // The disk the guest flushed, before the job.
  std::vector<uint8_t> model_;
  testing::TempDir dir_;  // the disks exported for qemu-img
  FaultFileSystem fs_;
  // By depth: the simulated disks, and what each held before the job.
  std::vector<std::shared_ptr<FaultDisk>> disks_;
  std::vector<std::vector<uint8_t>> initial_;
};

TEST_P(CrashLiveTest, PowerCutAtEveryStep) {
  SKIP_WITHOUT_QEMU();
  // Active commit: by default, the top and mid into a qcow2 base, cut at
  // the first and last operations and a few between; with
  // QCOW2_LONG_TESTS, at every operation, and also into mid and into a
  // raw base (about 15 s each).
  const Config& c = GetParam();
  const bool long_run = getenv("QCOW2_LONG_TESTS") != nullptr;
  const bool active = c.job == Job::kActiveMid || c.job == Job::kActiveBase;
  if (!long_run && active && (c.job == Job::kActiveMid || c.raw_base)) {
    GTEST_SKIP() << "set QCOW2_LONG_TESTS=1 to run " << Name(c);
  }
  testing::SweepOptions sweep;
  if (!long_run && active) {
    sweep.dense_ends = 3;
    sweep.points = 4;
  }
  auto [total, status] = RunJob(0);
  ASSERT_OK(status);
  ASSERT_GT(total, 3u);
  ASSERT_NO_FATAL_FAILURE(CheckSurvivor("no cut", true));
  const Job job = c.job;
  if (active) {
    // Finished: the base (the top now) reads the disk, and the old top
    // still reads it through the chain it names.
    const int base = job == Job::kActiveMid ? 1 : 2;
    testing::ExpectTopReads("no cut, the base", ReadTop(base), Real(base),
                            true, model_);
  } else {
    // Finished: the top names the shorter chain.
    ASSERT_OK_AND_ASSIGN(auto done, Open(0, false));
    const size_t want = job == Job::kStreamAll ? 1 : 2;
    EXPECT_EQ(done->GetChainInfo().size(), want);
  }
  const int cuts = testing::SweepPowerCuts(
      Name(GetParam()), total, disks_,
      [this](uint64_t cut) { return RunJob(cut).second; },
      [this](const std::string& where, bool with_qemu) {
        CheckSurvivor(where, with_qemu);
      },
      sweep);
  printf("[power-cut] %s: %d cut points over %llu file operations\n",
         Name(GetParam()).c_str(), cuts,
         static_cast<unsigned long long>(total));
}

INSTANTIATE_TEST_SUITE_P(
    Live, CrashLiveTest,
    ::testing::Values(Config{false, Job::kStreamMid},
                      Config{false, Job::kStreamAll},
                      Config{false, Job::kCommitMid},
                      Config{true, Job::kStreamMid},
                      Config{true, Job::kStreamAll},
                      Config{true, Job::kCommitMid},
                      Config{false, Job::kActiveMid},
                      Config{false, Job::kActiveBase},
                      Config{true, Job::kActiveBase}),
    [](const auto& info) { return Name(info.param); });

}  // namespace
}  // namespace qcow2
