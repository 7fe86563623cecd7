// SPDX-License-Identifier: Apache-2.0
#include <algorithm>

#include "lib/layer/layer.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

absl::Status Layer::ReadExtent(const Extent& e, uint64_t extent_start,
                               uint64_t offset, absl::Span<uint8_t> buf) {
  switch (e.kind) {
    case Extent::kData:
      return file()->ReadAt(e.host_offset + (offset - extent_start), buf);
    case Extent::kZero:
    case Extent::kUnallocated:
      std::fill(buf.begin(), buf.end(), 0);
      return absl::OkStatus();
    case Extent::kCompressed:
      break;
  }
  return absl::InternalError("compressed extent in a layer without them");
}

absl::StatusOr<std::unique_ptr<RawLayer>> RawLayer::Open(
    std::unique_ptr<File> file) {
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  return std::unique_ptr<RawLayer>(new RawLayer(std::move(file), size));
}

absl::StatusOr<Extent> RawLayer::Map(uint64_t offset, uint64_t max_len) {
  Extent e;
  e.host_offset = offset;
  if (offset < file_size_) {
    uint64_t run = 0;
    ASSIGN_OR_RETURN(bool data, file_->DataRun(
                                    offset, std::min(max_len, file_size_ - offset),
                                    &run));
    e.kind = data ? Extent::kData : Extent::kZero;
    e.has_host_cluster = !data;
    e.length = std::max<uint64_t>(run, 1);
  } else {
    // The tail that rounds the size up to a sector: zeros.
    e.kind = Extent::kZero;
    e.has_host_cluster = true;
    e.length = std::min(max_len, size_ - offset);
  }
  return e;
}

LayerInfo RawLayer::Info() const {
  LayerInfo info;
  info.filename = file_->name();
  info.format = ImageFormat::kRaw;
  info.virtual_size = size_;
  info.file_size = file_size_;
  return info;
}

}  // namespace qcow2::internal
