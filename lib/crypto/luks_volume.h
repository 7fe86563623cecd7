// SPDX-License-Identifier: Apache-2.0
// LuksVolume: an unlocked LUKS-encrypted qcow2 image's payload cipher, the
// one object the qcow2 driver needs for I/O. Open it from the encryption
// area (the bytes the crypto header extension points at) and the secret;
// then encrypt before writing and decrypt after reading, by HOST offset
// (the IV sector number is host_offset / 512, see sector_cipher.h).
#ifndef QCOW2_LIB_CRYPTO_LUKS_VOLUME_H_
#define QCOW2_LIB_CRYPTO_LUKS_VOLUME_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/crypto/luks_header.h"
#include "lib/crypto/sector_cipher.h"
#include "lib/io/data_cipher.h"

namespace qcow2::internal {

class LuksVolume final : public DataCipher {
 public:
  // Parses and validates the header in `area`, unlocks a key slot with
  // `secret` (see UnlockLuks for the errors) and keys the payload cipher.
  // The master key lives only inside the cipher's key schedules, wiped
  // when the volume dies.
  static absl::StatusOr<std::unique_ptr<LuksVolume>> Open(
      absl::Span<const uint8_t> area, absl::Span<const uint8_t> secret,
      const std::string& where);

  // A volume keyed with a master key already unlocked (amend holds one).
  static absl::StatusOr<std::unique_ptr<LuksVolume>> FromKey(
      LuksHeader h, absl::Span<const uint8_t> master_key);

  // In place, for data at `host_offset` in the image file. REQUIRES (else
  // kInvalidArgument): host_offset and data.size() multiples of 512.
  // Thread-safe.
  absl::Status Decrypt(uint64_t host_offset,
                       absl::Span<uint8_t> data) const override;
  absl::Status Encrypt(uint64_t host_offset,
                       absl::Span<uint8_t> data) const override;

  const LuksHeader& header() const { return header_; }

 private:
  LuksVolume(LuksHeader h, std::unique_ptr<SectorCipher> c)
      : header_(std::move(h)), cipher_(std::move(c)) {}
  absl::Status CheckAligned(uint64_t host_offset, size_t len) const;

  LuksHeader header_;
  std::unique_ptr<SectorCipher> cipher_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CRYPTO_LUKS_VOLUME_H_
