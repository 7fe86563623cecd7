// SPDX-License-Identifier: Apache-2.0
// qcowtool against qemu-img: `map`, `info` and `convert` must print (and
// write) exactly what qemu-img does for images built with qemu-img and
// qemu-io; plus argument handling and the shared CLI helpers.
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/util/test_util.h"
#include "tools/cli_util.h"
#include "tools/json_writer.h"

// The tool's helpers are not part of any library target: compile them in.
#include "tools/cli_util.cc"     // NOLINT(build/include)

namespace qcow2::tool {
namespace {

using ::qcow2::testing::CommandResult;
using ::qcow2::testing::Run;
using ::qcow2::testing::RunShell;
using ::qcow2::testing::TempDir;

// The binary under test. This file is compiled with QCOWTOOL_BIN; prefer it
// in case the test utility library was built without it.
std::string QcowtoolPath() {
#ifdef QCOWTOOL_BIN
  return QCOWTOOL_BIN;
#else
  return ::qcow2::testing::QcowtoolPath();
#endif
}

// ---------------------------------------------------------------------------
// ParseSize / FormatSize / QemuPathCombine

TEST(ParseSizeTest, AcceptsQemuSyntax) {
  struct Case {
    const char* text;
    uint64_t want;
  } cases[] = {
      {"0", 0},
      {"512", 512},
      {"1b", 1},
      {"7B", 7},
      {"4k", 4096},
      {"4K", 4096},
      {"10M", 10ull << 20},
      {"10m", 10ull << 20},
      {"1G", 1ull << 30},
      {"1T", 1ull << 40},
      {"2P", 2ull << 50},
      {"7E", 7ull << 60},
      {"0x1000", 4096},
      {"0XfF", 255},
      {"1.5G", 3ull << 29},
      {"0.5k", 512},
      {"1.k", 1024},
      {"1.0", 1},
      {"9223372036854775807", 9223372036854775807ull},
  };
  for (const Case& c : cases) {
    absl::StatusOr<uint64_t> v = ParseSize(c.text);
    ASSERT_TRUE(v.ok()) << c.text << ": " << v.status();
    EXPECT_EQ(*v, c.want) << c.text;
  }
}

TEST(ParseSizeTest, RejectsGarbageWithTheText) {
  for (const char* text :
       {"",     "abc",   "4x",   "-1",  "-0",    "+4",   " 4k",
        "4k ",  "4kb",   "4KiB", "k",   "1.5",   "0.5b", "0x",
        "0x1k", "0x1.5", "1e3",  ".5k", "1..5k", "0xg"}) {
    absl::StatusOr<uint64_t> v = ParseSize(text);
    ASSERT_FALSE(v.ok()) << "'" << text << "' parsed as " << *v;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(
        absl::StrContains(v.status().message(), absl::StrCat("'", text, "'")))
        << v.status();
  }
}

TEST(ParseSizeTest, RejectsOverflow) {
  for (const char* text :
       {"8E", "9223372036854775808", "18446744073709551616",
        "99999999999999999999999", "8388608T", "0x8000000000000000",
        "0x10000000000000000", "8.0E", "8192P"}) {
    absl::StatusOr<uint64_t> v = ParseSize(text);
    ASSERT_FALSE(v.ok()) << text << " parsed as " << *v;
    EXPECT_TRUE(absl::StrContains(v.status().message(), "too large"))
        << v.status();
  }
}

TEST(FormatSizeTest, MatchesQemuSizeToStr) {
  EXPECT_EQ(FormatSize(0), "0 B");
  EXPECT_EQ(FormatSize(512), "512 B");
  EXPECT_EQ(FormatSize(999), "999 B");
  EXPECT_EQ(FormatSize(1000), "0.977 KiB");
  EXPECT_EQ(FormatSize(1024), "1 KiB");
  EXPECT_EQ(FormatSize(270336), "264 KiB");
  EXPECT_EQ(FormatSize(1048576), "1 MiB");
  EXPECT_EQ(FormatSize(1572864), "1.5 MiB");
  EXPECT_EQ(FormatSize(1023999), "1e+03 KiB");  // QEMU's own quirk
  EXPECT_EQ(FormatSize(10ull << 30), "10 GiB");
  EXPECT_EQ(FormatSize(5ull << 40), "5 TiB");
  EXPECT_EQ(FormatSize(~0ull), "16 EiB");
}

TEST(QemuPathCombineTest, KeepsTheImageDirectoryAsWritten) {
  EXPECT_EQ(QemuPathCombine("b.qcow2", "a.qcow2"), "a.qcow2");
  EXPECT_EQ(QemuPathCombine("d/b.qcow2", "a.qcow2"), "d/a.qcow2");
  EXPECT_EQ(QemuPathCombine("d/b.qcow2", "../a"), "d/../a");
  EXPECT_EQ(QemuPathCombine("/b.qcow2", "a"), "/a");
  EXPECT_EQ(QemuPathCombine("d/b.qcow2", "/abs/a"), "/abs/a");
}

// ---------------------------------------------------------------------------
// JSON writer

TEST(JsonTest, QuotesLikeQemu) {
  EXPECT_EQ(JsonQuote("plain"), "\"plain\"");
  EXPECT_EQ(JsonQuote("a\"b\\c/d"), "\"a\\\"b\\\\c/d\"");
  EXPECT_EQ(JsonQuote("\b\f\n\r\t"), "\"\\b\\f\\n\\r\\t\"");
  EXPECT_EQ(JsonQuote(std::string("\x01\x1f\x7f", 3)),
            "\"\\u0001\\u001F\\u007F\"");
  EXPECT_EQ(JsonQuote("caf\xc3\xa9"), "\"caf\\u00E9\"");
  EXPECT_EQ(JsonQuote("\xf0\x9f\x98\x80"), "\"\\uD83D\\uDE00\"");
  EXPECT_EQ(JsonQuote("\xff"), "\"\\uFFFD\"");
  EXPECT_EQ(JsonQuote("\xc3"), "\"\\uFFFD\"");      // truncated
  EXPECT_EQ(JsonQuote("\xc0\xaf"), "\"\\uFFFD\"");  // overlong
}

TEST(JsonTest, PrettyLayoutAndQdictOrder) {
  Json data = Json::Object();
  data.Set("compat", Json::String("1.1"));
  data.Set("lazy-refcounts", Json::Bool(false));
  data.Set("refcount-bits", Json::Uint(16));
  data.Set("compression-type", Json::String("zlib"));
  Json spec = Json::Object();
  spec.Set("type", Json::String("qcow2"));
  spec.Set("data", std::move(data));
  Json info = Json::Object();
  info.Set("filename", Json::String("x"));
  info.Set("virtual-size", Json::Uint(1));
  info.Set("format-specific", std::move(spec));
  info.Set("list", Json::Array().Append(Json::Uint(1)).Append(Json::Uint(2)));
  info.Set("empty", Json::Object());
  EXPECT_EQ(ToJson(info, JsonStyle::kQemuPretty),
            "{\n"
            "    \"list\": [\n"
            "        1,\n"
            "        2\n"
            "    ],\n"
            "    \"empty\": {\n"
            "    },\n"
            "    \"virtual-size\": 1,\n"
            "    \"filename\": \"x\",\n"
            "    \"format-specific\": {\n"
            "        \"type\": \"qcow2\",\n"
            "        \"data\": {\n"
            "            \"compat\": \"1.1\",\n"
            "            \"compression-type\": \"zlib\",\n"
            "            \"lazy-refcounts\": false,\n"
            "            \"refcount-bits\": 16\n"
            "        }\n"
            "    }\n"
            "}");
  EXPECT_EQ(ToJson(info, JsonStyle::kCompact),
            "{\"filename\": \"x\", \"virtual-size\": 1, \"format-specific\": "
            "{\"type\": \"qcow2\", \"data\": {\"compat\": \"1.1\", "
            "\"lazy-refcounts\": false, \"refcount-bits\": 16, "
            "\"compression-type\": \"zlib\"}}, \"list\": [1, 2], "
            "\"empty\": {}}");
}

TEST(JsonTest, SameBucketKeepsQdictHeadInsertion) {
  // "backing-filename-format" and "children" share bucket 206.
  ASSERT_EQ(QemuKeyBucket("backing-filename-format"),
            QemuKeyBucket("children"));
  Json o = Json::Object();
  o.Set("children", Json::Uint(1));
  o.Set("backing-filename-format", Json::Uint(2));
  EXPECT_EQ(ToJson(o, JsonStyle::kQemuPretty),
            "{\n    \"backing-filename-format\": 2,\n"
            "    \"children\": 1\n}");
}

// ---------------------------------------------------------------------------
// Argument handling

CommandResult Tool(std::vector<std::string> args) {
  args.insert(args.begin(), QcowtoolPath());
  return Run(args);
}

TEST(CliUsageTest, HelpListsCommands) {
  for (const char* flag : {"--help", "help", "-h"}) {
    CommandResult r = Tool({flag});
    EXPECT_EQ(r.exit_code, 0) << flag;
    for (const char* cmd : {"info", "map", "convert"}) {
      EXPECT_TRUE(absl::StrContains(r.out, absl::StrCat("  ", cmd, " ")))
          << flag << ":\n"
          << r.out;
    }
    EXPECT_EQ(r.err, "");
  }
}

TEST(CliUsageTest, CommandHelpExitsZero) {
  for (const char* cmd : {"info", "map", "convert"}) {
    for (std::vector<std::string> args :
         {std::vector<std::string>{cmd, "--help"},
          std::vector<std::string>{cmd, "-h"},
          std::vector<std::string>{"help", cmd}}) {
      CommandResult r = Tool(args);
      EXPECT_EQ(r.exit_code, 0) << absl::StrJoin(args, " ");
      EXPECT_TRUE(
          absl::StartsWith(r.out, absl::StrCat("usage: qcowtool ", cmd, " ")))
          << r.out;
      EXPECT_TRUE(absl::StrContains(r.out, "Exit status")) << r.out;
    }
  }
}

// Wrong arguments: exit 1, a message and the usage on stderr, nothing on
// stdout.
void ExpectUsageError(const std::vector<std::string>& args,
                      const std::string& usage_start,
                      const std::string& message) {
  CommandResult r = Tool(args);
  std::string what = absl::StrJoin(args, " ");
  EXPECT_EQ(r.exit_code, 1) << what << "\n" << r.err;
  EXPECT_EQ(r.out, "") << what;
  EXPECT_TRUE(absl::StrContains(r.err, usage_start)) << what << "\n" << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, message)) << what << "\n" << r.err;
}

TEST(CliUsageTest, WrongArgumentsExitOneWithUsage) {
  const std::string top = "usage: qcowtool COMMAND";
  ExpectUsageError({}, top, "no command");
  ExpectUsageError({"bogus"}, top, "unknown command 'bogus'");
  ExpectUsageError({"help", "bogus"}, top, "unknown command 'bogus'");
  for (const char* cmd : {"info", "map"}) {
    const std::string usage = absl::StrCat("usage: qcowtool ", cmd, " ");
    ExpectUsageError({cmd}, usage, "expecting an image name");
    ExpectUsageError({cmd, "--bogus", "x.qcow2"}, usage,
                     "unrecognized option '--bogus'");
    ExpectUsageError({cmd, "-z", "x.qcow2"}, usage, "invalid option");
    ExpectUsageError({cmd, "--output=xml", "x.qcow2"}, usage, "'xml'");
    ExpectUsageError({cmd, "--output"}, usage, "requires an argument");
    ExpectUsageError({cmd, "-f", "vmdk", "x.qcow2"}, usage, "'vmdk'");
    ExpectUsageError({cmd, "a.qcow2", "b.qcow2"}, usage,
                     "unexpected argument 'b.qcow2'");
  }
  const std::string map = "usage: qcowtool map ";
  ExpectUsageError({"map", "--start-offset=1q", "x"}, map, "'1q'");
  ExpectUsageError({"map", "--max-length=-4k", "x"}, map, "'-4k'");
  const std::string convert = "usage: qcowtool convert ";
  ExpectUsageError({"convert"}, convert, "expecting a source");
  ExpectUsageError({"convert", "a"}, convert, "expecting a source");
  ExpectUsageError({"convert", "a", "b", "c"}, convert, "'c'");
  ExpectUsageError({"convert", "-O", "vmdk", "a", "b"}, convert, "'vmdk'");
}

TEST(CliUsageTest, MissingImageExitsOneNamingIt) {
  TempDir dir;
  const std::string path = dir.File("does-not-exist.qcow2");
  for (const char* cmd : {"info", "map"}) {
    CommandResult r = Tool({cmd, path});
    EXPECT_EQ(r.exit_code, 1) << cmd;
    EXPECT_TRUE(absl::StartsWith(r.err, "qcowtool: ")) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, path)) << r.err;
    EXPECT_EQ(r.out, "");
  }
  CommandResult r = Tool({"convert", path, dir.File("out.raw")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, path)) << r.err;
  // qemu-img's status, 1, on its other verbs too; io keeps its own 2.
  r = Tool({"snapshot", "-l", path});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  r = Tool({"create", "-q", dir.File("no-dir/x.qcow2"), "1M"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  r = Tool({"io", "-c", "read 0 512", path});
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

TEST(CliUsageTest, GarbageAsQcow2IsAClearError) {
  TempDir dir;
  const std::string path = dir.File("garbage.bin");
  ASSERT_OK(
      ::qcow2::testing::WriteFileBytes(path, std::vector<uint8_t>(4096, 'x')));
  for (const char* cmd : {"info", "map"}) {
    CommandResult r = Tool({cmd, "-f", "qcow2", path});
    EXPECT_EQ(r.exit_code, 1) << cmd;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
    EXPECT_TRUE(absl::StartsWith(r.err, "qcowtool: ")) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, path)) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, "qcow2")) << r.err;
  }
  // Probed, the same file is a raw image.
  CommandResult r = Tool({"info", "--output=json", path});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "\"format\": \"raw\"")) << r.out;
}

// ---------------------------------------------------------------------------
// Comparison with qemu-img on images it built

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

// Runs `argv` in `dir` (so relative names are printed as given).
CommandResult RunIn(const std::string& dir,
                    const std::vector<std::string>& argv) {
  std::vector<std::string> quoted;
  for (const std::string& a : argv) quoted.push_back(ShellQuote(a));
  return RunShell(
      absl::StrCat("cd ", ShellQuote(dir), " && ", absl::StrJoin(quoted, " ")));
}

// Compares two files in chunks (they may be large and sparse).
void ExpectSameFileContents(const std::string& got_path,
                            const std::string& want_path) {
  std::ifstream got(got_path, std::ios::binary);
  std::ifstream want(want_path, std::ios::binary);
  ASSERT_TRUE(got && want) << got_path << " / " << want_path;
  std::vector<char> a(1 << 20), b(1 << 20);
  uint64_t offset = 0;
  while (true) {
    got.read(a.data(), a.size());
    want.read(b.data(), b.size());
    ASSERT_EQ(got.gcount(), want.gcount()) << "sizes differ after " << offset;
    const size_t n = static_cast<size_t>(got.gcount());
    if (n == 0) break;
    auto mismatch = std::mismatch(a.begin(), a.begin() + n, b.begin());
    ASSERT_EQ(mismatch.first, a.begin() + n)
        << "contents differ at byte " << offset + (mismatch.first - a.begin());
    offset += n;
  }
}

struct Scenario {
  const char* name;
  // Shell commands run with `set -e` in an empty directory.
  const char* setup;
  // The image to inspect, relative to that directory.
  const char* image;
};

std::ostream& operator<<(std::ostream& os, const Scenario& s) {
  return os << s.name;
}

const Scenario kScenarios[] = {
    {"plain",
     "qemu-img create -q -f qcow2 img.qcow2 1M\n"
     "qemu-io -c 'write -P 1 0 4k' -c 'write -P 2 300k 70k' img.qcow2\n",
     "img.qcow2"},
    {"compressed",
     "qemu-img create -q -f qcow2 img.qcow2 1M\n"
     "qemu-io -c 'write -c -P 1 0 64k' -c 'write -c -P 2 64k 64k'"
     " -c 'write -c 320k 64k' -c 'write -P 3 640k 4k' img.qcow2\n",
     "img.qcow2"},
    {"compressed_zstd",
     "qemu-img create -q -f qcow2 -o compression_type=zstd img.qcow2 1M\n"
     "qemu-io -c 'write -c -P 1 0 64k' -c 'write -P 3 128k 64k' img.qcow2\n",
     "img.qcow2"},
    {"zero_clusters",
     "qemu-img create -q -f qcow2 img.qcow2 1M\n"
     "qemu-io -c 'write -P 1 0 192k' -c 'write -z 64k 64k'"
     " -c 'write -z -u 128k 64k' -c 'write -z 512k 64k'"
     " -c 'write -z 768k 4k' img.qcow2\n",
     "img.qcow2"},
    {"prealloc_metadata",
     "qemu-img create -q -f qcow2 -o preallocation=metadata img.qcow2 1M\n"
     "qemu-io -c 'write -z 64k 64k' -c 'write -P 3 128k 4k'"
     " -c 'write -z -u 256k 64k' img.qcow2\n",
     "img.qcow2"},
    {"prealloc_metadata_refcount1",
     "qemu-img create -q -f qcow2 -o preallocation=metadata,refcount_bits=1"
     " img.qcow2 2M\n"
     "qemu-io -c 'write -z 64k 64k' -c 'write -P 3 1M 4k' img.qcow2\n",
     "img.qcow2"},
    {"prealloc_falloc",
     "qemu-img create -q -f qcow2 -o preallocation=falloc img.qcow2 1M\n"
     "qemu-io -c 'write -P 3 128k 4k' -c 'write -z 256k 64k' img.qcow2\n",
     "img.qcow2"},
    {"ext_l2",
     "qemu-img create -q -f qcow2 -o extended_l2=on img.qcow2 1M\n"
     "qemu-io -c 'write -P 1 0 64k' -c 'write -z 4k 8k' -c 'write -z 128k 8k'"
     " -c 'write -c -P 2 256k 64k' -c 'write -z 512k 64k' img.qcow2\n",
     "img.qcow2"},
    {"ext_l2_partial",  // subclusters left unallocated in allocated clusters
     "qemu-img create -q -f qcow2 -o extended_l2=on img.qcow2 1M\n"
     "qemu-io -c 'write -P 1 0 4k' -c 'write -P 2 70k 2k'"
     " -c 'write -z 200k 8k' img.qcow2\n",
     "img.qcow2"},
    {"ext_l2_over_backing",
     "qemu-img create -q -f qcow2 base.qcow2 1M\n"
     "qemu-io -c 'write -P 1 0 1M' base.qcow2\n"
     "qemu-img create -q -f qcow2 -o extended_l2=on -b base.qcow2 -F qcow2"
     " img.qcow2\n"
     "qemu-io -c 'write -P 2 0 4k' -c 'write -P 3 70k 2k'"
     " -c 'write -z 200k 8k' -c 'write -z 300k 64k' img.qcow2\n",
     "img.qcow2"},
    {"chain2",
     "qemu-img create -q -f qcow2 base.qcow2 1M\n"
     "qemu-io -c 'write -P 1 0 256k' -c 'write -c 512k 64k'"
     " -c 'write -z 768k 64k' base.qcow2\n"
     "qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 img.qcow2 2M\n"
     "qemu-io -c 'write -P 2 64k 4k' -c 'write -z 128k 64k'"
     " -c 'write -P 3 1536k 64k' -c 'write -P 4 960k 128k' img.qcow2\n",
     "img.qcow2"},
    {"chain3",
     "qemu-img create -q -f qcow2 base.qcow2 1M\n"
     "qemu-io -c 'write -P 1 0 64k' -c 'write -P 1 900k 4k' base.qcow2\n"
     "qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 mid.qcow2\n"
     "qemu-io -c 'write -P 2 64k 64k' -c 'write -z 900k 4k' mid.qcow2\n"
     "qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 img.qcow2 3M\n"
     "qemu-io -c 'write -P 3 128k 64k' -c 'write -P 3 2M 4k' img.qcow2\n",
     "img.qcow2"},
    {"chain_in_subdir",
     "mkdir sub\n"
     "qemu-img create -q -f qcow2 base.qcow2 1M\n"
     "qemu-io -c 'write -P 1 0 64k' base.qcow2\n"
     "qemu-img create -q -f qcow2 -b ../base.qcow2 -F qcow2 sub/img.qcow2\n"
     "qemu-io -c 'write -P 2 64k 4k' sub/img.qcow2\n",
     "sub/img.qcow2"},
    {"raw",
     "truncate -s 1M img.raw\n"
     "qemu-io -f raw -c 'write -P 1 12k 4k' -c 'write -P 2 600k 64k'"
     " -c 'write -P 3 700416 512' img.raw\n",
     "img.raw"},
    {"raw_odd_size",  // QEMU sizes raw images in whole sectors
     "head -c 1000 /dev/urandom > img.raw\n", "img.raw"},
    {"raw_odd_size_backing",
     "head -c 1000 /dev/urandom > base.raw\n"
     "qemu-img create -q -f qcow2 -b base.raw -F raw img.qcow2 64k\n",
     "img.qcow2"},
    {"raw_backing",
     "truncate -s 1M base.raw\n"
     "qemu-io -f raw -c 'write -P 1 12k 4k' -c 'write -P 2 600k 8k' base.raw\n"
     "qemu-img create -q -f qcow2 -b base.raw -F raw img.qcow2 2M\n"
     "qemu-io -c 'write -P 5 8k 4k' -c 'write -P 5 1M 4k' img.qcow2\n",
     "img.qcow2"},
    {"empty", "qemu-img create -q -f qcow2 img.qcow2 1G\n", "img.qcow2"},
    {"compat_0_10",
     "qemu-img create -q -f qcow2 -o compat=0.10 img.qcow2 1M\n"
     "qemu-io -c 'write -P 1 0 4k' -c 'write -z 64k 64k'"
     " -c 'write -c 128k 64k' img.qcow2\n",
     "img.qcow2"},
    {"small_clusters",
     "qemu-img create -q -f qcow2 -o cluster_size=4k img.qcow2 64M\n"
     "qemu-io -c 'write -P 1 0 4k' -c 'write -P 2 3M 8k'"
     " -c 'write -P 3 41943552 1k' -c 'write -c 60M 4k' img.qcow2\n",
     "img.qcow2"},
    {"big_clusters",
     "qemu-img create -q -f qcow2 -o cluster_size=2M img.qcow2 64M\n"
     "qemu-io -c 'write -P 1 1M 4k' -c 'write -z 8M 2M' img.qcow2\n",
     "img.qcow2"},
    {"odd_size",
     "qemu-img create -q -f qcow2 img.qcow2 1000000\n"
     "qemu-io -c 'write -P 1 999424 512' img.qcow2\n",
     "img.qcow2"},
    {"dirty_lazy_refcounts",
     "ulimit -c 0\n"
     "qemu-img create -q -f qcow2 -o lazy_refcounts=on img.qcow2 1M\n"
     "qemu-io -c 'write -P 1 0 4k' -c abort img.qcow2 || true\n",
     "img.qcow2"},
    {"refcount64",
     "qemu-img create -q -f qcow2 -o refcount_bits=64 img.qcow2 1M\n"
     "qemu-io -c 'write -P 1 0 4k' img.qcow2\n",
     "img.qcow2"},
};

// Each scenario's images are built once and shared by its tests, which
// only read them (until the program exits).
struct BuiltScenario {
  std::unique_ptr<TempDir> dir;
  CommandResult setup;
};

const BuiltScenario& Build(const Scenario& s) {
  // Destroyed at exit, which removes the directories.
  static std::map<std::string, BuiltScenario> built;
  auto [it, inserted] = built.try_emplace(s.name);
  if (inserted) {
    it->second.dir = std::make_unique<TempDir>();
    it->second.setup = RunShell(absl::StrCat(
        "cd ", ShellQuote(it->second.dir->path()), " && set -e\n", s.setup));
  }
  return it->second;
}

class QemuParityTest : public ::testing::TestWithParam<Scenario> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_QEMU();
    const BuiltScenario& b = Build(GetParam());
    ASSERT_EQ(b.setup.exit_code, 0) << GetParam().setup << "\n" << b.setup.err;
    dir_ = b.dir->path();
  }

  // Runs qemu-img and qcowtool with the same arguments (the image last)
  // and expects the same output and success.
  void ExpectSameOutput(const std::vector<std::string>& args) {
    std::vector<std::string> tail = args;
    tail.push_back(GetParam().image);
    std::vector<std::string> qemu = {"qemu-img"}, tool = {QcowtoolPath()};
    qemu.insert(qemu.end(), tail.begin(), tail.end());
    tool.insert(tool.end(), tail.begin(), tail.end());
    CommandResult want = RunIn(dir_, qemu);
    CommandResult got = RunIn(dir_, tool);
    const std::string what = absl::StrJoin(tail, " ");
    EXPECT_EQ(got.out, want.out) << what << "\nqemu-img stderr: " << want.err
                                 << "\nqcowtool stderr: " << got.err;
    // The same status too (1 on any error, e.g. compressed clusters in
    // human map output).
    EXPECT_EQ(got.exit_code, want.exit_code)
        << what << "\nqemu-img: " << want.err << "\nqcowtool: " << got.err;
  }

  std::string dir_;  // the scenario's directory
};

TEST_P(QemuParityTest, MapJson) { ExpectSameOutput({"map", "--output=json"}); }

TEST_P(QemuParityTest, MapHuman) { ExpectSameOutput({"map"}); }

TEST_P(QemuParityTest, MapJsonPart) {
  ExpectSameOutput(
      {"map", "--output=json", "--start-offset=6k", "--max-length=333k"});
}

TEST_P(QemuParityTest, InfoJson) {
  ExpectSameOutput({"info", "--output=json"});
}

TEST_P(QemuParityTest, InfoHuman) { ExpectSameOutput({"info"}); }

TEST_P(QemuParityTest, InfoJsonBackingChain) {
  ExpectSameOutput({"info", "--output=json", "--backing-chain"});
}

TEST_P(QemuParityTest, InfoHumanBackingChain) {
  ExpectSameOutput({"info", "--backing-chain"});
}

TEST_P(QemuParityTest, ConvertIsByteIdentical) {
  TempDir out;
  const std::string want_path = out.File("want.raw");
  const std::string got_path = out.File("got.raw");
  CommandResult q = RunIn(
      dir_, {"qemu-img", "convert", "-O", "raw", GetParam().image, want_path});
  ASSERT_EQ(q.exit_code, 0) << q.err;
  CommandResult t = RunIn(dir_, {QcowtoolPath(), "convert", "-O", "raw",
                                 GetParam().image, got_path});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_EQ(t.out, "");
  ExpectSameFileContents(got_path, want_path);
}

INSTANTIATE_TEST_SUITE_P(Images, QemuParityTest,
                         ::testing::ValuesIn(kScenarios),
                         [](const ::testing::TestParamInfo<Scenario>& info) {
                           return std::string(info.param.name);
                         });

// ---------------------------------------------------------------------------
// Cases compared one by one

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_QEMU(); }
  void Sh(const std::string& script) {
    CommandResult r = RunShell(
        absl::StrCat("cd ", ShellQuote(dir_.path()), " && set -e\n", script));
    ASSERT_EQ(r.exit_code, 0) << script << "\n" << r.err;
  }
  TempDir dir_;
};

TEST_F(CliTest, AbsolutePathsAreShownAsQemuShowsThem) {
  ASSERT_NO_FATAL_FAILURE(
      Sh("qemu-img create -q -f qcow2 base.qcow2 1M\n"
         "qemu-io -c 'write -P 1 0 64k' base.qcow2\n"
         "qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2\n"));
  const std::string top = dir_.File("top.qcow2");
  for (std::vector<std::string> args :
       {std::vector<std::string>{"map", top},
        std::vector<std::string>{"map", "--output=json", top},
        std::vector<std::string>{"info", "--backing-chain", top},
        std::vector<std::string>{"info", "--output=json", top}}) {
    std::vector<std::string> q = args, t = args;
    q.insert(q.begin(), "qemu-img");
    t.insert(t.begin(), QcowtoolPath());
    CommandResult want = ::qcow2::testing::Run(q);
    CommandResult got = ::qcow2::testing::Run(t);
    EXPECT_EQ(got.out, want.out) << absl::StrJoin(args, " ");
    EXPECT_EQ(got.exit_code, 0) << got.err;
  }
}

TEST_F(CliTest, InfoDoesNotNeedTheBackingFile) {
  ASSERT_NO_FATAL_FAILURE(
      Sh("qemu-img create -q -f qcow2 base.qcow2 1M\n"
         "qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2\n"
         "rm base.qcow2\n"));
  CommandResult want = RunIn(dir_.path(), {"qemu-img", "info", "top.qcow2"});
  CommandResult got = RunIn(dir_.path(), {QcowtoolPath(), "info", "top.qcow2"});
  EXPECT_EQ(got.exit_code, 0) << got.err;
  EXPECT_EQ(got.out, want.out);
  got = RunIn(dir_.path(),
              {QcowtoolPath(), "info", "--backing-chain", "top.qcow2"});
  EXPECT_EQ(got.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(got.err, "base.qcow2")) << got.err;
}

TEST_F(CliTest, InfoListsSnapshots) {
  ASSERT_NO_FATAL_FAILURE(
      Sh("qemu-img create -q -f qcow2 img.qcow2 1M\n"
         "qemu-img snapshot -c one img.qcow2\n"
         "qemu-img snapshot -c two img.qcow2\n"));
  for (const char* output : {"--output=json", "--output=human"}) {
    CommandResult want =
        RunIn(dir_.path(), {"qemu-img", "info", output, "img.qcow2"});
    CommandResult got =
        RunIn(dir_.path(), {QcowtoolPath(), "info", output, "img.qcow2"});
    ASSERT_EQ(got.exit_code, 0) << got.err;
    EXPECT_EQ(got.out, want.out);
  }
}

TEST_F(CliTest, ConvertOverwritesAndLeavesHoles) {
  ASSERT_NO_FATAL_FAILURE(
      Sh("qemu-img create -q -f qcow2 img.qcow2 64M\n"
         "qemu-io -c 'write -P 1 0 64k' -c 'write -P 0 1M 1M'"
         " -c 'write -P 2 63M 4k' img.qcow2\n"
         "head -c 2M /dev/zero | tr '\\0' 'x' > out.raw\n"
         "truncate -s 100M out.raw\n"));
  CommandResult r =
      RunIn(dir_.path(), {QcowtoolPath(), "convert", "img.qcow2", "out.raw"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  struct stat st;
  ASSERT_EQ(stat(dir_.File("out.raw").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 64 << 20);
  // Only the 64k and 4k of non-zero data were written (allow for
  // filesystem block rounding).
  EXPECT_LE(st.st_blocks * 512, 1 << 20) << "not sparse";
  CommandResult q = RunIn(dir_.path(), {"qemu-img", "convert", "-O", "raw",
                                        "img.qcow2", "want.raw"});
  ASSERT_EQ(q.exit_code, 0) << q.err;
  ExpectSameFileContents(dir_.File("out.raw"), dir_.File("want.raw"));
}

TEST_F(CliTest, ConvertRefusesToOverwriteItsSource) {
  ASSERT_NO_FATAL_FAILURE(
      Sh("qemu-img create -q -f qcow2 base.qcow2 1M\n"
         "qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2\n"));
  for (const char* dest : {"top.qcow2", "base.qcow2", "./base.qcow2"}) {
    CommandResult r =
        RunIn(dir_.path(), {QcowtoolPath(), "convert", "top.qcow2", dest});
    EXPECT_EQ(r.exit_code, 1) << dest;
    EXPECT_TRUE(absl::StrContains(r.err, dest)) << r.err;
  }
  EXPECT_EQ(::qcow2::testing::QemuCheck(dir_.File("top.qcow2")).exit_code, 0);
}

}  // namespace
}  // namespace qcow2::tool
