// SPDX-License-Identifier: Apache-2.0
// SectorCipher: encrypts and decrypts 512-byte sectors as QEMU's LUKS
// driver does: one cipher, one mode (ecb, cbc, xts, ctr), and the IV of
// each sector made from its sector number by an IV generator (plain,
// plain64, essiv:HASH). The same code serves the payload and the key-slot
// material (the latter numbered from sector 0 of the slot).
//
// In qcow2 the sector number of a payload sector is its HOST offset / 512:
// QEMU's qcow2 driver hands the LUKS layer the offset of the data in the
// image file, not the guest offset, whenever the image is LUKS-encrypted
// (block/qcow2-threads.c picks the host offset when the crypto is
// "physical", and block/qcow2.c marks LUKS so; only legacy AES used guest
// offsets). So a cluster moved to another host offset must be re-encrypted,
// and copying encrypted clusters verbatim between files is wrong unless
// they keep their host offsets.
#ifndef QCOW2_LIB_CRYPTO_SECTOR_CIPHER_H_
#define QCOW2_LIB_CRYPTO_SECTOR_CIPHER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/crypto/algorithms.h"
#include "lib/crypto/secure_buffer.h"

namespace qcow2::internal {

inline constexpr uint32_t kLuksSectorSize = 512;

// What a LUKS header's cipher_name, cipher_mode and key_bytes say.
struct CipherSpec {
  const CipherAlg* cipher = nullptr;
  CipherMode mode = CipherMode::kXts;
  IvGen ivgen = IvGen::kPlain64;
  // Used by essiv only; other IV generators carry it when the header
  // names one ("xts-plain64:sha256"), and ignore it.
  const HashAlg* ivgen_hash = nullptr;

  // Key bytes the mode needs: twice the cipher's for xts.
  size_t key_len() const;
  // The LUKS header's cipher_mode string: "xts-plain64", "cbc-essiv:sha256".
  std::string LuksModeString() const;
};

// Checks that the mode, cipher and IV generator go together as QEMU
// requires (xts needs a 16-byte block, essiv needs a matching key size).
absl::Status ValidateCipherSpec(const CipherSpec& spec);

class SectorCipher {
 public:
  // `key` is the whole key (both halves for xts); it is copied into the
  // key schedules, which the object wipes when it dies.
  static absl::StatusOr<std::unique_ptr<SectorCipher>> Create(
      const CipherSpec& spec, absl::Span<const uint8_t> key);
  ~SectorCipher();

  // Encrypts or decrypts `data` in place, sector by sector, the first
  // sector being number `first_sector`. data.size() is a multiple of 512,
  // except that the last piece may be shorter (key-slot material) if it is
  // still a whole number of cipher blocks. Thread-safe: the key schedules
  // are read-only after Create.
  absl::Status Encrypt(uint64_t first_sector, absl::Span<uint8_t> data) const;
  absl::Status Decrypt(uint64_t first_sector, absl::Span<uint8_t> data) const;

  const CipherSpec& spec() const { return spec_; }

 private:
  explicit SectorCipher(const CipherSpec& spec) : spec_(spec) {}
  absl::Status Run(bool encrypt, uint64_t first_sector,
                   absl::Span<uint8_t> data) const;
  void MakeIv(uint64_t sector, absl::Span<uint8_t> iv) const;
  void CryptOne(bool encrypt, uint8_t* iv, absl::Span<uint8_t> piece) const;
  void XtsWholeBlocks(bool encrypt, const uint8_t* iv,
                      absl::Span<uint8_t> piece) const;

  CipherSpec spec_;
  const CipherAlg* essiv_cipher_ = nullptr;
  SecureBuffer enc_ctx_, dec_ctx_, tweak_ctx_, essiv_ctx_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CRYPTO_SECTOR_CIPHER_H_
