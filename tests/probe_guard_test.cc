// SPDX-License-Identifier: Apache-2.0
// The probing attack: a guest of a raw disk opened with its format probed
// writes a qcow2 header naming a host file (/etc/hostname) as backing into
// block 0. Were that written, the next probed open would show the host
// file to the guest. The write is refused; with the format named "raw" it
// goes through (and the test shows why the guard matters). And the
// backing-file policy's qcowtool flag, --backing-root.
#include <sys/stat.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "lib/chain/probe_guard.h"
#include "qcow2/image.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

class ProbeGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    disk_ = dir_.File("disk.raw");
    CreateOptions raw;
    raw.format = ImageFormat::kRaw;
    raw.size = 1 << 20;
    ASSERT_OK(CreateImage(disk_, raw));
    // The attacker's header: a qcow2 image whose backing file is a host
    // file the guest must never see.
    const std::string evil = dir_.File("evil.qcow2");
    CreateOptions q;
    q.size = 1 << 20;
    q.backing_file = "/etc/hostname";
    q.backing_format = "raw";
    ASSERT_OK(CreateImage(evil, q));
    ASSERT_OK_AND_ASSIGN(header_, testing::ReadFileBytes(evil));
  }

  absl::StatusOr<std::unique_ptr<Image>> Open(const std::string& format) {
    OpenOptions o;
    o.read_write = true;
    o.format = format;
    return Image::Open(disk_, o);
  }

  TempDir dir_;
  std::string disk_;
  std::vector<uint8_t> header_;
};

TEST_F(ProbeGuardTest, ProbedRawRefusesAWriteThatMakesItQcow2) {
  ASSERT_OK_AND_ASSIGN(auto img, Open(""));
  absl::Status s = img->Write(0, header_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr(disk_));
  EXPECT_THAT(std::string(s.message()), HasSubstr("probe as qcow2"));
  // Just the magic, and a write that starts inside the first sector, too.
  s = img->Write(0, absl::MakeConstSpan(header_.data(), 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  std::vector<uint8_t> vhdx(512, 0);
  std::memcpy(vhdx.data(), "vhdxfile", 8);
  EXPECT_EQ(img->Write(0, vhdx).code(), absl::StatusCode::kPermissionDenied);
  ASSERT_OK(img->Close());
  img.reset();

  // Nothing was written: the disk still probes as raw and reads as zeros.
  ASSERT_OK_AND_ASSIGN(auto bytes, testing::ReadFileBytes(disk_));
  EXPECT_EQ(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 4096),
            std::vector<uint8_t>(4096, 0));
  ASSERT_OK_AND_ASSIGN(auto again, Image::Open(disk_, OpenOptions{}));
  EXPECT_EQ(again->GetChainInfo()[0].format, ImageFormat::kRaw);
}

TEST_F(ProbeGuardTest, OtherWritesToAProbedRawDiskGoThrough) {
  ASSERT_OK_AND_ASSIGN(auto img, Open(""));
  // A boot sector is fine, as is the header anywhere past the first sector.
  std::vector<uint8_t> mbr(512, 0x33);
  mbr[510] = 0x55;
  mbr[511] = 0xaa;
  EXPECT_OK(img->Write(0, mbr));
  EXPECT_OK(img->Write(512, header_));
  EXPECT_OK(img->WriteZeroes(0, 4096, false));
  EXPECT_OK(img->Discard(0, 4096));
  ASSERT_OK(img->Close());
}

TEST_F(ProbeGuardTest, NamedRawFormatAllowsTheWrite) {
  {
    ASSERT_OK_AND_ASSIGN(auto img, Open("raw"));
    ASSERT_OK(img->Write(0, header_));
    ASSERT_OK(img->Close());
  }
  // What the guard prevents: opened probed, the disk is now a qcow2 image
  // whose backing file is the host's /etc/hostname.
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(disk_, OpenOptions{}));
  EXPECT_EQ(img->GetChainInfo()[0].format, ImageFormat::kQcow2);
  ASSERT_EQ(img->chain_length(), 2);
  EXPECT_EQ(img->GetChainInfo()[1].filename, "/etc/hostname");
}

// The backing-file policy as a qcowtool flag: --backing-root=DIR refuses
// a backing file outside DIR on every command that opens a chain.
TEST(BackingRootFlagTest, RefusesBackingFilesOutsideTheRoot) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.File("root").c_str(), 0755), 0);
  CreateOptions base;
  base.size = 1 << 20;
  ASSERT_OK(CreateImage(dir.File("outside.qcow2"), base));
  CreateOptions top = base;
  top.backing_file = "../outside.qcow2";
  top.backing_format = "qcow2";
  const std::string image = dir.File("root/top.qcow2");
  ASSERT_OK(CreateImage(image, top));
  const std::string root = "--backing-root=" + dir.File("root");
  const std::string tool = testing::QcowtoolPath();
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{tool, "info", "--backing-chain", root, image},
        {tool, "map", root, image},
        {tool, "convert", root, image, dir.File("out.raw")},
        {tool, "io", "-r", root, image, "-c", "read 0 4k"}}) {
    testing::CommandResult r = testing::Run(argv);
    // qemu-img's verbs exit 1; io, a verb of our own, 2.
    EXPECT_EQ(r.exit_code, argv[1] == "io" ? 2 : 1) << argv[1];
    EXPECT_THAT(r.err, HasSubstr("outside the allowed directory")) << argv[1];
  }
  // Without the flag the same chain opens.
  testing::CommandResult r = testing::Run({tool, "map", image});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(ProbeNonRawTest, KnowsTheFormatsQemuProbes) {
  auto probe = [](const std::string& head, size_t at = 0) {
    std::vector<uint8_t> b(512, 0);
    std::memcpy(b.data() + at, head.data(), head.size());
    const char* f = internal::ProbeNonRaw(b);
    return std::string(f ? f : "raw");
  };
  EXPECT_EQ(probe(std::string("QFI\xfb", 4)), "qcow2");
  EXPECT_EQ(probe(std::string("QED\0", 4)), "qed");
  EXPECT_EQ(probe("KDMV"), "vmdk");
  EXPECT_EQ(probe(std::string("\x7f\x10\xda\xbe", 4), 64), "vdi");
  EXPECT_EQ(probe("conectix"), "vpc");
  EXPECT_EQ(probe(std::string("LUKS\xba\xbe", 6)), "luks");
  EXPECT_EQ(probe("QFI"), "raw");
  EXPECT_EQ(probe(""), "raw");
}

}  // namespace
}  // namespace qcow2
