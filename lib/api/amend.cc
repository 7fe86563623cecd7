// SPDX-License-Identifier: Apache-2.0
// AmendImage: opens the file read-write with QEMU's image locks and hands
// it to the driver's amend (lib/driver/amend.h).
#include <memory>

#include "absl/strings/str_cat.h"
#include "lib/base/endian.h"
#include "lib/base/status_macros.h"
#include "lib/driver/amend.h"
#include "lib/format/header.h"
#include "qcow2/amend.h"

namespace qcow2 {

absl::Status AmendImage(const std::string& path, const AmendOptions& opts) {
  FileOpener* opener = opts.opener ? opts.opener : DefaultFileOpener();
  FileOptions fo;
  fo.read_only = false;
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, opener->Open(path, fo));
  uint8_t magic[4] = {};
  RETURN_IF_ERROR(file->ReadAt(0, absl::MakeSpan(magic)));
  if (internal::LoadBE32(magic) != internal::kQcowMagic) {
    return absl::UnimplementedError(
        "Format driver 'raw' does not support option amendment");
  }
  return internal::AmendQcow2(file.get(), opts);
}

}  // namespace qcow2
