// SPDX-License-Identifier: Apache-2.0
// LUKS in qcow2 (lib/crypto, lib/format/crypto_ext): the LUKS1 header
// codec and its validation, key-slot unlock and creation, the sector
// cipher for every cipher/mode/IV generator QEMU 7.2 creates, checked both
// ways against qemu-img and qemu-io.
//
// Speed: QEMU measures PBKDF2 for over half a second per count when it
// creates a LUKS image, so `qemu-img create -o encrypt.format=luks` costs
// seconds. The default run makes one such image; the combination matrix
// uses areas we create with fixed small iteration counts, attached to
// plain images from qemu-img. QCOW2_LONG_TESTS=1 adds the whole matrix
// through qemu-img create.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <nettle/nettle-meta.h>
#include <nettle/xts.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/endian.h"
#include "lib/crypto/luks_header.h"
#include "lib/crypto/luks_keys.h"
#include "lib/crypto/luks_volume.h"
#include "lib/crypto/sector_cipher.h"
#include "lib/format/crypto_ext.h"
#include "lib/format/header.h"
#include "tests/util/harden_sha256.h"
#include "tests/util/test_util.h"

namespace qcow2::internal {
namespace {

using ::qcow2::testing::CommandResult;
using ::qcow2::testing::ReadFileBytes;
using ::qcow2::testing::RetryQemuKeyTiming;
using ::qcow2::testing::Run;
using ::qcow2::testing::TempDir;
using ::qcow2::testing::WriteFileBytes;
using ::testing::HasSubstr;

constexpr char kPass[] = "PASS-w0rd";
constexpr uint64_t kCluster = 65536;

absl::Span<const uint8_t> Bytes(const char* s) {
  return {reinterpret_cast<const uint8_t*>(s), strlen(s)};
}

bool LongTests() {
  const char* v = getenv("QCOW2_LONG_TESTS");
  return v != nullptr && std::string(v) == "1";
}

LuksCreateOptions FastOptions(const std::string& alg, const std::string& mode,
                              const std::string& ivgen,
                              const std::string& ivhash = "",
                              const std::string& hash = "sha256") {
  LuksCreateOptions o;
  o.cipher_alg = alg;
  o.cipher_mode = mode;
  o.ivgen_alg = ivgen;
  o.ivgen_hash_alg = ivhash;
  o.hash_alg = hash;
  o.slot_iterations = 1000;
  o.digest_iterations = 1000;
  return o;
}

// ---- qemu helpers ----------------------------------------------------------

std::vector<std::string> SecretArgs() {
  return {"--object", absl::StrCat("secret,id=s0,data=", kPass)};
}

std::string ImageOpts(const std::string& path) {
  return absl::StrCat("driver=qcow2,file.filename=", path,
                      ",encrypt.key-secret=s0");
}

CommandResult QemuIo(const std::string& path, const std::string& cmd) {
  std::vector<std::string> argv = {"qemu-io"};
  for (auto& a : SecretArgs()) argv.push_back(a);
  for (const std::string& a :
       {std::string("--image-opts"), ImageOpts(path), std::string("-c"), cmd}) {
    argv.push_back(a);
  }
  return Run(argv);
}

CommandResult QemuCheckSecret(const std::string& path) {
  std::vector<std::string> argv = {"qemu-img", "check"};
  for (auto& a : SecretArgs()) argv.push_back(a);
  argv.push_back("--image-opts");
  argv.push_back(ImageOpts(path));
  return Run(argv);
}

// The image's header, crypto extension and LUKS area, through our code.
struct Parsed {
  Header header;
  CryptoExtension ext;
  std::vector<uint8_t> file;
  absl::Span<const uint8_t> area() const {
    return absl::MakeConstSpan(file).subspan(ext.offset, ext.length);
  }
};

void ParseImage(const std::string& path, Parsed* p) {
  ASSERT_OK_AND_ASSIGN(p->file, ReadFileBytes(path));
  ASSERT_OK_AND_ASSIGN(
      p->header, DecodeHeader(absl::MakeConstSpan(p->file).first(kCluster), path));
  ASSERT_OK_AND_ASSIGN(auto ext,
                       DecodeCryptoExtension(p->header, p->file.size(), path));
  ASSERT_TRUE(ext.has_value());
  p->ext = *ext;
}

// The host offset of guest offset `guest` (cluster aligned, allocated),
// from the L1 and L2 tables.
uint64_t HostOffset(const Parsed& p, uint64_t guest) {
  constexpr uint64_t kMask = 0x00fffffffffffe00ull;
  const uint64_t entries = p.header.l2_entries();
  const uint64_t cl = guest / kCluster;
  uint64_t l1e = LoadBE64(&p.file[p.header.l1_table_offset + 8 * (cl / entries)]);
  uint64_t l2 = l1e & kMask;
  if (l2 == 0) return 0;
  return LoadBE64(&p.file[l2 + 8 * (cl % entries)]) & kMask;
}

// Makes `path` a LUKS-encrypted image with our area: a plain qcow2 from
// qemu-img, the area appended in fresh clusters (refcounted), crypt_method
// 2 and the crypto extension in the header. What the driver's create will
// do; here only to hand qemu-io images whose LUKS layer is ours.
void MakeImageWithArea(const std::string& path, const LuksArea& area) {
  CommandResult r = Run({"qemu-img", "create", "-q", "-f", "qcow2", path, "1M"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> file, ReadFileBytes(path));
  ASSERT_OK_AND_ASSIGN(Header h,
                       DecodeHeader(absl::MakeConstSpan(file).first(kCluster), path));
  ASSERT_EQ(h.refcount_order, 4u);
  const uint64_t refblock = LoadBE64(&file[h.refcount_table_offset]);
  ASSERT_NE(refblock, 0u);
  CryptoExtension ext;
  ext.offset = (file.size() + kCluster - 1) / kCluster * kCluster;
  ext.length = area.bytes.size();
  file.resize(ext.offset + ext.clusters(kCluster) * kCluster, 0);
  std::copy(area.bytes.begin(), area.bytes.end(), file.begin() + ext.offset);
  for (uint64_t c = 0; c < ext.clusters(kCluster); ++c) {
    StoreBE16(&file[refblock + 2 * (ext.offset / kCluster + c)], 1);
  }
  h.crypt_method = kCryptLuks;
  h.other_extensions.push_back(EncodeCryptoExtension(ext));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> hdr, EncodeHeader(h));
  std::fill(file.begin(), file.begin() + kCluster, 0);
  std::copy(hdr.begin(), hdr.end(), file.begin());
  ASSERT_OK(WriteFileBytes(path, file));
}

// ---- unit: codec, unlock, malformed ---------------------------------------

TEST(LuksTest, CreateParseUnlock) {
  ASSERT_OK_AND_ASSIGN(LuksArea a,
                       CreateLuks(FastOptions("aes-256", "xts", "plain64"),
                                  Bytes(kPass)));
  // QEMU's layout for a 64-byte key: 500 material sectors rounded to 504.
  EXPECT_EQ(a.header.slots[0].key_offset, 8u);
  EXPECT_EQ(a.header.slots[1].key_offset, 8u + 504);
  EXPECT_EQ(a.header.payload_offset, 8u + 8 * 504);
  EXPECT_EQ(a.bytes.size(), 4040u * 512);
  ASSERT_OK_AND_ASSIGN(LuksHeader h, DecodeLuksHeader(a.bytes, "t"));
  EXPECT_EQ(h.cipher_name, "aes");
  EXPECT_EQ(h.cipher_mode, "xts-plain64");
  EXPECT_EQ(h.hash_spec, "sha256");
  EXPECT_EQ(h.key_bytes, 64u);
  EXPECT_EQ(h.uuid.size(), 36u);
  ASSERT_OK_AND_ASSIGN(SecureBuffer key, UnlockLuks(h, a.bytes, Bytes(kPass), "t"));
  EXPECT_TRUE(std::equal(key.data(), key.data() + key.size(), a.master_key.data()));
}

// Iterations measured as QEMU measures them (thread CPU time of PBKDF2 on
// the real inputs, at least half a second per count): never below
// QEMU's floor of 1000, and the slot opens with them. Seconds of CPU, as
// in qemu-img: behind QCOW2_LONG_TESTS.
TEST(LuksTest, MeasuredIterations) {
  if (!LongTests()) GTEST_SKIP() << "QCOW2_LONG_TESTS=1 measures PBKDF2";
  LuksCreateOptions o = FastOptions("aes-128", "xts", "plain64");
  o.slot_iterations = o.digest_iterations = 0;
  o.iter_time_ms = 10;
  ASSERT_OK_AND_ASSIGN(LuksArea a, CreateLuks(o, Bytes(kPass)));
  EXPECT_GE(a.header.slots[0].iterations, 1000u);
  EXPECT_GE(a.header.mk_digest_iterations, 1000u);
  ASSERT_OK_AND_ASSIGN(LuksHeader h, DecodeLuksHeader(a.bytes, "t"));
  EXPECT_OK(UnlockLuks(h, a.bytes, Bytes(kPass), "t").status());
}

TEST(LuksTest, WrongPassphraseIsAClearError) {
  ASSERT_OK_AND_ASSIGN(LuksArea a,
                       CreateLuks(FastOptions("aes-128", "cbc", "essiv"),
                                  Bytes(kPass)));
  ASSERT_OK_AND_ASSIGN(LuksHeader h, DecodeLuksHeader(a.bytes, "img"));
  auto key = UnlockLuks(h, a.bytes, Bytes("wrong"), "img");
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(key.status().message()),
              HasSubstr("img: Invalid password, cannot unlock any keyslot "
                        "(LUKS key slots tried: 0)"));
  EXPECT_THAT(std::string(key.status().message()),
              ::testing::Not(HasSubstr("wrong")));
}

TEST(LuksTest, SectorCipherRoundTripsAndDependsOnSector) {
  for (const char* mode : {"ecb", "cbc", "xts", "ctr"}) {
    SCOPED_TRACE(mode);
    ASSERT_OK_AND_ASSIGN(CipherSpec spec,
                         CipherSpecFromOptions(FastOptions("twofish-256", mode, "plain64")));
    std::vector<uint8_t> key(spec.key_len(), 7);
    ASSERT_OK_AND_ASSIGN(auto c, SectorCipher::Create(spec, key));
    std::vector<uint8_t> plain(2048, 0xab), a = plain, b = plain;
    ASSERT_OK(c->Encrypt(10, absl::MakeSpan(a)));
    ASSERT_OK(c->Encrypt(11, absl::MakeSpan(b)));
    EXPECT_NE(a, plain);
    // Sector 11 of `a` is sector 11 of `b`'s first: same bytes.
    EXPECT_TRUE(std::equal(a.begin() + 512, a.begin() + 1024, b.begin()));
    if (std::string(mode) != "ecb") {
      EXPECT_FALSE(std::equal(a.begin(), a.begin() + 512, b.begin()));
    }
    ASSERT_OK(c->Decrypt(10, absl::MakeSpan(a)));
    EXPECT_EQ(a, plain);
  }
}

// SectorCipher's XTS masks a whole sector and runs the data cipher once
// over it: every XTS cipher must give nettle's own xts_encrypt_message's
// bytes, sector by sector with the plain64 IV, and decrypt back, for
// random keys, sectors and data (the tweak's doubling carries out of
// both halves), whole sectors and a short whole-block tail (key material).
TEST(LuksTest, XtsMatchesNettlesXts) {
  std::mt19937_64 rng(2026);
  int ciphers = 0;
  for (const char* cipher :
       {"aes-128", "aes-256", "serpent-128", "serpent-256", "twofish-128",
        "twofish-256"}) {
    SCOPED_TRACE(cipher);
    ASSERT_OK_AND_ASSIGN(
        CipherSpec spec,
        CipherSpecFromOptions(FastOptions(cipher, "xts", "plain64")));
    ++ciphers;
    for (int round = 0; round < 4; ++round) {
      std::vector<uint8_t> key(spec.key_len());
      for (uint8_t& k : key) k = static_cast<uint8_t>(rng());
      ASSERT_OK_AND_ASSIGN(auto c, SectorCipher::Create(spec, key));
      const uint64_t first = round == 0 ? 0 : rng() >> (round * 8);
      std::vector<uint8_t> plain(3 * 512 + (round == 3 ? 80 : 0));
      for (uint8_t& b : plain) b = static_cast<uint8_t>(rng());
      // The reference: nettle's XTS with the two key halves.
      const nettle_cipher* nc = spec.cipher->impl;
      std::vector<uint8_t> ctx(nc->context_size), tctx(nc->context_size);
      nc->set_encrypt_key(ctx.data(), key.data());
      nc->set_encrypt_key(tctx.data(), key.data() + key.size() / 2);
      std::vector<uint8_t> want = plain;
      for (size_t pos = 0; pos < want.size(); pos += 512) {
        uint8_t iv[16] = {};
        const uint64_t sector = first + pos / 512;
        for (int i = 0; i < 8; ++i) iv[i] = static_cast<uint8_t>(sector >> (8 * i));
        const size_t n = std::min<size_t>(512, want.size() - pos);
        xts_encrypt_message(ctx.data(), tctx.data(), nc->encrypt, iv, n,
                            want.data() + pos, want.data() + pos);
      }
      std::vector<uint8_t> got = plain;
      ASSERT_OK(c->Encrypt(first, absl::MakeSpan(got)));
      ASSERT_TRUE(got == want) << "sector " << first;
      ASSERT_OK(c->Decrypt(first, absl::MakeSpan(got)));
      ASSERT_TRUE(got == plain) << "sector " << first;
    }
  }
  EXPECT_EQ(ciphers, 6);
}

TEST(LuksTest, OptionsQemuRefuses) {
  auto bad = [](LuksCreateOptions o, const char* what) {
    auto s = CipherSpecFromOptions(o);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(what));
  };
  bad(FastOptions("cast5-128", "xts", "plain64"), "16-byte block");
  bad(FastOptions("aes-128", "cbc", "essiv", "sha1"), "20-byte key");
  bad(FastOptions("cast5-128", "cbc", "essiv", "sha256"), "32-byte key");
  bad(FastOptions("aes-192", "cbc", "plain64"), "QEMU 7.2 cannot");
  bad(FastOptions("aes-257", "cbc", "plain64"), "unknown encrypt.cipher-alg");
  bad(FastOptions("aes-128", "gcm", "plain64"), "unknown cipher mode");
  EXPECT_OK(CipherSpecFromOptions(FastOptions("aes-192", "xts", "plain64")).status());
  EXPECT_OK(CipherSpecFromOptions(FastOptions("cast5-128", "cbc", "essiv", "md5")).status());
}

struct BadLuks {
  const char* name;
  std::function<void(std::vector<uint8_t>&)> patch;
  absl::StatusCode code;
  const char* message;
};

TEST(LuksTest, MalformedHeaders) {
  ASSERT_OK_AND_ASSIGN(LuksArea a,
                       CreateLuks(FastOptions("aes-256", "xts", "plain64"),
                                  Bytes(kPass)));
  const size_t slot0 = 208, slot1 = 208 + 48;
  const std::vector<BadLuks> cases = {
      {"magic", [](auto& b) { b[0] = 'X'; }, absl::StatusCode::kDataLoss, "bad magic"},
      {"version", [](auto& b) { StoreBE16(&b[6], 2); }, absl::StatusCode::kUnimplemented, "LUKS version 2"},
      {"cipher_name_unterminated", [](auto& b) { memset(&b[8], 'a', 32); },
       absl::StatusCode::kDataLoss, "cipher_name is not NUL-terminated"},
      {"cipher_unknown", [](auto& b) { memcpy(&b[8], "blowfish", 9); },
       absl::StatusCode::kUnimplemented, "cipher 'blowfish'"},
      {"mode_no_ivgen", [](auto& b) { memset(&b[40], 0, 32); memcpy(&b[40], "xts", 3); },
       absl::StatusCode::kDataLoss, "is not MODE-IVGEN"},
      {"hash_unknown", [](auto& b) { memcpy(&b[72], "sha3", 5); },
       absl::StatusCode::kUnimplemented, "hash_spec 'sha3'"},
      {"key_bytes_0", [](auto& b) { StoreBE32(&b[108], 0); },
       absl::StatusCode::kDataLoss, "key_bytes 0"},
      {"key_bytes_huge", [](auto& b) { StoreBE32(&b[108], 0xfffffffe); },
       absl::StatusCode::kUnimplemented, "key_bytes 4294967294"},
      {"digest_iterations_0", [](auto& b) { StoreBE32(&b[164], 0); },
       absl::StatusCode::kDataLoss, "master key digest iterations is 0"},
      {"slot_active_junk", [=](auto& b) { StoreBE32(&b[slot1], 0x1234); },
       absl::StatusCode::kDataLoss, "key slot 1 active flag"},
      {"slot_iterations_0", [=](auto& b) { StoreBE32(&b[slot0 + 4], 0); },
       absl::StatusCode::kDataLoss, "key slot 0 iterations is 0"},
      {"stripes_0", [=](auto& b) { StoreBE32(&b[slot0 + 44], 0); },
       absl::StatusCode::kDataLoss, "key slot 0 stripes 0"},
      {"stripes_huge", [=](auto& b) { StoreBE32(&b[slot0 + 44], 0xffffffff); },
       absl::StatusCode::kDataLoss, "key slot 0 stripes 4294967295"},
      {"slot_in_header", [=](auto& b) { StoreBE32(&b[slot0 + 40], 1); },
       absl::StatusCode::kDataLoss, "overlaps the LUKS header"},
      {"slot_past_payload", [=](auto& b) { StoreBE32(&b[slot0 + 40], 4000); },
       absl::StatusCode::kDataLoss, "overlaps the payload"},
      {"slots_overlap", [=](auto& b) { StoreBE32(&b[slot1 + 40], 100); },
       absl::StatusCode::kDataLoss, "key slots 0 and 1 overlap"},
      {"slot_past_area", [=](auto& b) {
         StoreBE32(&b[104], 0);  // no payload bound
         StoreBE32(&b[slot0 + 40], 0x7fffffff);
       },
       absl::StatusCode::kDataLoss, "past the encryption area"},
  };
  for (const BadLuks& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<uint8_t> b = a.bytes;
    c.patch(b);
    auto h = DecodeLuksHeader(b, "img");
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), c.code) << h.status();
    EXPECT_THAT(std::string(h.status().message()), HasSubstr(c.message));
  }
  EXPECT_FALSE(DecodeLuksHeader(absl::MakeConstSpan(a.bytes).first(591), "img").ok());
}

TEST(LuksTest, MalformedCryptoExtension) {
  Header h;
  h.cluster_bits = 16;
  h.crypt_method = kCryptLuks;
  h.refcount_table_offset = kCluster;
  h.refcount_table_clusters = 1;
  h.l1_table_offset = 3 * kCluster;
  h.l1_size = 1;
  const uint64_t file_size = 10 * kCluster;
  auto expect = [&](CryptoExtension e, const char* what) {
    Header c = h;
    c.other_extensions = {EncodeCryptoExtension(e)};
    auto r = DecodeCryptoExtension(c, file_size, "img");
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(what));
  };
  expect({4 * kCluster + 512, 4096}, "not a multiple of the cluster size");
  expect({4 * kCluster, 0}, "length 0 is out of range");
  expect({4 * kCluster, 1ull << 40}, "out of range");
  expect({9 * kCluster, 2 * kCluster}, "past the end of the file");
  expect({0, 4096}, "overlaps the header cluster");
  expect({kCluster, 4096}, "overlaps the refcount table");
  expect({2 * kCluster, kCluster + 1}, "overlaps the L1 table");
  Header c = h;
  c.other_extensions = {{kExtCrypto, std::vector<uint8_t>(8)}};
  EXPECT_THAT(std::string(DecodeCryptoExtension(c, file_size, "img").status().message()),
              HasSubstr("length 8 (must be 16)"));
  c.other_extensions.clear();
  EXPECT_THAT(std::string(DecodeCryptoExtension(c, file_size, "img").status().message()),
              HasSubstr("without the crypto header extension"));
  c.crypt_method = kCryptAes;
  c.other_extensions = {EncodeCryptoExtension({4 * kCluster, 4096})};
  EXPECT_THAT(std::string(DecodeCryptoExtension(c, file_size, "img").status().message()),
              HasSubstr("with crypt_method 1"));
  c.crypt_method = kCryptLuks;
  ASSERT_OK_AND_ASSIGN(auto ok, DecodeCryptoExtension(c, file_size, "img"));
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->offset, 4 * kCluster);
}

// ---- against QEMU ----------------------------------------------------------

struct Combo {
  std::string alg, mode, ivgen, ivhash = "", hash = "sha256";
};

std::string ComboName(const Combo& c) {
  return absl::StrCat(c.alg, "-", c.mode, "-", c.ivgen,
                      c.ivgen == "essiv" ? ":" + c.ivhash : "", "/", c.hash);
}

// Every combination qemu-img 7.2 creates (tried one by one): all ciphers
// in every mode except xts with cast5's 8-byte block and the 24-byte keys
// outside xts (QEMU aborts on them); plain, plain64 and essiv with md5 or
// sha256 (essiv needs a hash whose length is a key size of the family);
// any PBKDF2 hash.
std::vector<Combo> AllCombos() {
  std::vector<Combo> v;
  for (const char* alg : {"aes-128", "aes-192", "aes-256", "cast5-128",
                          "serpent-128", "serpent-192", "serpent-256",
                          "twofish-128", "twofish-192", "twofish-256"}) {
    for (const char* mode : {"ecb", "cbc", "xts", "ctr"}) {
      LuksCreateOptions o = FastOptions(alg, mode, "plain64");
      if (!CipherSpecFromOptions(o).ok()) continue;
      v.push_back({alg, mode, "plain64"});
    }
  }
  for (const char* alg : {"aes-128", "aes-256", "serpent-256", "twofish-128"}) {
    v.push_back({alg, "cbc", "plain"});
    v.push_back({alg, "xts", "essiv", "sha256"});
    v.push_back({alg, "cbc", "essiv", "md5"});
  }
  v.push_back({"cast5-128", "cbc", "essiv", "md5"});
  v.push_back({"cast5-128", "ctr", "plain"});
  for (const char* h : {"md5", "sha1", "sha224", "sha384", "sha512", "ripemd160"}) {
    v.push_back({"aes-256", "xts", "plain64", "", h});
  }
  return v;
}

// A spread for the default run: each family, each mode, each IV generator.
std::vector<Combo> QuickCombos() {
  return {{"aes-256", "xts", "plain64"},
          {"aes-128", "cbc", "essiv", "sha256"},
          {"aes-192", "xts", "plain64", "", "sha512"},
          {"cast5-128", "cbc", "essiv", "md5", "sha1"},
          {"serpent-128", "ctr", "plain"},
          {"twofish-256", "ecb", "plain64", "", "ripemd160"}};
}

LuksCreateOptions ComboOptions(const Combo& c) {
  return FastOptions(c.alg, c.mode, c.ivgen, c.ivhash, c.hash);
}

// Both ways on one image whose LUKS area is ours: qemu-io writes, we
// decrypt; we encrypt, qemu-io reads; qemu-img check is clean.
void CheckBothWays(const std::string& path) {
  CommandResult w = QemuIo(path, "write -P 0xab 0 64k");
  ASSERT_EQ(w.exit_code, 0) << w.err << w.out;
  w = QemuIo(path, "write -P 0 64k 64k");
  ASSERT_EQ(w.exit_code, 0) << w.err << w.out;
  Parsed p;
  ASSERT_NO_FATAL_FAILURE(ParseImage(path, &p));
  ASSERT_OK_AND_ASSIGN(auto volume,
                       LuksVolume::Open(p.area(), Bytes(kPass), path));

  // QEMU -> us: the IV sector is the host offset / 512.
  const uint64_t host0 = HostOffset(p, 0);
  ASSERT_NE(host0, 0u);
  std::vector<uint8_t> data(p.file.begin() + host0, p.file.begin() + host0 + kCluster);
  ASSERT_OK(volume->Decrypt(host0, absl::MakeSpan(data)));
  // Decrypting as if at another offset gives garbage (ECB has no IV).
  std::vector<uint8_t> elsewhere(p.file.begin() + host0, p.file.begin() + host0 + kCluster);
  ASSERT_OK(volume->Decrypt(host0 + kCluster, absl::MakeSpan(elsewhere)));
  if (volume->header().spec.mode != CipherMode::kEcb) {
    EXPECT_TRUE(elsewhere != std::vector<uint8_t>(kCluster, 0xab));
  }
  EXPECT_EQ(volume->Decrypt(host0 + 1, absl::MakeSpan(elsewhere)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(data, std::vector<uint8_t>(kCluster, 0xab));

  // us -> QEMU: encrypt 0xcd into the second cluster's host bytes.
  const uint64_t host1 = HostOffset(p, kCluster);
  ASSERT_NE(host1, 0u);
  std::vector<uint8_t> mine(kCluster, 0xcd);
  ASSERT_OK(volume->Encrypt(host1, absl::MakeSpan(mine)));
  std::copy(mine.begin(), mine.end(), p.file.begin() + host1);
  ASSERT_OK(WriteFileBytes(path, p.file));
  CommandResult r = QemuIo(path, "read -P 0xcd 64k 64k");
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("Pattern verification failed")));
  r = QemuIo(path, "read -P 0xab 0 64k");
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("Pattern verification failed")));
  CommandResult c = QemuCheckSecret(path);
  EXPECT_EQ(c.exit_code, 0) << c.out << c.err;
}

void RunOurAreaCombos(const std::vector<Combo>& combos) {
  TempDir dir;
  for (const Combo& c : combos) {
    SCOPED_TRACE(ComboName(c));
    ASSERT_OK_AND_ASSIGN(LuksArea a, CreateLuks(ComboOptions(c), Bytes(kPass)));
    const std::string path = dir.File("ours.qcow2");
    ASSERT_NO_FATAL_FAILURE(MakeImageWithArea(path, a));
    ASSERT_NO_FATAL_FAILURE(CheckBothWays(path));
  }
}

TEST(LuksQemuTest, OurAreasQuick) {
  SKIP_WITHOUT_QEMU();
  RunOurAreaCombos(QuickCombos());
}

TEST(LuksQemuTest, OurAreasAllCombos) {
  SKIP_WITHOUT_QEMU();
  if (!LongTests()) GTEST_SKIP() << "QCOW2_LONG_TESTS=1 runs every combination";
  RunOurAreaCombos(AllCombos());
}

// An image qemu-img made (its header, slot and iterations): parse, unlock,
// decrypt what qemu-io wrote, encrypt what qemu-io reads. A wrong secret
// fails clearly and leaves the file as it was.
void RunQemuCreated(const Combo& c, bool check_wrong_secret) {
  TempDir dir;
  const std::string path = dir.File("q.qcow2");
  std::vector<std::string> argv = {"qemu-img", "create", "-q"};
  for (auto& a : SecretArgs()) argv.push_back(a);
  std::string o = absl::StrCat(
      "encrypt.format=luks,encrypt.key-secret=s0,encrypt.cipher-alg=", c.alg,
      ",encrypt.cipher-mode=", c.mode, ",encrypt.ivgen-alg=", c.ivgen,
      c.ivhash.empty() ? "" : ",encrypt.ivgen-hash-alg=", c.ivhash,
      ",encrypt.hash-alg=", c.hash,
      ",encrypt.iter-time=10");
  for (auto a : {"-f", "qcow2", "-o", o.c_str(), path.c_str(), "1M"}) argv.push_back(a);
  CommandResult r = RetryQemuKeyTiming([&] { return Run(argv); });
  ASSERT_EQ(r.exit_code, 0) << r.err;
  if (check_wrong_secret) {
    ASSERT_OK_AND_ASSIGN(auto before, ReadFileBytes(path));
    Parsed p;
    ASSERT_NO_FATAL_FAILURE(ParseImage(path, &p));
    ASSERT_OK_AND_ASSIGN(LuksHeader h, DecodeLuksHeader(p.area(), path));
    EXPECT_GE(h.slots[0].iterations, 1000u);
    EXPECT_FALSE(h.slots[1].enabled());
    auto k = UnlockLuks(h, p.area(), Bytes("not-it"), path);
    EXPECT_EQ(k.status().code(), absl::StatusCode::kPermissionDenied);
    ASSERT_OK_AND_ASSIGN(auto after, ReadFileBytes(path));
    EXPECT_EQ(::qcow2::testing::Sha256Hex(before), ::qcow2::testing::Sha256Hex(after));
    // Our layout is QEMU's: same offsets and payload for this key size.
    ASSERT_OK_AND_ASSIGN(LuksArea mine, CreateLuks(ComboOptions(c), Bytes(kPass)));
    for (size_t i = 0; i < kLuksNumSlots; ++i) {
      EXPECT_EQ(mine.header.slots[i].key_offset, h.slots[i].key_offset) << i;
    }
    EXPECT_EQ(mine.header.payload_offset, h.payload_offset);
    EXPECT_EQ(uint64_t{h.payload_offset} * 512, p.ext.length);
    EXPECT_EQ(mine.header.cipher_mode, h.cipher_mode);
  }
  ASSERT_NO_FATAL_FAILURE(CheckBothWays(path));
}

TEST(LuksQemuTest, QemuCreatedDefault) {
  SKIP_WITHOUT_QEMU();
  RunQemuCreated({"aes-256", "xts", "plain64"}, true);
}

TEST(LuksQemuTest, QemuCreatedAllCombos) {
  SKIP_WITHOUT_QEMU();
  if (!LongTests()) GTEST_SKIP() << "QCOW2_LONG_TESTS=1 runs every combination";
  for (const Combo& c : AllCombos()) {
    SCOPED_TRACE(ComboName(c));
    RunQemuCreated(c, false);
  }
}

// Key slots added and erased by us, judged by qemu-io: a new secret opens
// the image, an erased one no longer does, the last slot is kept.
TEST(LuksQemuTest, AddAndEraseKeySlots) {
  SKIP_WITHOUT_QEMU();
  ASSERT_OK_AND_ASSIGN(LuksArea a,
                       CreateLuks(FastOptions("aes-256", "xts", "plain64"),
                                  Bytes(kPass)));
  LuksHeader& h = a.header;
  auto area = absl::MakeSpan(a.bytes);
  ASSERT_OK_AND_ASSIGN(size_t used, AddKeySlot(h, area, a.master_key.span(),
                                               Bytes("second"), std::nullopt, 0, 1000));
  EXPECT_EQ(used, 1u);
  EXPECT_EQ(AddKeySlot(h, area, a.master_key.span(), Bytes("x"), 1, 0, 1000)
                .status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_OK_AND_ASSIGN(used, AddKeySlot(h, area, a.master_key.span(),
                                        Bytes("third"), 5, 0, 1000));
  EXPECT_EQ(used, 5u);
  ASSERT_OK(EraseKeySlot(h, area, 0));

  TempDir dir;
  const std::string path = dir.File("slots.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeImageWithArea(path, a));
  auto open_with = [&](const char* secret) {
    return ::qcow2::testing::Run(
        {"qemu-io", "--object", absl::StrCat("secret,id=s0,data=", secret),
         "--image-opts", ImageOpts(path), "-c", "read 0 512"});
  };
  EXPECT_EQ(open_with("second").exit_code, 0) << open_with("second").err;
  EXPECT_EQ(open_with("third").exit_code, 0);
  CommandResult old = open_with(kPass);
  EXPECT_NE(old.exit_code, 0);
  EXPECT_THAT(old.err, HasSubstr("Invalid password"));
  // Ours agrees, slot by slot.
  Parsed p;
  ASSERT_NO_FATAL_FAILURE(ParseImage(path, &p));
  ASSERT_OK_AND_ASSIGN(LuksHeader back, DecodeLuksHeader(p.area(), path));
  auto wrong = UnlockLuks(back, p.area(), Bytes(kPass), "img");
  EXPECT_THAT(std::string(wrong.status().message()),
              HasSubstr("LUKS key slots tried: 1, 5"));
  EXPECT_OK(UnlockLuks(back, p.area(), Bytes("third"), "img").status());
  ASSERT_OK(EraseKeySlot(h, area, 1));
  EXPECT_EQ(EraseKeySlot(h, area, 5).code(), absl::StatusCode::kFailedPrecondition);
}

// Legacy AES-CBC (crypt_method 1): qemu-img 7.2 still creates it (its
// tools read and write it; its system emulators refuse to open it). We
// refuse it and say so.
TEST(LuksQemuTest, LegacyAesIsRefusedWithQemusStance) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string path = dir.File("aes.qcow2");
  std::vector<std::string> argv = {"qemu-img", "create", "-q"};
  for (auto& a : SecretArgs()) argv.push_back(a);
  for (auto a : {"-f", "qcow2", "-o", "encrypt.format=aes,encrypt.key-secret=s0",
                 path.c_str(), "1M"}) {
    argv.push_back(a);
  }
  CommandResult r = ::qcow2::testing::Run(argv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> file, ReadFileBytes(path));
  ASSERT_OK_AND_ASSIGN(Header h,
                       DecodeHeader(absl::MakeConstSpan(file).first(kCluster), path));
  EXPECT_EQ(h.crypt_method, kCryptAes);
  // No crypto header extension for AES.
  ASSERT_OK_AND_ASSIGN(auto ext, DecodeCryptoExtension(h, file.size(), path));
  EXPECT_FALSE(ext.has_value());
  absl::Status s = CheckFeatures(h, path);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), HasSubstr("legacy AES-CBC"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("system emulators refuse it"));
}

}  // namespace
}  // namespace qcow2::internal
