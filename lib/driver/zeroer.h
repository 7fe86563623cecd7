// SPDX-License-Identifier: Apache-2.0
// Write-zeroes and discard for a qcow2 layer: zero flags, zero subcluster
// bitmaps, zero bytes where neither will do, and releasing host clusters.
#ifndef QCOW2_LIB_DRIVER_ZEROER_H_
#define QCOW2_LIB_DRIVER_ZEROER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/driver/qcow2_state.h"
#include "lib/io/io_plan.h"

namespace qcow2::internal {

class CowPlanner;
class ExtentReader;
class HeaderWriter;
class HostSpace;
class MetadataGuard;
class PendingClusters;
class WritePlanner;

class Zeroer {
 public:
  // Zero() stops a round after this many windows of kProbeClusters.
  static constexpr int kZeroRoundWindows = 4;

  // The parts are the layer's and outlive this.
  Zeroer(Qcow2State* s, const MetadataGuard* guard, HeaderWriter* header_writer,
         HostSpace* host_space, ExtentReader* reader, CowPlanner* cow,
         PendingClusters* pending, WritePlanner* writer)
      : s_(s),
        guard_(guard),
        header_writer_(header_writer),
        host_space_(host_space),
        reader_(reader),
        cow_(cow),
        pending_(pending),
        writer_(writer) {}

  // Makes the range read as zeros; with `free_clusters`, host clusters of
  // fully covered clusters are released. Metadata changes are made at
  // once. Zero bytes written into part of a cluster (or, with extended
  // L2, of a subcluster), and into whole clusters on version 2 images (no
  // zero flag there), are planned into `plan`: the caller runs and commits
  // it, holding the clusters. kFailedPrecondition unless the layer is
  // writable and open.
  //
  // Under a MissDeferral, the range is changed a window of kProbeClusters
  // at a time, each probed first (WritePlanner::ProbeChange): a miss there
  // stops the call with the deferred miss, and `*done` says how far it
  // got; call again with the same `done` once the entry is in.
  //
  // With `more`, the call also stops after a window that put I/O into the
  // plan, or after kZeroRoundWindows windows, and sets `*more` when part
  // of the range is left: the caller carries out and commits the plan,
  // then calls again with the same `done` and an empty plan. So a long
  // range is changed in rounds, each bounded in the metadata it touches
  // and the time it holds the caller's lock.
  absl::Status Zero(uint64_t offset, uint64_t len, bool free_clusters,
                    IoPlan* plan, uint64_t* done = nullptr,
                    bool* more = nullptr);

 private:
  // Zero's walk over [offset, +len), changing as it goes.
  absl::Status ZeroRange(uint64_t offset, uint64_t len, bool free_clusters,
                         IoPlan* plan);
  // One whole cluster: its zero flag (bitmap with extended L2), or zero
  // bytes on version 2 images.
  absl::Status ZeroCluster(uint64_t cluster, bool free_clusters, IoPlan* plan);
  // Part of one cluster, with extended L2: zero flags for the whole
  // subclusters, zero bytes around them.
  absl::Status ZeroSubclusters(uint64_t cluster, uint64_t in_cluster,
                               uint64_t len, IoPlan* plan);
  // The data file's cluster at `host`, which nothing maps any more, let
  // go (a hole punched) as QEMU lets it go, in the plan.
  void PlanPunch(uint64_t host, IoPlan* plan) const;
  // Whether [offset, +len) of this layer reads as zeros from metadata
  // alone (zero, or unallocated with no backing file).
  absl::StatusOr<bool> ReadsAsZeroHere(uint64_t offset, uint64_t len);

  // The layer's state, and the parts this one calls (not owned).
  Qcow2State* const s_;
  const MetadataGuard* const guard_;
  HeaderWriter* const header_writer_;
  HostSpace* const host_space_;
  ExtentReader* const reader_;
  CowPlanner* const cow_;
  PendingClusters* const pending_;
  WritePlanner* const writer_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_ZEROER_H_
