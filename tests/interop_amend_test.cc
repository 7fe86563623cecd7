// SPDX-License-Identifier: Apache-2.0
// `qcowtool amend` against `qemu-img amend`: each case builds an image with
// qemu-img and qemu-io (data, zero clusters, compressed clusters, a backing
// file, internal snapshots, 512 B .. 2 MiB clusters), copies it twice,
// amends one copy with each tool and compares:
//  - exit codes and messages (qemu-img's "qemu-img: " prefix against our
//    "qcowtool: ");
//  - on success: `qemu-img check` clean on ours, `qemu-img compare` of ours
//    against the image before the amend identical (and every snapshot's
//    contents too), and `qemu-img info --output=json` of both results key
//    for key (sizes, backing names, snapshots, format-specific data);
//  - on a refusal: our copy byte for byte as it was.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "tests/util/json_lite.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::CommandResult;

// How a case's image is made, in `dir`; returns the image's path.
using Setup = std::function<std::string(const testing::TempDir& dir)>;

void MustRun(const std::vector<std::string>& argv) {
  CommandResult r = testing::Run(argv);
  ASSERT_EQ(r.exit_code, 0) << testing::FormatCommand(argv) << "\n" << r.err;
}

// A qcow2 image with data, zero clusters, a compressed cluster and a
// discarded range. `opts` are extra qemu-img create options.
std::string Mixed(const testing::TempDir& dir, const std::string& opts,
                  uint64_t cluster_size) {
  const std::string path = dir.File("img.qcow2");
  const uint64_t cs = cluster_size;
  MustRun({"qemu-img", "create", "-q", "-f", "qcow2", "-o",
           absl::StrCat("cluster_size=", cs, opts.empty() ? "" : ",", opts),
           path, std::to_string(std::max<uint64_t>(8 << 20, 16 * cs))});
  // Offsets in units of at least 64 KiB, past the first 300 KiB of data.
  const uint64_t u = std::max<uint64_t>(cs, 65536);
  const uint64_t b = u < (1u << 20) ? 1u << 20 : 0;
  MustRun({"qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 300k", "-c",
           absl::StrCat("write -z ", b + 4 * u, " ", 3 * u), "-c",
           absl::StrCat("write -c -P 0x22 ", b + 8 * u, " ", u), "-c",
           absl::StrCat("write -P 0x33 ", b + 10 * u, " ", 2 * u), "-c",
           absl::StrCat("discard ", b + 10 * u, " ", u), "-c",
           absl::StrCat("write -z ", b + 13 * u, " 64k"), path});
  return path;
}

Setup MixedImage(const std::string& opts, uint64_t cluster_size = 65536) {
  return [=](const testing::TempDir& dir) {
    return Mixed(dir, opts, cluster_size);
  };
}

// An overlay over a base with data: zero clusters where the base has data
// (version 2 must allocate them), and data of its own.
Setup BackedImage(const std::string& opts) {
  return [=](const testing::TempDir& dir) {
    const std::string base = dir.File("base.qcow2");
    const std::string top = dir.File("img.qcow2");
    MustRun({"qemu-img", "create", "-q", "-f", "qcow2", base, "4M"});
    MustRun({"qemu-io", "-f", "qcow2", "-c", "write -P 0x44 0 4M", base});
    MustRun({"qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F",
             "qcow2", "-o", opts, top});
    MustRun({"qemu-io", "-f", "qcow2", "-c", "write -z 64k 192k", "-c",
             "write -P 0x55 1m 100k", "-c", "write -z 3m 4k", top});
    return top;
  };
}

// Internal snapshots (shared clusters, refcount 2 and 3); with a backing
// file, zero clusters in L2 tables the snapshots share.
Setup SnapshotImage(const std::string& opts, bool backing) {
  return [=](const testing::TempDir& dir) {
    std::string top = dir.File("img.qcow2");
    if (backing) {
      top = BackedImage(opts)(dir);
    } else {
      MustRun({"qemu-img", "create", "-q", "-f", "qcow2", "-o", opts, top,
               "4M"});
      MustRun({"qemu-io", "-f", "qcow2", "-c", "write -P 0x61 0 512k", "-c",
               "write -z 1m 128k", top});
    }
    MustRun({"qemu-img", "snapshot", "-c", "s1", top});
    MustRun({"qemu-io", "-f", "qcow2", "-c", "write -P 0x62 64k 64k", "-c",
             "write -z 2m 64k", top});
    MustRun({"qemu-img", "snapshot", "-c", "s2", top});
    MustRun({"qemu-io", "-f", "qcow2", "-c", "write -P 0x63 0 4k", top});
    return top;
  };
}

// A version 2 image whose snapshot entries have no extra data (as QEMU
// before 4.2 wrote them): made by qemu-img, then the table rewritten in
// place without the extra data.
std::string V2SnapshotsWithoutExtra(const testing::TempDir& dir) {
  const std::string p = SnapshotImage("compat=0.10", false)(dir);
  auto bytes = testing::ReadFileBytes(p);
  if (!bytes.ok()) return p;
  std::vector<uint8_t>& b = *bytes;
  auto be = [&](size_t at, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = v << 8 | b[at + i];
    return v;
  };
  const uint64_t count = be(60, 4);
  const uint64_t table = be(64, 8);
  std::vector<uint8_t> out;
  uint64_t pos = table;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t id_len = be(pos + 12, 2), name_len = be(pos + 14, 2);
    const uint64_t extra = be(pos + 36, 4);
    std::vector<uint8_t> e(b.begin() + pos, b.begin() + pos + 40);
    e[36] = e[37] = e[38] = e[39] = 0;
    const auto names = b.begin() + pos + 40 + extra;
    e.insert(e.end(), names, names + id_len + name_len);
    e.resize((e.size() + 7) / 8 * 8, 0);
    out.insert(out.end(), e.begin(), e.end());
    pos += (40 + extra + id_len + name_len + 7) / 8 * 8;
  }
  std::fill(b.begin() + table, b.begin() + pos, 0);
  std::copy(out.begin(), out.end(), b.begin() + table);
  EXPECT_OK(testing::WriteFileBytes(p, b));
  return p;
}

// A dirty image: lazy refcounts, and qemu-io killed before a clean close.
std::string DirtyLazy(const testing::TempDir& dir) {
  const std::string path = dir.File("img.qcow2");
  MustRun({"qemu-img", "create", "-q", "-f", "qcow2", "-o",
           "lazy_refcounts=on", path, "4M"});
  testing::Run({"qemu-io", "-f", "qcow2", "-c", "write -P 0x71 0 1m", "-c",
       "write -z 2m 64k", "-c", "abort", path});
  return path;
}

struct Case {
  const char* name;
  Setup setup;
  std::string options;  // the -o list
  // When we knowingly differ from qemu-img (documented in docs/cli.md):
  // our expected exit code and a piece of our message.
  int our_exit = -1;
  std::string our_message;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// The error text after the program's prefix, with the tool names
// normalised. The lines QEMU's open prints while it repairs a dirty image
// (we repair it silently) are left out.
std::string Message(const std::string& err, const char* prefix) {
  std::string kept;
  for (absl::string_view line : absl::StrSplit(err, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "ERROR cluster") ||
        absl::StartsWith(line, "Rebuilding refcount") ||
        absl::StartsWith(line, "Repairing cluster")) {
      continue;
    }
    absl::StrAppend(&kept, line, "\n");
  }
  absl::string_view s = kept;
  absl::ConsumePrefix(&s, prefix);
  return absl::StrReplaceAll(s, {{"qemu-img rebase", "TOOL rebase"},
                                 {"qcowtool rebase", "TOOL rebase"}});
}

// The parts of `qemu-img info --output=json` an amend decides.
void CompareInfo(const std::string& ours, const std::string& theirs) {
  CommandResult a = testing::Run({"qemu-img", "info", "--output=json", ours});
  CommandResult b = testing::Run({"qemu-img", "info", "--output=json", theirs});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  ASSERT_OK_AND_ASSIGN(auto x, testing::json::Parse(a.out));
  ASSERT_OK_AND_ASSIGN(auto y, testing::json::Parse(b.out));
  for (const char* key : {"virtual-size", "cluster-size", "format",
                          "backing-filename", "backing-filename-format",
                          "dirty-flag"}) {
    EXPECT_EQ(x[key].ToString(), y[key].ToString()) << key;
  }
  const auto& sx = x["snapshots"];
  const auto& sy = y["snapshots"];
  ASSERT_EQ(sx.size(), sy.size());
  for (size_t i = 0; i < sx.size(); ++i) {
    for (const char* key : {"id", "name", "vm-state-size", "date-sec"}) {
      EXPECT_EQ(sx[i][key].ToString(), sy[i][key].ToString()) << key;
    }
  }
  const auto& fx = x["format-specific"]["data"];
  const auto& fy = y["format-specific"]["data"];
  EXPECT_EQ(fx.ToString(), fy.ToString()) << "format-specific data";
}

// Every snapshot of `image` as raw bytes, by id.
std::vector<std::vector<uint8_t>> SnapshotContents(const testing::TempDir& dir,
                                                   const std::string& image) {
  std::vector<std::vector<uint8_t>> out;
  CommandResult info = testing::Run({"qemu-img", "info", "--output=json", image});
  auto v = testing::json::Parse(info.out);
  if (!v.ok()) return out;
  const auto& list = (*v)["snapshots"];
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string raw = dir.File("snap.raw");
    testing::Run({"qemu-img", "convert", "-l",
         absl::StrCat("snapshot.id=", list[i]["id"].as_string()), "-O", "raw",
         image, raw});
    auto bytes = testing::ReadFileBytes(raw);
    out.push_back(bytes.ok() ? *bytes : std::vector<uint8_t>{});
  }
  return out;
}

class AmendTest : public ::testing::TestWithParam<Case> {};

TEST_P(AmendTest, MatchesQemuImg) {
  SKIP_WITHOUT_QEMU();
  const Case& c = GetParam();
  testing::TempDir dir;
  const std::string image = c.setup(dir);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const std::string before = dir.File("before.qcow2");
  const std::string ours = dir.File("ours.qcow2");
  const std::string theirs = dir.File("theirs.qcow2");
  ASSERT_OK_AND_ASSIGN(const std::vector<uint8_t> bytes,
                       testing::ReadFileBytes(image));
  for (const std::string& p : {before, ours, theirs}) {
    ASSERT_OK(testing::WriteFileBytes(p, bytes));
  }
  const std::vector<std::vector<uint8_t>> snaps_before =
      SnapshotContents(dir, before);

  // Cases where we knowingly differ do not run qemu-img at all.
  CommandResult q;
  if (c.our_exit < 0) {
    q = testing::Run({"qemu-img", "amend", "-o", c.options, theirs});
  }
  CommandResult o =
      testing::Run({testing::QcowtoolPath(), "amend", "-o", c.options, ours});
  if (c.our_exit >= 0) {
    EXPECT_EQ(o.exit_code, c.our_exit) << o.err;
    EXPECT_NE(o.err.find(c.our_message), std::string::npos) << o.err;
  } else {
    ASSERT_EQ(o.exit_code, q.exit_code)
        << "qemu-img: " << q.err << "\nqcowtool: " << o.err;
    EXPECT_EQ(Message(o.err, "qcowtool: "), Message(q.err, "qemu-img: "));
  }
  if (o.exit_code != 0) {
    ASSERT_OK_AND_ASSIGN(const std::vector<uint8_t> after,
                         testing::ReadFileBytes(ours));
    EXPECT_TRUE(after == bytes) << "a refused amend wrote to the image";
    return;
  }
  CommandResult check = testing::Run({"qemu-img", "check", ours});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  // The guest data is unchanged (a shrink keeps what lies below the new
  // end) and reads as qemu-img's result does.
  if (!absl::StrContains(c.options, "size=1M")) {
    CommandResult cmp = testing::Run({"qemu-img", "compare", before, ours});
    EXPECT_EQ(cmp.exit_code, 0) << cmp.out << cmp.err;
  }
  if (c.our_exit < 0) {
    CommandResult cmp = testing::Run({"qemu-img", "compare", theirs, ours});
    EXPECT_EQ(cmp.exit_code, 0) << cmp.out << cmp.err;
  }
  // qemu-img reads a snapshot at the image's current size: zeros past the
  // snapshot's own end after a grow.
  const std::vector<std::vector<uint8_t>> snaps = SnapshotContents(dir, ours);
  ASSERT_EQ(snaps.size(), snaps_before.size());
  for (size_t i = 0; i < snaps.size(); ++i) {
    const std::vector<uint8_t>& a = snaps[i];
    const std::vector<uint8_t>& b = snaps_before[i];
    ASSERT_GE(a.size(), b.size());
    EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin()) &&
                std::all_of(a.begin() + b.size(), a.end(),
                            [](uint8_t x) { return x == 0; }))
        << "snapshot " << i << " reads differently";
  }
  if (c.our_exit < 0) CompareInfo(ours, theirs);
}

std::vector<Case> Cases() {
  std::vector<Case> v;
  auto add = [&](const char* name, Setup s, std::string opts) {
    v.push_back(Case{name, std::move(s), std::move(opts)});
  };
  // compat, both ways, at every cluster size.
  for (uint64_t cs : {512u, 4096u, 65536u, 2u << 20}) {
    const char* down = cs == 512       ? "downgrade_c512"
                       : cs == 4096    ? "downgrade_c4k"
                       : cs == 65536   ? "downgrade_c64k"
                                       : "downgrade_c2m";
    const char* up = cs == 512       ? "upgrade_c512"
                     : cs == 4096    ? "upgrade_c4k"
                     : cs == 65536   ? "upgrade_c64k"
                                     : "upgrade_c2m";
    add(down, MixedImage("", cs), "compat=0.10");
    add(up, MixedImage("compat=0.10", cs), "compat=1.1");
  }
  add("downgrade_v2_alias", MixedImage(""), "compat=v2");
  add("upgrade_v3_alias", MixedImage("compat=0.10"), "compat=v3");
  add("downgrade_backing", BackedImage("compat=1.1"), "compat=0.10");
  add("downgrade_backing_c4k", BackedImage("cluster_size=4096"),
      "compat=0.10");
  add("upgrade_backing", BackedImage("compat=0.10"), "compat=1.1");
  add("downgrade_lazy", MixedImage("lazy_refcounts=on"), "compat=0.10");
  add("downgrade_zstd_no_compressed",
      [](const testing::TempDir& dir) {
        const std::string p = dir.File("img.qcow2");
        MustRun({"qemu-img", "create", "-q", "-f", "qcow2", "-o",
                 "compression_type=zstd", p, "1M"});
        MustRun({"qemu-io", "-f", "qcow2", "-c", "write 0 64k", p});
        return p;
      },
      "compat=0.10");
  add("downgrade_rb8_with_rb16", MixedImage("refcount_bits=8"),
      "compat=0.10,refcount_bits=16");
  add("upgrade_and_lazy", MixedImage("compat=0.10"),
      "compat=1.1,lazy_refcounts=on");
  add("upgrade_and_rb64", MixedImage("compat=0.10"),
      "compat=1.1,refcount_bits=64");
  add("nothing_to_change", MixedImage(""), "compat=1.1");
  // Snapshots.
  add("downgrade_snapshots", SnapshotImage("compat=1.1", false),
      "compat=0.10");
  add("downgrade_snapshots_backing", SnapshotImage("compat=1.1", true),
      "compat=0.10");
  add("upgrade_snapshots", SnapshotImage("compat=0.10", false), "compat=1.1");
  add("upgrade_snapshots_without_extra_data", V2SnapshotsWithoutExtra,
      "compat=1.1");
  add("rb2_snapshots", SnapshotImage("compat=1.1", false), "refcount_bits=2");
  add("rb64_snapshots_backing", SnapshotImage("compat=1.1", true),
      "refcount_bits=64");
  add("refuse_rb1_snapshots", SnapshotImage("compat=1.1", false),
      "refcount_bits=1");
  add("refuse_downgrade_resized_snapshot",
      [](const testing::TempDir& dir) {
        const std::string p = dir.File("img.qcow2");
        MustRun({"qemu-img", "create", "-q", "-f", "qcow2", p, "1M"});
        MustRun({"qemu-img", "snapshot", "-c", "s1", p});
        MustRun({"qemu-img", "resize", "-q", p, "2M"});
        return p;
      },
      "compat=0.10");
  // Lazy refcounts.
  add("lazy_on", MixedImage(""), "lazy_refcounts=on");
  add("lazy_off", MixedImage("lazy_refcounts=on"), "lazy_refcounts=off");
  add("lazy_off_dirty", DirtyLazy, "lazy_refcounts=off");
  add("lazy_bare_key", MixedImage(""), "lazy_refcounts");
  add("downgrade_dirty", DirtyLazy, "compat=0.10");
  add("refuse_lazy_v2", MixedImage("compat=0.10"), "lazy_refcounts=on");
  add("refuse_lazy_value", MixedImage(""), "lazy_refcounts=maybe");
  // Refcount widths, every one, from 16 and back.
  for (const char* bits : {"1", "2", "4", "8", "32", "64"}) {
    v.push_back(Case{"rb", MixedImage(""), absl::StrCat("refcount_bits=", bits)});
  }
  for (size_t i = v.size() - 6; i < v.size(); ++i) {
    static const char* const kNames[] = {"rb1", "rb2", "rb4",
                                         "rb8", "rb32", "rb64"};
    v[i].name = kNames[i - (v.size() - 6)];
  }
  add("rb64_to_16", MixedImage("refcount_bits=64"), "refcount_bits=16");
  add("rb1_to_8_c512", MixedImage("refcount_bits=1", 512), "refcount_bits=8");
  // qemu-img 7.2 takes minutes to change the refcount width of images
  // with 1 or 2 MiB clusters: ours only, judged by check and compare.
  v.push_back(
      Case{"rb4_c2m_ours_only", MixedImage("", 2u << 20), "refcount_bits=4", 0,
           ""});
  add("rb32_xl2", MixedImage("extended_l2=on", 65536), "refcount_bits=32");
  add("rb16_dirty", DirtyLazy, "refcount_bits=8");
  add("rb_and_lazy", MixedImage(""), "refcount_bits=32,lazy_refcounts=on");
  // Refusals.
  add("refuse_rb3", MixedImage(""), "refcount_bits=3");
  add("refuse_rb128", MixedImage(""), "refcount_bits=128");
  add("refuse_rb0", MixedImage(""), "refcount_bits=0");
  add("refuse_rb_text", MixedImage(""), "refcount_bits=abc");
  add("refuse_rb8_v2", MixedImage("compat=0.10"), "refcount_bits=8");
  add("refuse_downgrade_rb8", MixedImage("refcount_bits=8"), "compat=0.10");
  add("refuse_downgrade_rb_combo", MixedImage(""),
      "compat=0.10,refcount_bits=8");
  add("refuse_downgrade_xl2", MixedImage("extended_l2=on"), "compat=0.10");
  add("refuse_downgrade_zstd_compressed", MixedImage("compression_type=zstd"),
      "compat=0.10");
  add("refuse_compat_2", MixedImage(""), "compat=2");
  add("refuse_compat_bare", MixedImage(""), "compat");
  for (const char* opt : {"cluster_size=4096", "extended_l2=on",
                          "preallocation=metadata", "compression_type=zstd",
                          "encryption=on", "encrypt.format=luks", "foo=bar",
                          "backing_file=x", "backing_fmt=raw", "data_file=x",
                          "data_file_raw=on", "encrypt.keyslot=1"}) {
    v.push_back(Case{"refuse", MixedImage(""), opt});
  }
  static const char* const kRefuseNames[] = {
      "refuse_cluster_size", "refuse_extended_l2",   "refuse_preallocation",
      "refuse_compression",  "refuse_encryption",    "refuse_encrypt_format",
      "refuse_unknown",      "refuse_backing_file",  "refuse_backing_fmt",
      "refuse_data_file",    "refuse_data_file_raw", "refuse_encrypt_keyslot"};
  for (size_t i = 0; i < 12; ++i) v[v.size() - 12 + i].name = kRefuseNames[i];
  add("refuse_backing_other", BackedImage("compat=1.1"),
      "backing_file=other.qcow2,backing_fmt=qcow2");
  add("refuse_backing_only_fmt", BackedImage("compat=1.1"),
      "backing_fmt=qcow2");
  add("refuse_empty_list", MixedImage(""), "");
  // A refusal after a step qemu-img applies first: we write nothing.
  v.push_back(Case{"refuse_upgrade_then_backing", MixedImage("compat=0.10"),
                   "compat=1.1,backing_file=x", 1,
                   "Cannot amend the backing file"});
  // Our own refusals where qemu-img goes ahead.
  Setup bitmap = [](const testing::TempDir& dir) {
    const std::string p = Mixed(dir, "", 65536);
    MustRun({"qemu-img", "bitmap", "--add", p, "b0"});
    return p;
  };
  v.push_back(Case{"refuse_downgrade_bitmaps", bitmap, "compat=0.10", 1,
                   "persistent bitmaps"});
  // The virtual size.
  add("size_grow", MixedImage(""), "size=64M");
  add("size_shrink", MixedImage(""), "size=1M");
  add("size_zero_is_unchanged", MixedImage(""), "size=0");
  add("size_grow_v2_and_downgrade", MixedImage(""), "size=16M,compat=0.10");
  add("size_grow_snapshots", SnapshotImage("compat=1.1", false), "size=8M");
  add("size_upgrade_snapshots_v2", SnapshotImage("compat=0.10", false),
      "size=8M,compat=1.1");
  add("refuse_size_v2_snapshots", SnapshotImage("compat=0.10", false),
      "size=8M");
  add("refuse_size_unaligned", MixedImage(""), "size=1000");
  add("refuse_size_negative", MixedImage(""), "size=-1");
  add("refuse_downgrade_after_resize_snapshots",
      SnapshotImage("compat=1.1", false), "size=8M,compat=0.10");
  v.push_back(Case{"size_shrink_snapshots_not_yet",
                   SnapshotImage("compat=1.1", false), "size=1M", 1,
                   "not supported yet"});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Amend, AmendTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) {
                           return std::string(info.param.name);
                         });

// The same backing file name and format as the image's own are accepted
// (nothing to change), as qemu-img does.
TEST(AmendBacking, SameNameAndFormatAccepted) {
  SKIP_WITHOUT_QEMU();
  testing::TempDir dir;
  const std::string top = BackedImage("compat=1.1")(dir);
  const std::string opts =
      absl::StrCat("backing_file=", dir.File("base.qcow2"), ",backing_fmt=qcow2");
  CommandResult o = testing::Run({testing::QcowtoolPath(), "amend", "-o", opts, top});
  CommandResult q = testing::Run({"qemu-img", "amend", "-o", opts, top});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(q.exit_code, 0) << q.err;
}

// The entries of a snapshot table without extra data get QEMU's 24 bytes
// (VM state size, disk size, icount) when the image is upgraded.
TEST(AmendSnapshots, UpgradeWritesExtraData) {
  SKIP_WITHOUT_QEMU();
  testing::TempDir dir;
  const std::string p = V2SnapshotsWithoutExtra(dir);
  auto extra_sizes = [&]() {
    std::vector<uint64_t> sizes;
    auto b = testing::ReadFileBytes(p);
    if (!b.ok()) return sizes;
    auto be = [&](size_t at, int n) {
      uint64_t v = 0;
      for (int i = 0; i < n; ++i) v = v << 8 | (*b)[at + i];
      return v;
    };
    uint64_t pos = be(64, 8);
    for (uint64_t i = 0; i < be(60, 4); ++i) {
      const uint64_t extra = be(pos + 36, 4);
      sizes.push_back(extra);
      pos += (40 + extra + be(pos + 12, 2) + be(pos + 14, 2) + 7) / 8 * 8;
    }
    return sizes;
  };
  EXPECT_EQ(extra_sizes(), (std::vector<uint64_t>{0, 0}));
  CommandResult o =
      testing::Run({testing::QcowtoolPath(), "amend", "-o", "compat=1.1", p});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(extra_sizes(), (std::vector<uint64_t>{24, 24}));
  CommandResult check = testing::Run({"qemu-img", "check", p});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
}

TEST(AmendCli, HelpListsQemuOptions) {
  SKIP_WITHOUT_QEMU();
  testing::TempDir dir;
  const std::string p = Mixed(dir, "", 65536);
  CommandResult o = testing::Run({testing::QcowtoolPath(), "amend", "-o", "help", p});
  CommandResult q = testing::Run({"qemu-img", "amend", "-f", "qcow2", "-o", "help", p});
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_EQ(o.out, q.out);
}

TEST(AmendCli, RawImageRefused) {
  SKIP_WITHOUT_QEMU();
  testing::TempDir dir;
  const std::string p = dir.File("r.raw");
  MustRun({"qemu-img", "create", "-q", "-f", "raw", p, "1M"});
  for (const std::vector<std::string>& fmt :
       {std::vector<std::string>{}, std::vector<std::string>{"-f", "raw"}}) {
    std::vector<std::string> a = {testing::QcowtoolPath(), "amend"};
    std::vector<std::string> b = {"qemu-img", "amend"};
    for (const std::string& f : fmt) {
      a.push_back(f);
      b.push_back(f);
    }
    for (auto* argv : {&a, &b}) {
      argv->insert(argv->end(), {"-o", "compat=1.1", p});
    }
    CommandResult o = testing::Run(a);
    CommandResult q = testing::Run(b);
    EXPECT_EQ(o.exit_code, 1);
    EXPECT_EQ(q.exit_code, 1);
    EXPECT_NE(q.err.find("does not support option amendment"),
              std::string::npos);
    EXPECT_NE(o.err.find("Format driver 'raw' does not support option "
                         "amendment"),
              std::string::npos)
        << o.err;
  }
}

TEST(AmendCli, NoOptionsIsAnError) {
  SKIP_WITHOUT_QEMU();
  testing::TempDir dir;
  const std::string p = Mixed(dir, "", 65536);
  CommandResult o = testing::Run({testing::QcowtoolPath(), "amend", p});
  CommandResult q = testing::Run({"qemu-img", "amend", p});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(q.exit_code, 1);
  EXPECT_NE(o.err.find("Must specify options (-o)"), std::string::npos);
}

// A writer holds the image (our own Image, open read-write): the amend is
// refused by the lock and writes nothing.
TEST(AmendCli, LockedImageRefused) {
  SKIP_WITHOUT_QEMU();
  testing::TempDir dir;
  const std::string p = Mixed(dir, "", 65536);
  ASSERT_OK_AND_ASSIGN(const std::vector<uint8_t> bytes,
                       testing::ReadFileBytes(p));
  OpenOptions oo;
  oo.read_write = true;
  auto img = Image::Open(p, oo);
  ASSERT_TRUE(img.ok()) << img.status();
  CommandResult o =
      testing::Run({testing::QcowtoolPath(), "amend", "-o", "compat=0.10", p});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("lock"), std::string::npos) << o.err;
  img->reset();
  ASSERT_OK_AND_ASSIGN(const std::vector<uint8_t> after,
                       testing::ReadFileBytes(p));
  EXPECT_TRUE(after == bytes);
}

}  // namespace
}  // namespace qcow2
