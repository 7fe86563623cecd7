// SPDX-License-Identifier: Apache-2.0
// The ciphers, cipher modes, IV generators and hashes that QEMU's LUKS
// driver knows, named as QEMU names them (the `encrypt.*` options and the
// LUKS header strings), mapped onto nettle. Also the primitives built on
// the hashes: a digest, PBKDF2-HMAC, and random bytes from getrandom(2).
// Every cipher and hash comes from nettle; nothing here is hand-written
// cryptography.
#ifndef QCOW2_LIB_CRYPTO_ALGORITHMS_H_
#define QCOW2_LIB_CRYPTO_ALGORITHMS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

struct nettle_cipher;
struct nettle_hash;

namespace qcow2::internal {

// A block cipher with one key size: "aes-128", "serpent-256", ...
struct CipherAlg {
  const char* name;         // QEMU's option name, e.g. "aes-256"
  const char* luks_name;    // the LUKS header's cipher_name, e.g. "aes"
  size_t key_len;           // bytes
  const nettle_cipher* impl;
  size_t block_size() const;
};

struct HashAlg {
  const char* name;  // "sha256"
  const nettle_hash* impl;
  size_t digest_len() const;
};

enum class CipherMode { kEcb, kCbc, kXts, kCtr };
enum class IvGen { kPlain, kPlain64, kEssiv };

// Lookups by QEMU's names; nullptr / error when unknown.
const CipherAlg* FindCipher(std::string_view name);
// The LUKS header names a cipher family and the key size picks the member
// ("aes" with 32 key bytes in xts mode is aes-128).
const CipherAlg* FindCipherByLuksName(std::string_view luks_name,
                                      size_t key_len);
const HashAlg* FindHash(std::string_view name);
absl::StatusOr<CipherMode> ParseCipherMode(std::string_view name);
absl::StatusOr<IvGen> ParseIvGen(std::string_view name);
const char* CipherModeName(CipherMode mode);
const char* IvGenName(IvGen ivgen);

// ESSIV encrypts the sector number with a key that is the digest of the
// data key, so its cipher is the family member whose key length equals the
// digest length (aes-128 with sha256 gives aes-256 for the IVs). Error when
// the family has no such member (aes with sha1), as in QEMU.
absl::StatusOr<const CipherAlg*> EssivCipher(const CipherAlg& cipher,
                                             const HashAlg& hash);

// The digest of the concatenation of `parts`.
void HashParts(const HashAlg& hash,
               std::initializer_list<absl::Span<const uint8_t>> parts,
               absl::Span<uint8_t> out);

// PBKDF2 with HMAC over `hash` (RFC 8018), as nettle computes it. `out`
// receives out.size() bytes. REQUIRES: iterations >= 1.
void Pbkdf2(const HashAlg& hash, absl::Span<const uint8_t> secret,
            absl::Span<const uint8_t> salt, uint32_t iterations,
            absl::Span<uint8_t> out);

// Fills `out` from getrandom(2) (blocking until the pool is ready).
absl::Status RandomBytes(absl::Span<uint8_t> out);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CRYPTO_ALGORITHMS_H_
