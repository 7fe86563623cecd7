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
#include "qcow2/types.h"

namespace qcow2::internal {

struct OpenedLuks {
  CryptoExtension ext;
  LuksHeader header;                  // decoded, key or no key
  std::unique_ptr<LuksVolume> volume;  // null while locked
  // The cipher attached to the layer's file: `volume`, or, for an image
  // opened without its key (metadata_only), one that refuses all data.
  const DataCipher* cipher() const;
};

// Reads the area of `h` (validated against the file's size) and unlocks
// it. An empty `secret` is kPermissionDenied naming the option that
// carries one, unless `metadata_only`: then the header is decoded and the
// volume left locked. A wrong secret is kPermissionDenied from
// UnlockLuks. Reads only.
absl::StatusOr<OpenedLuks> OpenLuks(File* file, const Header& h,
                                    uint64_t file_size,
                                    const std::string& secret,
                                    bool metadata_only,
                                    const std::string& name);

// The header as `qemu-img info` shows it.
EncryptionInfo LuksInfo(const LuksHeader& h);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_LUKS_OPEN_H_
