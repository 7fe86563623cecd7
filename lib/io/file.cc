// SPDX-License-Identifier: Apache-2.0
// Default implementations of the optional File methods.
#include <algorithm>
#include <vector>

#include "lib/base/status_macros.h"
#include "qcow2/file.h"

namespace qcow2 {

namespace {
constexpr uint64_t kZeroChunk = 1 << 20;
}  // namespace

absl::Status File::ReadvAt(uint64_t offset, absl::Span<const iovec> iov) {
  for (const iovec& v : iov) {
    RETURN_IF_ERROR(ReadAt(
        offset, absl::MakeSpan(static_cast<uint8_t*>(v.iov_base), v.iov_len)));
    offset += v.iov_len;
  }
  return absl::OkStatus();
}

absl::Status File::WritevAt(uint64_t offset, absl::Span<const iovec> iov) {
  for (const iovec& v : iov) {
    RETURN_IF_ERROR(WriteAt(
        offset,
        absl::MakeConstSpan(static_cast<const uint8_t*>(v.iov_base),
                            v.iov_len)));
    offset += v.iov_len;
  }
  return absl::OkStatus();
}

absl::Status File::WriteZeroes(uint64_t offset, uint64_t len) {
  std::vector<uint8_t> zeros(std::min(len, kZeroChunk));
  while (len > 0) {
    uint64_t n = std::min<uint64_t>(len, zeros.size());
    RETURN_IF_ERROR(WriteAt(offset, absl::MakeConstSpan(zeros.data(), n)));
    offset += n;
    len -= n;
  }
  return absl::OkStatus();
}

absl::Status File::Extend(uint64_t old_size, uint64_t new_size) {
  return Truncate(new_size);
}

absl::Status File::Reserve(uint64_t offset, uint64_t len) {
  return absl::UnimplementedError("Reserve is not implemented by this file");
}

absl::Status File::Allocate(uint64_t offset, uint64_t len) {
  ASSIGN_OR_RETURN(uint64_t size, Size());
  uint64_t end = offset + len;
  if (end <= size) return absl::OkStatus();
  uint64_t start = std::max(offset, size);
  return WriteZeroes(start, end - start);
}

absl::Status File::Discard(uint64_t offset, uint64_t len) {
  return absl::OkStatus();
}

}  // namespace qcow2
