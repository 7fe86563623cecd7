// SPDX-License-Identifier: Apache-2.0
// The length of a writable qcow2 layer's file: grown ahead of allocation so
// that writes into new clusters land inside it, and given back on Close.
#ifndef QCOW2_LIB_DRIVER_HOST_SPACE_H_
#define QCOW2_LIB_DRIVER_HOST_SPACE_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "lib/io/io_plan.h"
#include "lib/driver/qcow2_state.h"

namespace qcow2::internal {

// Used by the write path only: every method but GiveBackUnused REQUIRES a
// layer opened writable (refcounts exist).
class HostSpace {
 public:
  explicit HostSpace(Qcow2State* s) : s_(s) {}

  // Makes the file at least `end` bytes long, growing it ahead in steps
  // (a quarter of its length, 1 MiB to 256 MiB). A direct write that
  // extends a file waits on Linux file systems for every direct write in
  // flight; with the file grown ahead, writes into new clusters land
  // inside it and stay concurrent. The step is reserved where the file can
  // (fallocate for POSIX files), so such writes do not allocate blocks
  // either. GiveBackUnused() gives back what was not used.
  //
  // The step is only recorded in `plan` (IoPlan::grow_file): the executor
  // reserves it with no lock held (File::Reserve) before the plan's
  // writes; a fallocate of 256 MiB takes tens of milliseconds. Where
  // Reserve is not implemented, the file grows here (File::Extend).
  absl::Status GrowAhead(uint64_t end, IoPlan* plan);

  // A plan's grow (IoPlan::grow_file) could not reserve (`reserve`: no
  // fallocate, or no room): under the lock, makes the file long enough by
  // a size change instead, to past every cluster allocated so far (no
  // write in flight lies beyond that), and after kUnimplemented grows
  // under the lock from then on.
  absl::Status GrowWithoutReserve(const absl::Status& reserve);

  // Called when a write into the host cluster at `host` has committed (a
  // new cluster) or is planned (in place): the file must keep that
  // cluster.
  void NoteDataWritten(uint64_t host) {
    if (s_->has_data_file()) return;  // the data is in the data file
    data_end_ = std::max(data_end_, host + s_->geometry().cluster_size);
  }

  // For Close: gives back the room grown ahead and not used. The file
  // keeps its size at open, every cluster a committed write went to, and
  // every cluster ever given to metadata. Nothing to do if never grown.
  // REQUIRES: no write in flight; everything flushed.
  absl::Status GiveBackUnused();

 private:
  Qcow2State* const s_;  // the layer's; outlives this
  // The file's length as last set by GrowAhead (0: never grown), perhaps
  // still being reserved by a plan's executor.
  uint64_t grown_to_ = 0;
  // File::Reserve said kUnimplemented: GrowAhead extends under the lock.
  bool reserve_unsupported_ = false;
  // End of the furthest host cluster written to: new clusters when their
  // write commits, clusters already ours when a write into them is planned.
  uint64_t data_end_ = 0;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_HOST_SPACE_H_
