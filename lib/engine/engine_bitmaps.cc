// SPDX-License-Identifier: Apache-2.0
// Persistent dirty bitmaps of the top layer, under the metadata lock: the
// same lock under which every write marks them (Engine::PlanLocked), so a
// listing or a status reflects every write planned before it.
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/driver/qcow2_layer.h"
#include "lib/engine/engine.h"

namespace qcow2::internal {

absl::StatusOr<Qcow2Layer*> Engine::BitmapSource(
    const std::string& name) const {
  RETURN_IF_ERROR(chain_->closed() ? chain_->ClosedError() : absl::OkStatus());
  Qcow2Layer* top = chain_->top_qcow2();
  if (top != nullptr) RETURN_IF_ERROR(top->bitmaps().LoadReadOnly());
  if (top == nullptr && !name.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "Dirty bitmap '", name, "' not found (", chain_->filename(),
        " is raw)"));
  }
  return top;
}

absl::StatusOr<std::vector<BitmapInfo>> Engine::ListBitmaps() const {
  EngineLock lock(&mu_);
  ASSIGN_OR_RETURN(Qcow2Layer * top, BitmapSource(""));
  if (top == nullptr) return std::vector<BitmapInfo>{};  // raw: none
  return top->bitmaps().List();
}

absl::StatusOr<BitmapStatus> Engine::GetBitmapStatus(const std::string& name,
                                                     uint64_t offset,
                                                     uint64_t max_len) const {
  EngineLock lock(&mu_);
  ASSIGN_OR_RETURN(Qcow2Layer * top, BitmapSource(name));
  return top->bitmaps().Status(name, offset, max_len);
}

absl::StatusOr<std::pair<std::vector<uint8_t>, uint32_t>> Engine::BitmapBits(
    const std::string& name) const {
  EngineLock lock(&mu_);
  ASSIGN_OR_RETURN(Qcow2Layer * top, BitmapSource(name));
  return top->bitmaps().Bits(name);
}

absl::Status Engine::EditBitmaps(
    absl::FunctionRef<absl::Status(Qcow2Layer*)> edit) {
  CountedCall counted(&stats_);
  EngineLock lock(&mu_);
  RETURN_IF_ERROR(chain_->CheckWritable());
  Qcow2Layer* top = chain_->top_qcow2();
  if (top == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "Format 'raw' does not support persistent bitmaps (",
        chain_->filename(), ")"));
  }
  return edit(top);
}

}  // namespace qcow2::internal
