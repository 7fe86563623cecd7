// SPDX-License-Identifier: Apache-2.0
// Internal snapshots of the top layer, under the metadata lock. The
// contract is the simple one: no Queue may be open (a queue's requests
// could hold plans or pinned L2 slices across the switch of trees), and
// the caller runs no synchronous request meanwhile (as for Resize).
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/driver/qcow2_layer.h"
#include "lib/engine/engine.h"

namespace qcow2::internal {

absl::StatusOr<Qcow2Layer*> Engine::SnapshotTarget(const std::string& what) {
  RETURN_IF_ERROR(chain_->CheckWritable());
  Qcow2Layer* top = chain_->top_qcow2();
  if (top == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat(chain_->filename(), ": ", what,
                     ": internal snapshots need a qcow2 "
                     "image"));
  }
  if (size_t queues = stats_.live_sources(); queues > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(chain_->filename(), ": ", what, ": ", queues,
                     " queue(s) open; snapshot operations need every Queue "
                     "on the image destroyed first"));
  }
  return top;
}

absl::StatusOr<std::vector<SnapshotEntry>> Engine::ListSnapshots() const {
  EngineLock lock(&mu_);
  RETURN_IF_ERROR(chain_->closed() ? chain_->ClosedError() : absl::OkStatus());
  Qcow2Layer* top = chain_->top_qcow2();
  if (top == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        chain_->filename(), ": a raw image has no internal snapshots"));
  }
  ASSIGN_OR_RETURN(uint64_t size, top->file()->Size());
  ASSIGN_OR_RETURN(DecodedSnapshotTable table,
                   ReadSnapshotTable(top->file(), top->header(), size));
  return std::move(table.entries);
}

absl::StatusOr<SnapshotEntry> Engine::CreateSnapshot(const NewSnapshot& sn) {
  CountedCall counted(&stats_);
  EngineLock lock(&mu_);
  ASSIGN_OR_RETURN(Qcow2Layer * top,
                   SnapshotTarget(absl::StrCat("snapshot '", sn.name, "'")));
  return internal::CreateSnapshot(top, sn);
}

absl::Status Engine::ApplySnapshot(const std::string& key) {
  CountedCall counted(&stats_);
  EngineLock lock(&mu_);
  // The disk's contents change wholesale, under a job's copies.
  RETURN_IF_ERROR(RefuseDuringLiveJob("applying a snapshot"));
  ASSIGN_OR_RETURN(Qcow2Layer * top,
                   SnapshotTarget(absl::StrCat("snapshot '", key, "'")));
  return internal::ApplySnapshot(top, key);
}

absl::Status Engine::DeleteSnapshot(const std::string& key) {
  CountedCall counted(&stats_);
  EngineLock lock(&mu_);
  ASSIGN_OR_RETURN(Qcow2Layer * top,
                   SnapshotTarget(absl::StrCat("snapshot '", key, "'")));
  return internal::DeleteSnapshot(top, key);
}

}  // namespace qcow2::internal
