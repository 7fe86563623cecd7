// SPDX-License-Identifier: Apache-2.0
// qcowtool's writing commands (create, snapshot, io) against QEMU 7.2, both
// ways:
//  (a) images `qcowtool create` makes, over a spread of -o options, must
//      pass `qemu-img check`, show the asked options in `qemu-img info`,
//      take qemu-io writes at unaligned offsets, and then read back through
//      `qcowtool io` / `qcowtool convert` exactly as qemu-img reads them;
//  (b) images `qemu-img create` makes, over the same spread, are written by
//      `qcowtool io` (pattern writes, zero writes, discards) and must read
//      back through qemu-io / qemu-img as the model says, and pass check;
// plus external snapshots, argument errors, and qemu-compatible output.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/util/json_lite.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2::testing {
namespace {

constexpr uint64_t K = 1024;
constexpr uint64_t M = 1024 * 1024;

// Every image in the spread is this big; the write plan below fits in it.
constexpr uint64_t kSize = 8 * M;
// Backing files hold this pattern over [0, kBaseFill) and zeros above.
constexpr uint8_t kBasePattern = 0x77;
constexpr uint64_t kBaseFill = 6 * M;

// The binary under test. testing::QcowtoolPath() lives in the test
// utility library, which is not compiled with QCOWTOOL_BIN (it would look
// "qcowtool" up on PATH), so the macro wins here.
std::string ToolPath() {
#ifdef QCOWTOOL_BIN
  return QCOWTOOL_BIN;
#else
  return QcowtoolPath();
#endif
}

CommandResult Tool(std::vector<std::string> args) {
  args.insert(args.begin(), ToolPath());
  return Run(args);
}

std::string Describe(const CommandResult& r) {
  return absl::StrCat("exit ", r.exit_code, "\nstdout:\n", r.out, "\nstderr:\n",
                      r.err);
}

absl::StatusOr<json::Value> QemuInfo(const std::string& path) {
  CommandResult r = testing::Run({"qemu-img", "info", "--output=json", path});
  if (r.exit_code != 0) {
    return absl::InternalError(absl::StrCat("qemu-img info: ", r.err));
  }
  return json::Parse(r.out);
}

// The image's contents as `qcowtool convert -O raw` writes them.
absl::StatusOr<std::vector<uint8_t>> OurReadAll(const std::string& image) {
  const std::string raw = image + ".ours.raw";
  CommandResult r = Tool({"convert", "-O", "raw", image, raw});
  if (r.exit_code != 0) {
    return absl::InternalError(
        absl::StrCat("qcowtool convert ", image, ": ", Describe(r)));
  }
  auto bytes = ReadFileBytes(raw);
  unlink(raw.c_str());
  return bytes;
}

// Offset of the first byte where `a` and `b` differ (or the shorter size).
size_t FirstDifference(const std::vector<uint8_t>& a,
                       const std::vector<uint8_t>& b) {
  size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return i;
  }
  return n;
}

#define EXPECT_SAME_BYTES(a, b)                                                \
  do {                                                                         \
    const auto& qcow2_a_ = (a);                                                \
    const auto& qcow2_b_ = (b);                                                \
    EXPECT_EQ(qcow2_a_.size(), qcow2_b_.size());                               \
    EXPECT_TRUE(qcow2_a_ == qcow2_b_)                                          \
        << "first difference at byte " << FirstDifference(qcow2_a_, qcow2_b_); \
  } while (0)

// ---------------------------------------------------------------------------
// The write plan: ranges at unaligned offsets that cross 512 B, 64 KiB and
// 2 MiB boundaries, never overlapping, inside kSize.

struct PlannedWrite {
  enum Kind { kPattern, kZero, kZeroUnmap, kDiscard } kind = kPattern;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint8_t pattern = 0;

  // The byte every guest byte of the range reads as afterwards (discards
  // are only planned where nothing lies below).
  uint8_t expected() const { return kind == kPattern ? pattern : 0; }

  std::string WriteCommand() const {
    switch (kind) {
      case kPattern:
        return absl::StrCat("write -P ", pattern, " ", offset, " ", length);
      case kZero:
        return absl::StrCat("write -z ", offset, " ", length);
      case kZeroUnmap:
        return absl::StrCat("write -z -u ", offset, " ", length);
      case kDiscard:
        return absl::StrCat("discard ", offset, " ", length);
    }
    return "";
  }
  std::string ReadCommand() const {
    return absl::StrCat("read -P ", expected(), " ", offset, " ", length);
  }
};

std::vector<PlannedWrite> QemuWritePlan() {
  using W = PlannedWrite;
  return {
      {W::kPattern, 1, 1000, 0x11},
      {W::kPattern, 64 * K - 7, 20, 0x22},  // crosses 64 KiB
      {W::kPattern, 2 * M - 3, 10, 0x33},   // crosses 2 MiB
      {W::kPattern, 3 * M + 333, 200000, 0x44},
      {W::kZero, 5 * M + 77, 70000, 0},
      {W::kPattern, kSize - 4321, 4320, 0x55},  // ends 1 byte short of the end
  };
}

// What `qcowtool io` writes in (b): the same kinds of ranges, plus zero
// writes with unmap and discards above kBaseFill (where any backing file
// reads as zeros, so that every discard semantics agrees).
std::vector<PlannedWrite> OurWritePlan() {
  using W = PlannedWrite;
  return {
      {W::kPattern, 3, 777, 0xa1},
      {W::kPattern, 128 * K - 100, 300, 0xa2},  // crosses 64 KiB
      {W::kPattern, 4 * M - 1, 2, 0xa3},        // crosses 2 MiB
      {W::kPattern, 1 * M + 4097, 300000, 0xa4},
      {W::kZero, 2 * M + 511, 9000, 0},
      {W::kZeroUnmap, 5 * M + 1, 140000, 0},
      {W::kPattern, 6 * M + 1000, 400000, 0xa5},
      {W::kDiscard, 6 * M + 70000, 150000, 0},  // inside the write above
      {W::kDiscard, 7 * M + 5, 3000, 0},
      {W::kPattern, kSize - 700, 700, 0xa6},  // up to the end
  };
}

void ApplyToModel(const std::vector<PlannedWrite>& plan,
                  std::vector<uint8_t>* disk) {
  for (const PlannedWrite& w : plan) {
    std::fill(disk->begin() + w.offset, disk->begin() + w.offset + w.length,
              w.expected());
  }
}

// The ranges a plan leaves as the last writer did (for read -P checks):
// later entries of the plans above never overlap earlier ones except the
// discard inside 6M+1000, which is checked through the whole-disk model.
std::vector<std::string> ReadCommands(const std::vector<PlannedWrite>& plan) {
  std::vector<std::string> cmds;
  for (const PlannedWrite& w : plan) {
    if (w.offset == 6 * M + 1000) continue;  // partly discarded later
    cmds.push_back(w.ReadCommand());
  }
  return cmds;
}

std::vector<std::string> WriteCommands(const std::vector<PlannedWrite>& plan) {
  std::vector<std::string> cmds;
  for (const PlannedWrite& w : plan) cmds.push_back(w.WriteCommand());
  return cmds;
}

// `qcowtool io [-r] image -c CMD...`.
CommandResult OurIo(const std::string& image,
                    const std::vector<std::string>& cmds,
                    bool read_only = false) {
  std::vector<std::string> args = {"io"};
  if (read_only) args.push_back("-r");
  args.push_back(image);
  for (const std::string& c : cmds) {
    args.push_back("-c");
    args.push_back(c);
  }
  return Tool(args);
}

// A backing file for the spread: qcow2 or raw, kSize bytes, kBasePattern
// over [0, kBaseFill), written by qemu-io.
absl::Status MakeBase(const std::string& path, const std::string& format) {
  QemuImageSpec spec;
  spec.format = format;
  spec.size = kSize;
  if (auto s = QemuCreate(path, spec); !s.ok()) return s;
  return QemuIo(path,
                {absl::StrCat("write -P ", kBasePattern, " 0 ", kBaseFill)},
                format);
}

// ---------------------------------------------------------------------------
// (a) Images we create.

enum class Backing {
  kNone,
  kQcow2,         // -b base.qcow2 -F qcow2, no size
  kRawProbed,     // -b base.raw (format probed), no size
  kRelativeUp,    // sub/top.qcow2 with -b ../base.qcow2
  kRelativeDown,  // top.qcow2 with -b sub/base.raw -F raw
};

struct CreateCase {
  std::string name;
  std::vector<std::string> options;  // each one -o argument
  Backing backing = Backing::kNone;
  // What qemu-img info must show.
  uint32_t cluster_size = 65536;
  std::string compat = "1.1";
  uint32_t refcount_bits = 16;
  bool extended_l2 = false;
  std::string compression_type = "zlib";
  bool lazy_refcounts = false;
  std::string preallocation = "off";
};

std::vector<CreateCase> CreateCases() {
  std::vector<CreateCase> cases;
  auto add = [&](CreateCase c) { cases.push_back(std::move(c)); };
  add({.name = "defaults"});
  add({.name = "c512", .options = {"cluster_size=512"}, .cluster_size = 512});
  add({.name = "c2m",
       .options = {"cluster_size=2M"},
       .cluster_size = 2 * 1024 * 1024});
  add({.name = "c4k_rb1",
       .options = {"cluster_size=4k,refcount_bits=1"},
       .cluster_size = 4096,
       .refcount_bits = 1});
  add({.name = "rb64", .options = {"refcount_bits=64"}, .refcount_bits = 64});
  add({.name = "v2", .options = {"compat=0.10"}, .compat = "0.10"});
  add({.name = "v2_c1k",
       .options = {"compat=0.10", "cluster_size=1k"},
       .cluster_size = 1024,
       .compat = "0.10"});
  add({.name = "xl2", .options = {"extended_l2=on"}, .extended_l2 = true});
  add({.name = "c16k_xl2_zstd",
       .options = {"cluster_size=16k", "extended_l2=on,compression_type=zstd"},
       .cluster_size = 16384,
       .extended_l2 = true,
       .compression_type = "zstd"});
  add({.name = "zstd_rb2",
       .options = {"compression_type=zstd,refcount_bits=2"},
       .refcount_bits = 2,
       .compression_type = "zstd"});
  add({.name = "lazy",
       .options = {"lazy_refcounts=on"},
       .lazy_refcounts = true});
  add({.name = "prealloc_metadata",
       .options = {"preallocation=metadata"},
       .preallocation = "metadata"});
  add({.name = "c2m_prealloc_metadata",
       .options = {"preallocation=metadata,cluster_size=2M"},
       .cluster_size = 2 * 1024 * 1024,
       .preallocation = "metadata"});
  add({.name = "c512_prealloc_falloc",
       .options = {"preallocation=falloc,cluster_size=512"},
       .cluster_size = 512,
       .preallocation = "falloc"});
  add({.name = "prealloc_full_rb8",
       .options = {"preallocation=full", "refcount_bits=8"},
       .refcount_bits = 8,
       .preallocation = "full"});
  add({.name = "backing_qcow2", .backing = Backing::kQcow2});
  add({.name = "backing_raw_probed_c4k",
       .options = {"cluster_size=4k"},
       .backing = Backing::kRawProbed,
       .cluster_size = 4096});
  add({.name = "backing_relative_up_xl2",
       .options = {"extended_l2=on"},
       .backing = Backing::kRelativeUp,
       .extended_l2 = true});
  add({.name = "backing_relative_down_v2",
       .options = {"compat=0.10"},
       .backing = Backing::kRelativeDown,
       .compat = "0.10"});
  add({.name = "backing_xl2_prealloc_metadata",
       .options = {"extended_l2=on,preallocation=metadata,cluster_size=32k"},
       .backing = Backing::kQcow2,
       .cluster_size = 32768,
       .extended_l2 = true,
       .preallocation = "metadata"});
  add({.name = "backing_c512_rb64_lazy",
       .options = {"cluster_size=512,refcount_bits=64,lazy_refcounts=on"},
       .backing = Backing::kQcow2,
       .cluster_size = 512,
       .refcount_bits = 64,
       .lazy_refcounts = true});
  return cases;
}

void PrintTo(const CreateCase& c, std::ostream* os) { *os << c.name; }

class CreatedByUsTest : public ::testing::TestWithParam<CreateCase> {};

TEST_P(CreatedByUsTest, QemuChecksWritesAndWeReadBack) {
  SKIP_WITHOUT_QEMU();
  const CreateCase& c = GetParam();
  TempDir dir;
  ASSERT_EQ(mkdir(dir.File("sub").c_str(), 0755), 0);

  std::string top = dir.File("top.qcow2");
  std::vector<std::string> args = {"create", "-f", "qcow2"};
  for (const std::string& o : c.options) {
    args.push_back("-o");
    args.push_back(o);
  }
  std::string backing_name, backing_fmt;
  switch (c.backing) {
    case Backing::kNone:
      break;
    case Backing::kQcow2:
      ASSERT_OK(MakeBase(dir.File("base.qcow2"), "qcow2"));
      backing_name = "base.qcow2";
      backing_fmt = "qcow2";
      args.insert(args.end(), {"-b", backing_name, "-F", "qcow2"});
      break;
    case Backing::kRawProbed:
      ASSERT_OK(MakeBase(dir.File("base.raw"), "raw"));
      backing_name = "base.raw";
      backing_fmt = "raw";
      args.insert(args.end(), {"-b", backing_name});
      break;
    case Backing::kRelativeUp:
      ASSERT_OK(MakeBase(dir.File("base.qcow2"), "qcow2"));
      top = dir.File("sub/top.qcow2");
      backing_name = "../base.qcow2";
      backing_fmt = "qcow2";
      args.insert(args.end(), {"-b", backing_name, "-F", "qcow2"});
      break;
    case Backing::kRelativeDown:
      ASSERT_OK(MakeBase(dir.File("sub/base.raw"), "raw"));
      backing_name = "sub/base.raw";
      backing_fmt = "raw";
      args.insert(args.end(), {"-b", backing_name, "-F", "raw"});
      break;
  }
  args.push_back(top);
  // With a backing file the size comes from it.
  if (c.backing == Backing::kNone) args.push_back("8M");

  CommandResult r = Tool(args);
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(absl::StartsWith(
      r.out, absl::StrCat("Formatting '", top,
                          "', fmt=qcow2 cluster_size=", c.cluster_size, " ")))
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, absl::StrCat(" size=", kSize, " ")))
      << r.out;

  CommandResult check = QemuCheck(top);
  EXPECT_EQ(check.exit_code, 0) << Describe(check);

  ASSERT_OK_AND_ASSIGN(json::Value info, QemuInfo(top));
  EXPECT_EQ(info["format"].as_string(), "qcow2");
  EXPECT_EQ(info["virtual-size"].as_uint64(), kSize);
  EXPECT_EQ(info["cluster-size"].as_uint64(), c.cluster_size);
  const json::Value& data = info["format-specific"]["data"];
  EXPECT_EQ(data["compat"].as_string(), c.compat);
  EXPECT_EQ(data["refcount-bits"].as_uint64(), c.refcount_bits);
  EXPECT_EQ(data["compression-type"].as_string(), c.compression_type);
  if (c.compat == "1.1") {
    EXPECT_EQ(data["extended-l2"].as_bool(), c.extended_l2);
    EXPECT_EQ(data["lazy-refcounts"].as_bool(), c.lazy_refcounts);
  }
  if (c.backing == Backing::kNone) {
    EXPECT_EQ(info.Find("backing-filename"), nullptr);
  } else {
    EXPECT_EQ(info["backing-filename"].as_string(), backing_name);
    EXPECT_EQ(info["backing-filename-format"].as_string(), backing_fmt);
  }
  if (c.preallocation == "metadata") {
    // Every range has a host cluster.
    ASSERT_OK_AND_ASSIGN(json::Value map, QemuMapJson(top));
    for (const json::Value& e : map.array()) {
      if (e["depth"].as_int64() != 0) continue;
      EXPECT_NE(e.Find("offset"), nullptr) << e.ToString();
    }
  } else if (c.preallocation == "falloc" || c.preallocation == "full") {
    EXPECT_GE(info["actual-size"].as_uint64(), kSize);
  }

  // Before any write, the image reads as its backing file (or zeros).
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> before, QemuReadAll(top));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> ours_before, OurReadAll(top));
  EXPECT_SAME_BYTES(ours_before, before);
  std::vector<uint8_t> model(kSize, 0);
  if (c.backing != Backing::kNone) {
    std::fill(model.begin(), model.begin() + kBaseFill, kBasePattern);
  }
  EXPECT_SAME_BYTES(before, model);

  // qemu-io writes, we read.
  const std::vector<PlannedWrite> plan = QemuWritePlan();
  ASSERT_OK(QemuIo(top, WriteCommands(plan)));
  ApplyToModel(plan, &model);
  check = QemuCheck(top);
  EXPECT_EQ(check.exit_code, 0) << Describe(check);

  r = OurIo(top, ReadCommands(plan), /*read_only=*/true);
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> theirs, QemuReadAll(top));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> ours, OurReadAll(top));
  EXPECT_SAME_BYTES(theirs, model);
  EXPECT_SAME_BYTES(ours, theirs);
}

INSTANTIATE_TEST_SUITE_P(Spread, CreatedByUsTest,
                         ::testing::ValuesIn(CreateCases()),
                         [](const ::testing::TestParamInfo<CreateCase>& p) {
                           return p.param.name;
                         });

// ---------------------------------------------------------------------------
// (b) Images qemu-img creates, written by us.

struct QemuCase {
  std::string name;
  QemuImageSpec spec;
  std::string backing_format;  // "" none, else a base of that format
};

std::vector<QemuCase> QemuCases() {
  std::vector<QemuCase> cases;
  auto add = [&](std::string name, auto tweak, std::string backing = "") {
    QemuCase c;
    c.name = std::move(name);
    c.spec.size = kSize;
    tweak(c.spec);
    c.backing_format = std::move(backing);
    cases.push_back(std::move(c));
  };
  add("defaults", [](QemuImageSpec&) {});
  add("c512", [](QemuImageSpec& s) { s.cluster_size = 512; });
  add("c2m", [](QemuImageSpec& s) { s.cluster_size = 2 * M; });
  add("c4k_rb1", [](QemuImageSpec& s) {
    s.cluster_size = 4096;
    s.refcount_bits = 1;
  });
  add("rb64", [](QemuImageSpec& s) { s.refcount_bits = 64; });
  add("v2", [](QemuImageSpec& s) { s.compat = "0.10"; });
  add("v2_c2k", [](QemuImageSpec& s) {
    s.compat = "0.10";
    s.cluster_size = 2048;
  });
  add("xl2", [](QemuImageSpec& s) { s.extended_l2 = true; });
  add("c16k_xl2_zstd", [](QemuImageSpec& s) {
    s.cluster_size = 16384;
    s.extended_l2 = true;
    s.compression_type = "zstd";
  });
  add("c2m_xl2", [](QemuImageSpec& s) {
    s.cluster_size = 2 * M;
    s.extended_l2 = true;
  });
  add("lazy_rb4", [](QemuImageSpec& s) {
    s.lazy_refcounts = true;
    s.refcount_bits = 4;
  });
  add("prealloc_metadata",
      [](QemuImageSpec& s) { s.preallocation = "metadata"; });
  add("c512_prealloc_falloc", [](QemuImageSpec& s) {
    s.cluster_size = 512;
    s.preallocation = "falloc";
  });
  add("prealloc_full_rb32", [](QemuImageSpec& s) {
    s.preallocation = "full";
    s.refcount_bits = 32;
  });
  add("v2_prealloc_metadata", [](QemuImageSpec& s) {
    s.compat = "0.10";
    s.preallocation = "metadata";
  });
  add(
      "backing_qcow2", [](QemuImageSpec&) {}, "qcow2");
  add(
      "backing_raw_c4k", [](QemuImageSpec& s) { s.cluster_size = 4096; },
      "raw");
  add(
      "backing_qcow2_v2_c512",
      [](QemuImageSpec& s) {
        s.compat = "0.10";
        s.cluster_size = 512;
      },
      "qcow2");
  add(
      "backing_qcow2_xl2_zstd",
      [](QemuImageSpec& s) {
        s.extended_l2 = true;
        s.compression_type = "zstd";
      },
      "qcow2");
  add(
      "backing_raw_xl2_prealloc_metadata",
      [](QemuImageSpec& s) {
        s.extended_l2 = true;
        s.preallocation = "metadata";
      },
      "raw");
  return cases;
}

void PrintTo(const QemuCase& c, std::ostream* os) { *os << c.name; }

class CreatedByQemuTest : public ::testing::TestWithParam<QemuCase> {};

TEST_P(CreatedByQemuTest, WeWriteQemuReads) {
  SKIP_WITHOUT_QEMU();
  const QemuCase& c = GetParam();
  TempDir dir;
  QemuImageSpec spec = c.spec;
  std::vector<uint8_t> model(kSize, 0);
  if (!c.backing_format.empty()) {
    const std::string base = "base." + c.backing_format;
    ASSERT_OK(MakeBase(dir.File(base), c.backing_format));
    spec.backing_file = base;
    spec.backing_format = c.backing_format;
    std::fill(model.begin(), model.begin() + kBaseFill, kBasePattern);
  }
  const std::string top = dir.File("top.qcow2");
  ASSERT_OK(QemuCreate(top, spec));

  const std::vector<PlannedWrite> plan = OurWritePlan();
  CommandResult r = OurIo(top, WriteCommands(plan));
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.out, "wrote 777/777 bytes at offset 3\n"))
      << r.out;
  ApplyToModel(plan, &model);

  CommandResult check = QemuCheck(top);
  EXPECT_EQ(check.exit_code, 0) << Describe(check);
  EXPECT_OK(QemuIo(top, ReadCommands(plan)));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> theirs, QemuReadAll(top));
  EXPECT_SAME_BYTES(theirs, model);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> ours, OurReadAll(top));
  EXPECT_SAME_BYTES(ours, model);

  // qemu-io can keep writing what we wrote, and we read that back.
  ASSERT_OK(QemuIo(top, {"write -P 0xee 6291000 200000"}));
  std::fill(model.begin() + 6291000, model.begin() + 6291000 + 200000, 0xee);
  check = QemuCheck(top);
  EXPECT_EQ(check.exit_code, 0) << Describe(check);
  ASSERT_OK_AND_ASSIGN(ours, OurReadAll(top));
  EXPECT_SAME_BYTES(ours, model);
}

INSTANTIATE_TEST_SUITE_P(Spread, CreatedByQemuTest,
                         ::testing::ValuesIn(QemuCases()),
                         [](const ::testing::TestParamInfo<QemuCase>& p) {
                           return p.param.name;
                         });

// Raw images, both ways.
TEST(RawTest, CreateAndWriteRaw) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string img = dir.File("disk.raw");
  CommandResult r = Tool({"create", "-f", "raw", img, "3M"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out,
            absl::StrCat("Formatting '", img, "', fmt=raw size=", 3 * M, "\n"));
  r = OurIo(img, {"write -P 0x3c 1 5000", "write -z 4000 10", "flush"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_OK(QemuIo(img,
                   {"read -P 0x3c 1 3999", "read -P 0 4000 10",
                    "read -P 0x3c 4010 991", "read -P 0 5001 10000"},
                   "raw"));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, ReadFileBytes(img));
  EXPECT_EQ(bytes.size(), 3 * M);

  r = Tool({"create", "-q", "-f", "raw", "-o", "preallocation=full",
            dir.File("full.raw"), "1M"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out, "");
  struct stat st;
  ASSERT_EQ(stat(dir.File("full.raw").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, static_cast<off_t>(M));
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, M);
}

// ---------------------------------------------------------------------------
// The "Formatting" line is qemu-img's, byte for byte.

TEST(CreateOutputTest, FormattingLineMatchesQemuImg) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  ASSERT_OK(MakeBase(dir.File("base.qcow2"), "qcow2"));
  const std::vector<std::vector<std::string>> variants = {
      {"1M"},
      {"-o", "cluster_size=4k,extended_l2=off", "1000"},
      {"-o", "compat=0.10", "-o", "refcount_bits=16", "5G"},
      {"-o", "compat=1.1,preallocation=metadata,lazy_refcounts=on", "1M"},
      {"-o", "compression_type=zstd,extended_l2=on,refcount_bits=1", "2M"},
      {"-o", "compat=v3", "0x100000"},
      {"-b", "base.qcow2", "-F", "qcow2"},
      {"-b", "base.qcow2", "-F", "qcow2", "-o", "cluster_size=2M", "16M"},
      {"-o", "size=3M"},
  };
  for (const auto& v : variants) {
    const std::string img = dir.File("img.qcow2");
    // Options first, then the file, then a trailing size if any.
    std::vector<std::string> opts = v;
    std::string size;
    if (!opts.empty() && opts.back().find('=') == std::string::npos &&
        (opts.size() == 1 || opts[opts.size() - 2][0] != '-')) {
      size = opts.back();
      opts.pop_back();
    }
    std::vector<std::string> qemu = {"qemu-img", "create", "-f", "qcow2"};
    qemu.insert(qemu.end(), opts.begin(), opts.end());
    qemu.push_back(img);
    if (!size.empty()) qemu.push_back(size);
    CommandResult want = testing::Run(qemu);
    ASSERT_EQ(want.exit_code, 0) << Describe(want);

    std::vector<std::string> ours = {"create", "-f", "qcow2"};
    ours.insert(ours.end(), opts.begin(), opts.end());
    ours.push_back(img);
    if (!size.empty()) ours.push_back(size);
    CommandResult got = Tool(ours);  // also replaces qemu-img's image
    ASSERT_EQ(got.exit_code, 0) << Describe(got);
    EXPECT_EQ(got.out, want.out) << absl::StrJoin(v, " ");
    CommandResult check = QemuCheck(img);
    EXPECT_EQ(check.exit_code, 0) << absl::StrJoin(v, " ") << Describe(check);
  }
}

TEST(CreateTest, SizeForms) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  struct Case {
    std::vector<std::string> args;
    uint64_t want;
  } cases[] = {
      {{"512"}, 512},
      {{"4k"}, 4096},
      {{"10G"}, 10ull << 30},
      {{"1.5M"}, 3 * M / 2},
      {{"0x300000"}, 3 * M},
      {{"1000"}, 1024},  // rounded up to 512, like qemu-img
      {{"-o", "size=7M"}, 7 * M},
      {{"-o", "size=2M,size=5M"}, 5 * M},  // the last one wins
  };
  for (const Case& c : cases) {
    const std::string img = dir.File("s.qcow2");
    std::vector<std::string> args = {"create", "-q"};
    std::vector<std::string> rest = c.args;
    if (rest.size() == 1) {
      args.push_back(img);
      args.push_back(rest[0]);
    } else {
      args.insert(args.end(), rest.begin(), rest.end());
      args.push_back(img);
    }
    CommandResult r = Tool(args);
    ASSERT_EQ(r.exit_code, 0) << absl::StrJoin(c.args, " ") << Describe(r);
    ASSERT_OK_AND_ASSIGN(json::Value info, QemuInfo(img));
    EXPECT_EQ(info["virtual-size"].as_uint64(), c.want)
        << absl::StrJoin(c.args, " ");
  }
}

TEST(CreateTest, ReplacesAnExistingFileLikeQemuImg) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string img = dir.File("old.qcow2");
  ASSERT_OK(WriteFileBytes(img, std::vector<uint8_t>(100000, 0xab)));
  CommandResult r = Tool({"create", "-q", img, "2M"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(QemuCheck(img).exit_code, 0);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, QemuReadAll(img));
  EXPECT_EQ(bytes, std::vector<uint8_t>(2 * M, 0));
}

TEST(CreateTest, RefusesToBecomeItsOwnBackingFile) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string img = dir.File("a.qcow2");
  ASSERT_OK(MakeBase(img, "qcow2"));
  CommandResult r = Tool({"create", "-b", "a.qcow2", "-F", "qcow2", img});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, "its own backing file")) << r.err;
  // The image is untouched.
  EXPECT_EQ(QemuCheck(img).exit_code, 0);
  EXPECT_OK(QemuIo(img, {absl::StrCat("read -P ", kBasePattern, " 0 1M")}));
}

TEST(CreateTest, OptionHelp) {
  CommandResult r = Tool({"create", "-o", "help"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  for (const char* key : {"cluster_size=", "extended_l2=", "compression_type=",
                          "refcount_bits=", "lazy_refcounts=", "compat=",
                          "preallocation=", "size=", "backing_file="}) {
    EXPECT_TRUE(absl::StrContains(r.out, key)) << key << "\n" << r.out;
  }
  r = Tool({"create", "-f", "raw", "-o", "?"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.out, "Supported raw options")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "cluster_size")) << r.out;
  r = Tool({"create", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(absl::StartsWith(r.out, "usage: qcowtool create")) << r.out;
}

// ---------------------------------------------------------------------------
// Argument errors.

struct ErrorCase {
  const char* name;
  std::vector<std::string> args;  // "@" stands for the image path
  int exit_code;
  const char* message;  // in stderr
  bool usage = true;    // exit 1 prints the usage (not for image errors)
};

TEST(ArgumentErrorTest, CreateErrors) {
  TempDir dir;
  const std::string img = dir.File("x.qcow2");
  const ErrorCase cases[] = {
      {"unknown key",
       {"create", "-o", "foo=1", "@", "1M"},
       1,
       "qcowtool: unknown option 'foo'"},
      {"unknown key in a list",
       {"create", "-o", "cluster_size=4k,frobnicate=on", "@", "1M"},
       1,
       "unknown option 'frobnicate'"},
      {"unsupported qemu key",
       {"create", "-o", "encryption=on", "@", "1M"},
       1,
       "option 'encryption' is not supported"},
      {"qcow2 key for raw",
       {"create", "-f", "raw", "-o", "cluster_size=4k", "@", "1M"},
       1,
       "option 'cluster_size' is not valid for raw images"},
      {"bad size", {"create", "@", "12Q"}, 1, "invalid size '12Q'"},
      {"negative size", {"create", "@", "-5"}, 1, ""},
      {"missing file", {"create"}, 1, "expecting an image file name"},
      {"missing size", {"create", "@"}, 1, "image creation needs a size"},
      {"size twice",
       {"create", "-o", "size=1M", "@", "1M"},
       1,
       "given only once"},
      {"extra argument",
       {"create", "@", "1M", "junk"},
       1,
       "unexpected argument 'junk'"},
      {"cluster_size=3000",
       {"create", "-o", "cluster_size=3000", "@", "1M"},
       1,
       "cluster size 3000 must be a power of two between 512 and 2M"},
      {"cluster_size=4M",
       {"create", "-o", "cluster_size=4M", "@", "1M"},
       1,
       "must be a power of two between 512 and 2M"},
      {"extended_l2 with compat=0.10",
       {"create", "-o", "extended_l2=on,compat=0.10", "@", "1M"},
       1,
       "extended L2 entries (extended_l2=on) require compat=1.1"},
      {"extended_l2 with 4k clusters",
       {"create", "-o", "extended_l2=on,cluster_size=4k", "@", "1M"},
       1,
       "at least 16k"},
      {"zstd with compat=0.10",
       {"create", "-o", "compat=0.10", "-o", "compression_type=zstd", "@",
        "1M"},
       1,
       "compression_type=zstd requires compat=1.1"},
      {"lazy with compat=0.10",
       {"create", "-o", "compat=0.10,lazy_refcounts=on", "@", "1M"},
       1,
       "require compat=1.1"},
      {"refcount_bits with compat=0.10",
       {"create", "-o", "compat=0.10,refcount_bits=1", "@", "1M"},
       1,
       "require compat=1.1"},
      {"refcount_bits=3",
       {"create", "-o", "refcount_bits=3", "@", "1M"},
       1,
       "refcount_bits 3 must be a power of two up to 64"},
      {"refcount_bits=128",
       {"create", "-o", "refcount_bits=128", "@", "1M"},
       1,
       "refcount_bits 128"},
      {"bad compat",
       {"create", "-o", "compat=1.2", "@", "1M"},
       1,
       "compat '1.2'"},
      {"bad bool",
       {"create", "-o", "extended_l2=maybe", "@", "1M"},
       1,
       "expects 'on' or 'off'"},
      {"bad compression",
       {"create", "-o", "compression_type=lzo", "@", "1M"},
       1,
       "compression_type 'lzo'"},
      {"bad preallocation",
       {"create", "-o", "preallocation=some", "@", "1M"},
       1,
       "preallocation 'some'"},
      {"raw metadata preallocation",
       {"create", "-f", "raw", "-o", "preallocation=metadata", "@", "1M"},
       1,
       "preallocation 'metadata'"},
      {"value-less non-bool",
       {"create", "-o", "cluster_size", "@", "1M"},
       1,
       "needs a value"},
      {"bad format",
       {"create", "-f", "vmdk", "@", "1M"},
       1,
       "unknown image format 'vmdk'"},
      {"raw with backing",
       {"create", "-f", "raw", "-b", "a", "@", "1M"},
       1,
       "raw images cannot have a backing file"},
      {"backing format without backing",
       {"create", "-F", "raw", "@", "1M"},
       1,
       "needs a backing file"},
      {"backing format bad",
       {"create", "-b", "a", "-F", "vmdk", "@", "1M"},
       1,
       "backing format 'vmdk'"},
      {"backing twice",
       {"create", "-b", "a", "-o", "backing_file=b", "@"},
       1,
       "given twice"},
      {"backing with preallocation",
       {"create", "-b", "a", "-o", "preallocation=metadata", "@", "1M"},
       1,
       "extended_l2=on"},
      {"unsafe without size",
       {"create", "-u", "-b", "a", "@"},
       1,
       "-u needs the image size"},
      {"missing backing file",
       {"create", "-b", "nothere.qcow2", "@"},
       1,
       "qcowtool: cannot open backing file",
       false},
      {"unknown flag",
       {"create", "-Z", "@", "1M"},
       1,
       "usage: qcowtool create"},
  };
  for (const ErrorCase& c : cases) {
    std::vector<std::string> args;
    for (const std::string& a : c.args) args.push_back(a == "@" ? img : a);
    CommandResult r = Tool(args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.name << "\n" << Describe(r);
    EXPECT_TRUE(absl::StrContains(r.err, c.message)) << c.name << "\n" << r.err;
    if (c.usage && c.exit_code == 1) {
      EXPECT_TRUE(absl::StrContains(r.err, "usage: qcowtool create"))
          << c.name << "\n"
          << r.err;
    }
    struct stat st;
    EXPECT_NE(stat(img.c_str(), &st), 0) << c.name << ": image was created";
  }
}

TEST(ArgumentErrorTest, BadOptionsLeaveAnExistingImageAlone) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string img = dir.File("keep.qcow2");
  ASSERT_OK(MakeBase(img, "qcow2"));
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"create", "-o", "foo=1", img, "1M"},
        {"create", "-o", "extended_l2=on,compat=0.10", img, "1M"},
        {"create", "-b", "missing.qcow2", "-F", "qcow2", img}}) {
    CommandResult r = Tool(args);
    EXPECT_NE(r.exit_code, 0) << Describe(r);
  }
  EXPECT_EQ(QemuCheck(img).exit_code, 0);
  EXPECT_OK(
      QemuIo(img, {absl::StrCat("read -P ", kBasePattern, " 0 ", kBaseFill)}));
}

TEST(ArgumentErrorTest, IoErrors) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string img = dir.File("io.qcow2");
  QemuImageSpec spec;
  spec.size = M;
  ASSERT_OK(QemuCreate(img, spec));
  ASSERT_OK(QemuIo(img, {"write -P 0x42 0 64k"}));
  const ErrorCase cases[] = {
      {"unknown command",
       {"io", "@", "-c", "frob 0 1"},
       1,
       "unknown command 'frob'"},
      {"unknown command after good ones",
       {"io", "@", "-c", "write -P 1 0 512", "-c", "frobnicate"},
       1,
       "unknown command 'frobnicate'"},
      {"no commands", {"io", "@"}, 1, "at least one -c"},
      {"no image", {"io", "-c", "flush"}, 1, "expecting an image name"},
      {"missing length",
       {"io", "@", "-c", "read 0"},
       1,
       "expecting an offset and a length"},
      {"bad number", {"io", "@", "-c", "read 0 12Q"}, 1, "invalid size '12Q'"},
      {"bad pattern",
       {"io", "@", "-c", "write -P 300 0 1"},
       1,
       "300 is not a valid pattern byte"},
      {"bad pattern text",
       {"io", "@", "-c", "read -P 0xzz 0 1"},
       1,
       "0xzz is not a valid pattern byte"},
      {"-z with -P",
       {"io", "@", "-c", "write -z -P 1 0 1"},
       1,
       "-z and -P cannot be used together"},
      {"-u without -z", {"io", "@", "-c", "write -u 0 1"}, 1, "-u requires -z"},
      {"unknown flag",
       {"io", "@", "-c", "read -x 0 1"},
       1,
       "unknown option -x"},
      {"flush with arguments",
       {"io", "@", "-c", "flush now"},
       1,
       "flush takes no arguments"},
      {"past the end",
       {"io", "@", "-c", "write 1M 1"},
       1,
       "the range ends past the end of the image (1048576 bytes)"},
      {"write with -r",
       {"io", "-r", "@", "-c", "write 0 1"},
       1,
       "needs the image opened read-write"},
      {"pattern mismatch",
       {"io", "@", "-c", "read -P 0x42 0 64k", "-c", "read -P 0x42 1000 65536"},
       3,
       "qcowtool: read -P 0x42 1000 65536: Pattern verification failed at "
       "offset 65536, 1000 bytes (read 0x00, expected 0x42)"},
      {"missing image",
       {"io", "nothere.qcow2", "-c", "read 0 1"},
       2,
       "qcowtool: "},
  };
  for (const ErrorCase& c : cases) {
    std::vector<std::string> args;
    for (const std::string& a : c.args) args.push_back(a == "@" ? img : a);
    CommandResult r = Tool(args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.name << "\n" << Describe(r);
    EXPECT_TRUE(absl::StrContains(r.err, c.message)) << c.name << "\n" << r.err;
  }
  // Nothing above wrote anything: the argument errors were found before
  // the first command ran.
  EXPECT_EQ(QemuCheck(img).exit_code, 0);
  EXPECT_OK(QemuIo(img, {"read -P 0x42 0 64k", "read -P 0 64k 960k"}));
}

TEST(IoTest, StopsAtTheFirstFailingCommand) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string img = dir.File("stop.qcow2");
  QemuImageSpec spec;
  spec.size = M;
  ASSERT_OK(QemuCreate(img, spec));
  CommandResult r = OurIo(
      img, {"write -P 0x10 0 4k", "read -P 0x11 0 4k", "write -P 0x12 8k 4k"});
  EXPECT_EQ(r.exit_code, 3) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.out, "wrote 4096/4096 bytes at offset 0"));
  EXPECT_FALSE(absl::StrContains(r.out, "offset 8192")) << r.out;
  EXPECT_OK(QemuIo(img, {"read -P 0x10 0 4k", "read -P 0 4k 1020k"}));
}

// ---------------------------------------------------------------------------
// io output in qemu-io's formats.

TEST(IoOutputTest, ResultLinesLikeQemuIo) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string img = dir.File("out.qcow2");
  ASSERT_EQ(Tool({"create", "-q", img, "1M"}).exit_code, 0);
  CommandResult r =
      OurIo(img, {"write 0x1000 4k", "read -P 0xcd 4096 4096", "write -z 0 512",
                  "discard 64k 64k", "read -q 0 1", "flush", "length"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::vector<std::string> lines = absl::StrSplit(r.out, '\n');
  ASSERT_GE(lines.size(), 9u) << r.out;
  EXPECT_EQ(lines[0], "wrote 4096/4096 bytes at offset 4096");
  EXPECT_TRUE(absl::StartsWith(lines[1], "4 KiB, 1 ops; ")) << lines[1];
  EXPECT_TRUE(absl::StrContains(lines[1], " sec (")) << lines[1];
  EXPECT_TRUE(absl::EndsWith(lines[1], " ops/sec)")) << lines[1];
  EXPECT_EQ(lines[2], "read 4096/4096 bytes at offset 4096");
  EXPECT_EQ(lines[4], "wrote 512/512 bytes at offset 0");
  EXPECT_TRUE(absl::StartsWith(lines[5], "512 bytes, 1 ops; ")) << lines[5];
  EXPECT_EQ(lines[6], "discard 65536/65536 bytes at offset 65536");
  EXPECT_TRUE(absl::StartsWith(lines[7], "64 KiB, 1 ops; ")) << lines[7];
  EXPECT_EQ(lines[8], "1 MiB");  // read -q and flush print nothing

  r = OurIo(img, {"read -v 4095 20"}, /*read_only=*/true);
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  CommandResult want =
      testing::Run({"qemu-io", "-r", "-c", "read -v 4095 20", img});
  ASSERT_EQ(want.exit_code, 0);
  // The dump lines (the timing line differs).
  EXPECT_EQ(r.out.substr(0, r.out.find("read 20/20")),
            want.out.substr(0, want.out.find("read 20/20")));
}

TEST(IoOutputTest, MapAndInfoLikeQemuIo) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  ASSERT_OK(MakeBase(dir.File("base.qcow2"), "qcow2"));
  struct Case {
    std::string name;
    QemuImageSpec spec;
    std::vector<std::string> writes;
  };
  std::vector<Case> cases(4);
  cases[0].name = "plain";
  cases[0].spec.size = kSize;
  cases[0].writes = {"write 100 1", "write -z 1M 64k", "write 3M 2M"};
  cases[1].name = "overlay";
  cases[1].spec.backing_file = "base.qcow2";
  cases[1].spec.backing_format = "qcow2";
  cases[1].writes = {"write 5000 70000", "write -z -u 4M 128k"};
  cases[2].name = "v2_xl2less";
  cases[2].spec.size = 3 * M;
  cases[2].spec.compat = "0.10";
  cases[2].writes = {"write 0 1"};
  cases[3].name = "xl2_zstd_lazy";
  cases[3].spec.size = 3 * 1024 * M;
  cases[3].spec.extended_l2 = true;
  cases[3].spec.compression_type = "zstd";
  cases[3].spec.lazy_refcounts = true;
  cases[3].writes = {"write 2G 1"};
  for (const Case& c : cases) {
    const std::string img = dir.File(c.name + ".qcow2");
    ASSERT_OK(QemuCreate(img, c.spec));
    CommandResult r = OurIo(img, c.writes);
    ASSERT_EQ(r.exit_code, 0) << c.name << Describe(r);
    for (const char* cmd : {"map", "info"}) {
      CommandResult ours = OurIo(img, {cmd}, /*read_only=*/true);
      CommandResult want = testing::Run({"qemu-io", "-r", "-c", cmd, img});
      ASSERT_EQ(want.exit_code, 0) << Describe(want);
      EXPECT_EQ(ours.exit_code, 0) << Describe(ours);
      EXPECT_EQ(ours.out, want.out) << c.name << " " << cmd;
    }
  }
}

// ---------------------------------------------------------------------------
// snapshot.

TEST(SnapshotTest, OverlayWithItsOwnOptions) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  ASSERT_OK(MakeBase(base, "qcow2"));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> base_before, QemuReadAll(base));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> base_file_before,
                       ReadFileBytes(base));

  const std::string over = dir.File("over.qcow2");
  CommandResult r = Tool({"snapshot", "-o", "cluster_size=16k", "-o",
                          "extended_l2=on,compression_type=zstd", base, over});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.out,
                                "backing_file=base.qcow2 "
                                "backing_fmt=qcow2"))
      << r.out;

  ASSERT_OK_AND_ASSIGN(json::Value info, QemuInfo(over));
  EXPECT_EQ(info["cluster-size"].as_uint64(), 16384u);
  EXPECT_EQ(info["virtual-size"].as_uint64(), kSize);
  EXPECT_TRUE(info["format-specific"]["data"]["extended-l2"].as_bool());
  EXPECT_EQ(info["format-specific"]["data"]["compression-type"].as_string(),
            "zstd");
  EXPECT_EQ(info["backing-filename"].as_string(), "base.qcow2");
  EXPECT_EQ(info["backing-filename-format"].as_string(), "qcow2");

  const std::vector<PlannedWrite> plan = OurWritePlan();
  r = OurIo(over, WriteCommands(plan));
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  std::vector<uint8_t> model = base_before;
  ApplyToModel(plan, &model);

  EXPECT_EQ(QemuCheck(over).exit_code, 0);
  EXPECT_EQ(QemuCheck(base).exit_code, 0);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> over_bytes, QemuReadAll(over));
  EXPECT_SAME_BYTES(over_bytes, model);
  EXPECT_OK(QemuIo(over, ReadCommands(plan)));
  // Bytes between our writes still come from the base.
  EXPECT_OK(QemuIo(over, {absl::StrCat("read -P ", kBasePattern, " 780 ",
                                       128 * K - 100 - 780)}));
  // The base is unchanged, to the byte.
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> base_file_after,
                       ReadFileBytes(base));
  EXPECT_TRUE(base_file_after == base_file_before);
}

// Overlays get extended L2 entries unless told otherwise (or their
// cluster size cannot have them).
TEST(SnapshotTest, ExtendedL2ByDefault) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  ASSERT_OK(MakeBase(base, "qcow2"));
  struct Case {
    std::vector<std::string> flags;
    bool extended_l2;
    uint64_t cluster_size;
  };
  const Case cases[] = {
      {{}, true, 65536},
      {{"--no-extended-l2"}, false, 65536},
      {{"-o", "extended_l2=off"}, false, 65536},
      {{"-o", "cluster_size=4k"}, false, 4096},
      {{"-o", "cluster_size=16k"}, true, 16384},
      {{"-o", "compression_type=zstd,cluster_size=2M"}, true, 2u << 20},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string over = dir.File(absl::StrCat("o", n++, ".qcow2"));
    std::vector<std::string> argv = {"snapshot", "-q"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    argv.push_back(base);
    argv.push_back(over);
    CommandResult r = Tool(argv);
    ASSERT_EQ(r.exit_code, 0) << Describe(r);
    ASSERT_OK_AND_ASSIGN(json::Value info, QemuInfo(over));
    const std::string what = absl::StrJoin(c.flags, " ");
    EXPECT_EQ(info["format-specific"]["data"]["extended-l2"].as_bool(),
              c.extended_l2)
        << what;
    EXPECT_EQ(info["cluster-size"].as_uint64(), c.cluster_size) << what;
    // QEMU writes into it and reads the base through it.
    absl::Status io = QemuIo(
        over, {"write -P 7 4096 4096", "read -P 7 4096 4096",
               absl::StrCat("read -P ", kBasePattern, " 0 4096")});
    EXPECT_TRUE(io.ok()) << what << ": " << io;
    EXPECT_EQ(QemuCheck(over).exit_code, 0) << what;
  }
}

TEST(SnapshotTest, BackingNameAndFormat) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  ASSERT_EQ(mkdir(dir.File("sub").c_str(), 0755), 0);
  ASSERT_OK(MakeBase(dir.File("base.raw"), "raw"));

  // Same directory (spelled differently): the bare name; raw is probed.
  CommandResult r = Tool(
      {"snapshot", "-q", dir.File("sub/../base.raw"), dir.File("s1.qcow2")});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out, "");
  ASSERT_OK_AND_ASSIGN(json::Value info, QemuInfo(dir.File("s1.qcow2")));
  EXPECT_EQ(info["backing-filename"].as_string(), "base.raw");
  EXPECT_EQ(info["backing-filename-format"].as_string(), "raw");
  EXPECT_EQ(info["virtual-size"].as_uint64(), kSize);

  // Another directory: an absolute path. A chain of snapshots works.
  r = Tool({"snapshot", "-q", dir.File("s1.qcow2"), dir.File("sub/s2.qcow2")});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  ASSERT_OK_AND_ASSIGN(info, QemuInfo(dir.File("sub/s2.qcow2")));
  const std::string backing = info["backing-filename"].as_string();
  EXPECT_TRUE(absl::StartsWith(backing, "/")) << backing;
  EXPECT_TRUE(absl::EndsWith(backing, "/s1.qcow2")) << backing;
  EXPECT_EQ(info["backing-filename-format"].as_string(), "qcow2");

  r = OurIo(dir.File("sub/s2.qcow2"), {"write -P 9 6M 1"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(QemuCheck(dir.File("sub/s2.qcow2")).exit_code, 0);
  EXPECT_OK(QemuIo(dir.File("sub/s2.qcow2"),
                   {absl::StrCat("read -P ", kBasePattern, " 0 ", kBaseFill),
                    "read -P 9 6M 1", "read -P 0 6291457 2097151"}));

  // An explicit -F, and -o size= growing the overlay.
  r = Tool({"snapshot", "-q", "-F", "raw", "-o", "size=10M",
            dir.File("base.raw"), dir.File("sub/s3.qcow2")});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  ASSERT_OK_AND_ASSIGN(info, QemuInfo(dir.File("sub/s3.qcow2")));
  EXPECT_EQ(info["virtual-size"].as_uint64(), 10 * M);
  EXPECT_EQ(info["backing-filename-format"].as_string(), "raw");
}

TEST(SnapshotTest, Errors) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  ASSERT_OK(MakeBase(base, "qcow2"));
  const std::string existing = dir.File("existing.qcow2");
  ASSERT_OK(MakeBase(existing, "qcow2"));

  CommandResult r = Tool({"snapshot", base, existing});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, "already exists")) << r.err;
  EXPECT_OK(
      QemuIo(existing, {absl::StrCat("read -P ", kBasePattern, " 0 1M")}));

  // Internal snapshots (tests/interop_snapshot_test.cc has the rest).
  r = Tool({"snapshot", "-l", base});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out, "");
  r = Tool({"snapshot", "-c", "before-upgrade", base});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  r = Tool({"snapshot", "-l", "-d", "x", base});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, "Cannot mix")) << r.err;
  r = Tool({"snapshot", "-a", "missing", base});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, "Could not apply snapshot 'missing'"))
      << r.err;
  r = Tool({"snapshot", "-d", "before-upgrade", base});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);

  r = Tool({"snapshot", dir.File("nothere.qcow2"), dir.File("o.qcow2")});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, "cannot open backing file")) << r.err;

  r = Tool({"snapshot", "-o", "bogus=1", base, dir.File("o.qcow2")});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, "unknown option 'bogus'")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "usage: qcowtool snapshot")) << r.err;

  r = Tool({"snapshot", "-o", "cluster_size=4k,backing_file=x", base,
            dir.File("o.qcow2")});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, "-o backing_file cannot be used"))
      << r.err;

  r = Tool({"snapshot", base});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, "expecting an image and an overlay"))
      << r.err;

  struct stat st;
  EXPECT_NE(stat(dir.File("o.qcow2").c_str(), &st), 0);

  r = Tool({"snapshot", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(absl::StartsWith(r.out, "usage: qcowtool snapshot")) << r.out;
}

// ---------------------------------------------------------------------------
// Library contract checks found through the CLI.

// Image::Discard is documented as "afterwards it reads as the backing chain
// below (or zeros with no backing file)".
// Image::Discard's contract: the range reads as zeros afterwards, never as
// the backing file's data (as QEMU does for version 3 images), and qemu-io
// agrees on what the image holds.
TEST(LibraryContractTest, DiscardReadsAsZeros) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  ASSERT_OK(MakeBase(dir.File("base.qcow2"), "qcow2"));
  const std::string over = dir.File("over.qcow2");
  ASSERT_EQ(Tool({"snapshot", "-q", dir.File("base.qcow2"), over}).exit_code,
            0);
  CommandResult r = OurIo(
      over, {"write -P 1 0 128k", "discard 0 128k", "read -P 0 0 128k"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  CommandResult q =
      qcow2::testing::Run({"qemu-io", "-c", "read -P 0 0 128k", over});
  EXPECT_EQ(q.exit_code, 0) << q.out << q.err;
  EXPECT_EQ(q.out.find("failed"), std::string::npos) << q.out;
  EXPECT_EQ(QemuCheck(over).exit_code, 0);
}

// The refcount table of a 512 B-cluster image fills up once the refcount
// blocks it can list cover all host clusters (64 table entries x 512 B x
// 4096 / refcount_bits: 4 MiB with 32-bit, 2 MiB with 64-bit refcounts;
// the spread above covers 16-bit at 8 MiB through preallocation) and must
// grow. Writing past that point must work on images qemu-img made.
TEST(LibraryContractTest, RefcountTableGrowsWithSmallClusters) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  struct Case {
    std::string name;
    uint32_t refcount_bits;
    uint64_t write_bytes;
  } cases[] = {{"rb32", 32, 5 * M}, {"rb64", 64, 3 * M}};
  for (const Case& c : cases) {
    QemuImageSpec spec;
    spec.size = 16 * M;
    spec.cluster_size = 512;
    spec.refcount_bits = c.refcount_bits;
    const std::string img = dir.File(c.name + ".qcow2");
    ASSERT_OK(QemuCreate(img, spec));
    CommandResult r =
        OurIo(img, {absl::StrCat("write -q -P 5 0 ", c.write_bytes)});
    EXPECT_EQ(r.exit_code, 0) << c.name << "\n" << Describe(r);
    CommandResult check = QemuCheck(img);
    EXPECT_EQ(check.exit_code, 0) << c.name << "\n" << Describe(check);
    EXPECT_OK(QemuIo(img, {absl::StrCat("read -P 5 0 ", c.write_bytes)}));
  }
}

// An overlay created with a backing file, extended L2 entries and
// preallocation=metadata must still read its backing file (qemu-img leaves
// the preallocated subclusters unallocated).
TEST(LibraryContractTest, PreallocatedOverlayReadsItsBackingFile) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  ASSERT_OK(MakeBase(dir.File("base.qcow2"), "qcow2"));
  const std::string top = dir.File("top.qcow2");
  CommandResult r =
      Tool({"create", "-q", "-o", "extended_l2=on,preallocation=metadata", "-b",
            "base.qcow2", "-F", "qcow2", top});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_OK(
      QemuIo(top, {absl::StrCat("read -P ", kBasePattern, " 0 ", kBaseFill)}));
}

}  // namespace
}  // namespace qcow2::testing
