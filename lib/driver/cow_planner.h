// SPDX-License-Identifier: Apache-2.0
// Copy-on-write planning for a qcow2 layer: what a guest range inside one
// cluster holds now (this layer's subclusters, or the chain below), read
// into a buffer of the plan, and whether it reads as zeros from metadata
// alone. Used by the parts that write: WritePlanner (head and tail
// padding), PendingClusters (the fill of a pending cluster) and Zeroer.
#ifndef QCOW2_LIB_DRIVER_COW_PLANNER_H_
#define QCOW2_LIB_DRIVER_COW_PLANNER_H_

#include <cstdint>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/driver/extent_reader.h"
#include "lib/driver/qcow2_state.h"
#include "lib/io/io_plan.h"

namespace qcow2::internal {

class CowPlanner {
 public:
  // Plans reads of guest bytes from the chain below this layer (for
  // copy-on-write) into `dest`.
  using BackingPlanner = std::function<absl::Status(
      uint64_t offset, uint8_t* dest, uint64_t len, IoPlan* plan)>;
  // Whether guest bytes [offset, +len) read as zeros from the chain below,
  // judged from metadata alone (zero or unallocated everywhere down).
  using BackingZero =
      std::function<absl::StatusOr<bool>(uint64_t offset, uint64_t len)>;

  // The parts are the layer's and outlive this.
  CowPlanner(Qcow2State* s, ExtentReader* reader) : s_(s), reader_(reader) {}

  // The chain below, for copy-on-write; none (both null) at the bottom.
  // Set by the chain that opens the layer, and again when it changes.
  void set_backing(BackingPlanner planner, BackingZero zero) {
    backing_ = std::move(planner);
    backing_zero_ = std::move(zero);
  }
  bool has_backing() const { return static_cast<bool>(backing_); }
  bool has_backing_zero() const { return static_cast<bool>(backing_zero_); }

  // Whether guest range [offset, +len) inside one cluster whose L2 entry is
  // `entry`/`bitmap` reads as zeros, judged from metadata alone. A copy of
  // such a range into a never-written host cluster can be skipped.
  absl::StatusOr<bool> KnownZero(uint64_t entry, uint64_t bitmap,
                                 uint64_t offset, uint64_t len);
  // Plans filling `dest` with the current contents of guest range
  // [offset, +len) inside one cluster whose L2 entry is `entry`/`bitmap`.
  absl::Status PlanReadOld(uint64_t entry, uint64_t bitmap, uint64_t offset,
                           uint8_t* dest, uint64_t len, IoPlan* plan);

 private:
  // The layer's state, and the part this one calls (not owned).
  Qcow2State* const s_;
  ExtentReader* const reader_;  // compressed clusters
  BackingPlanner backing_;      // the chain below; null at the bottom
  BackingZero backing_zero_;    // null at the bottom
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_COW_PLANNER_H_
