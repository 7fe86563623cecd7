// SPDX-License-Identifier: Apache-2.0
// LUKS-encrypted qcow2 images with an external data file, raw and not
// raw, both ways against QEMU 7.2. QEMU keeps the LUKS header in the
// image file and encrypts each data cluster in the data file with the
// data file's offset (which equals the guest offset) as the IV's sector
// number; whole clusters zeroed in a raw data file hold plain zero bytes
// (the entries say zero), part of a cluster encrypted zeros. Checked
// here: qemu-io writes, we read (synchronous and queued); we write,
// qemu-img check is clean and qemu-img compare finds the model; the same
// qemu-io steps run by qemu-io and by `qcowtool io` on copies of one image
// leave both files byte for byte equal; a wrong secret fails naming it
// and leaves both files untouched; info, map, check and convert (into an
// encrypted raw data file too) agree with qemu-img.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "qcow2/options.h"
#include "tests/util/queued_read.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using ::qcow2::testing::CommandResult;
using ::qcow2::testing::TempDir;
using ::testing::HasSubstr;

constexpr uint64_t kSize = 4ull << 20;
constexpr uint64_t kCluster = 65536;
constexpr char kPass[] = "luks-data-pass";

std::string Obj(const std::string& pass = kPass) {
  return absl::StrCat("secret,id=s0,data=", pass);
}

std::string Opts(const std::string& image) {
  return absl::StrCat("driver=qcow2,file.filename=", image,
                      ",encrypt.key-secret=s0");
}

// Runs `argv` from `dir`: the image's stored data file name is relative
// and QEMU resolves it from the working directory as well.
CommandResult RunIn(const std::string& dir,
                    const std::vector<std::string>& argv) {
  std::string cmd = absl::StrCat("cd '", dir, "' &&");
  for (const std::string& a : argv) absl::StrAppend(&cmd, " '", a, "'");
  return ::qcow2::testing::RunShell(cmd);
}

// `tool` (qemu-io or qcowtool io) on dir/x.qcow2 with the secret.
CommandResult Io(const std::string& dir, const std::vector<std::string>& cmds,
                 bool ours = false, const std::string& pass = kPass) {
  std::vector<std::string> argv;
  if (ours) {
    argv = {::qcow2::testing::QcowtoolPath(), "io"};
  } else {
    argv = {"qemu-io"};
  }
  for (const std::string& a : {std::string("--object"), Obj(pass),
                               std::string("--image-opts"), Opts("x.qcow2")}) {
    argv.push_back(a);
  }
  for (const std::string& c : cmds) {
    argv.push_back("-c");
    argv.push_back(c);
  }
  return RunIn(dir, argv);
}

// dir/x.qcow2 with data file dir/d.raw (stored as "d.raw"), by us
// (PBKDF2 iterations kept low: qemu-img measures them for seconds).
void Create(const std::string& dir, bool raw) {
  CreateOptions o;
  o.size = kSize;
  o.encrypt.format = "luks";
  o.encrypt.key_secret = kPass;
  o.encrypt.iterations = 1000;
  o.data_file = dir + "/d.raw";
  o.data_file_raw = raw;
  ASSERT_TRUE(CreateImage(dir + "/x.qcow2", o).ok());
  // The name as QEMU would store it for a create from `dir`.
  CommandResult r =
      RunIn(dir, {"qemu-img", "amend", "--object", Obj(), "--image-opts",
                  Opts("x.qcow2"), "-o", "data_file=d.raw"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

void ExpectQemuCheckClean(const std::string& dir) {
  CommandResult r = RunIn(dir, {"qemu-img", "check", "--object", Obj(),
                                "--image-opts", Opts("x.qcow2")});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("No errors were found"));
}

// The disk as qemu-img reads it (convert to raw).
std::vector<uint8_t> QemuDisk(const std::string& dir) {
  CommandResult r =
      RunIn(dir, {"qemu-img", "convert", "--object", Obj(), "--image-opts",
                  Opts("x.qcow2"), "-O", "raw", "qemu.out"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto b = ::qcow2::testing::ReadFileBytes(dir + "/qemu.out");
  return b.ok() ? *std::move(b) : std::vector<uint8_t>();
}

std::unique_ptr<Image> Open(const std::string& dir, bool rw) {
  OpenOptions o;
  o.read_write = rw;
  o.key_secret = kPass;
  o.data_file = dir + "/d.raw";  // the stored name is relative
  auto img = Image::Open(dir + "/x.qcow2", o);
  EXPECT_TRUE(img.ok()) << img.status();
  return img.ok() ? std::move(img).value() : nullptr;
}

std::vector<uint8_t> ReadAll(Image* img) {
  std::vector<uint8_t> got(kSize);
  EXPECT_TRUE(img->Read(0, absl::MakeSpan(got)).ok());
  return got;
}

bool LongTests() {
  const char* v = getenv("QCOW2_LONG_TESTS");
  return v != nullptr && std::string(v) == "1";
}

std::string Name(bool raw) { return raw ? "raw" : "notraw"; }

// qemu-io writes (whole clusters, part of one, one sector, zeroes over
// data, a discard), and we read what qemu-img reads, synchronously and
// through a queue. With QCOW2_LONG_TESTS=1 the raw variant's image is
// qemu-img's own (its PBKDF2 measurement takes seconds).
TEST(LuksDataFileTest, QemuWritesWeRead) {
  SKIP_WITHOUT_QEMU();
  for (bool raw : {false, true}) {
    SCOPED_TRACE(Name(raw));
    TempDir dir;
    if (raw && LongTests()) {
      CommandResult r = ::qcow2::testing::RetryQemuKeyTiming([&] {
        return RunIn(dir.path(),
                     {"qemu-img", "create", "-q", "-f", "qcow2", "--object",
                      Obj(), "-o",
                      "encrypt.format=luks,encrypt.key-secret=s0,"
                      "encrypt.iter-time=10,data_file=d.raw,data_file_raw=on",
                      "x.qcow2", absl::StrCat(kSize)});
      });
      ASSERT_EQ(r.exit_code, 0) << r.err;
    } else {
      Create(dir.path(), raw);
    }
    CommandResult r =
        Io(dir.path(), {"write -P 0x11 0 192k", "write -P 0x22 200k 3k",
                        "write -P 0x33 1m 512", "write -z 16k 8k",
                        "write -z 64k 64k", "discard 128k 64k",
                        "write -P 0x44 3m 64k"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<uint8_t> want = QemuDisk(dir.path());
    ASSERT_EQ(want.size(), kSize);
    // Not raw: what the model says too (a raw data file's unwritten
    // clusters decrypt its zero bytes into noise, for QEMU as for us).
    if (!raw) {
      std::vector<uint8_t> m(kSize, 0);
      std::fill_n(m.begin(), 192 << 10, 0x11);
      std::fill_n(m.begin() + (200 << 10), 3 << 10, 0x22);
      std::fill_n(m.begin() + (1 << 20), 512, 0x33);
      std::fill_n(m.begin() + (16 << 10), 8 << 10, 0);
      std::fill_n(m.begin() + (64 << 10), 128 << 10, 0);
      std::fill_n(m.begin() + (3 << 20), 64 << 10, 0x44);
      EXPECT_TRUE(want == m);
    }
    auto img = Open(dir.path(), /*rw=*/false);
    ASSERT_NE(img, nullptr);
    EXPECT_TRUE(ReadAll(img.get()) == want);
    EXPECT_TRUE(::qcow2::testing::ReadAllQueued(img.get(), kSize, kCluster) ==
                want);
  }
}

// We write (the whole disk first, so that a raw data file holds nothing
// unknown; then allocating and partial writes, write-zeroes, discard):
// qemu-img check is clean and qemu-img compare finds the model.
TEST(LuksDataFileTest, WeWriteQemuReads) {
  SKIP_WITHOUT_QEMU();
  for (bool raw : {false, true}) {
    SCOPED_TRACE(Name(raw));
    TempDir dir;
    Create(dir.path(), raw);
    std::vector<uint8_t> m(kSize);
    for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<uint8_t>(i * 7 + (i >> 9));
    {
      auto img = Open(dir.path(), /*rw=*/true);
      ASSERT_NE(img, nullptr);
      ASSERT_TRUE(img->Write(0, absl::MakeConstSpan(m)).ok());
      std::vector<uint8_t> p(5000, 0x5c);
      ASSERT_TRUE(img->Write(70000 & ~511u, absl::MakeConstSpan(p.data(), 4608)).ok());
      std::fill_n(m.begin() + (70000 & ~511u), 4608, 0x5c);
      ASSERT_TRUE(img->WriteZeroes(256 << 10, 128 << 10).ok());
      std::fill_n(m.begin() + (256 << 10), 128 << 10, 0);
      ASSERT_TRUE(img->WriteZeroes(1024 + (512 << 10), 2048).ok());
      std::fill_n(m.begin() + 1024 + (512 << 10), 2048, 0);
      ASSERT_TRUE(img->Discard(2 << 20, 256 << 10).ok());
      std::fill_n(m.begin() + (2 << 20), 256 << 10, 0);
      ASSERT_TRUE(img->Close().ok());
    }
    ExpectQemuCheckClean(dir.path());
    ASSERT_TRUE(::qcow2::testing::WriteFileBytes(dir.File("model.raw"), m).ok());
    CommandResult r = RunIn(
        dir.path(), {"qemu-img", "compare", "--object", Obj(), "--image-opts",
                     Opts("x.qcow2"), "driver=raw,file.filename=model.raw"});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("Images are identical"));
  }
}

// The same steps through qemu-io and through `qcowtool io`, each on a copy
// of one image: both files end up byte for byte equal (the IVs, plain
// zeros in the raw data file's zeroed clusters, encrypted zeros in part
// of a cluster, the same entries; not raw, the image file only).
TEST(LuksDataFileTest, SameStepsSameBytes) {
  SKIP_WITHOUT_QEMU();
  for (bool raw : {false, true}) {
    SCOPED_TRACE(Name(raw));
    TempDir a;
    Create(a.path(), raw);
    TempDir b;
    ASSERT_EQ(::qcow2::testing::RunShell(absl::StrCat(
                  "cp '", a.path(), "/x.qcow2' '", a.path(), "/d.raw' '",
                  b.path(), "/'")).exit_code, 0);
    const std::vector<std::string> steps = {
        "write -P 0x5a 0 256k", "write -P 0x33 3m 100k", "write -z 64k 64k",
        "write -z -u 128k 64k", "discard 192k 64k",      "write -z 4k 4k",
        "write -P 0x66 3m 4k"};
    CommandResult r = Io(a.path(), steps);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = Io(b.path(), steps, /*ours=*/true);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // Not raw, QEMU punches the discarded cluster out of the data file;
    // we keep its bytes (zeroer.cc: a power cut before the entry is
    // written would leave it naming a hole, noise once decrypted).
    for (const char* f : {"/x.qcow2", raw ? "/d.raw" : "/x.qcow2"}) {
      auto qa = ::qcow2::testing::ReadFileBytes(a.path() + f);
      auto qb = ::qcow2::testing::ReadFileBytes(b.path() + f);
      ASSERT_TRUE(qa.ok() && qb.ok());
      EXPECT_TRUE(*qa == *qb) << f << " differs";
    }
    ExpectQemuCheckClean(b.path());
  }
}

// A wrong secret: the open fails naming it, and neither file changes.
TEST(LuksDataFileTest, WrongSecretLeavesBothFilesUntouched) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  Create(dir.path(), /*raw=*/false);
  ASSERT_EQ(Io(dir.path(), {"write -P 0x11 0 64k"}).exit_code, 0);
  auto before_x = ::qcow2::testing::ReadFileBytes(dir.File("x.qcow2"));
  auto before_d = ::qcow2::testing::ReadFileBytes(dir.File("d.raw"));
  OpenOptions o;
  o.read_write = true;
  o.key_secret = "not-the-pass";
  o.data_file = dir.File("d.raw");
  auto img = Image::Open(dir.File("x.qcow2"), o);
  ASSERT_FALSE(img.ok());
  EXPECT_THAT(img.status().message(), HasSubstr("Invalid password"));
  CommandResult r = Io(dir.path(), {"write -z 0 64k"}, /*ours=*/true, "nope");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("Invalid password"));
  EXPECT_TRUE(::qcow2::testing::ReadFileBytes(dir.File("x.qcow2")) == before_x);
  EXPECT_TRUE(::qcow2::testing::ReadFileBytes(dir.File("d.raw")) == before_d);
}

// info (no secret) as qemu-img prints it; map as qemu-img's JSON; check;
// convert out of the image, and into a new encrypted image with a raw
// data file (whose zero bytes read as noise: zeros must be written),
// equal to the source for qemu-img compare.
TEST(LuksDataFileTest, CliVerbsAsQemuImg) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  Create(dir.path(), /*raw=*/true);
  ASSERT_EQ(Io(dir.path(), {"write -P 0x11 0 192k", "write -z 64k 64k",
                            "write -z 132k 4k", "write -P 0x22 2m 8k"})
                .exit_code,
            0);
  const std::string tool = ::qcow2::testing::QcowtoolPath();
  CommandResult q = RunIn(dir.path(), {"qemu-img", "info", "x.qcow2"});
  CommandResult o = RunIn(dir.path(), {tool, "info", "x.qcow2"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, q.out);
  q = RunIn(dir.path(), {"qemu-img", "map", "--output=json", "--object", Obj(),
                         "--image-opts", Opts("x.qcow2")});
  o = RunIn(dir.path(), {tool, "map", "--output=json", "--object", Obj(),
                         "--image-opts", Opts("x.qcow2")});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, q.out);
  o = RunIn(dir.path(), {tool, "check", "--object", Obj(), "--image-opts",
                         Opts("x.qcow2")});
  EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
  EXPECT_THAT(o.out, HasSubstr("No errors were found"));
  o = RunIn(dir.path(), {tool, "convert", "--object", Obj(), "--image-opts",
                         Opts("x.qcow2"), "-O", "raw", "out.raw"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(::qcow2::testing::ReadFileBytes(dir.File("out.raw")).value() ==
              QemuDisk(dir.path()));
  o = RunIn(dir.path(),
            {tool, "convert", "--object", Obj(), "-f", "raw", "-O", "qcow2",
             "-o",
             "encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10,"
             "data_file=c.raw,data_file_raw=on",
             "out.raw", "c.qcow2"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  q = RunIn(dir.path(),
            {"qemu-img", "compare", "--object", Obj(), "--image-opts",
             Opts("c.qcow2"), "driver=raw,file.filename=out.raw"});
  EXPECT_EQ(q.exit_code, 0) << q.out << q.err;
  EXPECT_THAT(q.out, HasSubstr("Images are identical"));
}

}  // namespace
}  // namespace qcow2
