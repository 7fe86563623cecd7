// SPDX-License-Identifier: Apache-2.0
// LUKS1 key slots: unlocking the master key with a passphrase, and
// creating a header with one key slot as QEMU 7.2's
// `qemu-img create -o encrypt.format=luks,...` does.
//
// Unlock, per enabled slot: PBKDF2(slot hash = hash_spec, passphrase, slot
// salt, slot iterations) gives a key that decrypts the slot's key material
// (key_bytes * stripes bytes at key_offset, sectors numbered from 0, with
// the header's cipher spec); the anti-forensic merge of the stripes with
// hash_spec gives a candidate master key; PBKDF2 of the candidate with the
// header's digest salt and iterations must equal mk_digest.
#ifndef QCOW2_LIB_CRYPTO_LUKS_KEYS_H_
#define QCOW2_LIB_CRYPTO_LUKS_KEYS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/crypto/luks_header.h"
#include "lib/crypto/secure_buffer.h"

namespace qcow2::internal {

// Anti-forensic split and merge (LUKS1 spec, "AF-splitter"): `split` has
// stripes * key.size() bytes. AfSplit fills all but the last stripe from
// getrandom.
absl::Status AfSplit(const HashAlg& hash, absl::Span<const uint8_t> key,
                     uint32_t stripes, absl::Span<uint8_t> split);
void AfMerge(const HashAlg& hash, absl::Span<const uint8_t> split,
             uint32_t stripes, absl::Span<uint8_t> key);

// Tries every enabled slot of `h` with `secret`; `area` is the whole
// encryption area (header and key material). Returns the master key, or
// kPermissionDenied "Invalid password, cannot unlock any keyslot (LUKS key
// slots tried: N, M)" (QEMU's words first) when
// no slot opens, or kFailedPrecondition when no slot is enabled. `where`
// names the image in messages; the secret is never part of one.
absl::StatusOr<SecureBuffer> UnlockLuks(const LuksHeader& h,
                                        absl::Span<const uint8_t> area,
                                        absl::Span<const uint8_t> secret,
                                        const std::string& where);

// Whether `secret` opens slot `slot` of `h` (false when the slot is
// disabled): QEMU's per-slot test when amend erases slots by old secret.
absl::StatusOr<bool> SlotOpens(const LuksHeader& h,
                               absl::Span<const uint8_t> area, size_t slot,
                               absl::Span<const uint8_t> secret);

// The `encrypt.*` creation options (QEMU's names and defaults).
struct LuksCreateOptions {
  std::string cipher_alg = "aes-256";
  std::string cipher_mode = "xts";
  std::string ivgen_alg = "plain64";
  // encrypt.ivgen-hash-alg: "" when not given. QEMU writes it into the
  // header's cipher_mode whenever it is given ("xts-plain64:sha256"), but
  // only essiv uses it (sha256 when not given).
  std::string ivgen_hash_alg;
  std::string hash_alg = "sha256";
  uint32_t iter_time_ms = 2000;  // encrypt.iter-time
  // Fixed PBKDF2 iteration counts instead of measuring iter_time_ms (for
  // tests: QEMU measures for at least half a second per count). 0: measure.
  uint32_t slot_iterations = 0;
  uint32_t digest_iterations = 0;
};

// A created encryption area and the master key it protects.
struct LuksArea {
  LuksHeader header;
  // payload_offset * 512 bytes: the header, slot 0's encrypted key
  // material, zeros elsewhere. This is what the qcow2 crypto header
  // extension points at (its length is bytes.size()).
  std::vector<uint8_t> bytes;
  SecureBuffer master_key;
};

// The cipher spec the options name, validated as QEMU 7.2 validates it.
absl::StatusOr<CipherSpec> CipherSpecFromOptions(const LuksCreateOptions& o);

// Builds a LUKS1 area as QEMU 7.2 lays it out: 4000 stripes, slot i's
// material at sector 8 + i * S where S is the material's sectors rounded up
// to 8, payload at 8 + 8 * S; slot 0 enabled with `secret`, random master
// key, salts and UUID; iterations from iter_time_ms as QEMU measures them
// (thread CPU time), at least 1000.
absl::StatusOr<LuksArea> CreateLuks(const LuksCreateOptions& o,
                                    absl::Span<const uint8_t> secret);

// Key-slot amendment (QEMU 7.2's `qemu-img amend -o encrypt.state=active,
// encrypt.new-secret=ID[,encrypt.keyslot=N]` and `state=inactive`). Both
// update `h` and rewrite its 592 bytes at the start of `area`.
//
// AddKeySlot enables slot `slot` (or the first free one) for `secret`,
// protecting `master_key` (from UnlockLuks); iterations fixed, or measured
// for iter_time_ms when 0. Returns the slot used; kFailedPrecondition when
// that slot is in use, kResourceExhausted when all are.
absl::StatusOr<size_t> AddKeySlot(LuksHeader& h, absl::Span<uint8_t> area,
                                  absl::Span<const uint8_t> master_key,
                                  absl::Span<const uint8_t> secret,
                                  std::optional<size_t> slot,
                                  uint32_t iter_time_ms, uint32_t iterations);

// EraseKeySlot disables `slot` and overwrites its key material with random
// bytes. Refuses (kFailedPrecondition) to erase the last enabled slot
// unless `allow_last` (qemu-img amend --force).
absl::Status EraseKeySlot(LuksHeader& h, absl::Span<uint8_t> area,
                          size_t slot, bool allow_last = false);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CRYPTO_LUKS_KEYS_H_
