// SPDX-License-Identifier: Apache-2.0
#include "lib/driver/host_space.h"

#include <algorithm>

#include "lib/base/status_macros.h"

namespace qcow2::internal {

absl::Status HostSpace::GrowAhead(uint64_t end, IoPlan* plan) {
  const uint64_t have = std::max(grown_to_, s_->file_size);
  if (end <= have) return absl::OkStatus();
  const uint64_t step =
      std::clamp<uint64_t>(have / 4, uint64_t{1} << 20, uint64_t{256} << 20);
  const uint64_t cs = s_->geometry().cluster_size;
  const uint64_t target = (std::max(end, have + step) + cs - 1) / cs * cs;
  if (!reserve_unsupported_ && plan->grow_file == nullptr) {
    // Writes into [have, target) planned before the executor reserves it
    // extend the file themselves, which is sound, only slower.
    plan->grow_file = s_->file.get();
    plan->grow_from = have;
    plan->grow_to = target;
  } else {
    RETURN_IF_ERROR(s_->file->Extend(have, target));
  }
  grown_to_ = target;
  return absl::OkStatus();
}

absl::Status HostSpace::GrowWithoutReserve(const absl::Status& reserve) {
  if (absl::IsUnimplemented(reserve)) reserve_unsupported_ = true;
  const uint64_t want = std::max(grown_to_, s_->refcounts->end_cluster()
                                                << s_->geometry().cluster_bits);
  ASSIGN_OR_RETURN(uint64_t size, s_->file->Size());
  // Every write in flight lies inside a cluster allocated so far, so below
  // `want`: the size change never cuts one off.
  if (size < want) RETURN_IF_ERROR(s_->file->Truncate(want));
  grown_to_ = want;
  return absl::OkStatus();
}

absl::Status HostSpace::GiveBackUnused() {
  if (grown_to_ == 0) return absl::OkStatus();
  // The file keeps its size at open, every cluster a committed write went
  // to, and every cluster ever given to metadata (which a failed step may
  // still have put on disk). Clusters allocated for writes that failed
  // hold nothing.
  const uint64_t used = std::max(
      {s_->file_size, data_end_,
       s_->refcounts->metadata_end_cluster() << s_->header.cluster_bits});
  if (used < grown_to_) {
    RETURN_IF_ERROR(s_->meta->Truncate(used));
    RETURN_IF_ERROR(s_->meta->Flush());
  }
  grown_to_ = 0;
  return absl::OkStatus();
}

}  // namespace qcow2::internal
