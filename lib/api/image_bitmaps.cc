// SPDX-License-Identifier: Apache-2.0
// The public Image's persistent dirty bitmaps: thin calls into the engine,
// which runs them under its metadata lock on the top layer's bitmaps.
#include <algorithm>
#include <utility>

#include "lib/base/status_macros.h"
#include "lib/driver/qcow2_layer.h"
#include "lib/engine/engine.h"
#include "qcow2/image.h"

namespace qcow2 {

using internal::Qcow2Layer;

absl::StatusOr<std::vector<BitmapInfo>> Image::ListBitmaps() const {
  return engine_->ListBitmaps();
}

absl::StatusOr<BitmapStatus> Image::GetBitmapStatus(const std::string& name,
                                                    uint64_t offset,
                                                    uint64_t max_len) const {
  return engine_->GetBitmapStatus(name, offset, max_len);
}

absl::Status Image::AddBitmap(const std::string& name, uint64_t granularity,
                              bool enabled) {
  return engine_->EditBitmaps([&](Qcow2Layer* top) {
    // qemu-img's default: the cluster size, but no finer than 4 KiB.
    const uint64_t g =
        granularity != 0
            ? granularity
            : std::max<uint64_t>(4096, top->header().cluster_size());
    return top->bitmaps().Add(name, g, enabled);
  });
}

absl::Status Image::RemoveBitmap(const std::string& name) {
  return engine_->EditBitmaps(
      [&](Qcow2Layer* top) { return top->bitmaps().Remove(name); });
}

absl::Status Image::ClearBitmap(const std::string& name) {
  return engine_->EditBitmaps(
      [&](Qcow2Layer* top) { return top->bitmaps().Clear(name); });
}

absl::Status Image::EnableBitmap(const std::string& name) {
  return engine_->EditBitmaps(
      [&](Qcow2Layer* top) { return top->bitmaps().SetEnabled(name, true); });
}

absl::Status Image::DisableBitmap(const std::string& name) {
  return engine_->EditBitmaps(
      [&](Qcow2Layer* top) { return top->bitmaps().SetEnabled(name, false); });
}

absl::Status Image::MergeBitmap(const std::string& target,
                                const std::string& source,
                                const Image* source_image) {
  // The source's bits are copied under its own lock, then merged under
  // ours: never both locks at once (the source may be this image).
  const Image* src = source_image != nullptr ? source_image : this;
  ASSIGN_OR_RETURN(auto bits, src->engine_->BitmapBits(source));
  return engine_->EditBitmaps([&](Qcow2Layer* top) {
    return top->bitmaps().MergeInto(target, bits.first, bits.second);
  });
}

}  // namespace qcow2
