// SPDX-License-Identifier: Apache-2.0
// The overlay chain's lifecycle against QEMU: commit, rebase and stream.
// Each chain (depth 1 to 5, mixed cluster sizes, extended L2 on and off,
// raw at the bottom, a bottom smaller than the disk) is built once by
// qemu-img create and qemu-io writes, zero writes and discards, then copied
// twice: qcowtool runs the operation on one copy, qemu-img the matching
// one on the other. Then every file of our copy passes `qemu-img check`,
// every file reads as qemu-img's copy of it does (`qemu-img compare`, each
// through its own chain), the top reads as before where the operation must
// not change it, and `qemu-img info` shows the same backing names.
// `qcowtool stream` is checked against the qemu-img rebase that does the
// same. Also: Image::ChangeBackingFile's refusals.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "tests/util/json_lite.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::QemuLayerSpec;
using testing::QemuOp;

constexpr uint64_t kSize = 8 << 20;

CommandResult Tool(const std::string& program,
                   const std::vector<std::string>& args) {
  std::vector<std::string> argv = {program};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::Run(argv);
}

// A layer of `cluster` bytes (0: raw) with seeded random data, zero writes
// and discards over its first `size` bytes.
QemuLayerSpec Layer(uint32_t cluster, bool extended_l2, uint64_t seed,
                    uint64_t size = kSize, const std::string& compat = "1.1") {
  QemuLayerSpec l;
  if (cluster == 0) {
    l.image.format = "raw";
    l.image.size = size;
    l.raw_fill_seed = seed;
    return l;
  }
  l.image = testing::Qcow2Spec(compat, cluster, extended_l2);
  l.image.size = size;
  testing::RandomOpsConfig rc;
  rc.seed = seed;
  rc.size = size;
  rc.cluster_size = cluster;
  rc.writes = 8;
  rc.zero_writes = 3;
  rc.zero_unmap_every = 2;
  rc.compressed_writes = 0;
  rc.discards = 2;
  rc.max_length = 1 << 20;
  l.ops = testing::RandomQemuOps(rc);
  return l;
}

struct ChainConfig {
  std::string name;
  std::vector<QemuLayerSpec> layers;  // bottom first
};

std::vector<ChainConfig> Chains() {
  return {
      {"d1_c64k", {Layer(65536, false, 1), Layer(65536, false, 2)}},
      {"d2_raw_c4k_c64kxl2",
       {Layer(0, false, 3, 6 << 20), Layer(4096, false, 4),
        Layer(65536, true, 5)}},
      {"d3_v2c512_c2m_c32kxl2",
       {Layer(512, false, 6, kSize, "0.10"), Layer(2 << 20, false, 7),
        Layer(32768, true, 8), Layer(16384, true, 9)}},
      {"d4_raw_c64kxl2_c1m_c4k_c64k",
       {Layer(0, false, 10, 5 << 20), Layer(65536, true, 11),
        Layer(1 << 20, false, 12), Layer(4096, false, 13),
        Layer(65536, false, 14)}},
      {"d5_c1m_c512_c64kxl2_c32k_c16kxl2_c64k",
       {Layer(1 << 20, false, 15), Layer(512, false, 16),
        Layer(65536, true, 17), Layer(32768, false, 18),
        Layer(16384, true, 19), Layer(65536, false, 20)}},
  };
}

enum class Op {
  kCommit,         // commit TOP
  kCommitKeep,     // commit -d TOP
  kCommitBottom,   // commit -b layer0 TOP
  kCommitMiddle,   // commit -b layer1 TOP (3 images or more)
  kRebaseBottom,   // rebase -F FMT -b layer0 TOP
  kRebaseOther,    // rebase -F qcow2 -b other.qcow2 TOP (outside the chain)
  kRebaseUnsafe,   // rebase -u -F qcow2 -b other.qcow2 TOP
  kRebaseDrop,     // rebase -u TOP
  kFlatten,        // rebase -b "" TOP
  kStreamBottom,   // stream -b layer0 TOP = rebase -F FMT -b layer0 TOP
  kStreamAll,      // stream TOP = rebase -b "" TOP
};

const char* OpName(Op op) {
  switch (op) {
    case Op::kCommit: return "commit";
    case Op::kCommitKeep: return "commit_d";
    case Op::kCommitBottom: return "commit_b_bottom";
    case Op::kCommitMiddle: return "commit_b_middle";
    case Op::kRebaseBottom: return "rebase_bottom";
    case Op::kRebaseOther: return "rebase_other";
    case Op::kRebaseUnsafe: return "rebase_u_other";
    case Op::kRebaseDrop: return "rebase_u_none";
    case Op::kFlatten: return "rebase_flatten";
    case Op::kStreamBottom: return "stream_b_bottom";
    case Op::kStreamAll: return "stream_all";
  }
  return "?";
}

constexpr Op kOps[] = {Op::kCommit,       Op::kCommitKeep,   Op::kCommitBottom,
                       Op::kCommitMiddle, Op::kRebaseBottom, Op::kRebaseOther,
                       Op::kRebaseUnsafe, Op::kRebaseDrop,   Op::kFlatten,
                       Op::kStreamBottom, Op::kStreamAll};

struct Case {
  ChainConfig chain;
  Op op;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.chain.name << "_" << OpName(c.op);
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (const ChainConfig& c : Chains()) {
    for (Op op : kOps) out.push_back({c, op});
  }
  return out;
}

// The backing names `qemu-img info` shows for `image`, with `dir` cut out
// of the full name.
std::string BackingInfo(const std::string& image, const std::string& dir) {
  CommandResult r = Tool("qemu-img", {"info", "-U", "--output=json", image});
  if (r.exit_code != 0) return "info failed: " + r.err;
  absl::StatusOr<testing::json::Value> v = testing::json::Parse(r.out);
  if (!v.ok()) return "unparsable info";
  std::string out;
  for (const char* key : {"backing-filename", "backing-filename-format",
                          "full-backing-filename"}) {
    const testing::json::Value* f = v->Find(key);
    out += absl::StrCat(key, "=",
                        f ? absl::StrReplaceAll(f->as_string(), {{dir, "DIR"}})
                          : "(none)",
                        "\n");
  }
  return out;
}

class LifecycleTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
    const Case& c = GetParam();
    orig_ = dir_.File("orig");
    fs::create_directories(orig_);
    ASSERT_OK_AND_ASSIGN(paths_, testing::QemuBuildChain(orig_, c.chain.layers));
    // A backing file from outside the chain, for rebase.
    QemuLayerSpec other = Layer(65536, false, 99);
    ASSERT_OK(testing::QemuCreate(orig_ + "/other.qcow2", other.image));
    ASSERT_OK(testing::QemuIo(orig_ + "/other.qcow2",
                              testing::ToQemuIoCommands(other.ops)));
    for (const char* d : {"ours", "qemu"}) {
      fs::copy(orig_, dir_.File(d), fs::copy_options::recursive);
    }
  }

  std::string Name(size_t i) const {
    return fs::path(paths_[i]).filename().string();
  }
  const std::string& Format(size_t i) const {
    return GetParam().chain.layers[i].image.format;
  }

  // The arguments for qcowtool (ours) or qemu-img, top `top`; empty when
  // the operation does not apply to this chain.
  std::vector<std::string> Args(Op op, bool ours, const std::string& top) {
    const size_t n = paths_.size();
    switch (op) {
      case Op::kCommit:
        return {"commit", top};
      case Op::kCommitKeep:
        return {"commit", "-d", top};
      case Op::kCommitBottom:  // even the top's own backing: -b implies -d
        return {"commit", "-b", Name(0), top};
      case Op::kCommitMiddle:
        if (n < 3) return {};
        return {"commit", "-b", Name(1), top};
      case Op::kRebaseBottom:
        return {"rebase", "-F", Format(0), "-b", Name(0), top};
      case Op::kRebaseOther:
        return {"rebase", "-F", "qcow2", "-b", "other.qcow2", top};
      case Op::kRebaseUnsafe:
        return {"rebase", "-u", "-F", "qcow2", "-b", "other.qcow2", top};
      case Op::kRebaseDrop:
        return {"rebase", "-u", top};
      case Op::kFlatten:
        return {"rebase", "-b", "", top};
      case Op::kStreamBottom:
        if (ours) return {"stream", "-b", Name(0), top};
        return {"rebase", "-F", Format(0), "-b", Name(0), top};
      case Op::kStreamAll:
        if (ours) return {"stream", top};
        return {"rebase", "-b", "", top};
    }
    return {};
  }

  // Whether the top's disk reads as before the operation.
  static bool KeepsDisk(Op op) {
    return op != Op::kRebaseUnsafe && op != Op::kRebaseDrop;
  }

  testing::TempDir dir_;
  std::string orig_;
  std::vector<std::string> paths_;  // in orig_, bottom first
};

TEST_P(LifecycleTest, SameAsQemuImg) {
  const Op op = GetParam().op;
  const std::string ours = dir_.File("ours"), qemu = dir_.File("qemu");
  const std::string top = Name(paths_.size() - 1);
  std::vector<std::string> our_args = Args(op, true, ours + "/" + top);
  if (our_args.empty()) GTEST_SKIP() << "not for a chain this short";
  CommandResult q = Tool("qemu-img", Args(op, false, qemu + "/" + top));
  ASSERT_EQ(q.exit_code, 0) << q.out << q.err;
  CommandResult r = Tool(testing::QcowtoolPath(), our_args);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out, q.out);

  for (size_t i = 0; i < paths_.size(); ++i) {
    const std::string ours_i = ours + "/" + Name(i);
    if (Format(i) == "qcow2") {
      CommandResult c = testing::QemuCheck(ours_i);
      EXPECT_EQ(c.exit_code, 0) << Name(i) << ": " << c.out << c.err;
    }
    // Each file through its own chain, as qemu-img's copy of it reads.
    CommandResult cmp = Tool("qemu-img", {"compare", "-U", "-f", Format(i),
                                          "-F", Format(i), ours_i,
                                          qemu + "/" + Name(i)});
    EXPECT_EQ(cmp.exit_code, 0) << Name(i) << ": " << cmp.out << cmp.err;
  }
  if (KeepsDisk(op)) {
    CommandResult cmp =
        Tool("qemu-img", {"compare", "-U", ours + "/" + top, orig_ + "/" + top});
    EXPECT_EQ(cmp.exit_code, 0) << "the top's disk changed: " << cmp.out
                                << cmp.err;
  }
  EXPECT_EQ(BackingInfo(ours + "/" + top, ours),
            BackingInfo(qemu + "/" + top, qemu));
}

INSTANTIATE_TEST_SUITE_P(Chains, LifecycleTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) {
                           return absl::StrCat(info.param.chain.name, "_",
                                               OpName(info.param.op));
                         });

// --- Image::ChangeBackingFile on its own.

class ChangeBackingFileTest : public ::testing::Test {
 protected:
  std::unique_ptr<Image> Create(uint32_t cluster, const std::string& name) {
    CreateOptions co;
    co.size = 1 << 20;
    co.cluster_size = cluster;
    EXPECT_OK(CreateImage(dir_.File(name), co));
    OpenOptions oo;
    oo.read_write = true;
    auto img = Image::Open(dir_.File(name), oo);
    EXPECT_TRUE(img.ok()) << img.status();
    return img.ok() ? std::move(img).value() : nullptr;
  }
  testing::TempDir dir_;
};

TEST_F(ChangeBackingFileTest, NewNameReadsBackAndQemuSeesIt) {
  SKIP_WITHOUT_QEMU();
  auto base = Create(65536, "base.qcow2");
  ASSERT_OK(base->Close());
  auto img = Create(65536, "top.qcow2");
  ASSERT_OK(img->ChangeBackingFile("base.qcow2", "qcow2"));
  ASSERT_OK(img->Close());
  EXPECT_EQ(BackingInfo(dir_.File("top.qcow2"), dir_.path()),
            "backing-filename=base.qcow2\nbacking-filename-format=qcow2\n"
            "full-backing-filename=DIR/base.qcow2\n");
  EXPECT_EQ(testing::QemuCheck(dir_.File("top.qcow2")).exit_code, 0);
  OpenOptions oo;
  ASSERT_OK_AND_ASSIGN(auto reopened, Image::Open(dir_.File("top.qcow2"), oo));
  EXPECT_EQ(reopened->chain_length(), 2);
  EXPECT_EQ(reopened->GetChainInfo()[0].backing_file, "base.qcow2");
}

TEST_F(ChangeBackingFileTest, RefusesNamesThatDoNotFit) {
  auto img = Create(512, "small.qcow2");
  // 512-byte clusters: a 1000-byte name is within qcow2's limit but does
  // not fit after the header.
  absl::Status s = img->ChangeBackingFile(std::string(1000, 'x'), "raw");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("does not fit"), std::string::npos)
      << s;
  s = img->ChangeBackingFile(std::string(1024, 'x'), "raw");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = img->ChangeBackingFile("", "qcow2");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = img->ChangeBackingFile(std::string("a\0b", 3), "raw");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // Nothing was written: still no backing file.
  ASSERT_OK(img->Close());
  OpenOptions oo;
  ASSERT_OK_AND_ASSIGN(auto reopened,
                       Image::Open(dir_.File("small.qcow2"), oo));
  EXPECT_EQ(reopened->GetChainInfo()[0].backing_file, "");
}

TEST_F(ChangeBackingFileTest, RawTopIsUnimplemented) {
  CreateOptions co;
  co.size = 1 << 20;
  co.format = ImageFormat::kRaw;
  ASSERT_OK(CreateImage(dir_.File("disk.raw"), co));
  OpenOptions oo;
  oo.read_write = true;
  oo.format = "raw";
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(dir_.File("disk.raw"), oo));
  EXPECT_EQ(img->ChangeBackingFile("x.qcow2", "qcow2").code(),
            absl::StatusCode::kUnimplemented);
}

// qemu-img's refusals, through qcowtool: same exit status.
TEST(LifecycleCliTest, ErrorsAsQemuImg) {
  SKIP_WITHOUT_QEMU();
  testing::TempDir dir;
  ASSERT_OK_AND_ASSIGN(
      auto paths, testing::QemuBuildChain(
                      dir.path(), {Layer(65536, false, 1), Layer(65536, false, 2)}));
  const std::string top = paths[1], base = paths[0];
  const std::string raw = dir.File("disk.raw");
  ASSERT_EQ(Tool("qemu-img", {"create", "-q", "-f", "raw", raw, "1M"}).exit_code,
            0);
  struct Row {
    std::vector<std::string> args;
    std::string message;
  } rows[] = {
      {{"rebase", top}, "Must specify backing file (-b) or use unsafe mode"},
      {{"rebase", "-b", "layer0.qcow2", top},
       "backing format must be specified"},
      {{"rebase", "-F", "qcow2", "-b", "missing.qcow2", top},
       "Could not open new backing file 'missing.qcow2'"},
      {{"commit", base}, "Image does not have a backing file"},
      {{"commit", "-b", "missing.qcow2", top},
       "Did not find 'missing.qcow2' in the backing chain of"},
      {{"stream", "-b", "missing.qcow2", top},
       "Did not find 'missing.qcow2' in the backing chain of"},
      {{"commit", top, top}, "Expecting one image file name"},
      {{"rebase", "-f", "raw", "-u", "-F", "qcow2", "-b", "layer0.qcow2", raw},
       "Could not change the backing file to 'layer0.qcow2'"},
  };
  for (const Row& row : rows) {
    CommandResult r = Tool(testing::QcowtoolPath(), row.args);
    EXPECT_EQ(r.exit_code, 1) << row.message << ": " << r.err;
    EXPECT_NE(r.err.find(row.message), std::string::npos) << r.err;
    if (row.args[0] != "stream") {
      CommandResult q = Tool("qemu-img", row.args);
      EXPECT_EQ(q.exit_code, 1) << q.err;
      EXPECT_NE(q.err.find(row.message), std::string::npos) << q.err;
    }
  }
  // None of them changed anything.
  EXPECT_EQ(BackingInfo(top, dir.path()),
            "backing-filename=layer0.qcow2\nbacking-filename-format=qcow2\n"
            "full-backing-filename=DIR/layer0.qcow2\n");
}

}  // namespace
}  // namespace qcow2
