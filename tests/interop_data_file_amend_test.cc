// SPDX-License-Identifier: Apache-2.0
// Two verbs on images with an external data file, each run by qcowtool
// and by qemu-img 7.2 on copies of the same starting files and judged by
// QEMU:
//  - `commit` of a top whose clusters live in its data file: the top is
//    emptied as qemu-img empties it (every L2 entry cleared, the data
//    file's clusters discarded, its size kept), `qemu-img compare` finds
//    top and base equal, both pass `qemu-img check`, and the emptied top's
//    own map is qemu-img's;
//  - `amend -o data_file=...` and `-o data_file_raw=...`: every change
//    QEMU allows gives the same `qemu-img info --output=json`, a clean
//    check and the same data through qemu-io; every refusal has
//    qemu-img's message and exit status and leaves the file unchanged.
#include <cstdint>
#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using ::qcow2::testing::CommandResult;
using ::qcow2::testing::TempDir;

std::string Tool() { return QCOWTOOL_BIN; }

// Runs `argv` from `dir` (relative names, as an operator types them: a
// relative data file name resolves from there for QEMU and for us).
CommandResult RunIn(const TempDir& dir, const std::vector<std::string>& argv) {
  std::string cmd = absl::StrCat("cd '", dir.File(""), "' &&");
  for (const std::string& a : argv) absl::StrAppend(&cmd, " '", a, "'");
  return ::qcow2::testing::RunShell(cmd);
}

void MustRun(const TempDir& dir, const std::vector<std::string>& argv) {
  CommandResult r = RunIn(dir, argv);
  ASSERT_EQ(r.exit_code, 0) << argv[0] << " " << argv[1] << ": " << r.out
                            << r.err;
}

std::vector<uint8_t> Bytes(const TempDir& dir, const std::string& name) {
  absl::StatusOr<std::vector<uint8_t>> b =
      ::qcow2::testing::ReadFileBytes(dir.File(name));
  return b.ok() ? *std::move(b) : std::vector<uint8_t>{};
}

void ExpectCheckClean(const TempDir& dir, const std::string& image) {
  CommandResult r = RunIn(dir, {"qemu-img", "check", image});
  EXPECT_EQ(r.exit_code, 0) << image << ": " << r.out << r.err;
}

// ---- commit of a top with a data file -----------------------------------

// base.qcow2 (all 0x11) under top.qcow2, whose data file top.data holds
// data, a zero cluster, a discarded cluster and a partial cluster.
void MakeCommitChain(const TempDir& dir) {
  MustRun(dir, {"qemu-img", "create", "-q", "-f", "qcow2", "base.qcow2", "1M"});
  MustRun(dir, {"qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 1M",
                "base.qcow2"});
  MustRun(dir, {"qemu-img", "create", "-q", "-f", "qcow2", "-b", "base.qcow2",
                "-F", "qcow2", "-o", "data_file=top.data", "top.qcow2"});
  MustRun(dir, {"qemu-io", "-f", "qcow2", "-c", "write -P 0x22 64k 128k", "-c",
                "write -z 512k 64k", "-c", "discard 768k 64k", "-c",
                "write -P 0x23 900k 10k", "top.qcow2"});
}

// The top's own map (its backing file left out), as qemu-img prints it.
std::string TopMap(const TempDir& dir) {
  CommandResult r = RunIn(
      dir, {"qemu-img", "map", "--output=json",
            R"(json:{"driver": "qcow2", "backing": null, )"
            R"("file": {"driver": "file", "filename": "top.qcow2"}})"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.out;
}

TEST(DataFileCommitTest, EmptiesTopAsQemuImgDoes) {
  if (!::qcow2::testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
  TempDir ours, theirs;
  ASSERT_NO_FATAL_FAILURE(MakeCommitChain(ours));
  ASSERT_NO_FATAL_FAILURE(MakeCommitChain(theirs));
  const std::vector<uint8_t> data_before = Bytes(ours, "top.data");
  ASSERT_FALSE(data_before.empty());
  MustRun(ours, {Tool(), "commit", "top.qcow2"});
  MustRun(theirs, {"qemu-img", "commit", "top.qcow2"});
  for (const TempDir* d : {&ours, &theirs}) {
    SCOPED_TRACE(d == &ours ? "qcowtool" : "qemu-img");
    ExpectCheckClean(*d, "top.qcow2");
    ExpectCheckClean(*d, "base.qcow2");
    CommandResult r =
        RunIn(*d, {"qemu-img", "compare", "top.qcow2", "base.qcow2"});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  // Nothing is left in the top; its data file keeps its size and reads as
  // zeros (its clusters were discarded).
  EXPECT_EQ(TopMap(ours), TopMap(theirs));
  const std::vector<uint8_t> ours_data = Bytes(ours, "top.data");
  EXPECT_EQ(ours_data.size(), data_before.size());
  EXPECT_EQ(ours_data, Bytes(theirs, "top.data"));
  // Both bases hold the same guest data.
  CommandResult r =
      ::qcow2::testing::Run({"qemu-img", "compare", ours.File("base.qcow2"),
                             theirs.File("base.qcow2")});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

// ---- amend -o data_file=..., data_file_raw=... -------------------------

// The starting file `image` (.qcow2), made by qemu-img in `dir`: img
// (data file d.raw, 0x5a in its first 64 KiB), raw (data_file_raw=on,
// rd.raw, 0x5b), plain (no data file), back (data file bd.raw over
// plain.qcow2, 0x5c at 64 KiB) or v2 (compat=0.10); and a copy of its data
// file under the name the amends give it (an operator moves the file,
// then amends the name).
void MakeAmendImage(const TempDir& dir, const std::string& image) {
  auto create = [&](const std::vector<std::string>& opts,
                    const std::string& name) {
    std::vector<std::string> argv = {"qemu-img", "create", "-q", "-f",
                                     "qcow2"};
    argv.insert(argv.end(), opts.begin(), opts.end());
    argv.insert(argv.end(), {name, "1M"});
    MustRun(dir, argv);
  };
  auto fill = [&](const std::string& command, const std::string& copy) {
    MustRun(dir, {"sh", "-c",
                  absl::StrCat("qemu-io -f qcow2 -c \"", command, "\" ",
                               image, ".qcow2 >/dev/null && cp ", copy)});
  };
  if (image == "img") {
    create({"-o", "data_file=d.raw"}, "img.qcow2");
    fill("write -P 0x5a 0 64k", "d.raw new.raw");
  } else if (image == "raw") {
    create({"-o", "data_file=rd.raw,data_file_raw=on"}, "raw.qcow2");
    fill("write -P 0x5b 0 64k", "rd.raw rnew.raw");
  } else if (image == "back") {
    create({}, "plain.qcow2");
    create({"-b", "plain.qcow2", "-F", "qcow2", "-o", "data_file=bd.raw"},
           "back.qcow2");
    fill("write -P 0x5c 64k 64k", "bd.raw nb.raw");
  } else {
    create({"-o", image == "v2" ? "compat=0.10" : "compat=1.1"},
           image + ".qcow2");
  }
}

struct AmendCase {
  const char* image;    // img, raw, plain, back or v2 (.qcow2)
  const char* options;  // -o
  // "" for an amend both allow; else the message both print (after the
  // program's name).
  const char* refusal;
  // The data file the result opens with, when it names none any more.
  const char* explicit_data_file = "";
  // qemu-img writes part of the options before it refuses a later one;
  // we refuse them all up front.
  bool qemu_writes_first = false;
  // Only with QCOW2_LONG_TESTS=1 (the default suite's time is short).
  bool long_only = false;
};

// The image `c` names in `dir`, as qemu-io and qemu-img check open it.
std::vector<std::string> ImageArgs(const AmendCase& c) {
  const std::string file = absl::StrCat(c.image, ".qcow2");
  if (*c.explicit_data_file == 0) return {file};
  return {"--image-opts",
          absl::StrCat("driver=qcow2,file.filename=", file,
                       ",data-file.filename=", c.explicit_data_file)};
}

// What each image reads (qemu-io read -P of its data).
std::string ReadCommand(const AmendCase& c) {
  const std::string image = c.image;
  if (image == "img") return "read -P 0x5a 0 64k";
  if (image == "raw") return "read -P 0x5b 0 64k";
  if (image == "back") return "read -P 0x5c 64k 64k";
  return "read -P 0 0 64k";
}

void PrintTo(const AmendCase& c, std::ostream* os) {
  *os << c.image << " -o " << c.options;
}

bool LongTests() {
  const char* v = getenv("QCOW2_LONG_TESTS");
  return v != nullptr && std::string(v) == "1";
}

// `qemu-img info --output=json` without the disk usage (which depends on
// how the file system keeps holes, not on the image).
std::string Info(const TempDir& dir, const std::string& file) {
  CommandResult r = RunIn(dir, {"qemu-img", "info", "--output=json", file});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::string kept;
  for (absl::string_view line : absl::StrSplit(r.out, '\n')) {
    if (!absl::StrContains(line, "\"actual-size\"")) {
      absl::StrAppend(&kept, line, "\n");
    }
  }
  return kept;
}

class DataFileAmendTest : public ::testing::TestWithParam<AmendCase> {};

TEST_P(DataFileAmendTest, SameAsQemuImg) {
  if (!::qcow2::testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
  const AmendCase& c = GetParam();
  if (c.long_only && !LongTests()) GTEST_SKIP() << "QCOW2_LONG_TESTS=1";
  TempDir ours, theirs;
  ASSERT_NO_FATAL_FAILURE(MakeAmendImage(ours, c.image));
  MustRun(theirs,
          {"sh", "-c", absl::StrCat("cp -a '", ours.File(""), "'/. .")});
  const std::string file = absl::StrCat(c.image, ".qcow2");
  const std::vector<uint8_t> before = Bytes(ours, file);
  CommandResult o = RunIn(ours, {Tool(), "amend", "-o", c.options, file});
  CommandResult q = RunIn(theirs, {"qemu-img", "amend", "-o", c.options, file});
  if (*c.refusal != 0) {
    EXPECT_EQ(o.exit_code, 1) << o.err;
    EXPECT_EQ(q.exit_code, 1) << q.err;
    EXPECT_EQ(o.err, absl::StrCat("qcowtool: ", c.refusal, "\n"));
    EXPECT_EQ(q.err, absl::StrCat("qemu-img: ", c.refusal, "\n"));
    EXPECT_TRUE(Bytes(ours, file) == before) << "we wrote to a refused image";
    EXPECT_EQ(Bytes(theirs, file) == before, !c.qemu_writes_first);
    return;
  }
  ASSERT_EQ(o.exit_code, 0) << o.err;
  ASSERT_EQ(q.exit_code, 0) << q.err;
  // The same header, extensions and names as qemu-img writes.
  EXPECT_EQ(Info(ours, file), Info(theirs, file));
  std::vector<uint8_t> oc = Bytes(ours, file), qc = Bytes(theirs, file);
  oc.resize(65536);
  qc.resize(65536);
  EXPECT_TRUE(oc == qc) << "cluster 0 differs from qemu-img's";
  std::vector<std::string> check = {"qemu-img", "check"};
  std::vector<std::string> io = {"qemu-io", "-c", ReadCommand(c)};
  for (const std::string& a : ImageArgs(c)) {
    check.push_back(a);
    io.push_back(a);
  }
  CommandResult r = RunIn(ours, check);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  r = RunIn(ours, io);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("Pattern verification failed"), std::string::npos)
      << r.out;
}

constexpr char kNoDataFile[] =
    "data-file can only be set for images that use an external data file";
constexpr char kRawRefused[] = "data-file-raw cannot be set on existing images";

INSTANTIATE_TEST_SUITE_P(
    Amend, DataFileAmendTest,
    ::testing::Values(
        AmendCase{"img", "data_file=new.raw", ""},
        AmendCase{"img", "data_file=", "", "d.raw"},
        AmendCase{"img", "data_file_raw=off", "", "", false, true},
        AmendCase{"raw", "data_file_raw=off", ""},
        AmendCase{"raw", "data_file_raw=on", "", "", false, true},
        AmendCase{"raw", "data_file_raw=off,data_file=rnew.raw", "", "", false,
                  true},
        AmendCase{"plain", "data_file_raw=off", "", "", false, true},
        AmendCase{"back", "data_file=nb.raw", ""},
        AmendCase{"img", "data_file=new.raw,lazy_refcounts=on,size=2M", ""},
        AmendCase{"img", "data_file_raw=on", kRawRefused},
        AmendCase{"plain", "data_file=x.raw", kNoDataFile},
        AmendCase{"plain", "data_file=", kNoDataFile, "", false, true},
        AmendCase{"plain", "data_file_raw=on", kRawRefused, "", false, true},
        AmendCase{"v2", "data_file=x.raw", kNoDataFile, "", false, true},
        AmendCase{"img", "compat=0.10",
                  "Cannot downgrade an image with a data file"},
        AmendCase{"img", "data_file=q.raw,compat=0.10",
                  "Cannot downgrade an image with a data file", "", true},
        AmendCase{"img", "data_file_raw=on,refcount_bits=3", kRawRefused, "",
                  false, true},
        AmendCase{"plain", "refcount_bits=3,data_file=x", kNoDataFile, "",
                  false, true}),
    [](const auto& info) { return absl::StrCat("case", info.index); });

// An image whose data file does not open is not amended (QEMU's open
// fails the same way), and the file stays as it was.
TEST(DataFileAmendCli, MissingDataFileRefused) {
  if (!::qcow2::testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
  TempDir dir;
  MustRun(dir, {"qemu-img", "create", "-q", "-f", "qcow2", "-o",
                "data_file=d.raw", "img.qcow2", "1M"});
  MustRun(dir, {"rm", "d.raw"});
  const std::vector<uint8_t> before = Bytes(dir, "img.qcow2");
  CommandResult q = RunIn(dir, {"qemu-img", "amend", "-o",
                                "data_file=new.raw", "img.qcow2"});
  EXPECT_EQ(q.exit_code, 1) << q.err;
  CommandResult o =
      RunIn(dir, {Tool(), "amend", "-o", "data_file=new.raw", "img.qcow2"});
  EXPECT_EQ(o.exit_code, 1) << o.err;
  EXPECT_NE(o.err.find("d.raw"), std::string::npos) << o.err;
  EXPECT_TRUE(Bytes(dir, "img.qcow2") == before);
}

}  // namespace
}  // namespace qcow2
