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
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

}  // namespace
}  // namespace qcow2
