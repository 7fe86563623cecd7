// SPDX-License-Identifier: Apache-2.0
// Tests for the refcount checker (lib/check/check.{h,cc}) and
// `qcowtool check` (tools/cmd_check.cc), with `qemu-img check` as the
// oracle: images built by qemu-img/qemu-io must check clean with the same
// figures; images damaged byte by byte must get the same verdict, the same
// counters and the same exit code, and `-r leaks` / `-r all` must repair
// what QEMU's repairs do, leaving images that `qemu-img check` finds clean
// and whose guest data is unchanged.
#include "lib/check/check.h"

#include <unistd.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/format/entries.h"
#include "lib/format/header.h"
#include "testing/memory_file.h"
#include "lib/base/endian.h"
#include "qcow2/file.h"
#include "tests/util/json_lite.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2::internal {
namespace {

using ::qcow2::testing::CommandResult;
using ::qcow2::testing::QemuCreate;
using ::qcow2::testing::QemuImageSpec;
using ::qcow2::testing::QemuIo;
using ::qcow2::testing::QemuReadAll;
using ::qcow2::testing::ReadFileBytes;
using ::qcow2::testing::TempDir;
using ::qcow2::testing::WriteFileBytes;
using ::testing::HasSubstr;
namespace json = ::qcow2::testing::json;

// Runs a command (gtest's Test::Run hides the helper's name in test bodies).
CommandResult Cmd(const std::vector<std::string>& argv) {
  return ::qcow2::testing::Run(argv);
}

// ---------------------------------------------------------------------------
// Editing images byte by byte.

// The bytes of an image with accessors for the structures tests damage.
class RawImage {
 public:
  static absl::StatusOr<RawImage> Load(const std::string& path) {
    auto bytes = ReadFileBytes(path);
    if (!bytes.ok()) return bytes.status();
    return FromBytes(std::move(*bytes));
  }
  static absl::StatusOr<RawImage> FromBytes(std::vector<uint8_t> bytes) {
    RawImage img;
    img.bytes_ = std::move(bytes);
    std::vector<uint8_t> c0(img.bytes_);
    c0.resize(std::max<size_t>(c0.size(), 2 << 20), 0);
    auto h = DecodeHeader(c0, "test");
    if (!h.ok()) return h.status();
    img.h_ = *h;
    return img;
  }
  absl::Status Save(const std::string& path) const {
    return WriteFileBytes(path, bytes_);
  }
  std::vector<uint8_t>& bytes() { return bytes_; }
  const Header& header() const { return h_; }
  uint64_t cs() const { return h_.cluster_size(); }
  uint64_t clusters() const { return (bytes_.size() + cs() - 1) / cs(); }

  uint64_t Get64(uint64_t off) const {
    uint8_t b[8] = {};
    for (int i = 0; i < 8; ++i) {
      if (off + i < bytes_.size()) b[i] = bytes_[off + i];
    }
    return LoadBE64(b);
  }
  void Put64(uint64_t off, uint64_t v) {
    if (off + 8 > bytes_.size()) bytes_.resize(off + 8, 0);
    StoreBE64(&bytes_[off], v);
  }
  void Put32(uint64_t off, uint32_t v) {
    if (off + 4 > bytes_.size()) bytes_.resize(off + 4, 0);
    StoreBE32(&bytes_[off], v);
  }

  uint64_t L1(uint64_t i) const { return Get64(h_.l1_table_offset + i * 8); }
  void SetL1(uint64_t i, uint64_t v) { Put64(h_.l1_table_offset + i * 8, v); }
  uint64_t L2Offset(uint64_t l1i) const { return L1(l1i) & kEntryOffsetMask; }
  uint64_t L2EntryOffset(uint64_t l1i, uint64_t i) const {
    return L2Offset(l1i) + i * h_.l2_entry_size();
  }
  uint64_t L2(uint64_t l1i, uint64_t i) const {
    return Get64(L2EntryOffset(l1i, i));
  }
  void SetL2(uint64_t l1i, uint64_t i, uint64_t v) {
    Put64(L2EntryOffset(l1i, i), v);
  }
  uint64_t Bitmap(uint64_t l1i, uint64_t i) const {
    return Get64(L2EntryOffset(l1i, i) + 8);
  }
  void SetBitmap(uint64_t l1i, uint64_t i, uint64_t v) {
    Put64(L2EntryOffset(l1i, i) + 8, v);
  }
  // Host cluster index of data cluster `i` of the first L2 table.
  uint64_t DataCluster(uint64_t i) const {
    return (L2(0, i) & kEntryOffsetMask) >> h_.cluster_bits;
  }

  uint64_t RefTable(uint64_t i) const {
    return Get64(h_.refcount_table_offset + i * 8);
  }
  void SetRefTable(uint64_t i, uint64_t v) {
    Put64(h_.refcount_table_offset + i * 8, v);
  }
  uint64_t Refcount(uint64_t cluster) const {
    uint64_t block, index;
    Locate(cluster, &block, &index);
    const uint32_t order = h_.refcount_order;
    if (order < 3) {
      const uint64_t bit = index << order;
      return (bytes_[block + bit / 8] >> (bit % 8)) &
             ((1u << (1 << order)) - 1);
    }
    uint64_t v = 0;
    for (uint32_t i = 0; i < (1u << order) / 8; ++i) {
      v = (v << 8) | bytes_[block + (index << (order - 3)) + i];
    }
    return v;
  }
  void SetRefcount(uint64_t cluster, uint64_t value) {
    uint64_t block, index;
    Locate(cluster, &block, &index);
    const uint32_t order = h_.refcount_order;
    if (order < 3) {
      const uint64_t bit = index << order;
      const uint8_t mask = ((1u << (1 << order)) - 1) << (bit % 8);
      uint8_t& b = bytes_[block + bit / 8];
      b = static_cast<uint8_t>((b & ~mask) | ((value << (bit % 8)) & mask));
      return;
    }
    const uint32_t n = (1u << order) / 8;
    for (uint32_t i = 0; i < n; ++i) {
      bytes_[block + (index << (order - 3)) + n - 1 - i] =
          static_cast<uint8_t>(value >> (8 * i));
    }
  }
  void SetIncompatible(uint64_t bits) { Put64(72, bits); }

 private:
  void Locate(uint64_t cluster, uint64_t* block, uint64_t* index) const {
    const uint64_t per_block = cs() * 8 >> h_.refcount_order;
    *block = RefTable(cluster / per_block) & kRefTableOffsetMask;
    *index = cluster % per_block;
  }

  std::vector<uint8_t> bytes_;
  Header h_;
};

// ---------------------------------------------------------------------------
// Running both checkers.

const char* ModeFlag(RepairMode mode) {
  return mode == RepairMode::kAll ? "all" : "leaks";
}

std::string ModeName(RepairMode mode) {
  return mode == RepairMode::kNone ? "check" : ModeFlag(mode);
}

// `qemu-img check --output=json [-r MODE] path`.
CommandResult QemuCheckMode(const std::string& path, RepairMode mode) {
  std::vector<std::string> argv = {"qemu-img", "check", "--output=json"};
  if (mode != RepairMode::kNone) {
    argv.push_back("-r");
    argv.push_back(ModeFlag(mode));
  }
  argv.push_back(path);
  return Cmd(argv);
}

absl::StatusOr<CheckResult> OurCheck(const std::string& path, RepairMode mode) {
  FileOptions opts;
  opts.read_only = mode == RepairMode::kNone;
  auto file = OpenPosixFile(path, opts);
  if (!file.ok()) return file.status();
  return CheckImage(file->get(), mode);
}

// qemu-img's exit code for a result.
int ExitCode(const CheckResult& r) {
  if (!r.failure.empty() || r.check_errors) return 1;
  if (r.corruptions) return 2;
  if (r.leaks) return 3;
  return 0;
}

std::string Describe(const CheckResult& r) {
  return absl::StrCat("corruptions=", r.corruptions, " leaks=", r.leaks,
                      " check_errors=", r.check_errors,
                      " corruptions_fixed=", r.corruptions_fixed,
                      " leaks_fixed=", r.leaks_fixed,
                      " end=", r.image_end_offset, " failure='", r.failure,
                      "'\n  ", absl::StrJoin(r.messages, "\n  "));
}

uint64_t Field(const json::Value& v, const char* key) {
  const json::Value* f = v.Find(key);
  return f ? f->as_uint64() : 0;
}

// Expects our counters to equal the ones in qemu-img's JSON report.
void ExpectSameFigures(const json::Value& q, const CheckResult& r,
                       bool compare_end_offset) {
  EXPECT_EQ(Field(q, "check-errors"), r.check_errors);
  EXPECT_EQ(Field(q, "corruptions"), r.corruptions);
  EXPECT_EQ(Field(q, "leaks"), r.leaks);
  EXPECT_EQ(Field(q, "corruptions-fixed"), r.corruptions_fixed);
  EXPECT_EQ(Field(q, "leaks-fixed"), r.leaks_fixed);
  EXPECT_EQ(Field(q, "total-clusters"), r.total_clusters);
  EXPECT_EQ(Field(q, "allocated-clusters"), r.allocated_clusters);
  EXPECT_EQ(Field(q, "fragmented-clusters"), r.fragmented_clusters);
  EXPECT_EQ(Field(q, "compressed-clusters"), r.compressed_clusters);
  if (compare_end_offset) {
    EXPECT_EQ(Field(q, "image-end-offset"), r.image_end_offset);
  }
}

// Checks `path` with both tools and expects the same figures.
void ExpectCleanAndSameAsQemu(const std::string& path) {
  CommandResult q = QemuCheckMode(path, RepairMode::kNone);
  ASSERT_EQ(q.exit_code, 0) << q.out << q.err;
  ASSERT_OK_AND_ASSIGN(json::Value qj, json::Parse(q.out));
  ASSERT_OK_AND_ASSIGN(CheckResult r, OurCheck(path, RepairMode::kNone));
  EXPECT_EQ(ExitCode(r), 0) << Describe(r);
  EXPECT_TRUE(r.messages.empty()) << Describe(r);
  ExpectSameFigures(qj, r, /*compare_end_offset=*/true);
}

// ---------------------------------------------------------------------------
// Clean images: every layout qemu-img makes checks clean, with qemu's
// figures.

struct CleanCase {
  std::string name;
  QemuImageSpec spec;
  bool snapshots = true;
};

void PrintTo(const CleanCase& c, std::ostream* os) { *os << c.name; }

std::vector<CleanCase> CleanCases() {
  std::vector<CleanCase> cases;
  for (uint32_t cs : {512u, 4096u, 65536u, 2u << 20}) {
    for (uint32_t rb : {1u, 16u, 64u}) {
      for (const char* compat : {"0.10", "1.1"}) {
        for (bool xl2 : {false, true}) {
          QemuImageSpec spec;
          spec.size = 64 << 20;
          spec.cluster_size = cs;
          spec.refcount_bits = rb;
          spec.compat = compat;
          spec.extended_l2 = xl2;
          if (!spec.Valid()) continue;
          CleanCase c;
          c.spec = spec;
          c.name = spec.Token();
          // With 1-bit refcounts nothing may be shared: no snapshots.
          c.snapshots = rb > 1;
          cases.push_back(c);
        }
      }
    }
  }
  return cases;
}

class CleanImageTest : public ::testing::TestWithParam<CleanCase> {};

TEST_P(CleanImageTest, ChecksCleanWithQemuFigures) {
  SKIP_WITHOUT_QEMU();
  const CleanCase& c = GetParam();
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  ASSERT_OK(QemuCreate(path, c.spec));
  const uint32_t cs = c.spec.cluster_size;
  // Data, a compressed cluster, zero clusters, a partly written cluster,
  // then a discard.
  ASSERT_OK(
      QemuIo(path, {"write -P 1 0 100k", absl::StrCat("write -c -P 2 40M ", cs),
                    "write -z 16M 64k", "write -P 3 20M 3k",
                    "write -P 4 24M 1M", "discard 24M 64k"}));
  ExpectCleanAndSameAsQemu(path);
  if (!c.snapshots) return;
  ASSERT_EQ(Cmd({"qemu-img", "snapshot", "-c", "s1", path}).exit_code, 0);
  ASSERT_OK(
      QemuIo(path, {"write -P 5 0 8k", absl::StrCat("write -c -P 6 48M ", cs),
                    "write -P 7 30M 200k"}));
  ASSERT_EQ(Cmd({"qemu-img", "snapshot", "-c", "s2", path}).exit_code, 0);
  ASSERT_OK(QemuIo(path, {"write -P 8 20M 8k", "write -z 0 4k"}));
  ExpectCleanAndSameAsQemu(path);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CleanImageTest,
                         ::testing::ValuesIn(CleanCases()),
                         [](const auto& info) { return info.param.name; });

TEST(CheckTest, EmptyImageAndFullyCompressedImage) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  QemuImageSpec spec;
  spec.size = 10 << 20;
  ASSERT_OK(QemuCreate(dir.File("empty.qcow2"), spec));
  ExpectCleanAndSameAsQemu(dir.File("empty.qcow2"));
  // Every cluster compressed (several per host cluster).
  ASSERT_OK(testing::WritePatternFile(dir.File("raw"), 7, 3 << 20));
  ASSERT_OK(testing::QemuConvert(dir.File("raw"), dir.File("c.qcow2"), "qcow2",
                                 {"-f", "raw", "-c", "-o", "cluster_size=4k"}));
  ExpectCleanAndSameAsQemu(dir.File("c.qcow2"));
}

TEST(CheckTest, PreallocatedMetadataImage) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  QemuImageSpec spec;
  spec.size = 20 << 20;
  spec.preallocation = "metadata";
  ASSERT_OK(QemuCreate(dir.File("p.qcow2"), spec));
  ASSERT_OK(
      QemuIo(dir.File("p.qcow2"), {"write -z 0 64k", "write -P 1 1M 4k"}));
  ExpectCleanAndSameAsQemu(dir.File("p.qcow2"));
}

// ---------------------------------------------------------------------------
// Damaged images: same verdict as qemu-img, same repairs.

enum class Base {
  kPlain,       // 64 KiB clusters, 4 data clusters at guest 0..256k
  kSnapshot,    // kPlain, a snapshot, then cluster 1 rewritten
  kCompressed,  // two compressed clusters sharing a host cluster, one plain
  kExtended,    // extended L2
  kLazy,        // lazy refcounts
  kOneBit,      // refcount_bits=1
  kV2,          // compat=0.10
};

absl::Status BuildBase(Base base, const std::string& path) {
  QemuImageSpec spec;
  spec.size = 10 << 20;
  std::vector<std::string> io = {"write -P 1 0 256k"};
  switch (base) {
    case Base::kPlain:
    case Base::kSnapshot:
      break;
    case Base::kCompressed:
      io = {"write -c -P 1 0 64k", "write -c -P 2 64k 64k",
            "write -P 3 128k 64k"};
      break;
    case Base::kExtended:
      spec.extended_l2 = true;
      io = {"write -P 1 0 100k", "write -P 2 1M 4k", "write -c -P 3 2M 64k"};
      break;
    case Base::kLazy:
      spec.lazy_refcounts = true;
      break;
    case Base::kOneBit:
      spec.refcount_bits = 1;
      break;
    case Base::kV2:
      spec.compat = "0.10";
      break;
  }
  if (auto s = QemuCreate(path, spec); !s.ok()) return s;
  if (auto s = QemuIo(path, io); !s.ok()) return s;
  if (base == Base::kSnapshot) {
    CommandResult r = Cmd({"qemu-img", "snapshot", "-c", "s1", path});
    if (r.exit_code != 0) return absl::InternalError(r.err);
    return QemuIo(path, {"write -P 2 64k 64k"});
  }
  return absl::OkStatus();
}

struct DamageCase {
  std::string name;
  Base base;
  std::function<void(RawImage&)> damage;
  // The damage itself changes what the guest reads (so repaired data is
  // compared with qemu's repair, not with the original).
  bool changes_data = false;
  // QEMU's own -r all stops with "Check failed" here while ours repairs:
  // we then expect a clean, data-preserving repair of our own.
  bool qemu_repair_fails = false;
  // The repair writes a new refcount structure at the end of the file: the
  // image end offset differs from qemu's (its structure goes into holes).
  bool rebuilds = false;
};

std::vector<DamageCase> DamageCases() {
  std::vector<DamageCase> v;
  v.push_back({"RefcountTooHigh", Base::kPlain,
               [](RawImage& m) { m.SetRefcount(m.DataCluster(1), 2); }});
  v.push_back({"RefcountOfUnusedCluster", Base::kPlain, [](RawImage& m) {
                 // A cluster inside the file that nothing references.
                 m.bytes().resize(m.bytes().size() + 2 * m.cs(), 0);
                 m.SetRefcount(m.clusters() - 1, 1);
               }});
  v.push_back({"RefcountZero", Base::kPlain,
               [](RawImage& m) { m.SetRefcount(m.DataCluster(2), 0); }, false,
               false, true});
  v.push_back({"HeaderRefcountHigh", Base::kPlain, [](RawImage& m) {
                 m.SetRefcount(0, 2);
                 m.SetRefcount(m.DataCluster(0), 3);
               }});
  v.push_back({"SharedClusterRefcountTooLow", Base::kSnapshot,
               [](RawImage& m) { m.SetRefcount(m.DataCluster(0), 1); }});
  v.push_back({"L2CopiedCleared", Base::kPlain,
               [](RawImage& m) { m.SetL2(0, 1, m.L2(0, 1) & ~kOflagCopied); }});
  v.push_back({"L2CopiedOnSharedCluster", Base::kSnapshot,
               [](RawImage& m) { m.SetL2(0, 0, m.L2(0, 0) | kOflagCopied); }});
  v.push_back({"L1CopiedCleared", Base::kPlain,
               [](RawImage& m) { m.SetL1(0, m.L1(0) & ~kOflagCopied); }});
  v.push_back({"TwoL2EntriesOneCluster", Base::kPlain,
               [](RawImage& m) { m.SetL2(0, 1, m.L2(0, 0)); }, true});
  v.push_back({"L2ReservedBits", Base::kPlain,
               [](RawImage& m) { m.SetL2(0, 1, m.L2(0, 1) | 2); }});
  v.push_back({"L1ReservedBits", Base::kPlain,
               [](RawImage& m) { m.SetL1(0, m.L1(0) | 1); }});
  v.push_back({"MisalignedDataCluster", Base::kPlain,
               [](RawImage& m) { m.SetL2(0, 1, m.L2(0, 1) + 512); }, true});
  v.push_back(
      {"MisalignedPreallocatedZero", Base::kPlain,
       [](RawImage& m) { m.SetL2(0, 1, (m.L2(0, 1) + 512) | kOflagZero); },
       true});
  v.push_back({"DataPastEndOfFile", Base::kPlain,
               [](RawImage& m) {
                 m.SetL2(0, 1, kOflagCopied | ((m.clusters() + 40) * m.cs()));
               },
               true});
  v.push_back({"RefTableReservedBits", Base::kPlain,
               [](RawImage& m) { m.SetRefTable(0, m.RefTable(0) | 1); }, false,
               true, true});
  v.push_back({"RefBlockMisaligned", Base::kPlain,
               [](RawImage& m) { m.SetRefTable(0, m.RefTable(0) + 512); },
               false, true, true});
  v.push_back(
      {"RefBlockOutsideImage", Base::kPlain,
       [](RawImage& m) { m.SetRefTable(0, (m.clusters() + 80) * m.cs()); },
       false, false, true});
  v.push_back({"RefBlockAlsoData", Base::kPlain,
               [](RawImage& m) {
                 m.SetL2(0, 1,
                         kOflagCopied | (m.RefTable(0) & kRefTableOffsetMask));
               },
               true, false, true});
  v.push_back({"L2TableOnRefcountTable", Base::kPlain,
               [](RawImage& m) {
                 m.SetL1(0, kOflagCopied | m.header().refcount_table_offset);
               },
               true, false, true});
  v.push_back({"DirtyBitAndLeak", Base::kLazy, [](RawImage& m) {
                 m.SetIncompatible(kIncompatDirty);
                 m.SetRefcount(m.DataCluster(1), 2);
               }});
  v.push_back({"CorruptBitAndLeak", Base::kPlain, [](RawImage& m) {
                 m.SetIncompatible(kIncompatCorrupt);
                 m.SetRefcount(m.DataCluster(3), 3);
               }});
  v.push_back(
      {"CompressedHostClusterTooLow", Base::kCompressed, [](RawImage& m) {
         const CompressedExtent e =
             DecodeCompressed(m.L2(0, 0), m.header().cluster_bits);
         m.SetRefcount(e.host_offset / m.cs(), 1);
       }});
  v.push_back({"CompressedWithCopied", Base::kCompressed,
               [](RawImage& m) { m.SetL2(0, 0, m.L2(0, 0) | kOflagCopied); }});
  v.push_back({"ExtendedAllocAndZero", Base::kExtended, [](RawImage& m) {
                 m.SetBitmap(0, 0, m.Bitmap(0, 0) | (1ull << 32));
               }});
  v.push_back({"ExtendedUnallocatedWithAllocBits", Base::kExtended,
               [](RawImage& m) { m.SetBitmap(0, 5, 3); }});
  v.push_back({"ExtendedRefcountTooHigh", Base::kExtended,
               [](RawImage& m) { m.SetRefcount(m.DataCluster(1), 5); }});
  v.push_back({"OneBitRefcountOverflow", Base::kOneBit,
               [](RawImage& m) { m.SetL2(0, 1, m.L2(0, 0)); }, true});
  v.push_back({"V2RefcountZeroAndHigh", Base::kV2,
               [](RawImage& m) {
                 m.SetRefcount(m.DataCluster(0), 0);
                 m.SetRefcount(m.DataCluster(1), 3);
               },
               false, false, true});
  v.push_back({"SnapshotL1Misaligned", Base::kSnapshot, [](RawImage& m) {
                 const uint64_t sn = m.header().snapshots_offset;
                 m.Put64(sn, m.Get64(sn) + 512);
               }});
  v.push_back({"SnapshotEntryIncomplete", Base::kSnapshot, [](RawImage& m) {
                 m.Put32(m.header().snapshots_offset + 36, 8);
               }});
  v.push_back({"SnapshotExtraDataTooLarge", Base::kSnapshot, [](RawImage& m) {
                 m.Put32(m.header().snapshots_offset + 36, 5000);
               }});
  return v;
}

struct DamageParam {
  DamageCase c;
  RepairMode mode;
};

std::string DamageParamName(const DamageParam& p) {
  return p.c.name + "_" + ModeName(p.mode);
}

void PrintTo(const DamageParam& p, std::ostream* os) {
  *os << DamageParamName(p);
}

class DamageTest : public ::testing::TestWithParam<DamageParam> {};

TEST_P(DamageTest, SameVerdictAndRepairAsQemu) {
  SKIP_WITHOUT_QEMU();
  const DamageCase& c = GetParam().c;
  const RepairMode mode = GetParam().mode;
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  ASSERT_OK(BuildBase(c.base, base));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> original, QemuReadAll(base));
  ASSERT_OK_AND_ASSIGN(RawImage img, RawImage::Load(base));
  c.damage(img);
  const std::string theirs = dir.File("theirs.qcow2");
  const std::string ours = dir.File("ours.qcow2");
  ASSERT_OK(img.Save(theirs));
  ASSERT_OK(img.Save(ours));

  CommandResult q = QemuCheckMode(theirs, mode);
  ASSERT_OK_AND_ASSIGN(CheckResult r, OurCheck(ours, mode));
  SCOPED_TRACE(absl::StrCat("qemu-img (exit ", q.exit_code, "):\n", q.out,
                            q.err, "\nours (exit ", ExitCode(r),
                            "): ", Describe(r)));
  if (mode == RepairMode::kNone) {
    // The damaged image has problems and we see the same ones; nothing is
    // written.
    EXPECT_NE(q.exit_code, 0);
    EXPECT_EQ(ExitCode(r), q.exit_code);
    if (q.exit_code != 1) {
      ASSERT_OK_AND_ASSIGN(json::Value qj, json::Parse(q.out));
      ExpectSameFigures(qj, r, true);
    }
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> after, ReadFileBytes(ours));
    EXPECT_TRUE(after == img.bytes()) << "a check without -r wrote";
    return;
  }

  if (c.qemu_repair_fails && mode == RepairMode::kAll) {
    // Known disagreement: QEMU's rebuild trips over its own overlap check.
    EXPECT_EQ(q.exit_code, 1);
    EXPECT_EQ(ExitCode(r), 0);
  } else {
    EXPECT_EQ(ExitCode(r), q.exit_code);
    if (q.exit_code != 1) {
      ASSERT_OK_AND_ASSIGN(json::Value qj, json::Parse(q.out));
      ExpectSameFigures(qj, r, !(c.rebuilds && mode == RepairMode::kAll));
    }
  }
  // Whatever we repaired, qemu-img agrees with our verdict on the result,
  // and the guest sees what it saw after QEMU's own repair (or before the
  // damage).
  CommandResult after = QemuCheckMode(ours, RepairMode::kNone);
  if (ExitCode(r) != 1) {
    EXPECT_EQ(after.exit_code, ExitCode(r)) << after.err;
  }
  // (An image left corrupt may be unreadable for qemu-img convert, as is
  // the one QEMU repaired.)
  absl::StatusOr<std::vector<uint8_t>> data = QemuReadAll(ours);
  if (ExitCode(r) == 0) {
    ASSERT_TRUE(data.ok()) << data.status();
  }
  if (!c.changes_data && data.ok()) {
    EXPECT_TRUE(*data == original) << "guest data changed";
  }
  if (q.exit_code != 1) {
    absl::StatusOr<std::vector<uint8_t>> qdata = QemuReadAll(theirs);
    EXPECT_EQ(data.ok(), qdata.ok()) << data.status() << qdata.status();
    if (data.ok() && qdata.ok()) {
      EXPECT_TRUE(*data == *qdata) << "guest data differs from QEMU's repair";
    }
  }
  // A repair that left nothing to complain about also cleared the dirty
  // and corrupt bits.
  if (ExitCode(r) == 0 && img.header().version >= 3) {
    ASSERT_OK_AND_ASSIGN(RawImage repaired, RawImage::Load(ours));
    EXPECT_EQ(repaired.header().incompatible_features &
                  (kIncompatDirty | kIncompatCorrupt),
              0u);
  }
}

std::vector<DamageParam> DamageParams() {
  std::vector<DamageParam> v;
  for (const DamageCase& c : DamageCases()) {
    for (RepairMode m :
         {RepairMode::kNone, RepairMode::kLeaks, RepairMode::kAll}) {
      v.push_back({c, m});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, DamageTest, ::testing::ValuesIn(DamageParams()),
                         [](const auto& info) {
                           return DamageParamName(info.param);
                         });

// ---------------------------------------------------------------------------
// Specific behaviour.

TEST(CheckTest, MessagesMatchQemu) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  ASSERT_OK(BuildBase(Base::kPlain, dir.File("a.qcow2")));
  ASSERT_OK_AND_ASSIGN(RawImage img, RawImage::Load(dir.File("a.qcow2")));
  const uint64_t c1 = img.DataCluster(1);
  img.SetRefcount(c1, 2);
  img.SetL2(0, 2, img.L2(0, 2) & ~kOflagCopied);
  ASSERT_OK(img.Save(dir.File("a.qcow2")));
  ASSERT_OK_AND_ASSIGN(CheckResult r,
                       OurCheck(dir.File("a.qcow2"), RepairMode::kNone));
  EXPECT_THAT(
      r.messages,
      ::testing::ElementsAre(
          absl::StrCat("Leaked cluster ", c1, " refcount=2 reference=1"),
          absl::StrFormat("ERROR OFLAG_COPIED data cluster: "
                          "l2_entry=%x refcount=2",
                          img.L2(0, 1)),
          absl::StrFormat("ERROR OFLAG_COPIED data cluster: "
                          "l2_entry=%x refcount=1",
                          img.L2(0, 2))));
  // And the lines are the ones qemu-img prints.
  CommandResult q = QemuCheckMode(dir.File("a.qcow2"), RepairMode::kNone);
  EXPECT_EQ(q.err, absl::StrCat(absl::StrJoin(r.messages, "\n"), "\n"));
}

TEST(CheckTest, RepairIsRecheckedLikeQemuImg) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  ASSERT_OK(BuildBase(Base::kPlain, dir.File("a.qcow2")));
  ASSERT_OK_AND_ASSIGN(RawImage img, RawImage::Load(dir.File("a.qcow2")));
  img.SetRefcount(img.DataCluster(1), 2);
  ASSERT_OK(img.Save(dir.File("a.qcow2")));
  ASSERT_OK_AND_ASSIGN(CheckResult r,
                       OurCheck(dir.File("a.qcow2"), RepairMode::kLeaks));
  EXPECT_TRUE(r.rechecked);
  EXPECT_EQ(r.leaks_fixed, 1u);
  EXPECT_EQ(r.leaks, 0u);
  ASSERT_GE(r.messages.size(), 2u);
  // The repair pass prints the leak, then "Repairing"; the second pass
  // finds nothing.
  EXPECT_EQ(r.recheck_first_message, r.messages.size());
  EXPECT_THAT(r.messages.back(), HasSubstr("Repairing cluster"));
}

// Persistent dirty bitmaps own clusters too (directory, tables, data).
TEST(CheckTest, PersistentBitmaps) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string path = dir.File("bm.qcow2");
  QemuImageSpec spec;
  spec.size = 32 << 20;
  ASSERT_OK(QemuCreate(path, spec));
  ASSERT_EQ(Cmd({"qemu-img", "bitmap", "--add", path, "b0"}).exit_code, 0);
  ASSERT_EQ(
      Cmd({"qemu-img", "bitmap", "--add", "-g", "512", path, "b1"}).exit_code,
      0);
  ASSERT_OK(QemuIo(path, {"write -P 1 0 10M", "write -P 2 20M 1M"}));
  ExpectCleanAndSameAsQemu(path);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> original, QemuReadAll(path));
  // Forget the refcount of the last cluster (bitmap metadata, written
  // last): the rebuilt structure must count every bitmap cluster.
  ASSERT_OK_AND_ASSIGN(RawImage img, RawImage::Load(path));
  img.SetRefcount(img.clusters() - 1, 0);
  ASSERT_OK(img.Save(path));
  ASSERT_OK_AND_ASSIGN(CheckResult r, OurCheck(path, RepairMode::kAll));
  EXPECT_EQ(ExitCode(r), 0) << Describe(r);
  EXPECT_EQ(QemuCheckMode(path, RepairMode::kNone).exit_code, 0);
  CommandResult info = Cmd({"qemu-img", "info", path});
  EXPECT_THAT(info.out, HasSubstr("name: b1"));
  EXPECT_THAT(info.out, ::testing::Not(HasSubstr("in-use")));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> data, QemuReadAll(path));
  EXPECT_TRUE(data == original);
}

TEST(CheckTest, ReportsMetadataOverlap) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  ASSERT_OK(BuildBase(Base::kPlain, dir.File("a.qcow2")));
  ASSERT_OK_AND_ASSIGN(RawImage img, RawImage::Load(dir.File("a.qcow2")));
  // A data cluster on top of the L2 table.
  img.SetL2(0, 1, kOflagCopied | img.L2Offset(0));
  ASSERT_OK(img.Save(dir.File("a.qcow2")));
  ASSERT_OK_AND_ASSIGN(CheckResult r,
                       OurCheck(dir.File("a.qcow2"), RepairMode::kNone));
  EXPECT_EQ(ExitCode(r), 2);
  EXPECT_THAT(r.messages,
              ::testing::Contains(HasSubstr(
                  "is used as L2 table and guest data (metadata overlap)")));
}

TEST(CheckTest, NotQcow2AndBadHeaders) {
  TempDir dir;
  ASSERT_OK(WriteFileBytes(dir.File("raw"), std::vector<uint8_t>(4096, 7)));
  auto r = OurCheck(dir.File("raw"), RepairMode::kNone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_OK(WriteFileBytes(dir.File("empty"), {}));
  EXPECT_FALSE(OurCheck(dir.File("empty"), RepairMode::kNone).ok());
  // A qcow2 magic with a hopeless header.
  std::vector<uint8_t> bad(512, 0);
  StoreBE32(&bad[0], kQcowMagic);
  StoreBE32(&bad[4], 3);
  StoreBE32(&bad[20], 40);  // cluster_bits
  ASSERT_OK(WriteFileBytes(dir.File("bad"), bad));
  r = OurCheck(dir.File("bad"), RepairMode::kNone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
}

TEST(CheckTest, RefusesTooManyClusters) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  QemuImageSpec spec;
  spec.size = 1 << 20;
  spec.cluster_size = 512;
  const std::string path = dir.File("big.qcow2");
  ASSERT_OK(QemuCreate(path, spec));
  // A sparse file whose end implies 2^28 + 1 clusters.
  ASSERT_EQ(truncate(path.c_str(), ((kMaxCheckClusters + 1) * 512)), 0);
  auto r = OurCheck(path, RepairMode::kNone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted)
      << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("clusters"));
}

// ---------------------------------------------------------------------------
// In-memory images, and a file that dies after N writes.

class MemoryImage {
 public:
  explicit MemoryImage(std::vector<uint8_t> bytes)
      : store_(std::make_shared<MemoryStore>()) {
    store_->bytes = std::move(bytes);
  }
  std::unique_ptr<File> Open() {
    return std::make_unique<MemoryFile>("mem.qcow2", store_, false);
  }
  std::vector<uint8_t>& bytes() { return store_->bytes; }

 private:
  std::shared_ptr<MemoryStore> store_;
};

// Fails every write and flush after the first `budget` writes, as if the
// machine had stopped there.
class DyingFile : public File {
 public:
  DyingFile(std::unique_ptr<File> base, int budget)
      : base_(std::move(base)), budget_(budget) {}
  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) override {
    return base_->ReadAt(offset, buf);
  }
  absl::Status WriteAt(uint64_t offset,
                       absl::Span<const uint8_t> data) override {
    if (writes_ >= budget_) return absl::UnavailableError("power cut");
    ++writes_;
    return base_->WriteAt(offset, data);
  }
  absl::Status Flush() override {
    if (writes_ >= budget_) return absl::UnavailableError("power cut");
    return base_->Flush();
  }
  absl::StatusOr<uint64_t> Size() override { return base_->Size(); }
  absl::Status Truncate(uint64_t size) override {
    return absl::UnavailableError("not expected");
  }
  const std::string& name() const override { return base_->name(); }
  int writes() const { return writes_; }

 private:
  std::unique_ptr<File> base_;
  const int budget_;
  int writes_ = 0;
};

TEST(CheckTest, MemoryFileImage) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  ASSERT_OK(BuildBase(Base::kSnapshot, dir.File("a.qcow2")));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> original,
                       QemuReadAll(dir.File("a.qcow2")));
  ASSERT_OK_AND_ASSIGN(RawImage img, RawImage::Load(dir.File("a.qcow2")));
  MemoryImage mem(img.bytes());
  {
    auto f = mem.Open();
    ASSERT_OK_AND_ASSIGN(CheckResult r, CheckImage(f.get(), RepairMode::kNone));
    EXPECT_EQ(ExitCode(r), 0) << Describe(r);
    EXPECT_GT(r.allocated_clusters, 0u);
  }
  img.SetRefcount(img.DataCluster(2), 0);  // needs a rebuild
  img.SetRefcount(img.DataCluster(3), 7);  // a leak
  img.SetL2(0, 1, img.L2(0, 1) & ~kOflagCopied);
  mem.bytes() = img.bytes();
  auto f = mem.Open();
  ASSERT_OK_AND_ASSIGN(CheckResult r, CheckImage(f.get(), RepairMode::kAll));
  EXPECT_EQ(ExitCode(r), 0) << Describe(r);
  EXPECT_TRUE(r.rechecked);
  EXPECT_GT(r.corruptions_fixed, 0u);
  ASSERT_OK(WriteFileBytes(dir.File("b.qcow2"), mem.bytes()));
  EXPECT_EQ(QemuCheckMode(dir.File("b.qcow2"), RepairMode::kNone).exit_code, 0);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> data,
                       QemuReadAll(dir.File("b.qcow2")));
  EXPECT_TRUE(data == original);
}

// Stops every repair after each possible number of writes: the image must
// still hold the guest's data, and a later repair must finish the job.
TEST(CheckTest, RepairSurvivesPowerCutAtEveryWrite) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  ASSERT_OK(BuildBase(Base::kSnapshot, dir.File("a.qcow2")));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> original,
                       QemuReadAll(dir.File("a.qcow2")));
  ASSERT_OK_AND_ASSIGN(RawImage img, RawImage::Load(dir.File("a.qcow2")));
  img.SetRefcount(img.DataCluster(2), 0);  // rebuild
  img.SetRefcount(img.DataCluster(3), 4);  // leak
  img.SetL1(0, img.L1(0) & ~kOflagCopied);
  img.Put32(img.header().snapshots_offset + 36, 8);  // snapshot table rewrite
  int total = -1;
  for (int budget = 0; total < 0 || budget <= total; ++budget) {
    SCOPED_TRACE(absl::StrCat("power cut after ", budget, " writes"));
    MemoryImage mem(img.bytes());
    DyingFile dying(mem.Open(), budget);
    auto r = CheckImage(&dying, RepairMode::kAll);
    ASSERT_TRUE(r.ok()) << r.status();
    if (dying.writes() < budget) total = dying.writes();  // ran to the end
    const std::string path = dir.File(absl::StrCat("cut", budget, ".qcow2"));
    ASSERT_OK(WriteFileBytes(path, mem.bytes()));
    // Readable, and the active layer still reads as before. (The snapshot
    // entry was damaged so that its data reads differently; only the
    // active layer is compared.)
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> data, QemuReadAll(path));
    EXPECT_TRUE(data == original);
    // The next repair completes.
    auto again = OurCheck(path, RepairMode::kAll);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(ExitCode(*again), 0) << Describe(*again);
    EXPECT_EQ(QemuCheckMode(path, RepairMode::kNone).exit_code, 0);
    unlink(path.c_str());
    ASSERT_LT(budget, 200) << "repair never finished";
  }
  EXPECT_GT(total, 3);
}

// ---------------------------------------------------------------------------
// The command line.

// The binary under test (the CMake test rules define QCOWTOOL_BIN).
std::string ToolPath() {
#ifdef QCOWTOOL_BIN
  return QCOWTOOL_BIN;
#else
  return testing::QcowtoolPath();
#endif
}

bool ToolHasCheck() {
  static const bool has = [] {
    CommandResult r = Cmd({ToolPath(), "check", "--help"});
    return r.exit_code == 0 &&
           r.out.find("qcowtool check") != std::string::npos;
  }();
  return has;
}

#define SKIP_WITHOUT_TOOL()                                               \
  do {                                                                    \
    SKIP_WITHOUT_QEMU();                                                  \
    if (!ToolHasCheck()) GTEST_SKIP() << "qcowtool has no check command"; \
  } while (0)

CommandResult Tool(std::vector<std::string> args) {
  args.insert(args.begin(), {ToolPath(), "check"});
  return Cmd(args);
}

// Runs both tools with `args` on copies of `bytes` at the same path and
// expects the same exit code and stdout; returns stderr of both.
void ExpectSameCli(const TempDir& dir, const std::vector<uint8_t>& bytes,
                   const std::vector<std::string>& args, bool compare_stderr) {
  const std::string path = dir.File("cli.qcow2");
  std::vector<std::string> qargs = {"qemu-img", "check"};
  qargs.insert(qargs.end(), args.begin(), args.end());
  qargs.push_back(path);
  std::vector<std::string> oargs = args;
  oargs.push_back(path);
  ASSERT_OK(WriteFileBytes(path, bytes));
  CommandResult q = Cmd(qargs);
  ASSERT_OK(WriteFileBytes(path, bytes));
  CommandResult o = Tool(oargs);
  SCOPED_TRACE(absl::StrJoin(args, " "));
  EXPECT_EQ(o.exit_code, q.exit_code) << o.err << "\n--- qemu:\n" << q.err;
  EXPECT_EQ(o.out, q.out);
  if (compare_stderr) {
    EXPECT_EQ(o.err, absl::StrReplaceAll(q.err, {{"qemu-img:", "qcowtool:"}}));
  }
}

TEST(CheckCliTest, SameOutputAsQemuImg) {
  SKIP_WITHOUT_TOOL();
  TempDir dir;
  ASSERT_OK(BuildBase(Base::kCompressed, dir.File("a.qcow2")));
  ASSERT_OK_AND_ASSIGN(RawImage img, RawImage::Load(dir.File("a.qcow2")));
  const std::vector<uint8_t> clean = img.bytes();
  for (const auto& args : std::vector<std::vector<std::string>>{
           {},
           {"--output=json"},
           {"-f", "qcow2", "--output", "human"},
           {"-r", "all"},
           {"-q"}}) {
    ExpectSameCli(dir, clean, args, true);
  }
  // Leaks only (exit 3), then repaired.
  img.SetRefcount(img.DataCluster(2), 2);
  const std::vector<uint8_t> leaky = img.bytes();
  for (const auto& args :
       std::vector<std::vector<std::string>>{{},
                                             {"--output=json"},
                                             {"-r", "leaks"},
                                             {"-r", "all", "--output=json"}}) {
    ExpectSameCli(dir, leaky, args, true);
  }
  // Corruption (exit 2), -r leaks cannot fix it, -r all can.
  img.SetRefcount(img.DataCluster(2), 1);
  img.SetL1(0, img.L1(0) & ~kOflagCopied);
  const std::vector<uint8_t> corrupt = img.bytes();
  for (const auto& args : std::vector<std::vector<std::string>>{
           {}, {"--output=json"}, {"-r", "leaks"}, {"-r", "all"}}) {
    ExpectSameCli(dir, corrupt, args, true);
  }
  // Needs a rebuild: -r leaks stops with "Check failed" (exit 1).
  img.SetRefcount(img.DataCluster(2), 0);
  ExpectSameCli(dir, img.bytes(), {"-r", "leaks"}, true);
  ExpectSameCli(dir, img.bytes(), {"--output=json"}, true);
}

TEST(CheckCliTest, ArgumentsAndExitCodes) {
  SKIP_WITHOUT_TOOL();
  TempDir dir;
  ASSERT_OK(BuildBase(Base::kPlain, dir.File("a.qcow2")));
  EXPECT_EQ(Tool({dir.File("a.qcow2")}).exit_code, 0);
  for (const auto& args : std::vector<std::vector<std::string>>{
           {},
           {"-r", "some", dir.File("a.qcow2")},
           {"--output=xml", dir.File("a.qcow2")},
           {"--bogus", dir.File("a.qcow2")},
           {dir.File("a.qcow2"), dir.File("a.qcow2")},
           {"-r"}}) {
    CommandResult r = Tool(args);
    EXPECT_EQ(r.exit_code, 1) << absl::StrJoin(args, " ");
    EXPECT_THAT(r.err, HasSubstr("usage: qcowtool check"));
    EXPECT_TRUE(r.out.empty());
  }
  CommandResult missing = Tool({dir.File("nonexistent.qcow2")});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("Could not open"));
  // Not qcow2: "does not support checks" (63) like qemu-img's raw driver;
  // with -f qcow2 it is an open error (1).
  ASSERT_OK(WriteFileBytes(dir.File("r.raw"), std::vector<uint8_t>(65536, 0)));
  EXPECT_EQ(Tool({dir.File("r.raw")}).exit_code,
            Cmd({"qemu-img", "check", dir.File("r.raw")}).exit_code);
  EXPECT_EQ(
      Tool({"-f", "qcow2", dir.File("r.raw")}).exit_code,
      Cmd({"qemu-img", "check", "-f", "qcow2", dir.File("r.raw")}).exit_code);
  EXPECT_EQ(
      Tool({"-f", "raw", dir.File("a.qcow2")}).exit_code,
      Cmd({"qemu-img", "check", "-f", "raw", dir.File("a.qcow2")}).exit_code);
}

TEST(CheckCliTest, JsonEscapesLikeQemu) {
  SKIP_WITHOUT_TOOL();
  TempDir dir;
  const std::string path = dir.File("na\"me \xc3\xa9.qcow2");
  ASSERT_OK(BuildBase(Base::kPlain, path));
  CommandResult q = Cmd({"qemu-img", "check", "--output=json", path});
  CommandResult o = Tool({"--output=json", path});
  EXPECT_EQ(o.out, q.out);
}

}  // namespace
}  // namespace qcow2::internal
