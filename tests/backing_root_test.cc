// SPDX-License-Identifier: Apache-2.0
// OpenOptions::backing_root and max_chain_depth: backing files named by an
// untrusted image may only come from inside one directory, never through a
// protocol, and chains are bounded.
//
// Real files in a temporary directory, made with qemu-img:
//
//   DIR/outside.qcow2            a file the images must not reach
//   DIR/rootevil/evil.qcow2      shares the root's name as a prefix
//   DIR/root/base.qcow2          inside the root
//   DIR/root/sub/deep.qcow2      inside, one level down
//   DIR/root/...                 tops naming each of those
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "qcow2/image.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::CommandResult;
using ::testing::HasSubstr;
using testing::TempDir;

class BackingRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
    root_ = dir_.File("root");
    std::filesystem::create_directories(root_ + "/sub");
    std::filesystem::create_directories(dir_.File("rootevil"));
    std::filesystem::create_directories(dir_.File("elsewhere"));
    // Distinct contents so a test can tell which file it reads.
    Create(dir_.File("outside.qcow2"), "", 0x0a);
    Create(dir_.File("rootevil/evil.qcow2"), "", 0x0e);
    Create(root_ + "/base.qcow2", "", 0xba);
    Create(root_ + "/sub/deep.qcow2", "", 0xde);
    std::vector<uint8_t> raw(1 << 20, 0x7a);
    ASSERT_OK(testing::WriteFileBytes(dir_.File("outside.raw"), raw));
  }

  // Creates a 1 MiB qcow2 image; with `backing` as its stored backing name
  // (not checked: -u); with `fill`, its first 64 KiB hold that byte.
  void Create(const std::string& path, const std::string& backing,
              int fill = -1, const std::string& backing_format = "qcow2") {
    std::vector<std::string> argv = {"qemu-img", "create", "-q", "-f", "qcow2"};
    if (!backing.empty()) {
      argv.insert(argv.end(), {"-u", "-b", backing, "-F", backing_format});
    }
    argv.insert(argv.end(), {path, "1M"});
    CommandResult r = testing::Run(argv);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    if (fill >= 0) {
      ASSERT_OK(
          testing::QemuIo(path, {absl::StrCat("write -P ", fill, " 0 64k")}));
    }
  }

  OpenOptions RootOpts() const {
    OpenOptions o;
    o.backing_root = root_;
    return o;
  }

  // Opens `top`; must succeed with a chain of `length` files whose first
  // byte reads as `byte`.
  void ExpectOpens(const std::string& top, const OpenOptions& opts, int length,
                   uint8_t byte) {
    auto img = Image::Open(top, opts);
    ASSERT_TRUE(img.ok()) << img.status();
    EXPECT_EQ((*img)->chain_length(), length);
    uint8_t b = 0;
    ASSERT_OK((*img)->Read(0, absl::MakeSpan(&b, 1)));
    EXPECT_EQ(b, byte);
  }

  // Opens `top`; must fail with `code`, naming `image` (the file that holds
  // the bad name) and `backing` (the name as stored), with `text`.
  void ExpectRefused(const std::string& top, const OpenOptions& opts,
                     absl::StatusCode code, const std::string& image,
                     const std::string& backing, const std::string& text) {
    for (bool rw : {false, true}) {
      SCOPED_TRACE(rw ? "read-write" : "read-only");
      OpenOptions o = opts;
      o.read_write = rw;
      auto img = Image::Open(top, o);
      ASSERT_FALSE(img.ok()) << top << " opened";
      const std::string msg(img.status().message());
      EXPECT_EQ(img.status().code(), code) << img.status();
      EXPECT_THAT(msg, HasSubstr(image));
      if (!backing.empty()) {
        EXPECT_THAT(msg, HasSubstr("'" + backing + "'"));
      }
      EXPECT_THAT(msg, HasSubstr(text));
    }
  }

  TempDir dir_;
  std::string root_;
};

TEST_F(BackingRootTest, BackingInsideRootOpens) {
  Create(root_ + "/top.qcow2", "base.qcow2");
  ExpectOpens(root_ + "/top.qcow2", RootOpts(), 2, 0xba);
  // One level down, and spelled with detours that stay inside.
  Create(root_ + "/top2.qcow2", "sub/deep.qcow2");
  ExpectOpens(root_ + "/top2.qcow2", RootOpts(), 2, 0xde);
  Create(root_ + "/top3.qcow2", "./sub/../base.qcow2");
  ExpectOpens(root_ + "/top3.qcow2", RootOpts(), 2, 0xba);
  // An absolute name inside the root.
  Create(root_ + "/top4.qcow2", root_ + "/sub/deep.qcow2");
  ExpectOpens(root_ + "/top4.qcow2", RootOpts(), 2, 0xde);
  // A name in a subdirectory resolves against that image's directory.
  Create(root_ + "/sub/up.qcow2", "../base.qcow2");
  ExpectOpens(root_ + "/sub/up.qcow2", RootOpts(), 2, 0xba);
}

TEST_F(BackingRootTest, TopImageMayLieOutsideRoot) {
  // The root constrains backing files only: the caller chose the top.
  Create(dir_.File("elsewhere/top.qcow2"), root_ + "/base.qcow2");
  ExpectOpens(dir_.File("elsewhere/top.qcow2"), RootOpts(), 2, 0xba);
}

TEST_F(BackingRootTest, RootSpelledDifferently) {
  Create(root_ + "/top.qcow2", "base.qcow2");
  const std::string top = root_ + "/top.qcow2";
  OpenOptions o;
  // Trailing slash.
  o.backing_root = root_ + "/";
  ExpectOpens(top, o, 2, 0xba);
  // Through "..".
  o.backing_root = root_ + "/sub/..";
  ExpectOpens(top, o, 2, 0xba);
  // Through a symlink to the root directory.
  const std::string alias = dir_.File("alias");
  ASSERT_EQ(symlink(root_.c_str(), alias.c_str()), 0);
  o.backing_root = alias;
  ExpectOpens(top, o, 2, 0xba);
  // And the top opened through that symlink.
  ExpectOpens(alias + "/top.qcow2", o, 2, 0xba);
}

TEST_F(BackingRootTest, DotDotEscapeRefused) {
  Create(root_ + "/top.qcow2", "../outside.qcow2");
  ExpectRefused(root_ + "/top.qcow2", RootOpts(),
                absl::StatusCode::kPermissionDenied, "top.qcow2",
                "../outside.qcow2", "outside the allowed directory");
  // Deeper detours that still end outside.
  Create(root_ + "/top2.qcow2", "sub/../../outside.qcow2");
  ExpectRefused(root_ + "/top2.qcow2", RootOpts(),
                absl::StatusCode::kPermissionDenied, "top2.qcow2",
                "sub/../../outside.qcow2", "outside the allowed directory");
  // Without a root the same image opens: the refusal is the option's doing.
  ExpectOpens(root_ + "/top.qcow2", OpenOptions{}, 2, 0x0a);
}

TEST_F(BackingRootTest, AbsolutePathOutsideRefused) {
  Create(root_ + "/top.qcow2", dir_.File("outside.qcow2"));
  ExpectRefused(root_ + "/top.qcow2", RootOpts(),
                absl::StatusCode::kPermissionDenied, "top.qcow2",
                dir_.File("outside.qcow2"), "outside the allowed directory");
  // A system file, named absolutely.
  Create(root_ + "/passwd.qcow2", "/etc/passwd", -1, "raw");
  ExpectRefused(root_ + "/passwd.qcow2", RootOpts(),
                absl::StatusCode::kPermissionDenied, "passwd.qcow2",
                "/etc/passwd", "outside the allowed directory");
  // A raw file outside is refused like a qcow2 one.
  Create(root_ + "/raw.qcow2", "../outside.raw", -1, "raw");
  ExpectRefused(root_ + "/raw.qcow2", RootOpts(),
                absl::StatusCode::kPermissionDenied, "raw.qcow2",
                "../outside.raw", "outside the allowed directory");
}

TEST_F(BackingRootTest, SiblingWithRootAsPrefixRefused) {
  // DIR/rootevil starts with the characters of DIR/root.
  Create(root_ + "/top.qcow2", "../rootevil/evil.qcow2");
  ExpectRefused(root_ + "/top.qcow2", RootOpts(),
                absl::StatusCode::kPermissionDenied, "top.qcow2",
                "../rootevil/evil.qcow2", "outside the allowed directory");
}

TEST_F(BackingRootTest, SymlinkPointingOutsideRefused) {
  // A file symlink inside the root whose target is outside.
  ASSERT_EQ(symlink("../outside.qcow2", (root_ + "/link.qcow2").c_str()), 0);
  Create(root_ + "/top.qcow2", "link.qcow2");
  ExpectRefused(root_ + "/top.qcow2", RootOpts(),
                absl::StatusCode::kPermissionDenied, "top.qcow2", "link.qcow2",
                "outside the allowed directory");
  // A directory symlink inside the root whose target is outside.
  ASSERT_EQ(symlink(dir_.path().c_str(), (root_ + "/up").c_str()), 0);
  Create(root_ + "/top2.qcow2", "up/outside.qcow2");
  ExpectRefused(root_ + "/top2.qcow2", RootOpts(),
                absl::StatusCode::kPermissionDenied, "top2.qcow2",
                "up/outside.qcow2", "outside the allowed directory");
  // A symlink to a file inside the root is fine.
  ASSERT_EQ(symlink("sub/deep.qcow2", (root_ + "/inlink.qcow2").c_str()), 0);
  Create(root_ + "/top3.qcow2", "inlink.qcow2");
  ExpectOpens(root_ + "/top3.qcow2", RootOpts(), 2, 0xde);
}

TEST_F(BackingRootTest, DeeperLevelEscapeRefusedNamingThatImage) {
  // top -> mid (inside) -> ../outside.qcow2: the error names mid.qcow2.
  Create(root_ + "/mid.qcow2", "../outside.qcow2");
  Create(root_ + "/top.qcow2", "mid.qcow2");
  ExpectRefused(root_ + "/top.qcow2", RootOpts(),
                absl::StatusCode::kPermissionDenied, "mid.qcow2",
                "../outside.qcow2", "outside the allowed directory");
}

TEST_F(BackingRootTest, ProtocolPrefixesRefused) {
  struct Case {
    std::string name;
    std::string prefix;
  };
  const std::vector<Case> cases = {
      {"nbd:127.0.0.1:10809", "nbd"},
      {"nbd+unix:///export?socket=/tmp/s", "nbd+unix"},
      {"json:{\"file\":{\"driver\":\"file\",\"filename\":\"/etc/passwd\"}}",
       "json"},
      {"http://example.com/disk.qcow2", "http"},
      {"ssh://host/disk.qcow2", "ssh"},
      {"NBD:127.0.0.1:10809", "NBD"},  // prefixes are case-insensitive
      {"blkdebug::base.qcow2", "blkdebug"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string top = root_ + absl::StrCat("/proto", i++, ".qcow2");
    Create(top, c.name);
    // Refused with and without a root.
    for (const OpenOptions& o : {RootOpts(), OpenOptions{}}) {
      ExpectRefused(top, o, absl::StatusCode::kPermissionDenied,
                    top.substr(top.rfind('/') + 1), c.name,
                    "uses the protocol '" + c.prefix + ":'");
    }
  }
  // A colon after a slash is part of a file name, not a protocol.
  std::filesystem::create_directories(root_ + "/nbd:dir");
  Create(root_ + "/nbd:dir/b.qcow2", "", 0x42);
  Create(root_ + "/colon.qcow2", "./nbd:dir/b.qcow2");
  ExpectOpens(root_ + "/colon.qcow2", RootOpts(), 2, 0x42);
}

TEST_F(BackingRootTest, ChainDepthBound) {
  // c0 (bottom) <- c1 <- ... <- c5 (top): depth 5 below the top.
  Create(root_ + "/c0.qcow2", "", 0xc0);
  for (int i = 1; i <= 5; ++i) {
    Create(root_ + absl::StrCat("/c", i, ".qcow2"),
           absl::StrCat("c", i - 1, ".qcow2"));
  }
  const std::string top = root_ + "/c5.qcow2";
  OpenOptions o = RootOpts();
  // max_chain_depth counts the files below the top: 5 is enough...
  o.max_chain_depth = 5;
  ExpectOpens(top, o, 6, 0xc0);
  // ... 4 is not, and neither is 0 (no backing file at all).
  for (int depth : {4, 1, 0}) {
    SCOPED_TRACE(depth);
    o.max_chain_depth = depth;
    ExpectRefused(top, o, absl::StatusCode::kFailedPrecondition, "c5.qcow2", "",
                  absl::StrCat("deeper than ", depth, " images"));
  }
  // Not opening backing files at all needs no depth.
  o.max_chain_depth = 0;
  o.open_backing = false;
  ExpectOpens(top, o, 1, 0);
}

TEST_F(BackingRootTest, DefaultDepthIs64) {
  // 65 files (64 below the top) open with the defaults; 66 do not.
  Create(root_ + "/d0.qcow2", "", 0xd0);
  for (int i = 1; i <= 65; ++i) {
    Create(root_ + absl::StrCat("/d", i, ".qcow2"),
           absl::StrCat("d", i - 1, ".qcow2"));
  }
  ExpectOpens(root_ + "/d64.qcow2", RootOpts(), 65, 0xd0);
  ExpectRefused(root_ + "/d65.qcow2", RootOpts(),
                absl::StatusCode::kFailedPrecondition, "d65.qcow2", "",
                "deeper than 64 images");
}

TEST_F(BackingRootTest, CreateOverlayRespectsDepth) {
  // A chain at the limit cannot grow by a live snapshot.
  Create(root_ + "/s0.qcow2", "", 0x50);
  Create(root_ + "/s1.qcow2", "s0.qcow2");
  OpenOptions o = RootOpts();
  o.read_write = true;
  o.max_chain_depth = 1;
  auto img = Image::Open(root_ + "/s1.qcow2", o);
  ASSERT_TRUE(img.ok()) << img.status();
  absl::Status s = (*img)->CreateOverlay(root_ + "/s2.qcow2", CreateOptions{});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ((*img)->chain_length(), 2);
  EXPECT_FALSE(std::filesystem::exists(root_ + "/s2.qcow2"));
  // With room for one more it works, and the new chain reads the same.
  ASSERT_OK((*img)->Close());
  img->reset();
  o.max_chain_depth = 2;
  img = Image::Open(root_ + "/s1.qcow2", o);
  ASSERT_TRUE(img.ok()) << img.status();
  ASSERT_OK((*img)->CreateOverlay(root_ + "/s2.qcow2", CreateOptions{}));
  EXPECT_EQ((*img)->chain_length(), 3);
  uint8_t b = 0;
  ASSERT_OK((*img)->Read(0, absl::MakeSpan(&b, 1)));
  EXPECT_EQ(b, 0x50);
  ASSERT_OK((*img)->Close());
  // Reopened under the same root and depth.
  o.read_write = false;
  ExpectOpens(root_ + "/s2.qcow2", o, 3, 0x50);
}

}  // namespace
}  // namespace qcow2
