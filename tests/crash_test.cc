// SPDX-License-Identifier: Apache-2.0
// Power-cut sweep and error injection for the write path.
//
// A scripted workload runs over an overlay on a backing file, both on
// simulated disks (testing/fault_file.h). For every file operation N the
// workload is replayed with the machine dying at N; then the volatile writes
// are dropped (all of them, a random half, or all but the newest: a
// reordering disk cache) and
// the image is checked: `qemu-img check` finds no corruption (leaks are
// allowed), every byte reads as it was at the last completed flush or as a
// write issued after it, and the image can be written again.
#include <errno.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "testing/fault_file.h"
#include "lib/base/events.h"
#include "qcow2/image.h"
#include "tests/util/power_cut_sweep.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::FaultDisk;
using internal::FaultFileSystem;

struct Config {
  std::string name;
  uint32_t cluster_size;
  uint32_t refcount_bits;
  bool extended_l2;
  std::string compat;
  uint64_t size;
  // Bytes written into the overlay before the sweep starts: brings the
  // file close to what its refcount table covers, so the workload makes
  // the table grow (or, with `snapshot`, what the snapshot shares).
  uint64_t bulk = 0;
  bool lazy = false;  // lazy refcounts: reopening rebuilds them
  // An internal snapshot (qemu-img snapshot -c) taken after the bulk
  // writes: the workload's first write copies the shared L2 table.
  bool snapshot = false;
};

// One guest operation of the workload.
struct Op {
  enum Kind { kWrite, kZero, kDiscard, kFlush, kResize } kind;
  uint64_t offset = 0;
  uint64_t len = 0;
  uint8_t byte = 0;  // pattern for writes
};

// Whether small writes into fresh clusters may defer their L2 entry (and
// with standard L2 their copy-on-write).
bool DefersCow(const Config& c) { return c.cluster_size >= 16384; }

std::vector<Op> Workload(const Config& c) {
  const uint64_t cs = c.cluster_size;
  std::vector<Op> ops = {
      {Op::kWrite, cs + 100, 4096, 0xa1},               // COW over backing
      {Op::kWrite, 3 * cs - 7, 2 * cs + 11, 0xa2},      // spans clusters
      {Op::kFlush},
  };
  if (DefersCow(c)) {
    // A stream of 16 KiB writes (deferred copy-on-write), alone between
    // two flushes: it starts in place at the end of cluster 5 (ours since
    // the write above), fills cluster 6 by the writes alone and cluster 7
    // half; the flush copies the rest of cluster 7 from the backing file.
    // (With extended L2 nothing is copied: each write that enters a
    // cluster defers only its L2 entry, until it completes.)
    for (uint64_t off = 6 * cs - 16384; off < 7 * cs + cs / 2;
         off += 16384) {
      ops.push_back({Op::kWrite, off, 16384,
                     static_cast<uint8_t>(0xe0 + off / 16384 % 16)});
    }
    ops.push_back({Op::kFlush});
  }
  std::vector<Op> rest = {
      {Op::kZero, 8 * cs, 2 * cs, 0},                   // zero flag
      {Op::kZero, 12 * cs + 5, 300, 0},                 // partial zero
      {Op::kDiscard, 3 * cs, cs, 0},                    // frees a cluster
      {Op::kWrite, c.size - 5000, 5000, 0xa3},          // far: new L2 table
      {Op::kFlush},
      {Op::kWrite, cs + 200, 50, 0xa4},                 // in place
  };
  ops.insert(ops.end(), rest.begin(), rest.end());
  // Many scattered small writes: refcount blocks fill up, and with small
  // clusters the refcount table has to grow.
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    uint64_t off = (rng() % (c.size / cs - 2)) * cs + rng() % cs;
    ops.push_back({Op::kWrite, off, 1 + rng() % 700,
                   static_cast<uint8_t>(0xb0 + i)});
    if (i % 13 == 12) ops.push_back({Op::kFlush});
  }
  ops.push_back({Op::kZero, 20 * cs, 3 * cs + 1, 0});
  ops.push_back({Op::kFlush});
  ops.push_back({Op::kResize, 0, 2 * c.size, 0});  // may grow the L1 table
  ops.push_back({Op::kWrite, c.size + 1000, 3000, 0xd1});
  ops.push_back({Op::kFlush});
  ops.push_back({Op::kWrite, 2 * cs, 3000, 0xc1});  // left unflushed
  return ops;
}

absl::Status Apply(Image& img, const Op& op) {
  switch (op.kind) {
    case Op::kWrite: {
      std::vector<uint8_t> buf(op.len, op.byte);
      return img.Write(op.offset, buf);
    }
    case Op::kZero:
      return img.WriteZeroes(op.offset, op.len, false);
    case Op::kDiscard:
      return img.Discard(op.offset, op.len);
    case Op::kFlush:
      return img.Flush();
    case Op::kResize:
      return img.Resize(op.len);
  }
  return absl::OkStatus();
}

void ApplyToModel(std::vector<uint8_t>& m, const Op& op) {
  if (op.kind == Op::kFlush || op.kind == Op::kResize) return;
  std::fill(m.begin() + op.offset, m.begin() + op.offset + op.len,
            op.kind == Op::kWrite ? op.byte : 0);
}

void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

class CrashTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    const Config& c = GetParam();
    // Backing file: fully written by us, durable.
    CreateOptions bo;
    bo.size = c.size;
    bo.opener = &fs_;
    ASSERT_OK(CreateImage("/d/base.qcow2", bo));
    OpenOptions oo;
    oo.read_write = true;
    oo.opener = &fs_;
    {
      ASSERT_OK_AND_ASSIGN(auto base, Image::Open("/d/base.qcow2", oo));
      base_model_.assign(2 * c.size, 0);  // room for the resize
      for (uint64_t off = 0; off < c.size; off += 65536) {
        uint64_t n = std::min<uint64_t>(65536, c.size - off);
        std::vector<uint8_t> buf(n, static_cast<uint8_t>(off / 65536 + 1));
        ASSERT_OK(base->Write(off, buf));
        std::fill(base_model_.begin() + off, base_model_.begin() + off + n,
                  buf[0]);
      }
      ASSERT_OK(base->Close());
    }
    CreateOptions co;
    co.cluster_size = c.cluster_size;
    co.refcount_bits = c.refcount_bits;
    co.extended_l2 = c.extended_l2;
    co.compat = c.compat;
    co.lazy_refcounts = c.lazy;
    co.backing_file = "base.qcow2";
    co.backing_format = "qcow2";
    co.opener = &fs_;
    ASSERT_OK(CreateImage("/d/top.qcow2", co));
    if (c.bulk) {
      ASSERT_OK_AND_ASSIGN(auto top, Image::Open("/d/top.qcow2", oo));
      std::vector<uint8_t> buf(c.bulk, 0x99);
      ASSERT_OK(top->Write(0, buf));
      ASSERT_OK(top->Close());
      std::fill(base_model_.begin(), base_model_.begin() + c.bulk, 0x99);
    }
    initial_top_ = fs_.Disk("/d/top.qcow2")->durable;
    ASSERT_OK(testing::WriteFileBytes(
        dir_.File("base.qcow2"), fs_.Disk("/d/base.qcow2")->durable));
    if (c.snapshot && testing::HaveQemu()) {
      const std::string path = dir_.File("top.qcow2");
      ASSERT_OK(testing::WriteFileBytes(path, initial_top_));
      testing::CommandResult r =
          testing::Run({"qemu-img", "snapshot", "-c", "s1", path});
      ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
      ASSERT_OK_AND_ASSIGN(initial_top_, testing::ReadFileBytes(path));
    }
  }

  // Runs the workload on a fresh copy of the overlay. Returns the model at
  // the last completed flush and the ops issued after it.
  struct Outcome {
    std::vector<uint8_t> flushed;
    std::vector<Op> after_flush;
    std::vector<absl::Status> errors;
    // Bytes a failed operation may or may not have changed, and to what.
    std::vector<bool> uncertain;
    std::vector<uint8_t> maybe;
  };
  Outcome RunWorkload(const std::vector<Op>& ops, uint64_t die_at,
                      uint64_t fail_once_at, int err) {
    auto disk = fs_.Disk("/d/top.qcow2");
    disk->Reset(initial_top_, die_at);
    {
      std::lock_guard<std::mutex> lock(disk->mu);
      disk->fail_once_at = fail_once_at;
      disk->fail_once_errno = err;
    }
    Outcome out;
    std::vector<uint8_t> model = base_model_;
    out.flushed = model;
    out.uncertain.assign(model.size(), false);
    out.maybe.assign(model.size(), 0);
    OpenOptions oo;
    oo.read_write = true;
    oo.opener = &fs_;
    auto img = Image::Open("/d/top.qcow2", oo);
    if (!img.ok()) {
      out.errors.push_back(img.status());
      return out;
    }
    for (const Op& op : ops) {
      absl::Status s = Apply(**img, op);
      if (op.kind != Op::kFlush && op.kind != Op::kResize) {
        if (s.ok() || die_at != 0) {
          // After a power cut, the failed op counts as issued: its bytes
          // may or may not have landed, like any unflushed write.
          ApplyToModel(model, op);
          std::fill(out.uncertain.begin() + op.offset,
                    out.uncertain.begin() + op.offset + op.len, false);
        } else {
          // Error injection: a failed write may have partly landed.
          for (uint64_t i = op.offset; i < op.offset + op.len; ++i) {
            out.uncertain[i] = true;
            out.maybe[i] = op.kind == Op::kWrite ? op.byte : 0;
          }
        }
      }
      if (op.kind == Op::kFlush && s.ok()) {
        out.flushed = model;
        out.after_flush.clear();
      } else if (op.kind != Op::kFlush && op.kind != Op::kResize) {
        out.after_flush.push_back(op);
      }
      if (!s.ok()) out.errors.push_back(s);
      if (die_at != 0 && disk->dead) break;  // the machine is gone
    }
    if (die_at == 0) {
      // Error injection: the image must still flush and close.
      absl::Status s = (*img)->Flush();
      if (!s.ok()) s = (*img)->Flush();
      if (s.ok()) {
        out.flushed = model;
        out.after_flush.clear();
      }
      s = (*img)->Close();
      if (!s.ok()) out.errors.push_back(s);
    }
    img->reset();
    return out;
  }

  // Every byte reads as at the last flush or as a later write covering it.
  void CheckContents(const Outcome& o, const std::string& where) {
    auto disk = fs_.Disk("/d/top.qcow2");
    OpenOptions ro;
    ro.opener = &fs_;
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open("/d/top.qcow2", ro));
    std::vector<uint8_t> got(img->size());
    ASSERT_OK(img->Read(0, absl::MakeSpan(got)));
    for (uint64_t i = 0; i < got.size(); ++i) {
      if (got[i] == o.flushed[i]) continue;
      if (o.uncertain[i] && got[i] == o.maybe[i]) continue;
      bool ok = false;
      for (const Op& op : o.after_flush) {
        if (i >= op.offset && i < op.offset + op.len &&
            got[i] == (op.kind == Op::kWrite ? op.byte : 0)) {
          ok = true;
          break;
        }
      }
      ASSERT_TRUE(ok) << where << ": byte " << i << " reads 0x" << std::hex
                      << int{got[i]} << ", flushed value 0x"
                      << int{o.flushed[i]};
    }
  }

  // qemu-img check on the durable image: no corruption (exit 0 or 3).
  void QemuCheckNoCorruption(const std::string& where, bool expect_clean) {
    auto disk = fs_.Disk("/d/top.qcow2");
    std::string path = dir_.File("top.qcow2");
    ASSERT_OK(testing::WriteFileBytes(path, disk->current));
    testing::CommandResult r = testing::QemuCheck(path);
    if (expect_clean) {
      ASSERT_EQ(r.exit_code, 0) << where << "\n" << r.out << r.err;
    } else {
      ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 3)
          << where << ": qemu-img check exit " << r.exit_code << "\n"
          << r.out << r.err;
    }
  }

  testing::TempDir dir_;
  FaultFileSystem fs_;
  std::vector<uint8_t> base_model_;
  std::vector<uint8_t> initial_top_;
};

TEST_P(CrashTest, PowerCutAtEveryStep) {
  SKIP_WITHOUT_QEMU();
  const std::vector<Op> ops = Workload(GetParam());
  auto disk = fs_.Disk("/d/top.qcow2");

  // Dry run: count the file operations and name the step each belongs to.
  std::map<uint64_t, std::string> step_event;
  // An operation is named after the most structural event since the
  // previous operation (so the table write of "l2-alloc" is not called
  // "l2-update" after the cache that performs it); operations with no event
  // in between continue the previous step.
  // A new L2 table or refcount block does no I/O of its own when it is
  // allocated: the next flush writes it (l2-update, refblock-update) and
  // then what points at it (l1-update, reftable-update). Those two events
  // rank last, so the write that follows keeps its own name.
  static const char* const kRank[] = {
      "refcount-table-grow", "l1-grow",          "header-update",
      "l1-update",           "reftable-update",  "cow-write",
      "zero-skip-write",     "data-write",       "deferred-write",
      "deferred-fill",       "l2-update",        "refblock-update",
      "flush",               "cow-read",         "refblock-alloc",
      "l2-alloc"};
  auto rank = [](const std::string& e) {
    for (size_t i = 0; i < std::size(kRank); ++i) {
      if (e == kRank[i]) return i;
    }
    return std::size(kRank);
  };
  std::string last_event = "open";
  std::vector<std::string> since;
  internal::EventHook hook = [&](std::string_view e) {
    since.emplace_back(e);
  };
  internal::SetEventHook(&hook);
  disk->on_op = [&](uint64_t op, const char*) {
    if (!since.empty()) {
      last_event = *std::min_element(
          since.begin(), since.end(),
          [&](const std::string& a, const std::string& b) {
            return rank(a) < rank(b);
          });
      since.clear();
    }
    step_event[op] = last_event;
  };
  Outcome full = RunWorkload(ops, 0, 0, 0);
  internal::SetEventHook(nullptr);
  disk->on_op = nullptr;
  ASSERT_TRUE(full.errors.empty()) << full.errors[0];
  const uint64_t total = step_event.size();
  ASSERT_GT(total, 20u);

  const bool long_run = getenv("QCOW2_LONG_TESTS") != nullptr;
  std::map<std::string, int> cuts_per_event;
  std::mt19937 rng(1234);
  int cut_points = 0;
  for (uint64_t cut = 1; cut <= total; ++cut) {
    // Long workloads (unless QCOW2_LONG_TESTS): the steps that change the
    // refcount structure or the L1 table, the first operation after every
    // named event, and every 25th operation.
    const std::string& ev = step_event[cut];
    const bool structural =
        ev == "refcount-table-grow" || ev == "reftable-update" ||
        ev == "header-update" || ev == "l1-update" || ev == "l1-grow";
    const bool first_of_event = cut == 1 || step_event[cut - 1] != ev;
    if (total > 1500 && !long_run && !structural && !first_of_event &&
        cut % 25 != 0) {
      continue;
    }
    static const char* const kVariants[] = {
        "all dropped", "random half kept", "only the newest write kept"};
    // The two partial cuts at every structural step and event start, and
    // elsewhere as testing::CutAllVariants says (every other operation
    // away from the ends, unless QCOW2_LONG_TESTS).
    const int variants =
        structural || first_of_event || testing::CutAllVariants(cut, total)
            ? 3
            : 1;
    for (int variant = 0; variant < variants; ++variant) {
      std::string where =
          absl::StrCat(GetParam().name, " cut at op ", cut, " (",
                       step_event[cut], "), ", kVariants[variant]);
      Outcome o = RunWorkload(ops, cut, 0, 0);
      if (variant < 2) {
        disk->PowerCut(variant ? &rng : nullptr);
      } else if (disk->PowerCutKeepingNewest() < 2) {
        continue;  // the same as one of the others
      }
      ++cut_points;
      if (GetParam().lazy) {
        // Refcounts of a dirty lazy-refcount image are only hints: the
        // library rebuilds them when it opens the image for writing.
        OpenOptions oo;
        oo.read_write = true;
        oo.opener = &fs_;
        ASSERT_OK_AND_ASSIGN(auto img, Image::Open("/d/top.qcow2", oo));
        ASSERT_OK(img->Close());
      }
      cuts_per_event[step_event[cut]]++;
      // qemu-img check costs ~60 ms a run: every cut of the first and
      // third variants, every fourth of the second (all of them with
      // QCOW2_LONG_TESTS).
      if (variant != 1 || cut % 4 == 0 || long_run) {
        ASSERT_NO_FATAL_FAILURE(QemuCheckNoCorruption(where, false));
      }
      ASSERT_NO_FATAL_FAILURE(CheckContents(o, where));
      if (cut % 7 == 0) {
        // The survivor is writable again.
        OpenOptions oo;
        oo.read_write = true;
        oo.opener = &fs_;
        ASSERT_OK_AND_ASSIGN(auto img, Image::Open("/d/top.qcow2", oo));
        std::vector<uint8_t> buf(1000, 0xee);
        ASSERT_OK(img->Write(GetParam().cluster_size * 5 + 3, buf));
        ASSERT_OK(img->Close());
        ASSERT_NO_FATAL_FAILURE(QemuCheckNoCorruption(where + ", rewritten", false));
      }
    }
  }
  std::string summary;
  for (const auto& [event, n] : cuts_per_event) {
    absl::StrAppend(&summary, " ", event, "=", n);
  }
  printf("[power-cut] %s: %d cut points over %llu file operations:%s\n",
         GetParam().name.c_str(), cut_points,
         static_cast<unsigned long long>(total), summary.c_str());
  for (const char* e :
       {"l2-update", "l1-update", "flush", "zero-skip-write"}) {
    EXPECT_GT(cuts_per_event[e], 0) << "no cut during " << e;
  }
  if (GetParam().cluster_size < 4096 && GetParam().bulk == 0) {
    // 512-byte clusters: new refcount blocks, linked at a flush (with
    // `bulk`, the table grows instead and brings its own blocks).
    EXPECT_GT(cuts_per_event["reftable-update"], 0);
  }
  if (DefersCow(GetParam())) {
    EXPECT_GT(cuts_per_event["deferred-write"], 0);
    // With extended L2 nothing is left to fill.
    if (!GetParam().extended_l2) {
      EXPECT_GT(cuts_per_event["deferred-fill"], 0);
    }
  }
  if (GetParam().bulk != 0 && !GetParam().snapshot) {
    EXPECT_GT(cuts_per_event["refcount-table-grow"], 0)
        << "the workload no longer grows the refcount table";
  }
}

TEST_P(CrashTest, InjectedErrorsAtEveryStep) {
  SKIP_WITHOUT_QEMU();
  const std::vector<Op> ops = Workload(GetParam());
  auto disk = fs_.Disk("/d/top.qcow2");
  Outcome full = RunWorkload(ops, 0, 0, 0);
  ASSERT_TRUE(full.errors.empty());
  const uint64_t total = disk->ops;
  const uint64_t stride = total > 1500 ? 7 : 1;
  for (uint64_t k = 1; k <= total; k += stride) {
    const int err = k % 2 ? ENOSPC : EIO;
    std::string where = absl::StrCat(GetParam().name, " ",
                                     err == ENOSPC ? "ENOSPC" : "EIO",
                                     " at op ", k);
    Outcome o = RunWorkload(ops, 0, k, err);
    // The first error is the injected one, named as such; later ones may be
    // its consequences (a write past a resize that failed).
    for (const absl::Status& s : absl::MakeConstSpan(o.errors).first(
             std::min<size_t>(1, o.errors.size()))) {
      EXPECT_TRUE(absl::StrContains(s.message(), "injected fault"))
          << where << ": unclear error: " << s;
      if (err == ENOSPC) {
        EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted)
            << where << ": " << s;
      }
    }
    ASSERT_NO_FATAL_FAILURE(QemuCheckNoCorruption(where, false));
    ASSERT_NO_FATAL_FAILURE(CheckContents(o, where));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, CrashTest,
    ::testing::Values(
        Config{"c64k_r16", 65536, 16, false, "1.1", 4ull << 20},
        Config{"c64k_extl2", 65536, 16, true, "1.1", 4ull << 20},
        Config{"c512_r64", 512, 64, false, "1.1", 3ull << 20},
        Config{"c4k_v2", 4096, 16, false, "0.10", 3ull << 20},
        Config{"c512_r64_grow", 512, 64, false, "1.1", 3ull << 20,
               1960ull << 10},
        Config{"c64k_lazy", 65536, 16, false, "1.1", 4ull << 20, 0, true},
        Config{"c64k_snapshot", 65536, 16, false, "1.1", 4ull << 20,
               256ull << 10, false, true}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace qcow2
