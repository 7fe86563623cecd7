// SPDX-License-Identifier: Apache-2.0
// The full-disk-encryption header extension (magic 0x0537be77) of a
// LUKS-encrypted qcow2 image (crypt_method 2): two big-endian 64-bit
// fields, the offset and the length in bytes of the LUKS area (LUKS header
// and key material) in host clusters. QEMU allocates whole clusters for
// it, zero-filled past `length`.
#ifndef QCOW2_LIB_FORMAT_CRYPTO_EXT_H_
#define QCOW2_LIB_FORMAT_CRYPTO_EXT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "lib/format/header.h"

namespace qcow2::internal {

inline constexpr uint32_t kCryptNone = 0;
inline constexpr uint32_t kCryptAes = 1;
inline constexpr uint32_t kCryptLuks = 2;
inline constexpr size_t kCryptoExtSize = 16;
// Far above any LUKS1 area (eight slots of 64-byte keys need about 2 MiB):
// a larger length is hostile, and would make us read that much.
inline constexpr uint64_t kMaxCryptoAreaBytes = 64ull << 20;

struct CryptoExtension {
  uint64_t offset = 0;
  uint64_t length = 0;
  // The host clusters the area occupies (what refcounts must cover).
  uint64_t clusters(uint64_t cluster_size) const {
    return (length + cluster_size - 1) / cluster_size;
  }
};

// Finds and validates the extension in `h` (from DecodeHeader) against the
// file: exactly 16 bytes, at most one, only with crypt_method 2 and always
// with it; offset cluster aligned and past the header cluster; length
// nonzero and bounded; the area inside the file and not overlapping the
// L1 table, the refcount table or the snapshot table. nullopt when the
// image is not LUKS-encrypted. Errors are kDataLoss naming the field.
absl::StatusOr<std::optional<CryptoExtension>> DecodeCryptoExtension(
    const Header& h, uint64_t file_size, const std::string& filename);

// The 16 extension bytes for `ext`.
RawExtension EncodeCryptoExtension(const CryptoExtension& ext);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_FORMAT_CRYPTO_EXT_H_
