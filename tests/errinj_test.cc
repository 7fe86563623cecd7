// SPDX-License-Identifier: Apache-2.0
// I/O error injection (EIO and ENOSPC) at every file operation of a
// workload, reads included.
//
// Each configuration runs a scripted workload (allocating writes, new L2
// tables, new refcount blocks and refcount table growth with small clusters,
// copy-on-write over a backing file or out of compressed clusters,
// write-zeroes, discard, reads, flushes, live snapshots with
// Image::CreateOverlay, close) over simulated disks
// (tests/util/harden_faults.h). A dry run counts the file operations; then
// for every operation N (big workloads are sampled without
// QCOW2_LONG_TESTS: see `sampled` in Sweep) the workload runs again with
// operation N failing once, and:
//
//  - the step that hit the fault fails, and its message says "injected
//    fault", names the file and the operation ("write", "flush", "read",
//    ...) and the errno ("No space left on device" / "Input/output error");
//    ENOSPC comes back as kResourceExhausted, EIO never as kDataLoss;
//  - the library keeps working: every later step succeeds, and right after
//    the fault the whole disk reads back as the model says (bytes of the
//    failed step: old or new, never anything else);
//  - after Close(), the durable bytes (what a power cut would leave) read
//    the same through the library; on a sample of runs (all of them with
//    QCOW2_LONG_TESTS), they are written to real files where `qemu-img
//    check` finds no corruption (leaks allowed) and `qemu-img convert -O
//    raw` agrees with the model.
//
// Reads are counted by a decorator (FaultFile itself counts only writes,
// flushes, truncates and discards).
#include <errno.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "lib/base/events.h"
#include "qcow2/image.h"
#include "tests/util/harden_faults.h"
#include "testing/model.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::FaultPlan;
using testing::InjectingFileSystem;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;

bool LongRun() { return getenv("QCOW2_LONG_TESTS") != nullptr; }

struct Config {
  std::string name;
  uint32_t cluster_size = 65536;
  uint32_t refcount_bits = 16;
  bool extended_l2 = false;
  bool lazy = false;
  std::string compat = "1.1";
  uint64_t size = 4 * kMiB;
  bool backing = false;     // a qemu-written backing file under the top
  bool compressed = false;  // the top is `qemu-img convert -c` output
  // Bytes the library writes into the top before the sweep (brings the
  // file close to what its refcount table covers).
  uint64_t prefill = 0;
  uint64_t l2_cache_bytes = 32 * kMiB;
  uint64_t refcount_cache_bytes = 1 * kMiB;
  int scattered = 12;     // small writes at random places
  bool overlays = false;  // live snapshots in the middle of the workload
  // Named steps the dry run must go through (lib/base/events.h).
  std::vector<std::string> events;
  // A known library defect, reported and not fixed yet: when every problem
  // of the write sweep contains `defect_signature`, the sweep is reported
  // as skipped (QCOW2_STRICT_CORPUS=1 makes it fail); once the problems are
  // gone the test fails so that these two fields get deleted.
  std::string known_defect;
  std::string defect_signature;
};

void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

struct Step {
  enum Kind { kWrite, kZero, kDiscard, kRead, kFlush, kOverlay, kClose };
  Kind kind = kWrite;
  uint64_t offset = 0;
  uint64_t len = 0;
  bool unmap = false;
  uint64_t seed = 0;  // kWrite data
  std::string path;   // kOverlay

  std::vector<uint8_t> Data() const {
    std::vector<uint8_t> d(len);
    testing::FillPseudoRandom(seed, absl::MakeSpan(d));
    return d;
  }
  bool IsDataOp() const {
    return kind == kWrite || kind == kZero || kind == kDiscard;
  }
  std::string ToString() const {
    static const char* const kNames[] = {"write", "zero",    "discard", "read",
                                         "flush", "overlay", "close"};
    std::string s = kNames[kind];
    if (IsDataOp() || kind == kRead) {
      absl::StrAppend(&s, " 0x", absl::Hex(offset), "+", len);
    }
    if (kind == kZero && unmap) s += " unmap";
    if (kind == kOverlay) absl::StrAppend(&s, " ", path);
    return s;
  }
};

std::vector<Step> Workload(const Config& c, const std::string& dir) {
  const uint64_t cs = c.cluster_size;
  const uint64_t size = c.size;
  std::vector<Step> w;
  auto write = [&](uint64_t off, uint64_t len) {
    Step s;
    s.kind = Step::kWrite;
    s.offset = off;
    s.len = len;
    s.seed = 1000 + w.size();
    w.push_back(s);
  };
  auto simple = [&](Step::Kind k, uint64_t off = 0, uint64_t len = 0,
                    bool unmap = false) {
    Step s;
    s.kind = k;
    s.offset = off;
    s.len = len;
    s.unmap = unmap;
    w.push_back(s);
  };
  auto overlay = [&](const std::string& name) {
    Step s;
    s.kind = Step::kOverlay;
    s.path = dir + "/" + name;
    w.push_back(s);
  };
  write(cs + 100, 3000);           // allocation (COW over backing)
  write(3 * cs - 7, 2 * cs + 11);  // spans clusters
  simple(Step::kRead, 0, 6 * cs);
  simple(Step::kFlush);
  simple(Step::kZero, 8 * cs, 2 * cs);    // zero flag
  simple(Step::kZero, 12 * cs + 5, 300);  // partial zero
  simple(Step::kDiscard, 3 * cs, cs);     // frees a cluster
  write(size - 5000, 5000);               // far away: a new L2 table
  write(cs + 200, 50);                    // in place
  simple(Step::kRead, size - 8 * cs, 8 * cs);
  simple(Step::kFlush);
  if (c.overlays) {
    overlay("snap1.qcow2");
    write(cs + 1000, 700);  // COW from the old top
    write(5 * cs, cs);      // whole cluster
    simple(Step::kRead, 0, 8 * cs);
    overlay("snap2.qcow2");
    simple(Step::kZero, 6 * cs, cs + 17, true);
    write(2 * cs + 9, 33);
  }
  testing::TestRng rng(7);
  for (int i = 0; i < c.scattered; ++i) {
    uint64_t off = rng.Uniform(size / cs - 2) * cs + rng.Uniform(cs);
    write(off, 1 + rng.Uniform(700));
    if (i % 9 == 8) simple(Step::kFlush);
  }
  simple(Step::kZero, 20 * cs, 3 * cs + 1, true);
  simple(Step::kRead, 0, size);
  simple(Step::kFlush);
  simple(Step::kClose);
  return w;
}

// The expected disk: for every byte its value, or (after a failed step) two
// acceptable values.
struct Model {
  std::vector<uint8_t> bytes;
  std::vector<bool> uncertain;
  std::vector<uint8_t> alt;

  void Apply(const Step& s) {
    std::vector<uint8_t> d =
        s.kind == Step::kWrite ? s.Data() : std::vector<uint8_t>(s.len, 0);
    for (uint64_t i = 0; i < s.len; ++i) {
      bytes[s.offset + i] = d[i];
      uncertain[s.offset + i] = false;
    }
  }
  void Fail(const Step& s) {
    std::vector<uint8_t> d =
        s.kind == Step::kWrite ? s.Data() : std::vector<uint8_t>(s.len, 0);
    for (uint64_t i = 0; i < s.len; ++i) {
      if (uncertain[s.offset + i]) continue;  // keep the first alternative
      uncertain[s.offset + i] = true;
      alt[s.offset + i] = d[i];
    }
  }
  // "" when `got` (guest bytes at `base`) is acceptable.
  std::string Mismatch(absl::Span<const uint8_t> got, uint64_t base) const {
    uint64_t bad = 0, first = 0;
    for (uint64_t i = 0; i < got.size(); ++i) {
      const uint64_t g = base + i;
      if (got[i] == bytes[g] || (uncertain[g] && got[i] == alt[g])) continue;
      if (bad++ == 0) first = g;
    }
    if (bad == 0) return "";
    return absl::StrCat(
        bad, " bytes wrong, first at 0x", absl::Hex(first), ": got 0x",
        absl::Hex(got[first - base]), ", expected 0x", absl::Hex(bytes[first]),
        uncertain[first] ? absl::StrCat(" or 0x", absl::Hex(alt[first])) : "");
  }
};

std::string Basename(const std::string& p) {
  return p.substr(p.rfind('/') + 1);
}

// What one run did.
struct Outcome {
  int fired_step = -1;  // index of the step during which the fault fired
  std::vector<std::string> chain;  // files of the final chain, top first
  std::map<std::string, std::vector<uint8_t>> durable;
  Model model;
  // What went wrong (the sweep reports a sample at the end).
  std::vector<std::string> problems;
  bool failed() const { return !problems.empty(); }
};

class ErrorInjectionTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    if (!testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
    const Config& c = GetParam();
    top_ = dir_.File("top.qcow2");
    std::vector<std::string> to_load;
    testing::QemuImageSpec spec;
    spec.size = c.size;
    spec.cluster_size = c.cluster_size;
    spec.refcount_bits = c.refcount_bits;
    spec.extended_l2 = c.extended_l2;
    spec.lazy_refcounts = c.lazy;
    spec.compat = c.compat;
    if (c.backing) {
      const std::string base = dir_.File("base.qcow2");
      testing::QemuImageSpec bs;
      bs.size = c.size;
      ASSERT_OK(testing::QemuCreate(base, bs));
      std::vector<std::string> cmds;
      for (uint64_t off = 0; off + 256 * kKiB <= c.size; off += 512 * kKiB) {
        cmds.push_back(absl::StrCat("write -P ", 0x20 + off / (512 * kKiB), " ",
                                    off, " 256k"));
      }
      ASSERT_OK(testing::QemuIo(base, cmds));
      spec.backing_file = "base.qcow2";
      spec.backing_format = "qcow2";
      to_load.push_back(base);
    }
    if (c.compressed) {
      const std::string raw = dir_.File("src.raw");
      std::vector<uint8_t> bytes = testing::CompressibleBytes(5, c.size / 2);
      bytes.resize(c.size, 0);
      ASSERT_OK(testing::WriteFileBytes(raw, bytes));
      ASSERT_OK(testing::QemuConvert(
          raw, top_, "qcow2",
          {"-c", "-o", absl::StrCat("cluster_size=", c.cluster_size)}));
      unlink(raw.c_str());
    } else {
      ASSERT_OK(testing::QemuCreate(top_, spec));
    }
    to_load.push_back(top_);
    for (const std::string& p : to_load) {
      ASSERT_OK_AND_ASSIGN(initial_[p], testing::ReadFileBytes(p));
    }
    if (c.prefill > 0) {
      // Written by the library, outside the sweep.
      FaultPlan plan;
      plan.enabled = false;
      InjectingFileSystem fs(&plan);
      for (const auto& [p, b] : initial_) fs.AddFile(p, b);
      ASSERT_OK_AND_ASSIGN(auto img, Image::Open(top_, Options(&fs)));
      std::vector<uint8_t> buf(c.prefill, 0x99);
      ASSERT_OK(img->Write(0, buf));
      ASSERT_OK(img->Close());
      initial_[top_] = fs.DurableFiles()[top_];
      ASSERT_OK(testing::WriteFileBytes(top_, initial_[top_]));
    }
    ASSERT_OK_AND_ASSIGN(initial_model_, testing::QemuReadAll(top_));
    ASSERT_EQ(initial_model_.size(), c.size);
    steps_ = Workload(c, dir_.path());
  }

  OpenOptions Options(FileOpener* fs) const {
    OpenOptions o;
    o.read_write = true;
    o.opener = fs;
    o.l2_cache_bytes = GetParam().l2_cache_bytes;
    o.refcount_cache_bytes = GetParam().refcount_cache_bytes;
    return o;
  }

  CreateOptions OverlayOptions() const {
    CreateOptions co;
    co.cluster_size = GetParam().cluster_size;
    co.extended_l2 = GetParam().extended_l2;
    return co;
  }

  // The error of the step that hit the fault.
  void CheckInjectedError(const absl::Status& s, const FaultPlan& plan,
                          const std::string& where, Outcome* out) {
    const std::string msg(s.message());
    const char* errno_text =
        plan.err == ENOSPC ? "No space left on device" : "Input/output error";
    bool ok = !s.ok() && absl::StrContains(msg, "injected fault") &&
              absl::StrContains(msg, Basename(plan.failed_file)) &&
              absl::StrContains(msg, plan.failed_kind) &&
              absl::StrContains(msg, errno_text);
    if (plan.err == ENOSPC) {
      ok = ok && s.code() == absl::StatusCode::kResourceExhausted;
    } else {
      ok = ok && s.code() != absl::StatusCode::kDataLoss;
    }
    if (!ok) {
      out->problems.push_back(absl::StrCat(
          where, ": the failed ", plan.failed_kind, " of ",
          Basename(plan.failed_file),
          " should give an error that says 'injected fault', names the "
          "file, the operation and '",
          errno_text, "'", plan.err == ENOSPC ? " (kResourceExhausted)" : "",
          "; got: ", s.ToString()));
    }
  }

  // Reads the whole disk through `img` and compares it with the model.
  void CheckContents(Image& img, const Model& m, const std::string& where,
                     Outcome* out) {
    std::vector<uint8_t> got(img.size());
    absl::Status s = img.Read(0, absl::MakeSpan(got));
    if (!s.ok()) {
      out->problems.push_back(absl::StrCat(
          where, ": reading the disk back failed: ", s.ToString()));
      return;
    }
    std::string bad = m.Mismatch(got, 0);
    if (!bad.empty()) out->problems.push_back(absl::StrCat(where, ": ", bad));
  }

  // Runs the workload with `plan`; checks everything but the qemu oracle.
  Outcome RunOnce(FaultPlan& plan, const std::string& where) {
    Outcome out;
    out.model.bytes = initial_model_;
    out.model.uncertain.assign(initial_model_.size(), false);
    out.model.alt.assign(initial_model_.size(), 0);
    InjectingFileSystem fs(&plan);
    for (const auto& [p, b] : initial_) fs.AddFile(p, b);
    // Opening is not part of the sweep.
    const bool enabled = plan.enabled;
    plan.enabled = false;
    auto img = Image::Open(top_, Options(&fs));
    plan.enabled = enabled;
    if (!img.ok()) {
      out.problems.push_back(
          absl::StrCat(where, ": open: ", img.status().ToString()));
      return out;
    }
    Image& image = **img;
    for (size_t i = 0; i < steps_.size(); ++i) {
      const Step& step = steps_[i];
      const bool fired_before = plan.fired;
      const int chain_before = image.chain_length();
      if (step.kind == Step::kClose) out.chain = ChainFiles(image);
      absl::Status s;
      std::vector<uint8_t> read_buf;
      switch (step.kind) {
        case Step::kWrite:
          s = image.Write(step.offset, step.Data());
          break;
        case Step::kZero:
          s = image.WriteZeroes(step.offset, step.len, step.unmap);
          break;
        case Step::kDiscard:
          s = image.Discard(step.offset, step.len);
          break;
        case Step::kRead:
          read_buf.resize(step.len);
          s = image.Read(step.offset, absl::MakeSpan(read_buf));
          break;
        case Step::kFlush:
          s = image.Flush();
          break;
        case Step::kOverlay:
          s = image.CreateOverlay(step.path, OverlayOptions());
          break;
        case Step::kClose:
          s = image.Close();
          break;
      }
      const std::string at =
          absl::StrCat(where, ", step ", i, " (", step.ToString(), ")");
      const bool fired_here = !fired_before && plan.fired;
      if (fired_here) {
        out.fired_step = static_cast<int>(i);
        if (s.ok() && plan.failed_kind != "discard") {
          // Only hole punching is advisory; any other failed operation
          // must reach the caller.
          out.problems.push_back(absl::StrCat(
              at, ": the injected ", plan.failed_kind, " failure of ",
              Basename(plan.failed_file), " was lost: the step succeeded"));
        } else if (!s.ok()) {
          CheckInjectedError(s, plan, at, &out);
        }
      } else if (!s.ok()) {
        out.problems.push_back(absl::StrCat(
            at, ": failed",
            plan.fired
                ? absl::StrCat(" after the fault at step ", out.fired_step)
                : "",
            ": ", s.ToString()));
      }
      if (step.IsDataOp()) {
        if (s.ok()) {
          out.model.Apply(step);
        } else {
          out.model.Fail(step);
        }
      }
      if (step.kind == Step::kRead && s.ok()) {
        std::string bad = out.model.Mismatch(read_buf, step.offset);
        if (!bad.empty()) {
          out.problems.push_back(
              absl::StrCat(at, ": read returned wrong data: ", bad));
        }
      }
      if (step.kind == Step::kOverlay && !s.ok() &&
          image.chain_length() != chain_before) {
        out.problems.push_back(absl::StrCat(
            at, ": the chain changed although CreateOverlay failed"));
      }
      if (fired_here && step.kind != Step::kClose) {
        // Right after the fault, everything reads as the model says.
        plan.enabled = false;
        CheckContents(image, out.model, at + ", after the fault", &out);
        plan.enabled = true;
      }
      if (out.failed()) break;
    }
    plan.enabled = false;
    img->reset();
    out.durable = fs.DurableFiles();
    return out;
  }

  static std::vector<std::string> ChainFiles(Image& img) {
    std::vector<std::string> files;
    for (const LayerInfo& l : img.GetChainInfo()) files.push_back(l.filename);
    return files;
  }

  // The durable bytes read through the library (fresh simulated disks).
  void CheckDurableWithLibrary(Outcome& o, const std::string& where) {
    FaultPlan none;
    none.enabled = false;
    InjectingFileSystem fs(&none);
    for (const auto& [p, b] : o.durable) fs.AddFile(p, b);
    OpenOptions ro;
    ro.opener = &fs;
    auto img = Image::Open(o.chain.empty() ? top_ : o.chain[0], ro);
    if (!img.ok()) {
      o.problems.push_back(absl::StrCat(
          where, ": reopening the durable image: ", img.status().ToString()));
      return;
    }
    CheckContents(**img, o.model, where + ", durable image", &o);
  }

  // Writes the durable files to the real directory and asks qemu-img.
  void CheckDurableWithQemu(Outcome& o, const std::string& where) {
    for (const auto& [p, b] : o.durable) {
      ASSERT_OK(testing::WriteFileBytes(p, b));
    }
    const std::vector<std::string> chain =
        o.chain.empty() ? std::vector<std::string>{top_} : o.chain;
    for (const std::string& f : chain) {
      testing::CommandResult r = testing::QemuCheck(f);
      if (r.exit_code != 0 && r.exit_code != 3) {
        o.problems.push_back(absl::StrCat(where, ": qemu-img check ",
                                          Basename(f), " exit ", r.exit_code,
                                          "\n", r.out, r.err));
      }
    }
    absl::StatusOr<std::vector<uint8_t>> raw = testing::QemuReadAll(chain[0]);
    if (!raw.ok()) {
      o.problems.push_back(absl::StrCat(where, ": ", raw.status().ToString()));
    } else if (std::string bad = o.model.Mismatch(*raw, 0); !bad.empty()) {
      o.problems.push_back(absl::StrCat(
          where, ": qemu-img convert disagrees with the model: ", bad));
    }
    // Leave the directory as it was for the next run.
    for (const auto& [p, b] : o.durable) {
      if (initial_.count(p) == 0) unlink(p.c_str());
    }
  }

  // Dry run, then the sweep over every counted operation.
  void Sweep(bool reads) {
    const Config& c = GetParam();
    const char* mode = reads ? "reads" : "writes";
    // Dry run: counts the operations, records the events.
    FaultPlan dry;
    dry.count_reads = reads;
    dry.count_mutations = !reads;
    dry.record = true;
    std::set<std::string> events;
    internal::EventHook hook = [&](std::string_view e) { events.emplace(e); };
    internal::SetEventHook(&hook);
    Outcome base = RunOnce(dry, absl::StrCat(c.name, " dry run"));
    internal::SetEventHook(nullptr);
    ASSERT_FALSE(dry.fired);
    CheckDurableWithLibrary(base, c.name + " dry run");
    CheckDurableWithQemu(base, c.name + " dry run");
    ASSERT_FALSE(base.failed()) << absl::StrJoin(base.problems, "\n");
    if (!reads) {
      for (const std::string& e : c.events) {
        EXPECT_TRUE(events.count(e))
            << c.name << ": the workload no longer goes through '" << e
            << "' (it went through: " << absl::StrJoin(events, ", ") << ")";
      }
    }
    const uint64_t total = dry.ops;
    ASSERT_GT(total, 10u);

    // Long runs of the same operation on the same file (a big workload's
    // data writes or reads) are sampled without QCOW2_LONG_TESTS: every
    // operation within kDenseEnds of either end, every one whose kind
    // differs from a neighbour's (each flush, truncate and discard, and the
    // writes around them), and about kSampledRuns spread evenly.
    constexpr uint64_t kSampleAbove = 100, kDenseEnds = 20, kSampledRuns = 60;
    const uint64_t stride = LongRun() || total <= kSampleAbove
                                ? 1
                                : std::max<uint64_t>(2, total / kSampledRuns);
    auto sampled = [&](uint64_t n) {
      if (stride == 1 || n % stride == 0 || n <= kDenseEnds ||
          n + kDenseEnds > total) {
        return true;
      }
      auto kind = [&](uint64_t i) {
        const std::string& l = dry.log[i - 1];
        return std::string_view(l).substr(0, l.find(' '));
      };
      return kind(n) != kind(n - 1) || kind(n) != kind(n + 1);
    };
    uint64_t sampled_ops = 0;
    for (uint64_t n = 1; n <= total; ++n) sampled_ops += sampled(n);

    // Small workloads: every operation with both errnos. Bigger ones: every
    // operation once, ENOSPC and EIO alternating. The qemu-img oracle runs
    // on about kQemuRuns of them (spread evenly), plus every run whose
    // fault hit a snapshot or the close. QCOW2_LONG_TESTS: everything.
    constexpr uint64_t kFullSweepRuns = 200;
    constexpr uint64_t kQemuRuns = 16;
    const bool both =
        LongRun() || (stride == 1 && 2 * sampled_ops <= kFullSweepRuns);
    const uint64_t planned = both ? 2 * sampled_ops : sampled_ops;
    const uint64_t qemu_every =
        LongRun() ? 1 : std::max<uint64_t>(1, planned / kQemuRuns);
    int runs = 0, qemu_runs = 0, special_qemu_runs = 0;
    double lib_seconds = 0, qemu_seconds = 0;
    std::map<std::string, int> kinds;
    std::vector<std::string> problems;
    std::vector<uint64_t> failing_ops;
    for (uint64_t n = 1; n <= total; ++n) {
      if (!sampled(n)) continue;
      for (int err : {ENOSPC, EIO}) {
        if (!both && (n % 2 == 0) != (err == EIO)) continue;
        FaultPlan plan;
        plan.count_reads = reads;
        plan.count_mutations = !reads;
        plan.fail_at = n;
        plan.err = err;
        const std::string where = absl::StrCat(
            c.name, ": ", err == ENOSPC ? "ENOSPC" : "EIO", " at ", mode,
            " op ", n, "/", total, " (", dry.log[n - 1], ")");
        auto t0 = std::chrono::steady_clock::now();
        Outcome o = RunOnce(plan, where);
        if (!plan.fired) {
          // The run is identical to the dry run up to operation N.
          o.problems.push_back(where + ": the fault never fired");
        }
        if (!o.failed()) CheckDurableWithLibrary(o, where);
        lib_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count();
        ++runs;
        kinds[plan.failed_kind]++;
        const bool special =
            o.fired_step >= 0 &&
            (steps_[o.fired_step].kind == Step::kOverlay ||
             steps_[o.fired_step].kind == Step::kClose) &&
            (LongRun() || special_qemu_runs++ < static_cast<int>(kQemuRuns));
        if (!o.failed() && (runs % qemu_every == 0 || special)) {
          auto t1 = std::chrono::steady_clock::now();
          CheckDurableWithQemu(o, where);
          qemu_seconds += std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - t1)
                              .count();
          ++qemu_runs;
        }
        if (o.failed()) {
          failing_ops.push_back(n);
          problems.insert(problems.end(), o.problems.begin(), o.problems.end());
        }
      }
    }
    std::string summary;
    for (const auto& [k, v] : kinds) absl::StrAppend(&summary, " ", k, "=", v);
    printf(
        "[errinj] %s %s: %llu operations, %d runs (%.1f s), %d checked by "
        "qemu-img (%.1f s); failed operations:%s\n",
        c.name.c_str(), mode, static_cast<unsigned long long>(total), runs,
        lib_seconds, qemu_runs, qemu_seconds, summary.c_str());
    const bool known = !reads && !c.known_defect.empty() &&
                       getenv("QCOW2_STRICT_CORPUS") == nullptr;
    if (known && problems.empty()) {
      FAIL() << c.name << " no longer shows the known defect ("
             << c.known_defect << "): delete known_defect from its Config";
    }
    if (known && std::all_of(problems.begin(), problems.end(),
                             [&](const std::string& p) {
                               return absl::StrContains(p, c.defect_signature);
                             })) {
      GTEST_SKIP() << "KNOWN LIBRARY DEFECT: " << c.known_defect << "\n"
                   << failing_ops.size() << " of " << runs
                   << " runs show it (fault at operations "
                   << absl::StrJoin(failing_ops, ",") << "), e.g.\n"
                   << problems[0];
    }
    if (!problems.empty()) {
      // The first few problems in full, then where the others were.
      std::vector<std::string> shown(
          problems.begin(),
          problems.begin() + std::min<size_t>(problems.size(), 6));
      ADD_FAILURE() << c.name << " " << mode << " sweep: " << failing_ops.size()
                    << " of " << runs << " runs failed (fault at operations "
                    << absl::StrJoin(failing_ops, ",") << "); first problems:\n"
                    << absl::StrJoin(shown, "\n");
    }
  }

  testing::TempDir dir_;
  std::string top_;
  std::map<std::string, std::vector<uint8_t>> initial_;
  std::vector<uint8_t> initial_model_;
  std::vector<Step> steps_;
};

TEST_P(ErrorInjectionTest, WriteSideFaults) { Sweep(/*reads=*/false); }

TEST_P(ErrorInjectionTest, ReadFaults) { Sweep(/*reads=*/true); }

INSTANTIATE_TEST_SUITE_P(
    Configs, ErrorInjectionTest,
    ::testing::Values(
        // Allocation, new L2 tables and new refcount blocks: 512-byte
        // clusters with 64-bit refcounts (a block covers 32 KiB).
        Config{.name = "c512_r64",
               .cluster_size = 512,
               .refcount_bits = 64,
               .size = 3 * kMiB,
               .scattered = 40,
               .events = {"l2-alloc", "l1-update", "data-write", "l2-update",
                          "refblock-alloc", "refblock-update", "flush"}},
        // 512-byte clusters, 64-bit refcounts, the file filled close to
        // what the refcount table covers: new refcount blocks and a
        // refcount table that grows. No backing file: partial writes into
        // new clusters leave their zero padding unwritten.
        Config{.name = "c512_grow",
               .cluster_size = 512,
               .refcount_bits = 64,
               .size = 3 * kMiB,
               .prefill = 1960 * kKiB,
               .scattered = 30,
               .events = {"refcount-table-grow", "l2-alloc", "zero-skip-write"}},
        // Copy-on-write over a backing file, extended L2 (subclusters), and
        // two live snapshots.
        Config{.name = "c64k_xl2_backing_snapshots",
               .extended_l2 = true,
               .size = 2 * kMiB,
               .backing = true,
               .overlays = true,
               .events = {"cow-read", "cow-write", "l2-update"}},
        // Copy-on-write over a backing file, version 2 image, tiny caches
        // (every L2 slice and refcount block is evicted and read again).
        Config{.name = "c4k_v2_backing_small_cache",
               .cluster_size = 4096,
               .compat = "0.10",
               .backing = true,
               .l2_cache_bytes = 4096,
               .refcount_cache_bytes = 4096,
               .events = {"cow-read", "cow-write", "l2-alloc"}},
        // Writes into compressed clusters (copy-on-write out of them).
        Config{.name = "c64k_compressed",
               .size = 2 * kMiB,
               .compressed = true,
               .events = {"cow-write"}},
        // Lazy refcounts: the dirty bit is set on the first write and
        // cleared at close.
        Config{.name = "c64k_lazy",
               .lazy = true,
               .size = 2 * kMiB,
               .backing = true,
               .events = {"header-update", "cow-write"}}),
    [](const ::testing::TestParamInfo<Config>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace qcow2
