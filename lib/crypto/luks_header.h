// SPDX-License-Identifier: Apache-2.0
// The LUKS1 header (592 bytes, big-endian) at the start of a qcow2 image's
// full-disk-encryption area, and its validation against hostile input.
// Layout: the LUKS1 on-disk format specification (magic "LUKS\xba\xbe",
// version 1, cipher name/mode and hash strings, payload offset, key bytes,
// master-key digest, salt and iterations, UUID, eight 48-byte key slots).
#ifndef QCOW2_LIB_CRYPTO_LUKS_HEADER_H_
#define QCOW2_LIB_CRYPTO_LUKS_HEADER_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/crypto/sector_cipher.h"

namespace qcow2::internal {

inline constexpr size_t kLuksHeaderSize = 592;
inline constexpr size_t kLuksNumSlots = 8;
inline constexpr size_t kLuksSaltLen = 32;
inline constexpr size_t kLuksDigestLen = 20;
inline constexpr size_t kLuksUuidLen = 40;
inline constexpr size_t kLuksNameLen = 32;
inline constexpr uint32_t kLuksSlotEnabled = 0x00ac71f3;
inline constexpr uint32_t kLuksSlotDisabled = 0x0000dead;
// QEMU writes and accepts only this many anti-forensic stripes.
inline constexpr uint32_t kLuksStripes = 4000;
// Key material starts at or after this offset (QEMU and cryptsetup align
// the first slot to it).
inline constexpr uint32_t kLuksKeySlotOffset = 4096;

struct LuksKeySlot {
  uint32_t active = kLuksSlotDisabled;
  uint32_t iterations = 0;
  std::array<uint8_t, kLuksSaltLen> salt{};
  uint32_t key_offset = 0;  // in 512-byte sectors from the area's start
  uint32_t stripes = kLuksStripes;
  bool enabled() const { return active == kLuksSlotEnabled; }
};

struct LuksHeader {
  uint16_t version = 1;
  std::string cipher_name;  // "aes"
  std::string cipher_mode;  // "xts-plain64"
  std::string hash_spec;    // "sha256"
  uint32_t payload_offset = 0;  // sectors
  uint32_t key_bytes = 0;
  std::array<uint8_t, kLuksDigestLen> mk_digest{};
  std::array<uint8_t, kLuksSaltLen> mk_digest_salt{};
  uint32_t mk_digest_iterations = 0;
  std::string uuid;
  std::array<LuksKeySlot, kLuksNumSlots> slots;

  // Filled by DecodeLuksHeader from the strings above.
  CipherSpec spec;
  const HashAlg* hash = nullptr;
};

// Bytes of one slot's key material: key_bytes * stripes.
uint64_t SlotMaterialBytes(const LuksHeader& h, const LuksKeySlot& s);

// Parses and validates the header at the start of `area` (the whole
// encryption area as the qcow2 extension bounds it: the key material must
// lie inside it). Errors are kDataLoss naming the field, or kUnimplemented
// for a cipher, mode or hash we (and QEMU) do not know. `where` prefixes
// every message (the image's name).
absl::StatusOr<LuksHeader> DecodeLuksHeader(absl::Span<const uint8_t> area,
                                            const std::string& where);

// Serialises the 592 header bytes.
std::vector<uint8_t> EncodeLuksHeader(const LuksHeader& h);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CRYPTO_LUKS_HEADER_H_
