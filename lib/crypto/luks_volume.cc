// SPDX-License-Identifier: Apache-2.0
#include "lib/crypto/luks_volume.h"

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/crypto/luks_keys.h"

namespace qcow2::internal {

absl::StatusOr<std::unique_ptr<LuksVolume>> LuksVolume::Open(
    absl::Span<const uint8_t> area, absl::Span<const uint8_t> secret,
    const std::string& where) {
  ASSIGN_OR_RETURN(LuksHeader h, DecodeLuksHeader(area, where));
  ASSIGN_OR_RETURN(SecureBuffer key, UnlockLuks(h, area, secret, where));
  return FromKey(std::move(h), key.span());
}

absl::StatusOr<std::unique_ptr<LuksVolume>> LuksVolume::FromKey(
    LuksHeader h, absl::Span<const uint8_t> master_key) {
  ASSIGN_OR_RETURN(auto cipher, SectorCipher::Create(h.spec, master_key));
  return std::unique_ptr<LuksVolume>(
      new LuksVolume(std::move(h), std::move(cipher)));
}

absl::Status LuksVolume::CheckAligned(uint64_t host_offset, size_t len) const {
  if (host_offset % kLuksSectorSize != 0 || len % kLuksSectorSize != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "encrypted I/O at host offset ", host_offset, " of ", len,
        " bytes is not in whole 512-byte sectors"));
  }
  return absl::OkStatus();
}

absl::Status LuksVolume::Decrypt(uint64_t host_offset,
                                 absl::Span<uint8_t> data) const {
  RETURN_IF_ERROR(CheckAligned(host_offset, data.size()));
  return cipher_->Decrypt(host_offset / kLuksSectorSize, data);
}

absl::Status LuksVolume::Encrypt(uint64_t host_offset,
                                 absl::Span<uint8_t> data) const {
  RETURN_IF_ERROR(CheckAligned(host_offset, data.size()));
  return cipher_->Encrypt(host_offset / kLuksSectorSize, data);
}

}  // namespace qcow2::internal
