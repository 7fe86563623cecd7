// SPDX-License-Identifier: Apache-2.0
// Key-slot amends of LUKS-encrypted images (qemu-img amend -o encrypt.*),
// both ways against QEMU 7.2: a slot we add opens with qemu-io (the old
// secret too), a slot qemu-img adds opens through us; slots erased by
// secret and by number, by us and by qemu-img, no longer open on the other
// side; `qcowtool amend` refuses what qemu-img refuses, with its message,
// and leaves the file as it was (a wrong or missing secret too). Our
// images use fixed PBKDF2 counts (1000) so the file stays fast; one
// qemu-img add (and, with QCOW2_LONG_TESTS=1, one qcowtool add) measure
// iter-time (about a second of CPU each, as in QEMU).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "qcow2/amend.h"
#include "qcow2/image.h"
#include "tests/util/json_lite.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using ::qcow2::testing::CommandResult;
using ::qcow2::testing::ReadFileBytes;
using ::qcow2::testing::TempDir;
using ::testing::HasSubstr;

constexpr uint64_t kCs = 65536;

// The secrets every command line here defines: s0..s3 are "pass0".."pass3".
std::vector<std::string> Objects() {
  std::vector<std::string> v;
  for (int i = 0; i < 4; ++i) {
    v.push_back("--object");
    v.push_back(absl::StrCat("secret,id=s", i, ",data=pass", i));
  }
  v.push_back("--object");
  v.push_back("secret,id=bad,data=wrong");
  return v;
}

std::string Opts(const std::string& path, const std::string& id = "s0") {
  std::string o = absl::StrCat("driver=qcow2,file.filename=", path);
  if (!id.empty()) absl::StrAppend(&o, ",encrypt.key-secret=", id);
  return o;
}

CommandResult Cmd(const std::string& program, const std::string& verb,
                  const std::vector<std::string>& args) {
  std::vector<std::string> argv = {program, verb};
  for (const std::string& a : Objects()) argv.push_back(a);
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::Run(argv);
}

// qemu-img amend / qcowtool amend of `path` opened with secret `id`.
CommandResult Amend(bool ours, const std::string& path, const std::string& o,
                    const std::string& id = "s0",
                    std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--image-opts", Opts(path, id), "-o", o};
  args.insert(args.end(), extra.begin(), extra.end());
  if (ours) return Cmd(testing::QcowtoolPath(), "amend", args);
  return testing::RetryQemuKeyTiming(
      [&] { return Cmd("qemu-img", "amend", args); });
}

// Whether qemu-io opens `path` with "pass<n>" and reads our data.
bool QemuOpens(const std::string& path, int n) {
  CommandResult r = Cmd("qemu-io", "-r",
                        {"--image-opts", Opts(path, absl::StrCat("s", n)), "-c",
                         "read -P 0x5a 0 64k"});
  if (r.exit_code != 0 || r.out.find("read 65536/65536") == std::string::npos) {
    EXPECT_THAT(r.err + r.out, HasSubstr("Invalid password"));
    return false;
  }
  return true;
}

// Whether libqcow2 opens `path` with "pass<n>" and reads our data.
bool WeOpen(const std::string& path, int n) {
  OpenOptions oo;
  oo.key_secret = absl::StrCat("pass", n);
  auto img = Image::Open(path, oo);
  if (!img.ok()) {
    EXPECT_EQ(img.status().code(), absl::StatusCode::kPermissionDenied)
        << img.status();
    return false;
  }
  std::vector<uint8_t> buf(kCs);
  EXPECT_TRUE((*img)->Read(0, absl::MakeSpan(buf)).ok());
  return buf == std::vector<uint8_t>(kCs, 0x5a);
}

// The active key slots as qemu-img info reports them.
std::vector<int> ActiveSlots(const std::string& path) {
  CommandResult r =
      testing::Run({"qemu-img", "info", "--output=json", "-U", path});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto v = testing::json::Parse(r.out);
  EXPECT_TRUE(v.ok());
  std::vector<int> active;
  if (!v.ok()) return active;
  const auto& slots = (*v)["format-specific"]["data"]["encrypt"]["slots"];
  for (int i = 0; i < 8; ++i) {
    if (slots[i]["active"].ToString() == "true") active.push_back(i);
  }
  return active;
}

// Our amend through the library (PBKDF2 fixed at 1000 iterations).
absl::Status AddSlot(const std::string& path, int n, int64_t slot = -1,
                     bool force = false) {
  AmendOptions ao;
  ao.key_secret = "pass0";
  ao.encrypt.emplace();
  ao.encrypt->state = "active";
  ao.encrypt->new_secret = absl::StrCat("pass", n);
  if (slot >= 0) ao.encrypt->keyslot = slot;
  ao.encrypt->iterations = 1000;
  ao.force = force;
  return AmendImage(path, ao);
}

absl::Status EraseSlots(const std::string& path, int64_t slot, int old_n,
                        bool force = false) {
  AmendOptions ao;
  ao.key_secret = "pass0";
  ao.encrypt.emplace();
  ao.encrypt->state = "inactive";
  if (slot >= 0) ao.encrypt->keyslot = slot;
  if (old_n >= 0) ao.encrypt->old_secret = absl::StrCat("pass", old_n);
  ao.force = force;
  return AmendImage(path, ao);
}

// An encrypted 1 MiB image, secret "pass0" in slot 0, 0x5a in cluster 0,
// and "pass<n>" in slot i for each {i, n} of `more`.
void MakeImage(const std::string& path,
               const std::vector<std::pair<int, int>>& more = {}) {
  CreateOptions co;
  co.size = 1 << 20;
  co.encrypt.format = "luks";
  co.encrypt.key_secret = "pass0";
  co.encrypt.iterations = 1000;
  ASSERT_TRUE(CreateImage(path, co).ok());
  OpenOptions oo;
  oo.read_write = true;
  oo.key_secret = "pass0";
  auto img = Image::Open(path, oo);
  ASSERT_TRUE(img.ok()) << img.status();
  ASSERT_TRUE((*img)->Write(0, std::vector<uint8_t>(kCs, 0x5a)).ok());
  ASSERT_TRUE((*img)->Close().ok());
  for (const auto& [slot, n] : more) ASSERT_TRUE(AddSlot(path, n, slot).ok());
}

class InteropLuksAmendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
  }
  TempDir dir_;
};

TEST_F(InteropLuksAmendTest, SlotsWeAddOpenInQemu) {
  const std::string img = dir_.File("a.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeImage(img));
  ASSERT_TRUE(AddSlot(img, 1).ok());     // the first free slot: 1
  ASSERT_TRUE(AddSlot(img, 2, 5).ok());  // slot 5
  EXPECT_EQ(ActiveSlots(img), (std::vector<int>{0, 1, 5}));
  EXPECT_TRUE(QemuOpens(img, 0));
  EXPECT_TRUE(QemuOpens(img, 1));
  EXPECT_TRUE(QemuOpens(img, 2));
  EXPECT_FALSE(QemuOpens(img, 3));
  CommandResult check =
      Cmd("qemu-img", "check", {"--image-opts", Opts(img, "s2")});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
}

TEST_F(InteropLuksAmendTest, SlotQemuAddsOpensThroughUs) {
  const std::string img = dir_.File("a.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeImage(img));
  CommandResult r = Amend(false, img,
                          "encrypt.state=active,encrypt.new-secret=s1,"
                          "encrypt.keyslot=3,encrypt.iter-time=10");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(WeOpen(img, 1));
  EXPECT_TRUE(WeOpen(img, 0));
  EXPECT_FALSE(WeOpen(img, 2));
}

// The CLI, with --object and --image-opts, measuring iter-time as QEMU
// (a second of CPU: QCOW2_LONG_TESTS=1 only; the refusals and Force below
// run the CLI in the default suite).
TEST_F(InteropLuksAmendTest, CliAddsSlot) {
  if (getenv("QCOW2_LONG_TESTS") == nullptr) GTEST_SKIP() << "long test";
  const std::string img = dir_.File("a.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeImage(img));
  CommandResult r = Amend(true, img,
                          "encrypt.state=active,encrypt.new-secret=s1,"
                          "encrypt.iter-time=10");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ActiveSlots(img), (std::vector<int>{0, 1}));
  EXPECT_TRUE(QemuOpens(img, 1));
}

TEST_F(InteropLuksAmendTest, EraseBothWays) {
  const std::string img = dir_.File("a.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeImage(img, {{1, 1}, {2, 2}, {3, 3}, {4, 1}}));
  // We erase by secret (slots 1 and 4) and by number (2).
  ASSERT_TRUE(EraseSlots(img, -1, 1).ok());
  ASSERT_TRUE(EraseSlots(img, 2, -1).ok());
  EXPECT_EQ(ActiveSlots(img), (std::vector<int>{0, 3}));
  EXPECT_FALSE(QemuOpens(img, 1));
  EXPECT_FALSE(QemuOpens(img, 2));
  EXPECT_TRUE(QemuOpens(img, 3));
  // qemu-img erases what we added, by secret and by number.
  ASSERT_TRUE(AddSlot(img, 1, 1).ok());
  ASSERT_TRUE(AddSlot(img, 2, 2).ok());
  CommandResult r =
      Amend(false, img, "encrypt.state=inactive,encrypt.old-secret=s1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Amend(false, img, "encrypt.state=inactive,encrypt.keyslot=2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(WeOpen(img, 1));
  EXPECT_FALSE(WeOpen(img, 2));
  EXPECT_TRUE(WeOpen(img, 3));
  EXPECT_TRUE(WeOpen(img, 0));
  CommandResult check = Cmd("qemu-img", "check", {"--image-opts", Opts(img)});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
}

// --force: the only slot overwritten, then erased (the image is then
// unreadable, as qemu-img leaves it).
TEST_F(InteropLuksAmendTest, Force) {
  const std::string img = dir_.File("a.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeImage(img));
  ASSERT_TRUE(AddSlot(img, 1, 0, /*force=*/true).ok());
  EXPECT_EQ(ActiveSlots(img), (std::vector<int>{0}));
  EXPECT_TRUE(QemuOpens(img, 1));
  EXPECT_FALSE(QemuOpens(img, 0));
  CommandResult r = Amend(true, img, "encrypt.state=inactive,encrypt.keyslot=0",
                          "s1", {"--force"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ActiveSlots(img), (std::vector<int>{}));
}

// Each refusal: qemu-img's exit status and message, and our file
// untouched.
TEST_F(InteropLuksAmendTest, RefusalsAsQemu) {
  const std::string two = dir_.File("two.qcow2");    // slots 0, 1
  const std::string one = dir_.File("one.qcow2");    // slot 0
  const std::string full = dir_.File("full.qcow2");  // all eight
  const std::string plain = dir_.File("plain.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeImage(two, {{1, 1}}));
  ASSERT_NO_FATAL_FAILURE(MakeImage(one));
  ASSERT_NO_FATAL_FAILURE(MakeImage(
      full, {{1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1}}));
  CreateOptions co;
  co.size = 1 << 20;
  ASSERT_TRUE(CreateImage(plain, co).ok());
  struct Case {
    std::string image, options, id;
  };
  const std::vector<Case> cases = {
      {two, "encrypt.new-secret=s2", "s0"},
      {two, "encrypt.state=active", "s0"},
      {two, "encrypt.state=active,encrypt.new-secret=s2,encrypt.old-secret=s0",
       "s0"},
      {two, "encrypt.state=active,encrypt.new-secret=s2,encrypt.keyslot=9",
       "s0"},
      {two, "encrypt.state=active,encrypt.new-secret=s2,encrypt.keyslot=-1",
       "s0"},
      {two, "encrypt.state=active,encrypt.new-secret=s2,encrypt.keyslot=1",
       "s0"},
      {two, "encrypt.state=active,encrypt.new-secret=nosuch", "s0"},
      {two, "encrypt.state=inactive,encrypt.new-secret=s1", "s0"},
      {two, "encrypt.state=inactive,encrypt.iter-time=10", "s0"},
      {two, "encrypt.state=inactive", "s0"},
      {two, "encrypt.state=inactive,encrypt.keyslot=5", "s0"},
      {two, "encrypt.state=inactive,encrypt.keyslot=8", "s0"},
      {two, "encrypt.state=inactive,encrypt.keyslot=-1", "s0"},
      {two, "encrypt.state=inactive,encrypt.keyslot=1,encrypt.old-secret=s0",
       "s0"},
      {two, "encrypt.state=inactive,encrypt.old-secret=s2", "s0"},
      {two, "encrypt.state=inactive,encrypt.old-secret=nosuch", "s0"},
      {two, "encrypt.state=bogus", "s0"},
      {two, "encrypt.keyslot=abc,encrypt.state=active", "s0"},
      {two, "encrypt.state=inactive,encrypt.secret=s0", "s0"},
      {one, "encrypt.state=inactive,encrypt.keyslot=0", "s0"},
      {one, "encrypt.state=inactive,encrypt.old-secret=s0", "s0"},
      {full, "encrypt.state=active,encrypt.new-secret=s2", "s0"},
      {plain, "encrypt.state=inactive,encrypt.keyslot=0", ""},
  };
  auto strip = [](const std::string& err) {
    const size_t colon = err.find(": ");
    return colon == std::string::npos ? err : err.substr(colon + 2);
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.options);
    ASSERT_OK_AND_ASSIGN(auto before, ReadFileBytes(c.image));
    CommandResult ours = Amend(true, c.image, c.options, c.id);
    ASSERT_OK_AND_ASSIGN(auto after, ReadFileBytes(c.image));
    EXPECT_TRUE(before == after) << "qcowtool amend changed the file";
    CommandResult qemu = Amend(false, c.image, c.options, c.id);
    ASSERT_OK_AND_ASSIGN(after, ReadFileBytes(c.image));
    ASSERT_TRUE(before == after) << "qemu-img amend changed the file";
    EXPECT_EQ(ours.exit_code, 1);
    EXPECT_EQ(qemu.exit_code, 1) << qemu.err;
    EXPECT_EQ(strip(ours.err), strip(qemu.err));
  }
  // A wrong or missing secret: refused before anything is read of the
  // slots or written (qemu-img names the image by its option string).
  for (const std::string id : {"bad", ""}) {
    SCOPED_TRACE(id);
    ASSERT_OK_AND_ASSIGN(auto before, ReadFileBytes(two));
    const std::string o = "encrypt.state=active,encrypt.new-secret=s2";
    CommandResult ours = Amend(true, two, o, id);
    CommandResult qemu = Amend(false, two, o, id);
    ASSERT_OK_AND_ASSIGN(auto after, ReadFileBytes(two));
    EXPECT_TRUE(before == after);
    EXPECT_EQ(ours.exit_code, 1);
    EXPECT_EQ(qemu.exit_code, 1);
    const std::string want =
        id.empty() ? "Parameter 'encrypt.key-secret' is required for cipher"
                   : "Invalid password, cannot unlock any keyslot";
    EXPECT_THAT(ours.err, HasSubstr(want));
    EXPECT_THAT(qemu.err, HasSubstr(want));
  }
}

// A downgrade of an encrypted image writes its zeros encrypted (QEMU 7.2
// writes plain zeros there, which then read as noise), and a size change
// and lazy refcounts work on an encrypted image too.
TEST_F(InteropLuksAmendTest, OtherOptionsOnEncryptedImage) {
  const std::string base = dir_.File("base.qcow2");
  const std::string img = dir_.File("top.qcow2");
  ASSERT_EQ(
      testing::Run({"qemu-img", "create", "-q", "-f", "qcow2", base, "1M"})
          .exit_code,
      0);
  ASSERT_EQ(
      testing::Run({"qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 1M", base})
          .exit_code,
      0);
  CreateOptions co;
  co.size = 1 << 20;
  co.encrypt.format = "luks";
  co.encrypt.key_secret = "pass0";
  co.encrypt.iterations = 1000;
  co.backing_file = base;
  co.backing_format = "qcow2";
  ASSERT_TRUE(CreateImage(img, co).ok());
  {
    OpenOptions oo;
    oo.read_write = true;
    oo.key_secret = "pass0";
    auto image = Image::Open(img, oo);
    ASSERT_TRUE(image.ok()) << image.status();
    ASSERT_TRUE((*image)->WriteZeroes(kCs, kCs).ok());
    ASSERT_TRUE((*image)->Close().ok());
  }
  AmendOptions ao;
  ao.compat = "0.10";
  ao.size = 2 << 20;
  EXPECT_EQ(AmendImage(img, ao).code(), absl::StatusCode::kPermissionDenied);
  ao.key_secret = "pass0";
  ASSERT_TRUE(AmendImage(img, ao).ok());
  CommandResult r = Cmd("qemu-io", "-r",
                        {"--image-opts", Opts(img), "-c", "read -P 0x11 0 64k",
                         "-c", "read -P 0 64k 64k", "-c",
                         "read -P 0x11 128k 64k", "-c", "read -P 0 1M 1M"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("verification failed"))) << r.out;
  CommandResult check = Cmd("qemu-img", "check", {"--image-opts", Opts(img)});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  CommandResult info = testing::Run({"qemu-img", "info", img});
  EXPECT_THAT(info.out, HasSubstr("compat: 0.10"));
  EXPECT_THAT(info.out, HasSubstr("virtual size: 2 MiB"));
}

}  // namespace
}  // namespace qcow2
