// SPDX-License-Identifier: Apache-2.0
#include "lib/crypto/sector_cipher.h"

#include <nettle/cbc.h>
#include <nettle/ctr.h>
#include <nettle/nettle-meta.h>
#include <nettle/xts.h>

#include <endian.h>
#include <string.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

namespace {

constexpr size_t kMaxBlock = 16;
constexpr size_t kXtsBlock = 16;

// The sector number as the IV generators lay it out: little-endian.
void StoreLE(uint8_t* p, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t LoadLE64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return le64toh(v);
}

void StoreLE64(uint8_t* p, uint64_t v) {
  v = htole64(v);
  std::memcpy(p, &v, 8);
}

void XorInto(uint8_t* dst, const uint8_t* src, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    uint64_t a, b;
    std::memcpy(&a, dst + i, 8);
    std::memcpy(&b, src + i, 8);
    a ^= b;
    std::memcpy(dst + i, &a, 8);
  }
}

SecureBuffer KeySchedule(const nettle_cipher* c, bool encrypt,
                         const uint8_t* key) {
  SecureBuffer ctx(c->context_size);
  (encrypt ? c->set_encrypt_key : c->set_decrypt_key)(ctx.data(), key);
  return ctx;
}

}  // namespace

size_t CipherSpec::key_len() const {
  return cipher->key_len * (mode == CipherMode::kXts ? 2 : 1);
}

std::string CipherSpec::LuksModeString() const {
  std::string s = absl::StrCat(CipherModeName(mode), "-", IvGenName(ivgen));
  if (ivgen_hash != nullptr) {
    absl::StrAppend(&s, ":", ivgen_hash->name);
  }
  return s;
}

absl::Status ValidateCipherSpec(const CipherSpec& spec) {
  if (spec.cipher == nullptr) {
    return absl::InvalidArgumentError("no cipher algorithm");
  }
  if (spec.mode == CipherMode::kXts &&
      spec.cipher->block_size() != kXtsBlock) {
    return absl::InvalidArgumentError(
        absl::StrCat("cipher ", spec.cipher->name, " has a ",
                     spec.cipher->block_size(),
                     "-byte block; xts needs a 16-byte block"));
  }
  if (spec.ivgen == IvGen::kEssiv) {
    if (spec.ivgen_hash == nullptr) {
      return absl::InvalidArgumentError(
          "the essiv IV generator needs a hash (essiv:HASH)");
    }
    RETURN_IF_ERROR(EssivCipher(*spec.cipher, *spec.ivgen_hash).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SectorCipher>> SectorCipher::Create(
    const CipherSpec& spec, absl::Span<const uint8_t> key) {
  RETURN_IF_ERROR(ValidateCipherSpec(spec));
  if (key.size() != spec.key_len()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cipher ", spec.cipher->name, " in ",
                     CipherModeName(spec.mode), " mode needs a ",
                     spec.key_len(), "-byte key, not ", key.size()));
  }
  std::unique_ptr<SectorCipher> sc(new SectorCipher(spec));
  const nettle_cipher* c = spec.cipher->impl;
  sc->enc_ctx_ = KeySchedule(c, true, key.data());
  sc->dec_ctx_ = KeySchedule(c, false, key.data());
  if (spec.mode == CipherMode::kXts) {
    // The second half keys the tweak cipher.
    sc->tweak_ctx_ = KeySchedule(c, true, key.data() + spec.cipher->key_len);
  }
  if (spec.ivgen == IvGen::kEssiv) {
    ASSIGN_OR_RETURN(sc->essiv_cipher_,
                     EssivCipher(*spec.cipher, *spec.ivgen_hash));
    // The ESSIV key is the digest of the whole data key.
    SecureBuffer salt(spec.ivgen_hash->digest_len());
    HashParts(*spec.ivgen_hash, {key}, salt.span());
    sc->essiv_ctx_ = KeySchedule(sc->essiv_cipher_->impl, true, salt.data());
  }
  return sc;
}

SectorCipher::~SectorCipher() = default;

absl::Status SectorCipher::Encrypt(uint64_t first_sector,
                                   absl::Span<uint8_t> data) const {
  return Run(true, first_sector, data);
}

absl::Status SectorCipher::Decrypt(uint64_t first_sector,
                                   absl::Span<uint8_t> data) const {
  return Run(false, first_sector, data);
}

absl::Status SectorCipher::Run(bool encrypt, uint64_t first_sector,
                               absl::Span<uint8_t> data) const {
  const size_t block = spec_.cipher->block_size();
  size_t tail = data.size() % kLuksSectorSize;
  if (spec_.mode != CipherMode::kCtr && tail % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "encrypted length ", data.size(), " is not a multiple of the ",
        spec_.cipher->name, " block size ", block));
  }
  uint8_t iv[kMaxBlock];
  uint64_t sector = first_sector;
  for (size_t pos = 0; pos < data.size(); pos += kLuksSectorSize, ++sector) {
    size_t n = std::min<size_t>(kLuksSectorSize, data.size() - pos);
    MakeIv(sector, absl::MakeSpan(iv, block));
    CryptOne(encrypt, iv, data.subspan(pos, n));
  }
  return absl::OkStatus();
}

// The IV of one sector. ECB ignores it.
void SectorCipher::MakeIv(uint64_t sector, absl::Span<uint8_t> iv) const {
  std::fill(iv.begin(), iv.end(), 0);
  switch (spec_.ivgen) {
    case IvGen::kPlain: {
      // Only the low 32 bits: images past 2 TiB repeat IVs (as dm-crypt).
      StoreLE(iv.data(), sector & 0xffffffffu, std::min<size_t>(4, iv.size()));
      break;
    }
    case IvGen::kPlain64: {
      StoreLE(iv.data(), sector, std::min<size_t>(8, iv.size()));
      break;
    }
    case IvGen::kEssiv: {
      // The little-endian sector number in a zeroed block, encrypted with
      // the digest of the key.
      uint8_t blockbuf[kMaxBlock] = {};
      size_t nblock = essiv_cipher_->block_size();
      StoreLE(blockbuf, sector, std::min<size_t>(8, nblock));
      essiv_cipher_->impl->encrypt(essiv_ctx_.data(), nblock, blockbuf,
                                   blockbuf);
      std::copy_n(blockbuf, std::min(nblock, iv.size()), iv.begin());
      break;
    }
  }
}

void SectorCipher::CryptOne(bool encrypt, uint8_t* iv,
                            absl::Span<uint8_t> piece) const {
  const nettle_cipher* c = spec_.cipher->impl;
  const size_t block = c->block_size;
  uint8_t* p = piece.data();
  const size_t n = piece.size();
  switch (spec_.mode) {
    case CipherMode::kEcb:
      (encrypt ? c->encrypt : c->decrypt)(
          encrypt ? enc_ctx_.data() : dec_ctx_.data(), n, p, p);
      break;
    case CipherMode::kCbc:
      if (encrypt) {
        cbc_encrypt(enc_ctx_.data(), c->encrypt, block, iv, n, p, p);
      } else {
        cbc_decrypt(dec_ctx_.data(), c->decrypt, block, iv, n, p, p);
      }
      break;
    case CipherMode::kXts:
      if (n % kXtsBlock == 0 && n <= kLuksSectorSize) {
        XtsWholeBlocks(encrypt, iv, piece);
      } else if (encrypt) {
        xts_encrypt_message(enc_ctx_.data(), tweak_ctx_.data(), c->encrypt,
                            iv, n, p, p);
      } else {
        xts_decrypt_message(dec_ctx_.data(), tweak_ctx_.data(), c->decrypt,
                            c->encrypt, iv, n, p, p);
      }
      break;
    case CipherMode::kCtr:
      // CTR is its own inverse: both directions run the encryptor.
      ctr_crypt(enc_ctx_.data(), c->encrypt, block, iv, n, p, p);
      break;
  }
}

// XTS (IEEE 1619) of whole blocks, as xts_encrypt_message computes it, but
// with the data cipher called once for the piece: nettle's XTS calls it
// one 16-byte block at a time, which keeps AES-NI from working on several
// blocks at once. The tweak of block j is E_k2(iv) times x^j in GF(2^128)
// (little-endian, reduced by 0x87); the piece is masked with the tweaks,
// run through ECB, and masked again.
void SectorCipher::XtsWholeBlocks(bool encrypt, const uint8_t* iv,
                                  absl::Span<uint8_t> piece) const {
  const nettle_cipher* c = spec_.cipher->impl;
  uint8_t* p = piece.data();
  const size_t n = piece.size();
  alignas(16) uint8_t tweaks[kLuksSectorSize];
  uint8_t t0[kXtsBlock];
  c->encrypt(tweak_ctx_.data(), kXtsBlock, t0, iv);
  uint64_t lo = LoadLE64(t0), hi = LoadLE64(t0 + 8);
  for (size_t j = 0; j < n; j += kXtsBlock) {
    StoreLE64(tweaks + j, lo);
    StoreLE64(tweaks + j + 8, hi);
    const uint64_t carry = hi >> 63;
    hi = (hi << 1) | (lo >> 63);
    lo = (lo << 1) ^ (0x87 & (0 - carry));
  }
  XorInto(p, tweaks, n);
  (encrypt ? c->encrypt : c->decrypt)(
      encrypt ? enc_ctx_.data() : dec_ctx_.data(), n, p, p);
  XorInto(p, tweaks, n);
  // The tweaks are key material of a kind: E_k2 of a known IV.
  explicit_bzero(tweaks, n);
  explicit_bzero(t0, sizeof t0);
}

}  // namespace qcow2::internal
