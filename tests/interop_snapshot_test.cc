// SPDX-License-Identifier: Apache-2.0
// Internal snapshots against QEMU. Two copies of the same image go through
// the same history, one by qemu-img/qemu-io, one by qcowtool and the
// library; QEMU judges ours: `qemu-img check` clean, `qemu-img compare`
// of the active disks, every snapshot read back by `qemu-img convert -l`
// equal to QEMU's own, and the listings and info JSON equal to what
// qemu-img prints for the same file. Snapshots qemu-img made are listed,
// applied and deleted by us, and QEMU compares the results with its own.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "lib/base/endian.h"
#include "qcow2/image.h"
#include "tests/util/json_lite.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::CommandResult;

CommandResult Qcowtool(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::QcowtoolPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::Run(argv);
}

CommandResult QemuImg(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"qemu-img"};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::Run(argv);
}

#define EXPECT_RUNS(result)                         \
  do {                                              \
    const CommandResult& r_ = (result);             \
    ASSERT_EQ(r_.exit_code, 0) << r_.out << r_.err; \
  } while (0)

using testing::Qcow2Spec;

constexpr uint64_t kSize = 8 << 20;
// A cluster written compressed (qemu-io writes those only where nothing is
// allocated yet).
constexpr uint64_t kCompressedAt = 2 << 20;

// `qemu-img snapshot -l`'s table with the DATE and VM CLOCK columns cut
// out (they differ between two images made at different instants).
std::string WithoutDates(const std::string& listing) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(listing, '\n')) {
    std::string l(line);
    // ID and TAG fill 27 columns, VM SIZE 8, DATE 20, VM CLOCK 13.
    if (l.size() >= 68 && !absl::StartsWith(l, "Snapshot")) {
      l = l.substr(0, 35) + l.substr(68);
    }
    absl::StrAppend(&out, l, "\n");
  }
  return out;
}

class InteropSnapshotTest
    : public ::testing::TestWithParam<testing::QemuImageSpec> {
 protected:
  void SetUp() override {
    if (!testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
    testing::QemuImageSpec spec = GetParam();
    spec.size = kSize;
    ours_ = dir_.File("ours.qcow2");
    theirs_ = dir_.File("theirs.qcow2");
    ASSERT_OK(testing::QemuCreate(ours_, spec));
    // Data, a compressed cluster and zeros before any snapshot.
    const uint64_t cs = spec.cluster_size;
    static_assert(kCompressedAt % (64 << 10) == 0);
    std::vector<std::string> cmds = {
        "write -P 0x11 0 96k",
        absl::StrCat("write -c -P 0x22 ", kCompressedAt, " ", cs),
        "write -P 0x33 1m 200k", "write -z 1100k 64k", "write -P 0x34 7m 300k"};
    ASSERT_OK(testing::QemuIo(ours_, cmds));
    ASSERT_OK_AND_ASSIGN(auto bytes, testing::ReadFileBytes(ours_));
    ASSERT_OK(testing::WriteFileBytes(theirs_, bytes));
  }

  // The same guest write on both copies: QEMU's through qemu-io, ours
  // through the library (or `qcowtool io` with `cli`).
  void WriteBoth(uint64_t offset, uint64_t len, uint8_t byte,
                 bool cli = false) {
    const std::string cmd =
        absl::StrCat("write -P ", int{byte}, " ", offset, " ", len);
    ASSERT_OK(testing::QemuIo(theirs_, {cmd}));
    if (cli) {
      EXPECT_RUNS(Qcowtool({"io", "-c", cmd, ours_}));
      return;
    }
    OpenOptions oo;
    oo.read_write = true;
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(ours_, oo));
    std::vector<uint8_t> buf(len, byte);
    ASSERT_OK(img->Write(offset, buf));
    ASSERT_OK(img->Close());
  }

  void SnapshotBoth(const std::string& flag, const std::string& name) {
    EXPECT_RUNS(QemuImg({"snapshot", flag, name, theirs_}));
    EXPECT_RUNS(Qcowtool({"snapshot", flag, name, ours_}));
  }

  // QEMU's verdict on ours: check clean, same active disk, same snapshots.
  void ExpectSameAsQemu(const std::string& where) {
    SCOPED_TRACE(where);
    CommandResult check = testing::QemuCheck(ours_);
    EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
    CommandResult cmp = QemuImg({"compare", "-U", ours_, theirs_});
    EXPECT_EQ(cmp.exit_code, 0) << cmp.out << cmp.err;
    CommandResult ql = QemuImg({"snapshot", "-U", "-l", ours_});
    CommandResult tl = QemuImg({"snapshot", "-U", "-l", theirs_});
    EXPECT_EQ(WithoutDates(ql.out), WithoutDates(tl.out));
    // Our listing of our file is qemu-img's, byte for byte.
    CommandResult ol = Qcowtool({"snapshot", "-U", "-l", ours_});
    EXPECT_EQ(ol.out, ql.out);
    // Every snapshot reads in QEMU as QEMU's own copy of it.
    ASSERT_OK_AND_ASSIGN(auto list, Names(theirs_));
    for (const std::string& id : list) {
      const std::string a = dir_.File("a.raw"), b = dir_.File("b.raw");
      EXPECT_RUNS(
          QemuImg({"convert", "-U", "-l", absl::StrCat("snapshot.id=", id),
                   "-O", "raw", ours_, a}));
      EXPECT_RUNS(
          QemuImg({"convert", "-U", "-l", absl::StrCat("snapshot.id=", id),
                   "-O", "raw", theirs_, b}));
      ASSERT_OK_AND_ASSIGN(auto da, testing::ReadFileBytes(a));
      ASSERT_OK_AND_ASSIGN(auto db, testing::ReadFileBytes(b));
      EXPECT_TRUE(da == db) << "snapshot id " << id << " differs";
    }
  }

  // The ids of the snapshots of `path`, from qemu-img info.
  absl::StatusOr<std::vector<std::string>> Names(const std::string& path) {
    CommandResult r = QemuImg({"info", "-U", "--output=json", path});
    if (r.exit_code != 0) return absl::InternalError(r.err);
    auto v = testing::json::Parse(r.out);
    if (!v.ok()) return v.status();
    std::vector<std::string> ids;
    const auto& list = (*v)["snapshots"];
    for (size_t i = 0; i < list.size(); ++i) {
      ids.push_back(list[i]["id"].as_string());
    }
    return ids;
  }

  testing::TempDir dir_;
  std::string ours_, theirs_;
};

TEST_P(InteropSnapshotTest, CreateApplyDeleteLikeQemu) {
  SnapshotBoth("-c", "s1");
  ExpectSameAsQemu("after creating s1");
  // Writes after the snapshot (in place for QEMU's owned clusters, copied
  // for shared ones) leave s1 as it was.
  WriteBoth(0, 4096, 0x41);
  WriteBoth(kCompressedAt + 512, 1024, 0x42);         // the compressed cluster
  WriteBoth(3 << 20, 128 << 10, 0x43, /*cli=*/true);  // fresh clusters
  ExpectSameAsQemu("after writes over s1");
  SnapshotBoth("-c", "s2");
  SnapshotBoth("-c", "s1");  // a repeated name, as qemu-img allows
  WriteBoth(1 << 20, 70 << 10, 0x44, /*cli=*/true);
  ExpectSameAsQemu("after s2 and a second s1");
  // Apply by name picks the first s1; by id the third snapshot.
  SnapshotBoth("-a", "s1");
  ExpectSameAsQemu("after applying s1");
  WriteBoth(5 << 20, 10 << 10, 0x45);
  SnapshotBoth("-a", "3");
  ExpectSameAsQemu("after applying id 3");
  // Delete by name: the first s1 goes.
  SnapshotBoth("-d", "s1");
  ExpectSameAsQemu("after deleting s1");
  SnapshotBoth("-d", "s2");
  SnapshotBoth("-d", "s1");
  ExpectSameAsQemu("after deleting them all");
  ASSERT_OK_AND_ASSIGN(auto left, Names(ours_));
  EXPECT_TRUE(left.empty());
}

TEST_P(InteropSnapshotTest, InfoListsSnapshotsAsQemu) {
  SnapshotBoth("-c", "first");
  WriteBoth(0, 8192, 0x51);
  SnapshotBoth("-c", "a longer snapshot name");
  // JSON: the same members, of the same types, with the same values (the
  // same file, so the same dates).
  for (const std::string& path : {ours_, theirs_}) {
    CommandResult q = QemuImg({"info", "-U", "--output=json", path});
    CommandResult o = Qcowtool({"info", "-U", "--output=json", path});
    EXPECT_RUNS(q);
    EXPECT_RUNS(o);
    ASSERT_OK_AND_ASSIGN(auto qv, testing::json::Parse(q.out));
    ASSERT_OK_AND_ASSIGN(auto ov, testing::json::Parse(o.out));
    ASSERT_EQ(qv["snapshots"].size(), 2u);
    EXPECT_EQ(ov["snapshots"], qv["snapshots"]) << o.out << "\n" << q.out;
    EXPECT_EQ(o.out, q.out);
    // Human: the snapshot list sits where qemu-img prints it.
    CommandResult qh = QemuImg({"info", "-U", path});
    CommandResult oh = Qcowtool({"info", "-U", path});
    EXPECT_RUNS(oh);
    const size_t qs = qh.out.find("Snapshot list:");
    const size_t os = oh.out.find("Snapshot list:");
    ASSERT_NE(qs, std::string::npos);
    ASSERT_NE(os, std::string::npos);
    EXPECT_EQ(oh.out.substr(os, oh.out.find("Format specific", os) - os),
              qh.out.substr(qs, qh.out.find("Format specific", qs) - qs));
  }
}

TEST_P(InteropSnapshotTest, QemuSnapshotsThroughUs) {
  // Snapshots made by qemu-img only; we list, apply and delete them.
  EXPECT_RUNS(QemuImg({"snapshot", "-c", "q1", theirs_}));
  ASSERT_OK(testing::QemuIo(theirs_, {"write -P 0x61 0 100k"}));
  EXPECT_RUNS(QemuImg({"snapshot", "-c", "q2", theirs_}));
  ASSERT_OK(testing::QemuIo(theirs_, {"write -P 0x62 2m 100k"}));
  ASSERT_OK_AND_ASSIGN(auto bytes, testing::ReadFileBytes(theirs_));
  ASSERT_OK(testing::WriteFileBytes(ours_, bytes));
  EXPECT_EQ(Qcowtool({"snapshot", "-l", ours_}).out,
            QemuImg({"snapshot", "-l", theirs_}).out);
  OpenOptions ro;
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(ours_, ro));
  ASSERT_OK_AND_ASSIGN(auto list, img->ListSnapshots());
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].name, "q1");
  EXPECT_EQ(list[1].id, "2");
  EXPECT_EQ(list[1].icount, std::optional<uint64_t>(0));
  EXPECT_EQ(list[1].disk_size, kSize);
  img.reset();
  SnapshotBoth("-a", "q1");
  ExpectSameAsQemu("after applying QEMU's q1");
  WriteBoth(6 << 20, 64 << 10, 0x63);
  SnapshotBoth("-d", "q2");
  ExpectSameAsQemu("after deleting QEMU's q2");
}

TEST_P(InteropSnapshotTest, ApplyAcrossResize) {
  if (GetParam().compat == "0.10") {
    GTEST_SKIP() << "qemu-img refuses to resize a v2 image with snapshots";
  }
  SnapshotBoth("-c", "small");
  EXPECT_RUNS(QemuImg({"resize", theirs_, "64M"}));
  EXPECT_RUNS(QemuImg({"resize", ours_, "64M"}));
  WriteBoth(40 << 20, 64 << 10, 0x71);
  SnapshotBoth("-c", "big");
  SnapshotBoth("-a", "small");
  ExpectSameAsQemu("after going back to the small disk");
  OpenOptions ro;
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(ours_, ro));
  EXPECT_EQ(img->size(), kSize);
  img.reset();
  SnapshotBoth("-a", "big");
  ExpectSameAsQemu("after going back to the big disk");
}

TEST_P(InteropSnapshotTest, ErrorsNameImageAndSnapshot) {
  CommandResult r = Qcowtool({"snapshot", "-a", "nope", ours_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("Could not apply snapshot 'nope'"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(ours_), std::string::npos) << r.err;
  r = Qcowtool({"snapshot", "-d", "nope", ours_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("Could not delete snapshot 'nope': snapshot not found"),
            std::string::npos)
      << r.err;
  r = Qcowtool({"snapshot", "-l", "-c", "x", ours_});
  EXPECT_EQ(r.exit_code, 1);
  // An id in use is refused, through the library.
  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(ours_, oo));
  ASSERT_OK(img->CreateSnapshot("x", "5").status());
  auto again = img->CreateSnapshot("y", "5");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_OK_AND_ASSIGN(auto next, img->CreateSnapshot("z"));
  EXPECT_EQ(next.id, "6");
  // No snapshot operation while a queue is open.
  ASSERT_OK_AND_ASSIGN(auto queue, img->CreateQueue());
  EXPECT_EQ(img->CreateSnapshot("w").status().code(),
            absl::StatusCode::kFailedPrecondition);
  queue.reset();
  ASSERT_OK(img->DeleteSnapshot("x"));
  ASSERT_OK(img->Close());
  CommandResult check = testing::QemuCheck(ours_);
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  // Applying refuses an image with persistent bitmaps (v3 only), as
  // qemu-img does.
  if (GetParam().compat != "0.10") {
    EXPECT_RUNS(QemuImg({"snapshot", "-c", "before-bitmap", ours_}));
    EXPECT_RUNS(QemuImg({"bitmap", "--add", "--disable", ours_, "b0"}));
    r = Qcowtool({"snapshot", "-a", "before-bitmap", ours_});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("persistent bitmaps"), std::string::npos) << r.err;
    EXPECT_NE(QemuImg({"snapshot", "-a", "before-bitmap", ours_}).exit_code, 0);
  }
  // The external overlay form still works.
  EXPECT_RUNS(Qcowtool({"snapshot", "-q", ours_, dir_.File("over.qcow2")}));
}

TEST_P(InteropSnapshotTest, MalformedSnapshotsAreRefusedUntouched) {
  EXPECT_RUNS(QemuImg({"snapshot", "-c", "s1", ours_}));
  ASSERT_OK_AND_ASSIGN(auto good, testing::ReadFileBytes(ours_));
  const uint64_t table = internal::LoadBE64(&good[64]);
  struct Case {
    const char* what;
    uint64_t at;     // byte to patch (from the table's start)
    uint64_t value;  // big-endian u64 written there
    const char* says;
  };
  const Case cases[] = {
      {"L1 table past the end", 0, uint64_t{1} << 40, "L1 table"},
      {"L1 table unaligned", 0, 0x50007, "L1 table"},
      {"L1 size over 32 MiB", 8, uint64_t{0x01000000} << 32, "L1 table"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<uint8_t> bad = good;
    if (c.at == 8) {
      internal::StoreBE32(&bad[table + 8],
                          static_cast<uint32_t>(c.value >> 32));
    } else {
      internal::StoreBE64(&bad[table + c.at], c.value);
    }
    ASSERT_OK(testing::WriteFileBytes(ours_, bad));
    for (const char* flag : {"-a", "-d"}) {
      CommandResult r = Qcowtool({"snapshot", flag, "s1", ours_});
      EXPECT_EQ(r.exit_code, 1) << r.err;
      EXPECT_NE(r.err.find("snapshot 's1' (id 1)"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
      ASSERT_OK_AND_ASSIGN(auto after, testing::ReadFileBytes(ours_));
      EXPECT_TRUE(after == bad) << flag << " wrote to a refused image";
    }
  }
  // Extra data over QEMU's 1 KiB: listing fails, naming the image.
  std::vector<uint8_t> bad = good;
  internal::StoreBE32(&bad[table + 36], 5000);
  ASSERT_OK(testing::WriteFileBytes(ours_, bad));
  CommandResult r = Qcowtool({"snapshot", "-l", ours_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(ours_), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("snapshot table"), std::string::npos) << r.err;
}

INSTANTIATE_TEST_SUITE_P(Configs, InteropSnapshotTest,
                         ::testing::Values(Qcow2Spec("1.1", 65536),
                                           Qcow2Spec("1.1", 4096),
                                           Qcow2Spec("0.10", 65536),
                                           Qcow2Spec("0.10", 512),
                                           Qcow2Spec("1.1", 65536, true),
                                           Qcow2Spec("1.1", 32768, true)),
                         [](const auto& info) { return info.param.Token(); });

}  // namespace
}  // namespace qcow2
