// SPDX-License-Identifier: Apache-2.0
// The qcowtool verbs that open images take secrets as qemu-img takes them
// (`--object secret,id=ID,data=...` with `--image-opts driver=qcow2,
// file.filename=PATH,encrypt.key-secret=ID`): dd, commit, rebase,
// stream, resize, snapshot, bitmap, bench pattern, serve and serve
// --vhost-user-blk open a LUKS-encrypted image with its secret, and
// refuse it without (the file left as it was). What they wrote is read
// back through qemu-io and qemu-img check. Images are made with small
// fixed PBKDF2 counts, so that the whole file costs about a second.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "qcow2/options.h"
#include "tests/util/harden_sha256.h"
#include "tests/util/luks_cli.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using ::qcow2::testing::CommandResult;
using ::qcow2::testing::ReadFileBytes;
using ::qcow2::testing::Sha256Hex;
using ::qcow2::testing::StopServer;
using ::qcow2::testing::TempDir;
using ::testing::HasSubstr;

constexpr char kPass[] = "verb-s3cret";
constexpr char kNeeded[] = "Parameter 'encrypt.key-secret' is required";

std::string Obj() { return absl::StrCat("secret,id=s0,data=", kPass); }

std::string Opts(const std::string& path) {
  return absl::StrCat("driver=qcow2,file.filename=", path,
                      ",encrypt.key-secret=s0");
}

// The shared image with this file's secret.
void MakeEncrypted(const std::string& path, const std::string& backing = "") {
  ::qcow2::testing::MakeEncrypted(path, kPass, backing);
}

CommandResult Tool(std::vector<std::string> args) {
  args.insert(args.begin(), ::qcow2::testing::QcowtoolPath());
  return ::qcow2::testing::Run(args);
}

// The verb with the secret first succeeds; without it, it fails with
// qemu-img's words and the file is unchanged. `with` and `without` are
// the arguments after the verb.
void ExpectNeedsSecret(const std::string& path, const std::string& verb,
                       const std::vector<std::string>& without,
                       const std::vector<std::string>& with) {
  SCOPED_TRACE(verb);
  auto bytes = ReadFileBytes(path);
  ASSERT_TRUE(bytes.ok());
  const std::string before = Sha256Hex(*bytes);
  std::vector<std::string> args = {verb};
  args.insert(args.end(), without.begin(), without.end());
  CommandResult r = Tool(args);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.err, HasSubstr(kNeeded));
  bytes = ReadFileBytes(path);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(Sha256Hex(*bytes), before);
  args = {verb};
  args.insert(args.end(), with.begin(), with.end());
  r = Tool(args);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

CommandResult QemuIo(const std::string& opts, const std::string& cmd) {
  return ::qcow2::testing::Run({"qemu-io", "--object", Obj(), "--image-opts",
                                opts, "-c", cmd});
}

void ExpectQemuCheckClean(const std::string& path) {
  CommandResult r = ::qcow2::testing::Run(
      {"qemu-img", "check", "--object", Obj(), "--image-opts", Opts(path)});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

TEST(CliLuksVerbsTest, DdResizeSnapshotBitmap) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string img = dir.File("e.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeEncrypted(img));
  const std::string out = dir.File("out.raw");
  ExpectNeedsSecret(img, "dd",
                    {absl::StrCat("if=", img), absl::StrCat("of=", out),
                     "bs=64k", "count=1"},
                    {"--object", Obj(), "--image-opts",
                     absl::StrCat("if=", Opts(img)), absl::StrCat("of=", out),
                     "bs=64k", "count=1"});
  auto raw = ReadFileBytes(out);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(*raw, std::vector<uint8_t>(65536, 0x5a));
  ExpectNeedsSecret(img, "resize", {img, "8M"},
                    {"--object", Obj(), "--image-opts", Opts(img), "8M"});
  ExpectNeedsSecret(img, "snapshot", {"-c", "snap1", img},
                    {"--object", Obj(), "--image-opts", "-c", "snap1",
                     Opts(img)});
  ExpectNeedsSecret(img, "bitmap", {"--add", img, "b0"},
                    {"--object", Obj(), "--image-opts", "--add", Opts(img),
                     "b0"});
  CommandResult r = ::qcow2::testing::Run(
      {"qemu-img", "info", "--output=json", img});
  EXPECT_THAT(r.out, HasSubstr("\"virtual-size\": 8388608"));
  EXPECT_THAT(r.out, HasSubstr("\"name\": \"snap1\""));
  EXPECT_THAT(r.out, HasSubstr("\"name\": \"b0\""));
  EXPECT_EQ(QemuIo(Opts(img), "read -P 0x5a 0 64k").exit_code, 0);
  ExpectQemuCheckClean(img);
  // An unknown secret id: qemu-img's words.
  r = Tool({"resize", "--object", Obj(), "--image-opts",
            absl::StrCat("driver=qcow2,file.filename=", img,
                         ",encrypt.key-secret=s9"),
            "9M"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("No secret with id 's9'"));
}

// commit, stream and rebase on a chain of two encrypted images (one
// secret serves both, as OpenOptions::key_secret documents).
TEST(CliLuksVerbsTest, ChainVerbs) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  const std::string top = dir.File("top.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeEncrypted(base));
  ASSERT_NO_FATAL_FAILURE(MakeEncrypted(top, base));
  const std::string chain = Opts(top) + ",backing.encrypt.key-secret=s0";
  ASSERT_EQ(QemuIo(chain, "write -P 0x61 1m 64k").exit_code, 0);
  ExpectNeedsSecret(top, "commit", {top},
                    {"--object", Obj(), "--image-opts", Opts(top)});
  EXPECT_EQ(QemuIo(Opts(base), "read -P 0x61 1m 64k").exit_code, 0);
  ExpectNeedsSecret(top, "rebase", {"-u", "-b", base, "-F", "qcow2", top},
                    {"--object", Obj(), "--image-opts", "-u", "-b", base,
                     "-F", "qcow2", Opts(top)});
  // Stream copies base's data into top and drops the backing file.
  ExpectNeedsSecret(top, "stream", {top},
                    {"--object", Obj(), "--image-opts", Opts(top)});
  EXPECT_EQ(QemuIo(Opts(top), "read -P 0x61 1m 64k").exit_code, 0);
  EXPECT_EQ(QemuIo(Opts(top), "read -P 0x5a 0 64k").exit_code, 0);
  ExpectQemuCheckClean(top);
  ExpectQemuCheckClean(base);
}

// A chain whose two encrypted images have different secrets: the
// backing file's given as QEMU takes it (backing.encrypt.key-secret=ID,
// OpenOptions::backing_key_secrets); without it the chain does not open.
// What we read equals what qemu-img reads with the same options.
TEST(CliLuksVerbsTest, SecretPerImageOfChain) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  const std::string top = dir.File("top.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeEncrypted(base));
  CreateOptions o;
  o.size = 4 << 20;
  o.encrypt.format = "luks";
  o.encrypt.key_secret = "top-secret";
  o.encrypt.iterations = 1000;
  o.backing_file = base;
  o.backing_format = "qcow2";
  ASSERT_TRUE(CreateImage(top, o).ok());
  OpenOptions oo;
  oo.read_write = true;
  oo.key_secret = "top-secret";
  auto img = Image::Open(top, oo);
  ASSERT_FALSE(img.ok());
  EXPECT_EQ(img.status().code(), absl::StatusCode::kPermissionDenied);
  oo.backing_key_secrets = {kPass};
  img = Image::Open(top, oo);
  ASSERT_TRUE(img.ok()) << img.status();
  ASSERT_TRUE((*img)->Write(1 << 20, std::vector<uint8_t>(65536, 0x61)).ok());
  ASSERT_TRUE((*img)->Close().ok());

  const std::vector<std::string> secrets = {
      "--object", Obj(), "--object", "secret,id=t0,data=top-secret",
      "--image-opts",
      absl::StrCat("driver=qcow2,file.filename=", top,
                   ",encrypt.key-secret=t0,backing.encrypt.key-secret=s0")};
  auto convert = [&](const std::string& program, const std::string& out) {
    std::vector<std::string> argv = {program, "convert"};
    argv.insert(argv.end(), secrets.begin(), secrets.end());
    argv.insert(argv.end(), {"-O", "raw", out});
    return ::qcow2::testing::Run(argv);
  };
  CommandResult ours = convert(::qcow2::testing::QcowtoolPath(), dir.File("o.raw"));
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  CommandResult qemu = convert("qemu-img", dir.File("q.raw"));
  ASSERT_EQ(qemu.exit_code, 0) << qemu.err;
  auto a = ReadFileBytes(dir.File("o.raw"));
  auto b = ReadFileBytes(dir.File("q.raw"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(*a == *b);
  ASSERT_EQ(a->size(), 4u << 20);
  EXPECT_EQ((*a)[0], 0x5a);
  EXPECT_EQ((*a)[1 << 20], 0x61);
  // Without the backing file's secret: refused, naming the backing file.
  CommandResult c = Tool({"convert", "--object", "secret,id=t0,data=top-secret",
                          "--image-opts",
                          absl::StrCat("driver=qcow2,file.filename=", top,
                                       ",encrypt.key-secret=t0"),
                          "-O", "raw", dir.File("n.raw")});
  EXPECT_NE(c.exit_code, 0);
  EXPECT_THAT(c.err, HasSubstr("base.qcow2"));
}

// create -b over an encrypted backing file needs no secret (its size is
// metadata, as qemu-img reads it); the new overlay reads the backing data
// through qemu-io with the backing file's secret.
TEST(CliLuksVerbsTest, CreateOverEncryptedBacking) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  const std::string top = dir.File("top.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeEncrypted(base));
  CommandResult r = Tool({"create", "-q", "-f", "qcow2", "-b", base, "-F",
                          "qcow2", top});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  CreateOptions o;
  o.backing_file = base;
  o.backing_format = "qcow2";
  ASSERT_TRUE(CreateImage(dir.File("lib.qcow2"), o).ok());
  for (const std::string& img : {top, dir.File("lib.qcow2")}) {
    CommandResult io = ::qcow2::testing::Run(
        {"qemu-io", "--object", Obj(), "--image-opts",
         absl::StrCat("driver=qcow2,file.filename=", img,
                      ",backing.encrypt.key-secret=s0"),
         "-c", "read -P 0x5a 0 64k"});
    EXPECT_EQ(io.exit_code, 0) << io.err;
    EXPECT_THAT(io.out, HasSubstr("read 65536/65536"));
    EXPECT_THAT(io.out, ::testing::Not(HasSubstr("failed")));
    CommandResult info = ::qcow2::testing::Run({"qemu-img", "info", img});
    EXPECT_THAT(info.out, HasSubstr("virtual size: 4 MiB"));
  }
}

TEST(CliLuksVerbsTest, BenchPattern) {
  TempDir dir;
  const std::string img = dir.File("e.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeEncrypted(img));
  ExpectNeedsSecret(img, "bench", {"pattern", "-c", "64", img},
                    {"pattern", "--object", Obj(), "--image-opts", "-c", "64",
                     "-w", "--pattern=90", Opts(img)});
  // What bench wrote is 0x5a (90) through the cipher.
  OpenOptions oo;
  oo.key_secret = kPass;
  auto image = Image::Open(img, oo);
  ASSERT_TRUE(image.ok()) << image.status();
  std::vector<uint8_t> got(65536);
  ASSERT_TRUE((*image)->Read(0, absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, std::vector<uint8_t>(65536, 90));
}

// Starts a forked server (`args` after the verb) and returns its pid
// (from --pid-file), or -1.
pid_t StartServer(const std::vector<std::string>& args,
                  const std::string& pid_file) {
  // Through a shell, the daemon's output to /dev/null: it must not hold
  // the pipes Run reads to their end.
  std::string cmd = absl::StrCat(::qcow2::testing::QcowtoolPath(),
                                 " serve --fork --pid-file ", pid_file);
  for (const std::string& arg : args) absl::StrAppend(&cmd, " '", arg, "'");
  absl::StrAppend(&cmd, " >/dev/null 2>&1");
  CommandResult r = ::qcow2::testing::Run({"sh", "-c", cmd});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  std::ifstream in(pid_file);
  pid_t pid = -1;
  in >> pid;
  return r.exit_code == 0 ? pid : -1;
}

TEST(CliLuksVerbsTest, ServeAndVhost) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string img = dir.File("e.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeEncrypted(img));
  const std::string sock = dir.File("nbd.sock");
  CommandResult r = Tool({"serve", "--socket", sock, img});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr(kNeeded));
  pid_t pid = StartServer({"--socket", sock, "--object", Obj(),
                           "--image-opts", Opts(img)},
                          dir.File("nbd.pid"));
  // A real client reads the plaintext.
  r = ::qcow2::testing::Run({"qemu-io", "-f", "raw",
                             absl::StrCat("nbd+unix:///?socket=", sock), "-c",
                             "read -P 0x5a 0 64k"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("Pattern verification failed")));
  StopServer(pid);
  const std::string vsock = dir.File("vhost.sock");
  r = Tool({"serve", "--vhost-user-blk", vsock, img});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr(kNeeded));
  pid = StartServer({"--vhost-user-blk", vsock, "--object", Obj(),
                     "--image-opts", Opts(img)},
                    dir.File("vhost.pid"));
  StopServer(pid);
}

}  // namespace
}  // namespace qcow2
