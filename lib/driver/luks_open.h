// SPDX-License-Identifier: Apache-2.0
// Opening the LUKS layer of an encrypted qcow2 image (crypt_method 2):
// the crypto header extension, the encryption area it points at, and the
// key slots unlocked with the caller's secret.
#ifndef QCOW2_LIB_DRIVER_LUKS_OPEN_H_
#define QCOW2_LIB_DRIVER_LUKS_OPEN_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "lib/crypto/luks_volume.h"
#include "lib/format/crypto_ext.h"
#include "lib/format/header.h"
#include "qcow2/file.h"

namespace qcow2::internal {

struct OpenedLuks {
  CryptoExtension ext;
  std::unique_ptr<LuksVolume> volume;
};

// Reads the area of `h` (validated against the file's size) and unlocks
// it. An empty `secret` is kPermissionDenied naming the option that
// carries one; a wrong one kPermissionDenied from UnlockLuks. Reads only.
absl::StatusOr<OpenedLuks> OpenLuks(File* file, const Header& h,
                                    uint64_t file_size,
                                    const std::string& secret,
                                    const std::string& name);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_LUKS_OPEN_H_
