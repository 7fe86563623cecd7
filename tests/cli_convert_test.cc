// SPDX-License-Identifier: Apache-2.0
// qcowtool convert against qemu-img convert. Each case runs both on the
// same sources (a qcow2 chain, a raw file with zero runs, a compressed
// image) with the same flags, into two outputs (for -n: two identical
// prepared targets). QEMU judges ours: `qemu-img compare` with the source
// equal, `qemu-img check` clean, and `qemu-img map --output=json` the same
// allocation as qemu-img's own output (what is data, zero or left to the
// backing file, host offsets aside; zeros count as zeros whether flagged
// or unallocated), so that -S, -B and -n leave out what qemu-img leaves
// out and nothing more. Refusals print qemu-img's message.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/util/json_lite.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::CommandResult;
using testing::RunShell;

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// The sources every case may use, made once per test in `dir`:
//  - base.qcow2 (64 MiB, 8 MiB of data) and top.qcow2 over it (data, zero
//    clusters, a cluster written with zeros, a compressed cluster);
//  - mixed.raw: random data, a 1 MiB zero run inside data, text, 4 KiB
//    zero holes between data blocks, a hole at the end;
//  - comp.qcow2: mixed.raw compressed by qemu-img (4 KiB clusters).
constexpr char kSources[] =
    "qemu-img create -q -f qcow2 base.qcow2 64M\n"
    "qemu-io -c 'write -P 1 0 8M' -c 'write -P 0 5M 512k' base.qcow2\n"
    "qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2\n"
    "qemu-io -c 'write -P 2 1M 64k' -c 'write -z 2M 64k' "
    "-c 'write -P 0 3M 64k' -c 'write -P 7 3200k 4k' "
    "-c 'write -c -P 9 16M 128k' -c 'write -P 5 40M 1M' top.qcow2\n"
    "head -c 4M /dev/urandom > mixed.raw\n"
    "head -c 1M /dev/zero >> mixed.raw\n"
    "head -c 2M /dev/urandom >> mixed.raw\n"
    "yes 'compressible text, line after line' | head -c 3M >> mixed.raw\n"
    "for i in 1 2 3 4 5 6 7 8; do head -c 8k /dev/urandom >> mixed.raw; "
    "head -c 4k /dev/zero >> mixed.raw; done\n"
    "truncate -s 24M mixed.raw\n"
    "qemu-img convert -q -c -f raw -O qcow2 -o cluster_size=4k mixed.raw "
    "comp.qcow2\n";

struct Case {
  std::string name;
  std::string source;              // in the test directory
  std::vector<std::string> flags;  // before SOURCE DEST
  std::string out_format = "qcow2";
  // -n: the command that prepares DEST (run for both outputs; "{}" is
  // the file name).
  std::string prepare;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ConvertTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_QEMU();
    Sh(kSources);
  }

  void Sh(const std::string& script) {
    CommandResult r = RunShell(
        absl::StrCat("cd ", Quote(dir_.path()), " && set -e\n", script));
    ASSERT_EQ(r.exit_code, 0) << script << "\n" << r.err;
  }

  CommandResult In(const std::vector<std::string>& argv) {
    std::vector<std::string> q;
    for (const auto& a : argv) q.push_back(Quote(a));
    return RunShell(absl::StrCat("cd ", Quote(dir_.path()), " && ",
                                 absl::StrJoin(q, " ")));
  }

  // The map of `path` with host offsets left out, as one line per run of
  // equal allocation (runs qemu-img splits only by host offset merged).
  std::string Allocation(const std::string& path, const std::string& fmt) {
    CommandResult r =
        In({"qemu-img", "map", "-f", fmt, "--output=json", path});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto v = testing::json::Parse(r.out);
    EXPECT_TRUE(v.ok()) << v.status();
    if (!v.ok()) return "";
    std::string out;
    std::string last_key;
    uint64_t start = 0, end = 0;
    auto flush = [&] {
      if (!last_key.empty()) {
        absl::StrAppend(&out, start, "+", end - start, " ", last_key, "\n");
      }
    };
    for (size_t i = 0; i < v->size(); ++i) {
      const auto& e = (*v)[i];
      // Zeros read the same whether a zero flag says so or nothing is
      // allocated (the library leaves an unallocated cluster of an image
      // with no backing file as it is where qemu-img sets the flag).
      const bool zeros = e["zero"].as_bool() && !e["data"].as_bool();
      const std::string key =
          zeros ? absl::StrCat("depth=", e["depth"].as_int64(), " zeros")
                : absl::StrCat("depth=", e["depth"].as_int64(),
                               " present=", e["present"].as_bool(),
                               " zero=", e["zero"].as_bool(),
                               " data=", e["data"].as_bool());
      const uint64_t s = e["start"].as_uint64();
      if (key == last_key && s == end) {
        end += e["length"].as_uint64();
        continue;
      }
      flush();
      last_key = key;
      start = s;
      end = s + e["length"].as_uint64();
    }
    flush();
    return out;
  }

  testing::TempDir dir_;
};

TEST_P(ConvertTest, MatchesQemuImg) {
  const Case& c = GetParam();
  const std::string ext = c.out_format == "raw" ? ".raw" : ".qcow2";
  const std::string theirs = "theirs" + ext;
  const std::string ours = "ours" + ext;
  if (!c.prepare.empty()) {
    for (const std::string& f : {theirs, ours}) {
      std::string cmd = c.prepare;
      while (cmd.find("{}") != std::string::npos) {
        cmd.replace(cmd.find("{}"), 2, f);
      }
      ASSERT_NO_FATAL_FAILURE(Sh(cmd));
    }
  }
  std::vector<std::string> qemu = {"qemu-img", "convert"};
  std::vector<std::string> tool = {testing::QcowtoolPath(), "convert"};
  for (auto* argv : {&qemu, &tool}) {
    argv->insert(argv->end(), c.flags.begin(), c.flags.end());
    argv->insert(argv->end(), {"-O", c.out_format, c.source});
  }
  qemu.push_back(theirs);
  tool.push_back(ours);
  CommandResult q = In(qemu);
  ASSERT_EQ(q.exit_code, 0) << q.err;
  CommandResult t = In(tool);
  ASSERT_EQ(t.exit_code, 0) << t.out << t.err;

  const std::string src_fmt =
      absl::EndsWith(c.source, ".raw") ? "raw" : "qcow2";
  CommandResult cmp = In({"qemu-img", "compare", "-f", src_fmt, "-F",
                          c.out_format, c.source, ours});
  EXPECT_EQ(cmp.exit_code, 0) << cmp.out << cmp.err;
  if (c.out_format == "qcow2") {
    CommandResult check = In({"qemu-img", "check", ours});
    EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  }
  EXPECT_EQ(Allocation(ours, c.out_format), Allocation(theirs, c.out_format))
      << "ours (above) allocates otherwise than qemu-img's";
}

Case Make(std::string name, std::string source, std::vector<std::string> flags,
          std::string out_format = "qcow2", std::string prepare = "") {
  return Case{std::move(name), std::move(source), std::move(flags),
              std::move(out_format), std::move(prepare)};
}

// A target filled with 0x33 everywhere: -n must overwrite or zero all of it.
constexpr char kFilledQcow2[] =
    "qemu-img create -q -f qcow2 {} 64M && "
    "qemu-io -c 'write -P 0x33 0 64M' {} >/dev/null";
constexpr char kFilledRaw[] =
    "head -c 64M /dev/zero | tr '\\0' '3' > {}";

INSTANTIATE_TEST_SUITE_P(
    Cases, ConvertTest,
    ::testing::Values(
        Make("chain", "top.qcow2", {}), Make("chain_S0", "top.qcow2", {"-S", "0"}),
        Make("chain_S64k", "top.qcow2", {"-S", "64k"}),
        Make("chain_raw", "top.qcow2", {}, "raw"),
        Make("mixed", "mixed.raw", {"-f", "raw"}),
        Make("mixed_S0", "mixed.raw", {"-f", "raw", "-S", "0"}),
        Make("mixed_S8k", "mixed.raw", {"-f", "raw", "-S", "8k"}),
        Make("mixed_raw", "mixed.raw", {"-f", "raw"}, "raw"),
        Make("compressed_source", "comp.qcow2", {}),
        Make("c_zlib", "mixed.raw", {"-f", "raw", "-c"}),
        Make("c_zstd", "mixed.raw",
             {"-f", "raw", "-c", "-o", "compression_type=zstd"}),
        Make("c_chain_4k", "top.qcow2", {"-c", "-o", "cluster_size=4k"}),
        Make("c_S0", "top.qcow2", {"-c", "-S", "0"}),
        Make("cluster_4k", "top.qcow2", {"-o", "cluster_size=4k"}),
        Make("cluster_2m", "mixed.raw", {"-f", "raw", "-o", "cluster_size=2M"}),
        Make("cluster_512", "comp.qcow2", {"-o", "cluster_size=512"}),
        Make("extended_l2", "top.qcow2",
             {"-o", "extended_l2=on,cluster_size=32k"}),
        Make("compat_v2", "mixed.raw", {"-f", "raw", "-o", "compat=0.10"}),
        Make("backing", "top.qcow2", {"-B", "base.qcow2", "-F", "qcow2"}),
        Make("backing_c", "top.qcow2", {"-c", "-B", "base.qcow2", "-F", "qcow2"}),
        Make("backing_standalone", "mixed.raw",
             {"-f", "raw", "-B", "base.qcow2", "-F", "qcow2"}),
        Make("n_qcow2", "top.qcow2", {"-n"}, "qcow2", kFilledQcow2),
        Make("n_raw", "top.qcow2", {"-n"}, "raw", kFilledRaw),
        Make("n_c", "top.qcow2", {"-n", "-c"}, "qcow2",
             "qemu-img create -q -f qcow2 {} 64M"),
        Make("W_m16", "top.qcow2", {"-W", "-m", "16"}),
        Make("W_m16_c", "mixed.raw", {"-f", "raw", "-W", "-m", "16", "-c"}),
        Make("m1", "mixed.raw", {"-f", "raw", "-m", "1"}),
        Make("t_none", "top.qcow2", {"-t", "none", "-T", "none"}),
        Make("t_writeback", "top.qcow2", {"-t", "writeback"}),
        Make("t_unsafe_raw", "mixed.raw", {"-f", "raw", "-t", "unsafe"},
             "raw"),
        Make("t_directsync", "mixed.raw",
             {"-f", "raw", "-t", "directsync", "-T", "writethrough"})),
    [](const auto& info) { return info.param.name; });

class ConvertCliTest : public ConvertTest {};

TEST_F(ConvertCliTest, ProgressLinesAsQemuImg) {
  CommandResult t = In({testing::QcowtoolPath(), "convert", "-p", "-O",
                        "qcow2", "top.qcow2", "p.qcow2"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_TRUE(absl::StartsWith(t.out, "    (0.00/100%)\r")) << t.out;
  EXPECT_TRUE(absl::EndsWith(t.out, "    (100.00/100%)\r\n")) << t.out;
  t = In({testing::QcowtoolPath(), "convert", "-p", "-q", "-O", "qcow2",
          "top.qcow2", "p.qcow2"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_EQ(t.out, "");
}

// In guest order (no -W), clusters are allocated as the guest's come, as
// qemu-img allocates them: the same host offsets, extent by extent, and
// the same image end (compressed clusters packed alike; the file itself
// may run on to the end of the last host cluster). Out of order,
// compressed on every core, the output ends no further than 1% past
// qemu-img's.
class ConvertLayoutTest : public ConvertTest {
 protected:
  // Converts with both tools into theirs.qcow2 and ours.qcow2.
  void Both(const std::vector<std::string>& args) {
    std::vector<std::string> qemu = {"qemu-img", "convert", "-O", "qcow2"};
    std::vector<std::string> tool = {testing::QcowtoolPath(), "convert", "-O",
                                     "qcow2"};
    qemu.insert(qemu.end(), args.begin(), args.end());
    tool.insert(tool.end(), args.begin(), args.end());
    qemu.push_back("theirs.qcow2");
    tool.push_back("ours.qcow2");
    CommandResult q = In(qemu);
    ASSERT_EQ(q.exit_code, 0) << q.err;
    CommandResult t = In(tool);
    ASSERT_EQ(t.exit_code, 0) << t.err;
  }

  // `qemu-img check`'s image end offset (0 if it fails).
  uint64_t End(const std::string& path) {
    CommandResult r = In({"qemu-img", "check", "--output=json", path});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    auto v = testing::json::Parse(r.out);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? (*v)["image-end-offset"].as_uint64() : 0;
  }
};

TEST_F(ConvertLayoutTest, InOrderAllocatesAsQemuImg) {
  const std::vector<std::vector<std::string>> cases = {
      {"-f", "raw", "mixed.raw"},
      {"top.qcow2"},
      {"-m", "16", "top.qcow2"},
      {"-S", "0", "top.qcow2"},
      {"-c", "-f", "raw", "mixed.raw"},
      {"-c", "-o", "cluster_size=4k", "comp.qcow2"},
      {"-c", "-o", "compression_type=zstd", "-f", "raw", "mixed.raw"},
  };
  for (const auto& args : cases) {
    const std::string what = absl::StrJoin(args, " ");
    ASSERT_NO_FATAL_FAILURE(Both(args)) << what;
    CommandResult qm = In({"qemu-img", "map", "--output=json", "theirs.qcow2"});
    CommandResult tm = In({"qemu-img", "map", "--output=json", "ours.qcow2"});
    ASSERT_EQ(qm.exit_code, 0) << qm.err;
    EXPECT_EQ(tm.out, qm.out) << what;
    EXPECT_EQ(End("ours.qcow2"), End("theirs.qcow2")) << what;
  }
}

TEST_F(ConvertLayoutTest, OutOfOrderCompressedNoLargerThanQemuImgs) {
  for (const char* m : {"2", "16"}) {
    ASSERT_NO_FATAL_FAILURE(
        Both({"-W", "-m", m, "-c", "-f", "raw", "mixed.raw"}));
    EXPECT_LE(static_cast<double>(End("ours.qcow2")),
              static_cast<double>(End("theirs.qcow2")) * 1.01)
        << "-m " << m;
    CommandResult cmp =
        In({"qemu-img", "compare", "-f", "raw", "mixed.raw", "ours.qcow2"});
    EXPECT_EQ(cmp.exit_code, 0) << cmp.out << cmp.err;
  }
}

// -W without -c: each worker writes its chunks as it reads them, the
// clusters allocated in the order the writes come; the output reads as
// the source, passes qemu-img check, and ends no further than 1% past
// qemu-img's own -W output.
TEST_F(ConvertLayoutTest, OutOfOrderPlainNoLargerThanQemuImgs) {
  for (const char* m : {"2", "16"}) {
    for (const char* src : {"mixed.raw", "top.qcow2"}) {
      const bool raw = std::string(src) == "mixed.raw";
      std::vector<std::string> args = {"-W", "-m", m};
      if (raw) args.insert(args.end(), {"-f", "raw"});
      args.push_back(src);
      ASSERT_NO_FATAL_FAILURE(Both(args)) << src << " -m " << m;
      EXPECT_LE(static_cast<double>(End("ours.qcow2")),
                static_cast<double>(End("theirs.qcow2")) * 1.01)
          << src << " -m " << m;
      std::vector<std::string> cmp = {"qemu-img", "compare"};
      if (raw) cmp.insert(cmp.end(), {"-f", "raw"});
      cmp.insert(cmp.end(), {src, "ours.qcow2"});
      CommandResult c = In(cmp);
      EXPECT_EQ(c.exit_code, 0) << src << " -m " << m << c.out << c.err;
    }
  }
}

TEST_F(ConvertCliTest, RefusesWithQemuImgsMessages) {
  Sh("qemu-img create -q -f qcow2 small.qcow2 1M");
  const std::vector<std::vector<std::string>> cases = {
      {"-c", "-O", "raw", "top.qcow2", "x.raw"},
      {"-B", "base.qcow2", "-O", "raw", "top.qcow2", "x.raw"},
      {"-m", "17", "-O", "qcow2", "top.qcow2", "x.qcow2"},
      {"-t", "bogus", "-O", "qcow2", "top.qcow2", "x.qcow2"},
      {"-T", "bogus", "-O", "qcow2", "top.qcow2", "x.qcow2"},
      {"-m", "0", "-O", "qcow2", "top.qcow2", "x.qcow2"},
      {"-S", "1000", "-O", "qcow2", "top.qcow2", "x.qcow2"},
      {"-S", "32M", "-O", "qcow2", "top.qcow2", "x.qcow2"},
      {"-n", "-o", "cluster_size=4k", "-O", "qcow2", "top.qcow2",
       "small.qcow2"},
      {"-n", "-O", "qcow2", "top.qcow2", "small.qcow2"},
  };
  for (const auto& args : cases) {
    std::vector<std::string> qemu = {"qemu-img", "convert"};
    std::vector<std::string> tool = {testing::QcowtoolPath(), "convert"};
    qemu.insert(qemu.end(), args.begin(), args.end());
    tool.insert(tool.end(), args.begin(), args.end());
    CommandResult q = In(qemu);
    CommandResult t = In(tool);
    const std::string what = absl::StrJoin(args, " ");
    ASSERT_NE(q.exit_code, 0) << what;
    EXPECT_NE(t.exit_code, 0) << what;
    ASSERT_TRUE(absl::StartsWith(q.err, "qemu-img: ")) << q.err;
    EXPECT_EQ(t.err.substr(0, t.err.find('\n')),
              "qcowtool: " + q.err.substr(10, q.err.find('\n') - 10))
        << what;
  }
}

}  // namespace
}  // namespace qcow2
