// SPDX-License-Identifier: Apache-2.0
// The public check-and-repair and compression calls (qcow2/maintenance.h):
// thin doors onto the checker (lib/check/check.h) and the codec
// (lib/format/compress.h).
#include <memory>

#include "absl/strings/str_cat.h"
#include "lib/check/check.h"
#include "lib/format/compress.h"
#include "qcow2/maintenance.h"

namespace qcow2 {

absl::StatusOr<CheckReport> CheckFile(File* file, RepairMode repair) {
  return internal::CheckImage(file, repair);
}

absl::StatusOr<CheckReport> CheckImage(const std::string& path,
                                       const CheckOptions& opts) {
  if (opts.force_share && opts.repair != RepairMode::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": force_share can only be used with a check "
                           "that repairs nothing"));
  }
  FileOpener* opener = opts.opener ? opts.opener : DefaultFileOpener();
  FileOptions fo;
  fo.read_only = opts.repair == RepairMode::kNone;
  fo.force_share = opts.force_share;
  absl::StatusOr<std::unique_ptr<File>> file = opener->Open(path, fo);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("Could not open '", path,
                                     "': ", file.status().message()));
  }
  return CheckFile(file->get(), opts.repair);
}

absl::StatusOr<size_t> CompressCluster(CompressionType type,
                                       absl::Span<const uint8_t> in,
                                       absl::Span<uint8_t> out) {
  return internal::CompressCluster(type, in, out);
}

}  // namespace qcow2
