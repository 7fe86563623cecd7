// SPDX-License-Identifier: Apache-2.0
// LUKS-encrypted qcow2 images (crypt_method 2) opened, read, written and
// created through the public API, both ways against QEMU 7.2: images that
// qemu-img creates and qemu-io fills read back through us (synchronous
// calls and io_uring queues); images we create and write (allocating,
// copy-on-write inside a cluster and from backing files, write-zeroes,
// discard) read back through qemu-io, pass `qemu-img check` with the
// secret, and `qemu-img compare` finds them equal to a plain reference. A
// missing or wrong secret is kPermissionDenied and leaves the file as it
// was. The default run covers a spread of ciphers (images with fixed small
// PBKDF2 counts; qemu-img's iter-time=10 still measures for about a
// second); QCOW2_LONG_TESTS=1 runs every cipher/mode/ivgen qemu-img
// creates.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "qcow2/options.h"
#include "qcow2/queue.h"
#include "tests/util/harden_sha256.h"
#include "tests/util/queued_read.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using ::qcow2::testing::CommandResult;
using ::qcow2::testing::ReadFileBytes;
using ::qcow2::testing::Sha256Hex;
using ::qcow2::testing::TempDir;
using ::testing::HasSubstr;

constexpr char kPass[] = "s3cret-PASS";
constexpr uint64_t kSize = 4ull << 20;
constexpr uint64_t kCluster = 65536;

bool LongTests() {
  const char* v = getenv("QCOW2_LONG_TESTS");
  return v != nullptr && std::string(v) == "1";
}

struct Combo {
  std::string alg, mode, ivgen, ivhash, hash;
};

std::string ComboName(const Combo& c) {
  return absl::StrCat(c.alg, "-", c.mode, "-", c.ivgen,
                      c.ivhash.empty() ? "" : "-" + c.ivhash,
                      c.hash.empty() ? "" : "-" + c.hash);
}

// What qemu-img 7.2 creates (as luks_test.cc's matrix finds it).
std::vector<Combo> AllCombos() {
  std::vector<Combo> v;
  for (const char* alg : {"aes-128", "aes-192", "aes-256", "serpent-128",
                          "serpent-192", "serpent-256", "twofish-128",
                          "twofish-192", "twofish-256"}) {
    for (const char* mode : {"ecb", "cbc", "xts", "ctr"}) {
      const bool k24 = std::string(alg).ends_with("192");
      if (k24 && std::string(mode) != "xts") continue;  // QEMU aborts
      v.push_back({alg, mode, "plain64", "", ""});
    }
  }
  for (const char* mode : {"ecb", "cbc", "ctr"}) {
    v.push_back({"cast5-128", mode, "plain64", "", ""});
  }
  for (const char* alg : {"aes-128", "aes-256", "serpent-256", "twofish-128"}) {
    v.push_back({alg, "cbc", "plain", "", ""});
    v.push_back({alg, "xts", "essiv", "sha256", ""});
    v.push_back({alg, "cbc", "essiv", "md5", ""});
  }
  for (const char* h : {"md5", "sha1", "sha224", "sha384", "sha512", "ripemd160"}) {
    v.push_back({"aes-256", "xts", "plain64", "", h});
  }
  return v;
}

std::vector<Combo> QuickCombos() {
  return {{"aes-256", "xts", "plain64", "", ""},
          {"aes-128", "cbc", "essiv", "sha256", "sha1"},
          {"serpent-256", "ctr", "plain", "", ""},
          {"twofish-128", "ecb", "plain64", "", "sha512"}};
}

std::vector<Combo> Combos() { return LongTests() ? AllCombos() : QuickCombos(); }

// ---- QEMU ----------------------------------------------------------------

std::vector<std::string> Secret(const std::string& pass = kPass) {
  return {"--object", absl::StrCat("secret,id=s0,data=", pass)};
}

std::string Opts(const std::string& path) {
  return absl::StrCat("driver=qcow2,file.filename=", path,
                      ",encrypt.key-secret=s0");
}

CommandResult Qemu(std::vector<std::string> argv) { return ::qcow2::testing::Run(argv); }

CommandResult QemuIo(const std::string& path, const std::vector<std::string>& cmds) {
  std::vector<std::string> argv = {"qemu-io"};
  for (auto& a : Secret()) argv.push_back(a);
  argv.push_back("--image-opts");
  argv.push_back(Opts(path));
  for (const std::string& c : cmds) {
    argv.push_back("-c");
    argv.push_back(c);
  }
  return ::qcow2::testing::Run(argv);
}

void ExpectQemuCheckClean(const std::string& path,
                          const std::string& more_opts = "") {
  std::vector<std::string> argv = {"qemu-img", "check"};
  for (auto& a : Secret()) argv.push_back(a);
  argv.push_back("--image-opts");
  argv.push_back(Opts(path) + more_opts);
  CommandResult r = ::qcow2::testing::Run(argv);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("No errors were found"));
}

void ExpectQemuCompareEqual(const std::string& path, const std::string& raw) {
  std::vector<std::string> argv = {"qemu-img", "compare"};
  for (auto& a : Secret()) argv.push_back(a);
  argv.push_back("--image-opts");
  argv.push_back(Opts(path));
  argv.push_back(absl::StrCat("driver=raw,file.filename=", raw));
  CommandResult r = ::qcow2::testing::Run(argv);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("Images are identical"));
}

std::vector<std::string> EncryptCreateArgs(const Combo& c) {
  std::string o = "encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10";
  absl::StrAppend(&o, ",encrypt.cipher-alg=", c.alg, ",encrypt.cipher-mode=",
                  c.mode, ",encrypt.ivgen-alg=", c.ivgen);
  if (!c.ivhash.empty()) absl::StrAppend(&o, ",encrypt.ivgen-hash-alg=", c.ivhash);
  if (!c.hash.empty()) absl::StrAppend(&o, ",encrypt.hash-alg=", c.hash);
  std::vector<std::string> argv = {"qemu-img", "create", "-q", "-f", "qcow2"};
  for (auto& a : Secret()) argv.push_back(a);
  argv.push_back("-o");
  argv.push_back(o);
  return argv;
}

// ---- us ------------------------------------------------------------------

CreateOptions OurCreate(const Combo& c) {
  CreateOptions o;
  o.size = kSize;
  o.encrypt.format = "luks";
  o.encrypt.key_secret = kPass;
  o.encrypt.cipher_alg = c.alg;
  o.encrypt.cipher_mode = c.mode;
  o.encrypt.ivgen_alg = c.ivgen;
  o.encrypt.ivgen_hash_alg = c.ivhash;
  if (!c.hash.empty()) o.encrypt.hash_alg = c.hash;
  o.encrypt.iterations = 1000;
  return o;
}

std::unique_ptr<Image> OpenRw(const std::string& path, bool rw = true) {
  OpenOptions o;
  o.read_write = rw;
  o.key_secret = kPass;
  auto img = Image::Open(path, o);
  EXPECT_TRUE(img.ok()) << img.status();
  return img.ok() ? std::move(img).value() : nullptr;
}

std::vector<uint8_t> Pattern(size_t len, uint8_t seed) {
  std::vector<uint8_t> v(len);
  for (size_t i = 0; i < len; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 9));
  return v;
}

// The guest writes of the tests below, applied to a model of the disk.
struct Model {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(kSize, 0);
  void Put(uint64_t off, const std::vector<uint8_t>& d) {
    std::copy(d.begin(), d.end(), bytes.begin() + off);
  }
  void Zero(uint64_t off, uint64_t len) {
    std::fill(bytes.begin() + off, bytes.begin() + off + len, 0);
  }
};

std::vector<uint8_t> ReadAll(Image* img) {
  std::vector<uint8_t> got(kSize);
  EXPECT_TRUE(img->Read(0, absl::MakeSpan(got)).ok());
  return got;
}

// The same, through an io_uring queue (depth 8, 64 KiB reads).
std::vector<uint8_t> ReadAllQueued(Image* img) {
  return ::qcow2::testing::ReadAllQueued(img, kSize, kCluster);
}

void WriteRaw(const std::string& path, const Model& m) {
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(fwrite(m.bytes.data(), 1, m.bytes.size(), f), m.bytes.size());
  fclose(f);
}

// ---- qemu writes, we read --------------------------------------------------

void QemuWritesWeRead(const Combo& c, bool qemu_creates) {
  SCOPED_TRACE(ComboName(c));
  TempDir dir;
  const std::string path = dir.File("q.qcow2");
  CommandResult r;
  if (qemu_creates) {
    std::vector<std::string> argv = EncryptCreateArgs(c);
    argv.push_back(path);
    argv.push_back(absl::StrCat(kSize));
    r = testing::RetryQemuKeyTiming([&] { return Qemu(argv); });
    ASSERT_EQ(r.exit_code, 0) << r.err;
  } else {
    ASSERT_TRUE(CreateImage(path, OurCreate(c)).ok());
  }
  // Whole clusters, a partial one (copy-on-write in QEMU), sectors apart,
  // zeroes over data, a compressed cluster.
  r = QemuIo(path, {"write -P 0x11 0 128k", "write -P 0x22 200k 3k",
                    "write -P 0x33 1m 512", "write -P 0x44 2047k 2k",
                    "write -z 16k 8k", "write -c -P 0x55 3m 64k"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Model m;
  m.bytes.assign(kSize, 0);
  std::fill_n(m.bytes.begin(), 128 << 10, 0x11);
  std::fill_n(m.bytes.begin() + (200 << 10), 3 << 10, 0x22);
  std::fill_n(m.bytes.begin() + (1 << 20), 512, 0x33);
  std::fill_n(m.bytes.begin() + (2047 << 10), 2 << 10, 0x44);
  m.Zero(16 << 10, 8 << 10);
  // QEMU stores a compressed cluster unencrypted: read as it is.
  std::fill_n(m.bytes.begin() + (3 << 20), 64 << 10, 0x55);
  auto img = OpenRw(path, /*rw=*/false);
  ASSERT_NE(img, nullptr);
  EXPECT_TRUE(ReadAll(img.get()) == m.bytes);
  EXPECT_TRUE(ReadAllQueued(img.get()) == m.bytes);
}

TEST(LuksIoTest, QemuWritesWeRead) {
  SKIP_WITHOUT_QEMU();
  // qemu-img measures PBKDF2 for a second or more per create: by default
  // qemu-io writes into images we create with fixed counts (luks_test.cc
  // unlocks images qemu-img created); with QCOW2_LONG_TESTS=1 qemu-img
  // creates one of every combination too.
  for (const Combo& c : Combos()) QemuWritesWeRead(c, /*qemu_creates=*/false);
  if (!LongTests()) return;
  for (const Combo& c : AllCombos()) QemuWritesWeRead(c, /*qemu_creates=*/true);
}

// ---- we write, qemu reads --------------------------------------------------

void WeWriteQemuReads(const Combo& c) {
  SCOPED_TRACE(ComboName(c));
  TempDir dir;
  const std::string path = dir.File("ours.qcow2");
  const std::string raw = dir.File("ref.raw");
  ASSERT_TRUE(CreateImage(path, OurCreate(c)).ok());
  Model m;
  {
    auto img = OpenRw(path);
    ASSERT_NE(img, nullptr);
    auto w = [&](uint64_t off, size_t len, uint8_t seed) {
      std::vector<uint8_t> d = Pattern(len, seed);
      ASSERT_TRUE(img->Write(off, d).ok());
      m.Put(off, d);
    };
    w(0, 2 * kCluster, 1);                 // allocating, whole clusters
    w(3 * kCluster + 1024, 4096, 2);       // partial: copy-on-write of zeros
    w(3 * kCluster + 8192, 512, 3);        // into the same cluster again
    w(kCluster / 2, 1536, 4);              // rewrite in place
    w(1 << 20, 3 * kCluster + 512, 5);     // unaligned to clusters
    ASSERT_TRUE(img->WriteZeroes(kCluster + 4096, 8192).ok());
    m.Zero(kCluster + 4096, 8192);
    ASSERT_TRUE(img->Discard(1 << 20, kCluster).ok());
    m.Zero(1 << 20, kCluster);
    ASSERT_TRUE(img->WriteZeroes(2 << 20, 2 * kCluster, /*unmap=*/true).ok());
    // Through a queue (io_uring): writes and a read back.
    QueueOptions qo;
    qo.depth = 4;
    auto q = img->CreateQueue(qo);
    ASSERT_TRUE(q.ok()) << q.status();
    std::vector<std::vector<uint8_t>> bufs;
    for (int i = 0; i < 6; ++i) {
      bufs.push_back(Pattern(8192, static_cast<uint8_t>(40 + i)));
    }
    int failed = 0;
    for (int i = 0; i < 6; ++i) {
      const uint64_t off = (3 << 20) + i * 20480;
      m.Put(off, bufs[i]);
      while ((*q)->in_flight() >= 4) (*q)->Poll(1);
      ASSERT_TRUE((*q)->SubmitWrite(off, bufs[i], [&](absl::Status s) {
                        failed += !s.ok();
                      }).ok());
    }
    while ((*q)->in_flight() > 0) (*q)->Poll(1);
    EXPECT_EQ(failed, 0);
    q->reset();
    EXPECT_TRUE(ReadAll(img.get()) == m.bytes);
    EXPECT_TRUE(ReadAllQueued(img.get()) == m.bytes);
    ASSERT_TRUE(img->Close().ok());
  }
  ASSERT_NO_FATAL_FAILURE(WriteRaw(raw, m));
  ExpectQemuCheckClean(path);
  ExpectQemuCompareEqual(path, raw);
  // qemu-io reads a few spans with the pattern it should find.
  CommandResult r = QemuIo(path, {"read -P 0 1m 64k", "read -P 0 2m 128k"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("Pattern verification failed")));
}

TEST(LuksIoTest, WeWriteQemuReads) {
  SKIP_WITHOUT_QEMU();
  for (const Combo& c : Combos()) WeWriteQemuReads(c);
}

// ---- backing files -------------------------------------------------------

// An encrypted overlay of ours over a plain qcow2 backing (qemu-io filled):
// partial writes copy the backing's bytes into our clusters, encrypted at
// their new host offsets.
TEST(LuksIoTest, EncryptedOverlayOverPlainBacking) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  const std::string top = dir.File("top.qcow2");
  const std::string raw = dir.File("ref.raw");
  ASSERT_EQ(Qemu({"qemu-img", "create", "-q", "-f", "qcow2", base,
                  absl::StrCat(kSize)}).exit_code, 0);
  ASSERT_EQ(Qemu({"qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 4m", base})
                .exit_code, 0);
  CreateOptions co = OurCreate(QuickCombos()[0]);
  co.backing_file = "base.qcow2";
  co.backing_format = "qcow2";
  ASSERT_TRUE(CreateImage(top, co).ok());
  Model m;
  m.bytes.assign(kSize, 0x5a);
  {
    auto img = OpenRw(top);
    ASSERT_NE(img, nullptr);
    std::vector<uint8_t> d = Pattern(4096, 9);
    ASSERT_TRUE(img->Write(kCluster + 512, d).ok());
    m.Put(kCluster + 512, d);
    ASSERT_TRUE(img->Write(5 * kCluster - 1024, d).ok());  // two clusters
    m.Put(5 * kCluster - 1024, d);
    ASSERT_TRUE(img->WriteZeroes(8 * kCluster + 512, 1024).ok());
    m.Zero(8 * kCluster + 512, 1024);
    EXPECT_TRUE(ReadAll(img.get()) == m.bytes);
    ASSERT_TRUE(img->Close().ok());
  }
  ASSERT_NO_FATAL_FAILURE(WriteRaw(raw, m));
  ExpectQemuCheckClean(top);
  ExpectQemuCompareEqual(top, raw);
}

// qemu-img makes an encrypted base and an encrypted overlay (the same
// secret) and qemu-io writes both; we read the chain, then write the top
// with copy-on-write from the encrypted base, and QEMU agrees.
TEST(LuksIoTest, EncryptedOverlayOverEncryptedBacking) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  const std::string top = dir.File("top.qcow2");
  const std::string raw = dir.File("ref.raw");
  const Combo c = QuickCombos()[0];
  ASSERT_TRUE(CreateImage(base, OurCreate(QuickCombos()[1])).ok());
  ASSERT_EQ(QemuIo(base, {"write -P 0x61 0 4m"}).exit_code, 0);
  CreateOptions co = OurCreate(c);
  co.backing_file = "base.qcow2";
  co.backing_format = "qcow2";
  ASSERT_TRUE(CreateImage(top, co).ok());
  // qemu-io opens the chain with the secret for both (backing.encrypt.*).
  std::vector<std::string> argv = {"qemu-io"};
  for (auto& a : Secret()) argv.push_back(a);
  argv.push_back("--image-opts");
  argv.push_back(Opts(top) + ",backing.encrypt.key-secret=s0");
  argv.push_back("-c");
  argv.push_back("write -P 0x62 64k 1k");
  CommandResult r = ::qcow2::testing::Run(argv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Model m;
  m.bytes.assign(kSize, 0x61);
  std::fill_n(m.bytes.begin() + kCluster, 1024, 0x62);
  {
    auto img = OpenRw(top);
    ASSERT_NE(img, nullptr);
    EXPECT_TRUE(ReadAll(img.get()) == m.bytes);
    std::vector<uint8_t> d = Pattern(2048, 17);
    ASSERT_TRUE(img->Write(7 * kCluster + 4096, d).ok());
    m.Put(7 * kCluster + 4096, d);
    EXPECT_TRUE(ReadAllQueued(img.get()) == m.bytes);
    ASSERT_TRUE(img->Close().ok());
  }
  ASSERT_NO_FATAL_FAILURE(WriteRaw(raw, m));
  argv = {"qemu-img", "compare"};
  for (auto& a : Secret()) argv.push_back(a);
  argv.push_back("--image-opts");
  argv.push_back(Opts(top) + ",backing.encrypt.key-secret=s0");
  argv.push_back(absl::StrCat("driver=raw,file.filename=", raw));
  r = ::qcow2::testing::Run(argv);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  ExpectQemuCheckClean(top, ",backing.encrypt.key-secret=s0");
}

// ---- qcowtool ---------------------------------------------------------------

std::string FileSha(const std::string& path) {
  absl::StatusOr<std::vector<uint8_t>> bytes = ReadFileBytes(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? Sha256Hex(*bytes) : "";
}

// An encrypted image (QuickCombos()[0]) whose first cluster holds data.
void CreateWithOneCluster(const std::string& path) {
  ASSERT_TRUE(CreateImage(path, OurCreate(QuickCombos()[0])).ok());
  auto img = OpenRw(path);
  ASSERT_NE(img, nullptr);
  ASSERT_TRUE(img->Write(0, Pattern(kCluster, 3)).ok());
  ASSERT_TRUE(img->Close().ok());
}

CommandResult Tool(std::vector<std::string> args) {
  args.insert(args.begin(), ::qcow2::testing::QcowtoolPath());
  return ::qcow2::testing::Run(args);
}

// qcowtool takes secrets as qemu-img does: create with -o encrypt.* and
// --object, then map, compare and convert with --image-opts; qemu-img and
// qemu-io agree on what they see.
TEST(LuksIoTest, CliSecretsAsQemuImgTakesThem) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string enc = dir.File("enc.qcow2");
  const std::string plain = dir.File("plain.qcow2");
  const std::string obj = absl::StrCat("secret,id=s0,data=", kPass);
  CommandResult r;
  if (LongTests()) {
    // create -o encrypt.* measures PBKDF2 (a second or more), as qemu-img.
    r = Tool({"create", "-q", "-f", "qcow2", "--object", obj, "-o",
              "encrypt.format=luks,encrypt.key-secret=s0,"
              "encrypt.cipher-alg=aes-128,encrypt.iter-time=10",
              enc, "4M"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  } else {
    ASSERT_TRUE(CreateImage(enc, OurCreate(QuickCombos()[1])).ok());
  }
  ASSERT_EQ(QemuIo(enc, {"write -P 0x71 0 96k", "write -P 0x72 1m 4k"}).exit_code, 0);
  // map: the same JSON as qemu-img's (no host offsets for encrypted data).
  std::vector<std::string> qmap = {"qemu-img", "map", "--output=json",
                                   "--object", obj, "--image-opts", Opts(enc)};
  CommandResult want = ::qcow2::testing::Run(qmap);
  ASSERT_EQ(want.exit_code, 0) << want.err;
  r = Tool({"map", "--output=json", "--object", obj, "--image-opts", Opts(enc)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, want.out);
  // convert to a plain image; compare says identical, so does qemu-img.
  r = Tool({"convert", "-O", "qcow2", "--object", obj, "--image-opts", Opts(enc),
            plain});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Tool({"compare", "--object", obj, "--image-opts", Opts(enc),
            absl::StrCat("driver=qcow2,file.filename=", plain)});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<std::string> qcmp = {"qemu-img", "compare", "--object", obj,
                                   "--image-opts", Opts(enc),
                                   absl::StrCat("driver=qcow2,file.filename=", plain)};
  EXPECT_EQ(::qcow2::testing::Run(qcmp).exit_code, 0);
  ExpectQemuCheckClean(enc);
  // check: the LUKS area is referenced (no leak), as qemu-img counts it.
  r = Tool({"check", "--object", obj, "--image-opts", Opts(enc)});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("No errors were found"));
  // An unknown secret id, and no secret at all: qemu-img's words.
  r = Tool({"map", "--object", obj, "--image-opts",
            absl::StrCat("driver=qcow2,file.filename=", enc, ",encrypt.key-secret=s9")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("No secret with id 's9'"));
  r = Tool({"map", enc});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("key secret is needed"));
  r = Tool({"map", "--object", "secret,id=s1", enc});
  EXPECT_THAT(r.err, HasSubstr("Either 'file' or 'data' must be provided"));
}

// qcowtool info shows an encrypted image as qemu-img info does, without
// its secret (the LUKS header's fields, "encrypted"), byte for byte in
// human and JSON output, alone and in a backing chain: on an image
// qemu-img made and on images we made (essiv and a non-default hash too).
TEST(LuksIoTest, InfoWithoutSecretAsQemuImg) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  std::vector<std::string> images;
  const std::string theirs = dir.File("theirs.qcow2");
  std::vector<std::string> argv = EncryptCreateArgs(QuickCombos()[0]);
  argv.push_back(theirs);
  argv.push_back("1M");
  CommandResult r = testing::RetryQemuKeyTiming([&] { return Qemu(argv); });
  ASSERT_EQ(r.exit_code, 0) << r.err;
  images.push_back(theirs);
  for (int i : {1, 3}) {
    const std::string ours = dir.File(absl::StrCat("ours", i, ".qcow2"));
    ASSERT_TRUE(CreateImage(ours, OurCreate(QuickCombos()[i])).ok());
    images.push_back(ours);
  }
  // A plain overlay over an encrypted image, and an encrypted one (ours)
  // over that.
  const std::string mid = dir.File("mid.qcow2");
  ASSERT_EQ(Qemu({"qemu-img", "create", "-q", "-f", "qcow2", "-b", theirs,
                  "-F", "qcow2", mid}).exit_code, 0);
  const std::string top = dir.File("top.qcow2");
  CreateOptions co = OurCreate(QuickCombos()[0]);
  co.backing_file = mid;
  co.backing_format = "qcow2";
  ASSERT_TRUE(CreateImage(top, co).ok());
  images.push_back(top);
  const std::string before = FileSha(theirs);
  for (const std::string& img : images) {
    for (const char* output : {"--output=human", "--output=json"}) {
      for (bool chain : {false, true}) {
        if (chain && img != top) continue;
        SCOPED_TRACE(absl::StrCat(img, " ", output, chain ? " chain" : ""));
        std::vector<std::string> args = {"info", output};
        if (chain) args.push_back("--backing-chain");
        args.push_back(img);
        std::vector<std::string> q = args;
        q.insert(q.begin(), "qemu-img");
        CommandResult want = Qemu(q);
        ASSERT_EQ(want.exit_code, 0) << want.err;
        r = Tool(args);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.out, want.out);
        EXPECT_THAT(r.out, HasSubstr("ivgen"));
      }
    }
  }
  // With the secret (--image-opts): what qemu-img prints, its json:
  // name of the image included (tests/cli_luks_secrets_test.cc).
  const std::vector<std::string> with = {
      "info", "--object", absl::StrCat("secret,id=s0,data=", kPass),
      "--image-opts", Opts(theirs)};
  r = Tool(with);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> q = with;
  q.insert(q.begin(), "qemu-img");
  EXPECT_EQ(r.out, Qemu(q).out);
  EXPECT_EQ(FileSha(theirs), before);
}

// OpenOptions::metadata_only opens an encrypted image without its secret
// and then refuses its data: reads fail (synchronous and queued) with the
// buffer zeroed, never ciphertext; read-write is refused at open.
TEST(LuksIoTest, MetadataOnlyOpenRefusesData) {
  TempDir dir;
  const std::string path = dir.File("e.qcow2");
  ASSERT_NO_FATAL_FAILURE(CreateWithOneCluster(path));
  const std::string before = FileSha(path);
  OpenOptions o;
  o.metadata_only = true;
  o.read_write = true;
  auto rw = Image::Open(path, o);
  ASSERT_FALSE(rw.ok());
  EXPECT_EQ(rw.status().code(), absl::StatusCode::kInvalidArgument);
  o.read_write = false;
  auto img = Image::Open(path, o);
  ASSERT_TRUE(img.ok()) << img.status();
  std::vector<LayerInfo> info = (*img)->GetChainInfo();
  ASSERT_TRUE(info[0].encrypted);
  ASSERT_TRUE(info[0].encryption.has_value());
  EXPECT_EQ(info[0].encryption->cipher_alg, "aes-256");
  EXPECT_EQ(info[0].encryption->cipher_mode, "xts");
  EXPECT_EQ(info[0].encryption->ivgen_alg, "plain64");
  ASSERT_EQ(info[0].encryption->slots.size(), 8u);
  EXPECT_TRUE(info[0].encryption->slots[0].active);
  EXPECT_EQ(info[0].encryption->slots[0].iterations, 1000u);
  std::vector<uint8_t> buf(kCluster, 0xEE);
  absl::Status rs = (*img)->Read(0, absl::MakeSpan(buf));
  EXPECT_EQ(rs.code(), absl::StatusCode::kFailedPrecondition) << rs;
  EXPECT_THAT(std::string(rs.message()), HasSubstr("metadata only"));
  EXPECT_TRUE(buf == std::vector<uint8_t>(kCluster, 0) ||
              buf == std::vector<uint8_t>(kCluster, 0xEE));
  buf.assign(kCluster, 0xEE);
  QueueOptions qo;
  auto q = (*img)->CreateQueue(qo);
  ASSERT_TRUE(q.ok()) << q.status();
  absl::Status got = absl::OkStatus();
  bool done = false;
  absl::Status s = (*q)->SubmitRead(0, absl::MakeSpan(buf),
                                    [&](absl::Status st) {
                                      got = st;
                                      done = true;
                                    });
  if (s.ok()) {
    while (!done) (*q)->Poll(1);
    s = got;
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(buf == std::vector<uint8_t>(kCluster, 0) ||
              buf == std::vector<uint8_t>(kCluster, 0xEE));
  q->reset();
  img->reset();
  EXPECT_EQ(FileSha(path), before);
}

// ---- refusals --------------------------------------------------------------

TEST(LuksIoTest, MissingOrWrongSecretLeavesTheFileAlone) {
  TempDir dir;
  const std::string path = dir.File("e.qcow2");
  ASSERT_NO_FATAL_FAILURE(CreateWithOneCluster(path));
  const std::string before = FileSha(path);
  for (const std::string& secret : {std::string(), std::string("wrong")}) {
    OpenOptions o;
    o.read_write = true;
    o.key_secret = secret;
    auto img = Image::Open(path, o);
    ASSERT_FALSE(img.ok());
    EXPECT_EQ(img.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(std::string(img.status().message()),
                HasSubstr(secret.empty() ? "key secret is needed"
                                         : "Invalid password"));
    EXPECT_THAT(std::string(img.status().message()), HasSubstr(path));
    EXPECT_THAT(std::string(img.status().message()),
                ::testing::Not(HasSubstr("wrong")));
  }
  EXPECT_EQ(FileSha(path), before);
}

TEST(LuksIoTest, UnalignedAndCompressedRequestsRefused) {
  TempDir dir;
  const std::string path = dir.File("e.qcow2");
  ASSERT_TRUE(CreateImage(path, OurCreate(QuickCombos()[0])).ok());
  auto img = OpenRw(path);
  ASSERT_NE(img, nullptr);
  std::vector<uint8_t> d(1000, 1);
  absl::Status s = img->Write(0, d);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("512-byte sectors"));
  s = img->Read(100, absl::MakeSpan(d).first(512));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  std::vector<uint8_t> c(kCluster, 7);
  s = img->WriteCompressed(0, c);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("encrypt"));
  // Nothing of it reached the disk.
  std::vector<uint8_t> got(kCluster, 1);
  ASSERT_TRUE(img->Read(0, absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, std::vector<uint8_t>(kCluster, 0));
}

TEST(LuksIoTest, CreateRefusesWhatQemuRefuses) {
  TempDir dir;
  CreateOptions o = OurCreate(QuickCombos()[0]);
  o.encrypt.key_secret.clear();
  absl::Status s = CreateImage(dir.File("a.qcow2"), o);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("Parameter 'encrypt.key-secret' is required for cipher"));
  o = OurCreate(QuickCombos()[0]);
  o.encrypt.format = "aes";
  EXPECT_FALSE(CreateImage(dir.File("b.qcow2"), o).ok());
  o = OurCreate(QuickCombos()[0]);
  o.encrypt.cipher_alg = "aes-999";
  EXPECT_FALSE(CreateImage(dir.File("c.qcow2"), o).ok());
  EXPECT_FALSE(std::filesystem::exists(dir.File("c.qcow2")));
}

}  // namespace
}  // namespace qcow2
