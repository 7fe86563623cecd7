// SPDX-License-Identifier: Apache-2.0
// Power-cut sweep over the chain operations of lib/ops: commit (into the
// backing file, emptying the top; and with a base two layers down), safe
// rebase (onto a layer of the chain and onto an image outside it),
// flatten (rebase onto nothing) and stream. Every file of the chain lives
// on a simulated disk (testing/fault_file.h); the operations are counted
// across all of them, and for every operation N the machine dies at N:
// every file's volatile writes are dropped (all, a random half, all but
// the newest), and then every qcow2 file must pass `qemu-img check` (leaks
// allowed) and the top must read the same guest-visible disk as before,
// through libqcow2 and through qemu-img: the old chain and the new one
// read the same, so whichever the cut left must show it.
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "qcow2/maintenance.h"
#include "qcow2/image.h"
#include "testing/fault_file.h"
#include "tests/util/power_cut_sweep.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::FaultDisk;
using internal::FaultFileSystem;

enum class Op { kCommit, kCommitBase, kRebaseBase, kRebaseOther, kFlatten,
                kStream };

const char* OpName(Op op) {
  switch (op) {
    case Op::kCommit: return "commit";
    case Op::kCommitBase: return "commit_b_base";
    case Op::kRebaseBase: return "rebase_base";
    case Op::kRebaseOther: return "rebase_other";
    case Op::kFlatten: return "flatten";
    case Op::kStream: return "stream_base";
  }
  return "?";
}

struct Config {
  std::string chain;  // "qcow2" or "raw" bottom: see SetUp
  Op op;
};

std::string Name(const Config& c) {
  return absl::StrCat(c.chain, "_", OpName(c.op));
}
void PrintTo(const Config& c, std::ostream* os) { *os << Name(c); }

constexpr uint64_t kSize = 4 << 20;
constexpr char kDir[] = "/d/";
// Bottom first; "base" is raw in the "raw" chain.
const char* const kFiles[] = {"base", "mid", "top", "other"};

class CrashLifecycleTest : public ::testing::TestWithParam<Config> {
 protected:
  bool RawBase() const { return GetParam().chain == "raw"; }
  std::string File(const std::string& name) const {
    return absl::StrCat(kDir, name, name == "base" && RawBase() ? ".raw"
                                                                : ".qcow2");
  }

  void Create(const std::string& name, uint32_t cluster, bool xl2,
              const std::string& backing, uint64_t size = kSize) {
    CreateOptions co;
    co.size = size;
    co.opener = &fs_;
    if (name == "base" && RawBase()) {
      co.format = ImageFormat::kRaw;
    } else {
      co.cluster_size = cluster;
      co.extended_l2 = xl2;
    }
    if (!backing.empty()) {
      co.backing_file = File(backing).substr(sizeof kDir - 1);
      co.backing_format = backing == "base" && RawBase() ? "raw" : "qcow2";
    }
    ASSERT_OK(CreateImage(File(name), co));
  }

  // Data, zero writes and discards at odd offsets, seeded per image.
  void Scribble(const std::string& name, uint32_t seed) {
    OpenOptions oo;
    oo.read_write = true;
    oo.opener = &fs_;
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(File(name), oo));
    std::mt19937 rng(seed);
    const bool raw = name == "base" && RawBase();
    for (int i = 0; i < 12; ++i) {
      const uint64_t len = 512 + rng() % (300 << 10);
      const uint64_t off = rng() % (img->size() - len);
      const int kind = raw ? 0 : static_cast<int>(rng() % 5);
      if (kind == 3) {
        ASSERT_OK(img->WriteZeroes(off, len));
      } else if (kind == 4) {
        ASSERT_OK(img->Discard(off, len));
      } else {
        std::vector<uint8_t> buf(len, static_cast<uint8_t>(seed * 16 + i));
        ASSERT_OK(img->Write(off, buf));
      }
    }
    ASSERT_OK(img->Close());
  }

  void SetUp() override {
    // Mixed clusters and extended L2; the raw base is smaller than the
    // disk.
    ASSERT_NO_FATAL_FAILURE(Create("base", 65536, false, "",
                                   RawBase() ? (3 << 20) : kSize));
    ASSERT_NO_FATAL_FAILURE(Scribble("base", 1));
    ASSERT_NO_FATAL_FAILURE(Create("mid", 65536, true, "base"));
    ASSERT_NO_FATAL_FAILURE(Scribble("mid", 2));
    ASSERT_NO_FATAL_FAILURE(Create("top", 4096, false, "mid"));
    ASSERT_NO_FATAL_FAILURE(Scribble("top", 3));
    ASSERT_NO_FATAL_FAILURE(Create("other", 32768, true, ""));
    ASSERT_NO_FATAL_FAILURE(Scribble("other", 4));
    // Created first: a registered disk exists already.
    for (const char* f : kFiles) disks_.push_back(fs_.Disk(File(f)));
    for (auto& d : disks_) initial_.push_back(d->durable);
    ASSERT_OK_AND_ASSIGN(model_, ReadTop());
    // The chain as qemu-img reads it is the model too.
    if (testing::HaveQemu()) {
      ASSERT_OK(Export());
      ASSERT_OK_AND_ASSIGN(auto q, testing::QemuReadAll(RealFile("top")));
      ASSERT_TRUE(q == model_) << "qemu-img reads the setup differently";
    }
  }

  std::string RealFile(const std::string& name) const {
    return dir_.File(File(name).substr(sizeof kDir - 1));
  }

  // Copies every simulated disk into a real file in dir_.
  absl::Status Export() {
    for (size_t i = 0; i < disks_.size(); ++i) {
      absl::Status s =
          testing::WriteFileBytes(RealFile(kFiles[i]), disks_[i]->current);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<uint8_t>> ReadTop() {
    OpenOptions ro;
    ro.opener = &fs_;
    auto img = Image::Open(File("top"), ro);
    if (!img.ok()) return img.status();
    std::vector<uint8_t> got((*img)->size());
    absl::Status s = (*img)->Read(0, absl::MakeSpan(got));
    if (!s.ok()) return s;
    return got;
  }

  // Runs the operation on fresh copies of the disks, the machine dying at
  // operation `cut` of all of them together (0: never). Returns the number
  // of operations made and the operation's status.
  std::pair<uint64_t, absl::Status> RunOp(uint64_t cut) {
    uint64_t count = 0;
    for (size_t i = 0; i < disks_.size(); ++i) {
      FaultDisk* d = disks_[i].get();
      d->Reset(initial_[i]);
      std::lock_guard<std::mutex> lock(d->mu);
      // Single-threaded: the queues drive these files synchronously.
      d->on_op = [this, d, cut, &count](uint64_t op, const char*) {
        if (++count != cut) return;
        for (auto& other : disks_) {
          if (other.get() != d) other->die_at = 1;  // next op dies
        }
        d->die_at = op;
      };
    }
    ChainOpOptions opts;
    opts.open.opener = &fs_;
    opts.chunk = 256 << 10;
    opts.depth = 4;
    absl::Status s;
    switch (GetParam().op) {
      case Op::kCommit:
      case Op::kCommitBase: {
        CommitSpec spec;
        spec.image = File("top");
        if (GetParam().op == Op::kCommitBase) {
          spec.base = File("base").substr(sizeof kDir - 1);
        }
        s = Commit(spec, opts).status();
        break;
      }
      case Op::kRebaseBase:
      case Op::kRebaseOther:
      case Op::kFlatten: {
        RebaseSpec spec;
        spec.image = File("top");
        if (GetParam().op != Op::kFlatten) {
          const std::string to =
              GetParam().op == Op::kRebaseBase ? "base" : "other";
          spec.backing = File(to).substr(sizeof kDir - 1);
          spec.backing_format = to == "base" && RawBase() ? "raw" : "qcow2";
        }
        s = Rebase(spec, opts);
        break;
      }
      case Op::kStream: {
        StreamSpec spec;
        spec.image = File("top");
        spec.base = File("base").substr(sizeof kDir - 1);
        s = StreamChain(spec, opts);
        break;
      }
    }
    for (auto& d : disks_) d->on_op = nullptr;
    return {count, s};
  }

  void CheckSurvivor(const std::string& where, bool with_qemu) {
    ASSERT_OK(Export());
    if (with_qemu) {
      for (const char* f : kFiles) {
        if (std::string(f) == "base" && RawBase()) continue;
        testing::CommandResult r = testing::QemuCheck(RealFile(f));
        ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 3)
            << where << ": " << f << ": qemu-img check exit " << r.exit_code
            << "\n" << r.out << r.err;
      }
    }
    testing::ExpectTopReads(where, ReadTop(), RealFile("top"), with_qemu, model_);
  }

  testing::TempDir dir_;
  FaultFileSystem fs_;
  std::vector<std::shared_ptr<FaultDisk>> disks_;  // as kFiles
  std::vector<std::vector<uint8_t>> initial_;
  std::vector<uint8_t> model_;
};

TEST_P(CrashLifecycleTest, PowerCutAtEveryStep) {
  SKIP_WITHOUT_QEMU();
  auto [total, status] = RunOp(0);
  ASSERT_OK(status);
  ASSERT_GT(total, 3u);
  ASSERT_NO_FATAL_FAILURE(CheckSurvivor("no cut", true));
  for (const char* f : kFiles) {
    if (std::string(f) == "base" && RawBase()) continue;
    testing::CommandResult r = testing::QemuCheck(RealFile(f));
    ASSERT_EQ(r.exit_code, 0) << f << ": without a cut no leak either\n"
                              << r.out << r.err;
  }
  const int cuts = testing::SweepPowerCuts(
      Name(GetParam()), total, disks_,
      [this](uint64_t cut) { return RunOp(cut).second; },
      [this](const std::string& where, bool with_qemu) {
        CheckSurvivor(where, with_qemu);
      });
  printf("[power-cut] %s: %d cut points over %llu file operations\n",
         Name(GetParam()).c_str(), cuts,
         static_cast<unsigned long long>(total));
}

std::vector<Config> Configs() {
  std::vector<Config> out;
  for (const char* chain : {"qcow2", "raw"}) {
    for (Op op : {Op::kCommit, Op::kCommitBase, Op::kRebaseBase,
                  Op::kRebaseOther, Op::kFlatten, Op::kStream}) {
      out.push_back({chain, op});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Ops, CrashLifecycleTest, ::testing::ValuesIn(Configs()),
                         [](const auto& info) { return Name(info.param); });

}  // namespace
}  // namespace qcow2
