// SPDX-License-Identifier: Apache-2.0
// Persistent dirty bitmaps against QEMU: bitmaps added by qemu-img, guest
// changes made by libqcow2, and QEMU as the judge (qemu-img check and
// info, and the bits themselves read by qemu-nbd through nbdinfo --map,
// which share no code with our reader). Also: a crash leaves the bitmaps
// in use, a power cut at every write step of a clean close leaves them
// stored or in use, `qcowtool bitmap` does what `qemu-img bitmap` does, the
// public calls (Image::ListBitmaps, GetBitmapStatus, the edits) agree with
// QEMU, and malformed or unsupported bitmap directories are refused, never
// crashed on.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/base/endian.h"
#include "lib/format/bitmaps.h"
#include "lib/format/header.h"
#include "qcow2/image.h"
#include "testing/fault_file.h"
#include "tests/util/json_lite.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::FaultFileSystem;
using testing::CommandResult;


bool HaveNbdinfo() {
  return testing::Run({"sh", "-c", "command -v nbdinfo && command -v qemu-nbd"})
             .exit_code == 0;
}

void QemuImg(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"qemu-img"};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandResult r = testing::Run(argv);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
}

// qemu-img info's list of bitmaps: name -> flags joined by ",", and
// granularity.
struct SeenBitmap {
  std::string flags;
  uint64_t granularity = 0;
  bool operator==(const SeenBitmap& o) const {
    return flags == o.flags && granularity == o.granularity;
  }
};
std::map<std::string, SeenBitmap> QemuBitmaps(const std::string& path,
                                              bool force_share = false) {
  std::map<std::string, SeenBitmap> out;
  std::vector<std::string> argv = {"qemu-img", "info", "--output=json"};
  if (force_share) argv.push_back("-U");
  argv.push_back(path);
  CommandResult r = testing::Run(argv);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  absl::StatusOr<testing::json::Value> v = testing::json::Parse(r.out);
  EXPECT_TRUE(v.ok()) << r.out;
  if (!v.ok()) return out;
  const testing::json::Value& list = (*v)["format-specific"]["data"]["bitmaps"];
  for (size_t i = 0; i < list.size(); ++i) {
    SeenBitmap b;
    for (size_t k = 0; k < list[i]["flags"].size(); ++k) {
      if (k) b.flags += ",";
      b.flags += list[i]["flags"][k].as_string();
    }
    b.granularity = list[i]["granularity"].as_uint64();
    out[list[i]["name"].as_string()] = b;
  }
  return out;
}

// The granules QEMU reads as dirty in bitmap `name` (qemu-nbd exports it
// as the qemu:dirty-bitmap:NAME context; nbdinfo prints its extents).
std::set<uint64_t> QemuDirtyGranules(const std::string& path,
                                     const std::string& name,
                                     uint64_t granularity) {
  std::set<uint64_t> out;
  CommandResult r = testing::Run({"nbdinfo", "--map=qemu:dirty-bitmap:" + name, "--",
                         "[", "qemu-nbd", "-r", "-f", "qcow2", "-B", name,
                         path, "]"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  std::istringstream in(r.out);
  uint64_t start, len;
  int type;
  std::string desc;
  while (in >> start >> len >> type >> desc) {
    if (type != 1) continue;
    for (uint64_t g = start / granularity;
         g <= (start + len - 1) / granularity; ++g) {
      out.insert(g);
    }
  }
  return out;
}

// Names the first granules that differ.
void ExpectSameGranules(const std::set<uint64_t>& got,
                        const std::set<uint64_t>& want) {
  std::string diff;
  int n = 0;
  for (uint64_t g : got) {
    if (!want.count(g) && n++ < 10) absl::StrAppend(&diff, " +", g);
  }
  for (uint64_t g : want) {
    if (!got.count(g) && n++ < 10) absl::StrAppend(&diff, " -", g);
  }
  EXPECT_EQ(n, 0) << "granules set (+) or missing (-) in QEMU's view:"
                  << diff << " (" << got.size() << " set, " << want.size()
                  << " expected)";
}

void ExpectCheckClean(const std::string& path) {
  CommandResult r = testing::QemuCheck(path);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

struct Change {
  enum Kind { kWrite, kZero, kDiscard } kind;
  uint64_t offset, len;
};

// --- Writes by us, bits read by QEMU. -------------------------------------

struct GranularityCase {
  uint32_t cluster_size;
  uint64_t granularity;
};

class BitmapWriteTest : public ::testing::TestWithParam<GranularityCase> {};

TEST_P(BitmapWriteTest, BitsCoverExactlyTheTouchedGranules) {
  SKIP_WITHOUT_QEMU();
  if (!HaveNbdinfo()) GTEST_SKIP() << "no nbdinfo/qemu-nbd (libnbd-bin)";
  const GranularityCase c = GetParam();
  testing::TempDir dir;
  const std::string path = dir.File("a.qcow2");
  const uint64_t size = 64ull << 20;
  QemuImg({"create", "-q", "-f", "qcow2", "-o",
           absl::StrCat("cluster_size=", c.cluster_size), path, "64M"});
  QemuImg({"bitmap", "--add", "-g", std::to_string(c.granularity), path,
           "on"});
  QemuImg({"bitmap", "--add", "--disable", path, "off"});

  std::mt19937_64 rng(c.granularity * 31 + c.cluster_size);
  std::vector<Change> changes;
  for (int i = 0; i < 40; ++i) {
    Change ch;
    ch.kind = static_cast<Change::Kind>(i % 3);
    ch.offset = (rng() % (size / 512)) * 512;
    ch.len = std::min<uint64_t>(size - ch.offset, 512 * (1 + rng() % 600));
    changes.push_back(ch);
  }
  std::set<uint64_t> want;
  {
    OpenOptions oo;
    oo.read_write = true;
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(path, oo));
    for (const Change& ch : changes) {
      std::vector<uint8_t> buf(ch.len, 0x5a);
      switch (ch.kind) {
        case Change::kWrite:
          ASSERT_OK(img->Write(ch.offset, buf));
          break;
        case Change::kZero:
          ASSERT_OK(img->WriteZeroes(ch.offset, ch.len));
          break;
        case Change::kDiscard:
          ASSERT_OK(img->Discard(ch.offset, ch.len));
          break;
      }
      for (uint64_t g = ch.offset / c.granularity;
           g <= (ch.offset + ch.len - 1) / c.granularity; ++g) {
        want.insert(g);
      }
    }
    // While open, QEMU sees the bitmaps in use (the disabled one too:
    // QEMU marks every bitmap it loads read-write).
    std::map<std::string, SeenBitmap> open_view =
        QemuBitmaps(path, /*force_share=*/true);
    EXPECT_EQ(open_view["on"].flags, "in-use,auto");
    ASSERT_OK(img->Close());
  }
  ExpectCheckClean(path);
  std::map<std::string, SeenBitmap> seen = QemuBitmaps(path);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen["on"].flags, "auto");
  EXPECT_EQ(seen["on"].granularity, c.granularity);
  EXPECT_EQ(seen["off"].flags, "");
  ExpectSameGranules(QemuDirtyGranules(path, "on", c.granularity), want);
  EXPECT_TRUE(QemuDirtyGranules(path, "off", 65536).empty());

  // A second session adds to the bits already stored.
  {
    OpenOptions oo;
    oo.read_write = true;
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(path, oo));
    std::vector<uint8_t> buf(4096, 1);
    ASSERT_OK(img->Write(size - 4096, buf));
    ASSERT_OK(img->Close());
    for (uint64_t g = (size - 4096) / c.granularity;
         g <= (size - 1) / c.granularity; ++g) {
      want.insert(g);
    }
  }
  ExpectCheckClean(path);
  ExpectSameGranules(QemuDirtyGranules(path, "on", c.granularity), want);
  // And QEMU can go on using it: its own write lands in the same bitmap.
  QemuImg({"bitmap", "--clear", path, "on"});
  EXPECT_TRUE(QemuDirtyGranules(path, "on", c.granularity).empty());
  ExpectCheckClean(path);
}

INSTANTIATE_TEST_SUITE_P(
    Granularities, BitmapWriteTest,
    ::testing::Values(GranularityCase{65536, 65536},
                      GranularityCase{65536, 4096},
                      GranularityCase{4096, 512},
                      GranularityCase{512, 1 << 20},
                      GranularityCase{2 << 20, 65536}),
    [](const ::testing::TestParamInfo<GranularityCase>& i) {
      return absl::StrCat("cluster", i.param.cluster_size, "_granularity",
                          i.param.granularity);
    });

TEST(BitmapResizeTest, GrowingTheDiskGrowsTheBitmaps) {
  SKIP_WITHOUT_QEMU();
  if (!HaveNbdinfo()) GTEST_SKIP() << "no nbdinfo/qemu-nbd (libnbd-bin)";
  testing::TempDir dir;
  const std::string path = dir.File("a.qcow2");
  QemuImg({"create", "-q", "-f", "qcow2", path, "16M"});
  QemuImg({"bitmap", "--add", path, "b0"});
  {
    OpenOptions oo;
    oo.read_write = true;
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(path, oo));
    std::vector<uint8_t> buf(4096, 1);
    ASSERT_OK(img->Write(0, buf));
    ASSERT_OK(img->Resize(4ull << 30));
    ASSERT_OK(img->Write((4ull << 30) - 4096, buf));
    ASSERT_OK(img->Close());
  }
  ExpectCheckClean(path);
  EXPECT_EQ(QemuBitmaps(path)["b0"].flags, "auto");
  ExpectSameGranules(QemuDirtyGranules(path, "b0", 65536),
                     {0, ((4ull << 30) - 4096) / 65536});
}

// --- A crash leaves them in use. ------------------------------------------

TEST(BitmapCrashTest, KilledWriterLeavesBitmapsInUse) {
  SKIP_WITHOUT_QEMU();
  testing::TempDir dir;
  const std::string path = dir.File("a.qcow2");
  QemuImg({"create", "-q", "-f", "qcow2", path, "16M"});
  QemuImg({"bitmap", "--add", path, "b0"});
  QemuImg({"bitmap", "--add", "--disable", path, "b1"});
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    OpenOptions oo;
    oo.read_write = true;
    auto img = Image::Open(path, oo);
    if (!img.ok()) _exit(2);
    std::vector<uint8_t> buf(65536, 7);
    if (!(*img)->Write(0, buf).ok() || !(*img)->Flush().ok()) _exit(3);
    _exit(0);  // no Close: the process dies with the image open
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;

  std::map<std::string, SeenBitmap> seen = QemuBitmaps(path);
  EXPECT_EQ(seen["b0"].flags, "in-use,auto");
  EXPECT_EQ(seen["b1"].flags, "in-use");
  ExpectCheckClean(path);
  {
    CommandResult r = testing::Run({"qemu-img", "check", "-r", "all", path});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  // We open it again: the bitmaps stay in use (their bits are lost), our
  // writes and close keep the image clean.
  {
    OpenOptions oo;
    oo.read_write = true;
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(path, oo));
    std::vector<uint8_t> buf(4096, 9);
    ASSERT_OK(img->Write(1 << 20, buf));
    ASSERT_OK(img->Close());
  }
  ExpectCheckClean(path);
  EXPECT_EQ(QemuBitmaps(path)["b0"].flags, "in-use,auto");
  // QEMU (7.2 here) can still remove them, and reads the data we wrote.
  QemuImg({"bitmap", "--remove", path, "b0"});
  QemuImg({"bitmap", "--remove", path, "b1"});
  EXPECT_TRUE(QemuBitmaps(path).empty());
  ExpectCheckClean(path);
  CommandResult r = testing::Run({"qemu-io", "-c", "read -P 7 0 64k", "-c",
                         "read -P 9 1M 4k", path});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_FALSE(absl::StrContains(r.out, "Pattern verification failed"))
      << r.out;
}

// --- A power cut at every write step of a session that stores them. -------

TEST(BitmapCrashTest, PowerCutAtEveryStepOfOpenWriteClose) {
  SKIP_WITHOUT_QEMU();
  testing::TempDir dir;
  const std::string path = dir.File("a.qcow2");
  QemuImg({"create", "-q", "-f", "qcow2", path, "16M"});
  QemuImg({"bitmap", "--add", path, "b0"});
  QemuImg({"bitmap", "--add", "-g", "4096", path, "b1"});
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> initial,
                       testing::ReadFileBytes(path));

  FaultFileSystem fs;
  auto disk = fs.Disk("/d/a.qcow2");
  auto reset = [&](uint64_t die_at) { disk->Reset(initial, die_at); };
  // One session: open, writes, a flush, more writes, a clean close.
  auto session = [&]() -> absl::Status {
    OpenOptions oo;
    oo.read_write = true;
    oo.opener = &fs;
    absl::StatusOr<std::unique_ptr<Image>> img = Image::Open("/d/a.qcow2", oo);
    if (!img.ok()) return img.status();
    std::vector<uint8_t> buf(8192, 3);
    absl::Status s = (*img)->Write(0, buf);
    if (s.ok()) s = (*img)->WriteZeroes(5 << 20, 1 << 20);
    if (s.ok()) s = (*img)->Flush();
    if (s.ok()) s = (*img)->Discard(9 << 20, 65536);
    if (s.ok()) s = (*img)->Close();
    img->reset();
    return s;
  };
  reset(0);
  ASSERT_OK(session());
  const uint64_t total = disk->ops;
  ASSERT_GT(total, 10u);
  ASSERT_OK(testing::WriteFileBytes(path, disk->current));
  ExpectCheckClean(path);
  const std::set<uint64_t> stored_b0 = QemuDirtyGranules(path, "b0", 65536);
  EXPECT_FALSE(stored_b0.empty());

  int stored = 0, in_use = 0, untouched = 0;
  std::mt19937 rng(7);
  for (uint64_t cut = 1; cut <= total + 1; ++cut) {
    for (int variant = 0; variant < 2; ++variant) {
      SCOPED_TRACE(absl::StrCat("power cut at op ", cut, " of ", total,
                                variant ? " (random writes survive)" : ""));
      reset(cut);
      session().IgnoreError();
      {
        std::lock_guard<std::mutex> lock(disk->mu);
        disk->dead = false;
      }
      disk->PowerCut(variant ? &rng : nullptr);
      ASSERT_OK(testing::WriteFileBytes(path, disk->durable));
      CommandResult r = testing::QemuCheck(path);
      ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 3)
          << "qemu-img check exit " << r.exit_code << "\n" << r.out << r.err;
      std::map<std::string, SeenBitmap> seen = QemuBitmaps(path);
      ASSERT_EQ(seen.size(), 2u);
      const std::string f = seen["b0"].flags;
      ASSERT_TRUE(f == "auto" || f == "in-use,auto") << f;
      ASSERT_EQ(seen["b1"].flags, f);
      if (f == "in-use,auto") {
        ++in_use;
      } else if (cut > total) {
        ++stored;
      } else {
        // Either before the open marked them, or after the store: the
        // bits are then the stored ones or the initial (empty) ones.
        std::set<uint64_t> bits =
            HaveNbdinfo() ? QemuDirtyGranules(path, "b0", 65536) : stored_b0;
        ASSERT_TRUE(bits.empty() || bits == stored_b0);
        ++(bits.empty() ? untouched : stored);
      }
    }
  }
  EXPECT_GT(in_use, 0);
  EXPECT_GT(stored, 0);
  std::printf("power cuts: %d in use, %d stored, %d before the open marked "
              "them\n", in_use, stored, untouched);
}

// --- qcowtool bitmap against qemu-img bitmap. -----------------------------

TEST(BitmapToolTest, VerbsMatchQemuImg) {
  SKIP_WITHOUT_QEMU();
  testing::TempDir dir;
  const std::string ours = dir.File("ours.qcow2");
  const std::string theirs = dir.File("theirs.qcow2");
  QemuImg({"create", "-q", "-f", "qcow2", ours, "32M"});
  QemuImg({"create", "-q", "-f", "qcow2", theirs, "32M"});
  const std::vector<std::vector<std::string>> steps = {
      {"--add", "b0"},
      {"--add", "-g", "1M", "--disable", "b1"},
      {"--add", "-g", "512", "b2"},
      {"--add", "b0"},                 // exists
      {"--add", "-g", "100", "b9"},    // bad granularity
      {"--add", "-g", "256", "b9"},    // under 512
      {"--remove", "nope"},            // missing
      {"--clear", "nope"},
      {"--enable", "b1"},
      {"--disable", "b0"},
      {"--merge", "b2", "b1"},
      {"--clear", "b2"},
      {"--remove", "b2"},
      {"--add", "--remove", "b3"},
      {"--enable", "--disable", "--enable", "b0"},
      {"b0"},                          // no operation
      {"--add", ""},                   // empty name
  };
  for (const auto& step : steps) {
    std::vector<std::string> q = {"qemu-img", "bitmap"};
    std::vector<std::string> u = {testing::QcowtoolPath(), "bitmap"};
    for (size_t i = 0; i + 1 < step.size(); ++i) {
      q.push_back(step[i]);
      u.push_back(step[i]);
    }
    q.push_back(theirs);
    u.push_back(ours);
    q.push_back(step.back());
    u.push_back(step.back());
    // Some data for the bitmaps to see, written by QEMU into both.
    for (const std::string& p : {ours, theirs}) {
      CommandResult w = testing::Run({"qemu-io", "-c", "write 4M 64k", p});
      ASSERT_EQ(w.exit_code, 0) << w.err;
    }
    CommandResult rq = testing::Run(q);
    CommandResult ru = testing::Run(u);
    const std::string where = testing::FormatCommand(u);
    EXPECT_EQ(ru.exit_code, rq.exit_code) << where << "\nqemu-img: " << rq.err
                                          << "\nqcowtool: " << ru.err;
    if (rq.exit_code != 0) {
      // Same message after the program name.
      std::string qm = rq.err.substr(rq.err.find(": ") + 2);
      std::string um = ru.err.substr(ru.err.find(": ") + 2);
      EXPECT_EQ(um, qm) << where;
    }
    EXPECT_EQ(QemuBitmaps(ours), QemuBitmaps(theirs)) << where;
    ExpectCheckClean(ours);
    if (HaveNbdinfo()) {
      for (const auto& [name, b] : QemuBitmaps(theirs)) {
        EXPECT_EQ(QemuDirtyGranules(ours, name, b.granularity),
                  QemuDirtyGranules(theirs, name, b.granularity))
            << where << " bitmap " << name;
      }
    }
  }
  // qcowtool info shows them as qemu-img info does.
  CommandResult a = testing::Run({"qemu-img", "info", "--output=json", ours});
  CommandResult b =
      testing::Run({testing::QcowtoolPath(), "info", "--output=json", ours});
  auto strip = [](const std::string& s) {
    std::string out;
    std::istringstream in(s);
    for (std::string line; std::getline(in, line);) {
      if (!absl::StrContains(line, "actual-size")) out += line + "\n";
    }
    return out;
  };
  EXPECT_EQ(strip(b.out), strip(a.out));
}

// --- Malformed and unsupported directories. -------------------------------

// Patches the first directory entry of `path` (one bitmap) at byte `at`
// of the entry with `bytes`.
void PatchEntry(const std::string& path, size_t at,
                const std::vector<uint8_t>& bytes) {
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> f, testing::ReadFileBytes(path));
  // Our own decoder finds the extension; the patch is checked by QEMU's
  // verdict below, not by our reader.
  ASSERT_OK_AND_ASSIGN(internal::Header h, internal::DecodeHeader(f, path));
  uint64_t dir = 0;
  for (const auto& e : h.other_extensions) {
    if (e.magic == internal::kExtBitmaps) dir = internal::LoadBE64(&e.data[16]);
  }
  ASSERT_NE(dir, 0u);
  std::copy(bytes.begin(), bytes.end(), f.begin() + dir + at);
  ASSERT_OK(testing::WriteFileBytes(path, f));
}

struct BadCase {
  const char* name;
  size_t at;
  std::vector<uint8_t> bytes;
  absl::StatusCode code;
  const char* says;
};

TEST(BitmapMalformedTest, RefusedForWritingReadableOtherwise) {
  SKIP_WITHOUT_QEMU();
  const std::vector<BadCase> cases = {
      {"reserved flag", 12, {0, 0, 0, 0x0a}, absl::StatusCode::kUnimplemented,
       "unsupported flags 0x8"},
      {"type 2", 16, {2}, absl::StatusCode::kUnimplemented, "has type 2"},
      {"granularity 70", 17, {70}, absl::StatusCode::kDataLoss,
       "granularity_bits 70"},
      {"granularity 8", 17, {8}, absl::StatusCode::kUnimplemented,
       "granularity_bits 8"},
      {"name size 0", 18, {0, 0}, absl::StatusCode::kDataLoss,
       "name_size is 0"},
      {"name past end", 18, {0x7f, 0xff}, absl::StatusCode::kDataLoss,
       "run past the end of the directory"},
      {"unaligned table", 6, {0x12, 0x34}, absl::StatusCode::kDataLoss,
       "bitmap table offset"},
      {"table size 0", 8, {0, 0, 0, 0}, absl::StatusCode::kDataLoss,
       "bitmap_table_size 0"},
      {"table size wrong", 8, {0, 0, 0, 9}, absl::StatusCode::kDataLoss,
       "does not match"},
      {"table past eof", 0, {0, 0, 0, 1, 0, 0, 0, 0},
       absl::StatusCode::kDataLoss, "past the end of the file"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    testing::TempDir dir;
    const std::string path = dir.File("a.qcow2");
    QemuImg({"create", "-q", "-f", "qcow2", path, "16M"});
    QemuImg({"bitmap", "--add", path, "b0"});
    PatchEntry(path, c.at, c.bytes);
    OpenOptions rw;
    rw.read_write = true;
    absl::StatusOr<std::unique_ptr<Image>> img = Image::Open(path, rw);
    ASSERT_FALSE(img.ok());
    EXPECT_EQ(img.status().code(), c.code) << img.status();
    EXPECT_TRUE(absl::StrContains(img.status().message(), c.says))
        << img.status();
    EXPECT_TRUE(absl::StrContains(img.status().message(), path))
        << img.status();
    // Read-only opens do not touch bitmaps, and the file is unchanged.
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> before,
                         testing::ReadFileBytes(path));
    OpenOptions ro;
    ASSERT_OK_AND_ASSIGN(auto rimg, Image::Open(path, ro));
    std::vector<uint8_t> buf(4096);
    ASSERT_OK(rimg->Read(0, absl::MakeSpan(buf)));
    rimg.reset();
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> after,
                         testing::ReadFileBytes(path));
    EXPECT_EQ(before, after);
  }
}

TEST(BitmapMalformedTest, DirectoryDecoderNeverCrashes) {
  // Random bytes in a directory: an error or entries, never a crash.
  internal::Header h;
  h.cluster_bits = 16;
  h.size = 1 << 30;
  internal::BitmapsExtension ext;
  ext.nb_bitmaps = 3;
  ext.directory_offset = 1 << 16;
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> dir(8 + rng() % 200);
    for (auto& b : dir) b = static_cast<uint8_t>(rng() % 4 == 0 ? rng() : 0);
    ext.directory_size = dir.size();
    auto r = internal::DecodeBitmapDirectory(dir, ext, h, 1ull << 40, "x");
    if (!r.ok()) EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  }
}

TEST(BitmapMalformedTest, ExtensionChecks) {
  internal::Header h;
  h.cluster_bits = 16;
  h.size = 1 << 30;
  std::vector<uint8_t> data = internal::EncodeBitmapsExtension({1, 32, 65536});
  EXPECT_OK(internal::DecodeBitmapsExtension(data, h, 1 << 20, "x").status());
  auto bad = [&](size_t at, uint8_t v, const char* says) {
    std::vector<uint8_t> d = data;
    d[at] = v;
    auto r = internal::DecodeBitmapsExtension(d, h, 1 << 20, "x");
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::StrContains(r.status().message(), says)) << r.status();
  };
  bad(3, 0, "nb_bitmaps 0");
  bad(7, 1, "reserved field");
  bad(23, 8, "not a cluster aligned");
  bad(20, 1, "past the end of the file");
  bad(15, 0, "bitmap_directory_size 0");
  EXPECT_FALSE(
      internal::DecodeBitmapsExtension({1, 2, 3}, h, 1 << 20, "x").ok());
}

// --- The public bitmap calls of Image (ListBitmaps, GetBitmapStatus and
// the edits): the dirty granules GetBitmapStatus walks on an open image,
// while requests run on a queue, are the ones qemu-nbd exports once the
// image is closed, and the listing is what `qemu-img info` lists.

// The granules of bitmap `name` that GetBitmapStatus reports dirty, walking
// the disk range by range (each range uniform and granule-aligned).
std::set<uint64_t> OurDirtyGranules(const Image& image,
                                    const std::string& name,
                                    uint64_t granularity) {
  std::set<uint64_t> out;
  uint64_t off = 0;
  while (off < image.size()) {
    absl::StatusOr<BitmapStatus> st =
        image.GetBitmapStatus(name, off, image.size());
    EXPECT_TRUE(st.ok()) << st.status();
    if (!st.ok()) break;
    EXPECT_EQ(st->offset, off);
    EXPECT_GT(st->length, 0u);
    EXPECT_TRUE((off + st->length) % granularity == 0 ||
                off + st->length == image.size())
        << off << "+" << st->length;
    if (st->dirty) {
      for (uint64_t g = off / granularity;
           g <= (off + st->length - 1) / granularity; ++g) {
        out.insert(g);
      }
    }
    off += st->length;
  }
  return out;
}

// The bitmaps as Image::ListBitmaps lists them, in QemuBitmaps' terms.
std::map<std::string, SeenBitmap> OurListed(const Image& image) {
  std::map<std::string, SeenBitmap> out;
  absl::StatusOr<std::vector<BitmapInfo>> list = image.ListBitmaps();
  EXPECT_TRUE(list.ok()) << list.status();
  if (!list.ok()) return out;
  for (const BitmapInfo& b : *list) {
    SeenBitmap s;
    s.flags = b.in_use && b.enabled ? "in-use,auto"
              : b.in_use            ? "in-use"
              : b.enabled           ? "auto"
                                    : "";
    s.granularity = b.granularity;
    out[b.name] = s;
  }
  return out;
}

TEST(BitmapApiTest, LiveStatusIsWhatQemuExportsAfterClose) {
  SKIP_WITHOUT_QEMU();
  if (!HaveNbdinfo()) GTEST_SKIP() << "no nbdinfo/qemu-nbd (libnbd-bin)";
  testing::TempDir dir;
  const std::string path = dir.File("disk.qcow2");
  constexpr uint64_t kSize = 8ull << 20;
  QemuImg({"create", "-q", "-f", "qcow2", "-o", "cluster_size=65536", path,
           std::to_string(kSize)});
  // "old" comes from qemu-img, with writes made before we open.
  QemuImg({"bitmap", "--add", "-g", "65536", path, "old"});
  QemuImg({"bitmap", "--add", "--disable", "-g", "131072", path, "off"});
  CommandResult io = testing::Run(
      {"qemu-io", "-f", "qcow2", "-c", "write 0 4k", "-c", "write 3M 1k",
       path});
  ASSERT_EQ(io.exit_code, 0) << io.err;

  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image, Image::Open(path, oo));
  ASSERT_OK(image->AddBitmap("fine", 4096));
  ASSERT_OK(image->AddBitmap("coarse", 1 << 20, /*enabled=*/false));
  ASSERT_OK(image->AddBitmap("default"));
  absl::Status dup = image->AddBitmap("fine", 4096);
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists) << dup;

  // Writes on a queue while another thread reads the status: the status
  // call must be safe beside requests in flight.
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      absl::StatusOr<BitmapStatus> st = image->GetBitmapStatus("fine", 0, kSize);
      ASSERT_TRUE(st.ok()) << st.status();
    }
  });
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Queue> q, image->CreateQueue());
    std::vector<uint8_t> buf(8192, 0xab);
    const uint64_t writes[] = {5000, 1 << 20, (5 << 20) + 100, kSize - 8192};
    int left = 0;
    for (uint64_t off : writes) {
      ++left;
      ASSERT_OK(q->SubmitWrite(off, absl::MakeSpan(buf),
                               [&](absl::Status s) {
                                 EXPECT_OK(s);
                                 --left;
                               }));
    }
    ASSERT_OK(q->SubmitWriteZeroes(6 << 20, 3000, false,
                                   [&](absl::Status s) { EXPECT_OK(s); }));
    q->Drain();
  }
  done = true;
  reader.join();
  ASSERT_OK(image->WriteZeroes(7 << 20, 65536));

  // What each bitmap saw, while the image is open.
  const std::set<uint64_t> fine = OurDirtyGranules(*image, "fine", 4096);
  const std::set<uint64_t> want_fine = {1, 2, 3, 256, 257, 1280, 1281, 1282,
                                        1536, 2046, 2047, 1792, 1793, 1794,
                                        1795, 1796, 1797, 1798, 1799, 1800,
                                        1801, 1802, 1803, 1804, 1805, 1806,
                                        1807};
  EXPECT_EQ(fine, want_fine);
  EXPECT_TRUE(OurDirtyGranules(*image, "coarse", 1 << 20).empty());
  const std::set<uint64_t> old_live = OurDirtyGranules(*image, "old", 65536);
  EXPECT_TRUE(old_live.count(0) && old_live.count(48) && old_live.count(16))
      << "before-open and live writes both recorded";
  EXPECT_TRUE(OurDirtyGranules(*image, "off", 131072).empty());

  // A status clipped by max_len, and the errors.
  ASSERT_OK_AND_ASSIGN(BitmapStatus one,
                       image->GetBitmapStatus("fine", 4096, 100));
  EXPECT_TRUE(one.dirty);
  EXPECT_EQ(one.length, 100u);
  absl::StatusOr<BitmapStatus> missing = image->GetBitmapStatus("nope", 0, 1);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "nope"));
  EXPECT_EQ(image->GetBitmapStatus("fine", kSize, 1).status().code(),
            absl::StatusCode::kOutOfRange);

  // Merge, clear, enable, disable, remove.
  ASSERT_OK(image->MergeBitmap("coarse", "fine"));
  ASSERT_OK(image->EnableBitmap("off"));
  ASSERT_OK(image->DisableBitmap("default"));
  ASSERT_OK(image->ClearBitmap("old"));
  ASSERT_OK(image->AddBitmap("gone", 65536));
  ASSERT_OK(image->RemoveBitmap("gone"));
  EXPECT_EQ(image->RemoveBitmap("gone").code(), absl::StatusCode::kNotFound);
  ASSERT_OK(image->Write(0, std::vector<uint8_t>(512, 1)));
  const std::map<std::string, SeenBitmap> live = OurListed(*image);
  const std::set<uint64_t> coarse_want = {0, 1, 5, 6, 7};
  EXPECT_EQ(OurDirtyGranules(*image, "coarse", 1 << 20), coarse_want);
  ASSERT_OK(image->Close());
  image.reset();

  // QEMU's view of the stored bitmaps.
  EXPECT_EQ(QemuBitmaps(path), live);
  std::set<uint64_t> fine_after = fine;
  fine_after.insert(0);  // the last write
  EXPECT_EQ(QemuDirtyGranules(path, "fine", 4096), fine_after);
  EXPECT_EQ(QemuDirtyGranules(path, "coarse", 1 << 20), coarse_want);
  const std::set<uint64_t> old_want = {0};
  EXPECT_EQ(QemuDirtyGranules(path, "old", 65536), old_want);
  EXPECT_EQ(QemuDirtyGranules(path, "off", 131072), old_want);
  EXPECT_EQ(testing::QemuCheck(path).exit_code, 0);

  // Read-only: loaded from the file on first use, the same bits.
  OpenOptions ro;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> again, Image::Open(path, ro));
  EXPECT_EQ(OurListed(*again), live);
  EXPECT_EQ(OurDirtyGranules(*again, "fine", 4096), fine_after);
  EXPECT_EQ(again->AddBitmap("x").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BitmapApiTest, RawImagesHaveNone) {
  testing::TempDir dir;
  const std::string path = dir.File("disk.raw");
  CreateOptions co;
  co.format = ImageFormat::kRaw;
  co.size = 1 << 20;
  ASSERT_OK(CreateImage(path, co));
  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image, Image::Open(path, oo));
  ASSERT_OK_AND_ASSIGN(std::vector<BitmapInfo> list, image->ListBitmaps());
  EXPECT_TRUE(list.empty());
  EXPECT_EQ(image->GetBitmapStatus("b", 0, 1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(image->AddBitmap("b").code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace qcow2
