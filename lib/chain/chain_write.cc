// Write-side operations of the chain: everything goes to the top layer;
// layers below are read for copy-on-write only.
#include <algorithm>

#include "lib/chain/chain.h"
#include "lib/image/qcow2_layer.h"
#include "lib/util/status_macros.h"

namespace qcow2::internal {

Qcow2Layer* Chain::top_qcow2() {
  return dynamic_cast<Qcow2Layer*>(layers_[0].get());
}

absl::Status Chain::CheckWritable() const {
  if (closed_) return absl::FailedPreconditionError("image is closed");
  if (!writable_) {
    return absl::FailedPreconditionError(
        layers_[0]->filename() + " is open read-only");
  }
  return absl::OkStatus();
}

void Chain::ConnectBacking() {
  Qcow2Layer* top = top_qcow2();
  if (top == nullptr || length() < 2) return;
  top->set_backing([this](uint64_t offset, absl::Span<uint8_t> buf) {
    return ReadFrom(1, offset, buf);
  });
}

absl::Status Chain::Write(uint64_t offset, absl::Span<const uint8_t> data) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(CheckWritable());
  RETURN_IF_ERROR(CheckRange(offset, data.size()));
  if (data.empty()) return absl::OkStatus();
  if (Qcow2Layer* top = top_qcow2()) return top->Write(offset, data);
  return layers_[0]->file()->WriteAt(offset, data);
}

absl::Status Chain::WriteZeroes(uint64_t offset, uint64_t len, bool unmap) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(CheckWritable());
  RETURN_IF_ERROR(CheckRange(offset, len));
  if (len == 0) return absl::OkStatus();
  if (Qcow2Layer* top = top_qcow2()) return top->Zero(offset, len, unmap);
  return layers_[0]->file()->WriteZeroes(offset, len);
}

absl::Status Chain::Discard(uint64_t offset, uint64_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(CheckWritable());
  RETURN_IF_ERROR(CheckRange(offset, len));
  if (len == 0) return absl::OkStatus();
  if (Qcow2Layer* top = top_qcow2()) return top->Zero(offset, len, true);
  return layers_[0]->file()->WriteZeroes(offset, len);
}

absl::Status Chain::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("image is closed");
  if (!writable_) return absl::OkStatus();
  return layers_[0]->Flush();
}

absl::Status Chain::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::OkStatus();
  closed_ = true;
  absl::Status result;
  for (auto& layer : layers_) {
    absl::Status s = layer->Close();
    if (result.ok() && !s.ok()) result = s;
  }
  return result;
}

}  // namespace qcow2::internal
