// SPDX-License-Identifier: Apache-2.0
#include "lib/driver/luks_open.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

absl::StatusOr<OpenedLuks> OpenLuks(File* file, const Header& h,
                                    uint64_t file_size,
                                    const std::string& secret,
                                    const std::string& name) {
  ASSIGN_OR_RETURN(std::optional<CryptoExtension> ext,
                   DecodeCryptoExtension(h, file_size, name));
  if (!ext.has_value()) {
    return absl::DataLossError(
        absl::StrCat(name, ": crypt_method 2 without a crypto header extension"));
  }
  if (secret.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        name, ": the image is encrypted (LUKS): its key secret is needed "
              "(OpenOptions::key_secret; qcowtool: --object secret,id=ID,... "
              "with encrypt.key-secret=ID)"));
  }
  std::vector<uint8_t> area(ext->length);
  absl::Status s = file->ReadAt(ext->offset, absl::MakeSpan(area));
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(name, ": reading the LUKS area: ",
                                               s.message()));
  }
  OpenedLuks out;
  out.ext = *ext;
  ASSIGN_OR_RETURN(
      out.volume,
      LuksVolume::Open(area,
                       absl::MakeConstSpan(
                           reinterpret_cast<const uint8_t*>(secret.data()),
                           secret.size()),
                       name));
  return out;
}

}  // namespace qcow2::internal
