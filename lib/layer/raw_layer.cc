// SPDX-License-Identifier: Apache-2.0
#include <algorithm>

#include "lib/layer/layer.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

absl::Status Layer::ReadExtent(const Extent& e, uint64_t extent_start,
                               uint64_t offset, absl::Span<uint8_t> buf) {
  switch (e.kind) {
    case Extent::kData:
      return data_file()->ReadAt(e.host_offset + (offset - extent_start), buf);
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
    std::unique_ptr<File> file, bool read_only) {
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  std::unique_ptr<RawLayer> layer(
      new RawLayer(std::move(file), size, read_only));
  if (read_only) layer->PrimeStatus();
  return layer;
}

void RawLayer::PrimeStatus() {
  // Learnt here, with no lock held, rather than by a copy-on-write
  // decision under the engine's lock later: most raw files are one run of
  // data, or a few. A file of more runs than the cache holds is learnt in
  // part; the rest is asked for when needed.
  MutexLock lock(&mu_);
  for (uint64_t pos = 0; pos < file_size_ && runs_.size() < kMaxCachedRuns;) {
    uint64_t run = 0;
    absl::StatusOr<bool> data = file_->DataRun(pos, file_size_ - pos, &run);
    if (!data.ok()) return;  // asked again when needed, and reported then
    run = std::max<uint64_t>(run, 1);
    runs_[pos] = Run{pos + run, *data};
    pos += run;
  }
}

Extent RawLayer::Tail(uint64_t offset, uint64_t max_len) const {
  Extent e;
  e.host_offset = offset;
  e.kind = Extent::kZero;
  e.has_host_cluster = true;
  e.length = std::min(max_len, size_ - offset);
  return e;
}

absl::StatusOr<Extent> RawLayer::Map(uint64_t offset, uint64_t max_len) {
  if (offset >= file_size_) return Tail(offset, max_len);
  // Data, holes included: they read as zeros, and asking the file which is
  // which costs two lseek calls (and on tmpfs a walk of its pages).
  Extent e;
  e.kind = Extent::kData;
  e.host_offset = offset;
  e.length = std::min(max_len, file_size_ - offset);
  return e;
}

absl::StatusOr<Extent> RawLayer::MapStatus(uint64_t offset,
                                           uint64_t max_len) {
  if (offset >= file_size_) return Tail(offset, max_len);
  const uint64_t limit = std::min(max_len, file_size_ - offset);
  Extent e;
  e.host_offset = offset;
  MutexLock lock(&mu_);
  if (cache_status_) {
    auto it = runs_.upper_bound(offset);
    if (it != runs_.begin()) {
      --it;
      if (offset < it->second.end) {
        e.kind = it->second.data ? Extent::kData : Extent::kZero;
        e.has_host_cluster = !it->second.data;
        e.length = std::min(limit, it->second.end - offset);
        return e;
      }
    }
  }
  // The whole run from `offset`, not only `max_len` of it, so that the
  // cache answers the requests that follow.
  uint64_t run = 0;
  ASSIGN_OR_RETURN(bool data,
                   file_->DataRun(offset, file_size_ - offset, &run));
  run = std::max<uint64_t>(run, 1);
  if (cache_status_) {
    if (runs_.size() >= kMaxCachedRuns) runs_.clear();
    runs_[offset] = Run{offset + run, data};
  }
  e.kind = data ? Extent::kData : Extent::kZero;
  e.has_host_cluster = !data;
  e.length = std::min(limit, run);
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
