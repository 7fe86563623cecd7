// SPDX-License-Identifier: Apache-2.0
// Empties a qcow2 layer, as QEMU's bdrv_make_empty does after a commit:
// every L2 entry is cleared, so that the whole disk reads from the backing
// file again, and the host clusters they held are let go of.
#ifndef QCOW2_LIB_OPS_MAKE_EMPTY_H_
#define QCOW2_LIB_OPS_MAKE_EMPTY_H_

#include "absl/status/status.h"
#include "lib/driver/qcow2_layer.h"

namespace qcow2::internal {

// Clears every L2 entry of `layer` and releases its host clusters, then
// flushes: the entries are durable before the counts they let go of (a
// power cut part way leaves some entries cleared and leaks at most). The
// emptied L2 tables stay allocated, as QEMU's discard fallback leaves
// them. With an external data file, the clusters the entries named are
// discarded there after the flush (the data file keeps its size), as QEMU
// does. Meant for a top whose data is already in its backing file (a
// commit): any subset of cleared entries then reads the same.
// kUnimplemented with internal snapshots (their tables share clusters);
// kFailedPrecondition unless writable and open.
absl::Status MakeEmpty(Qcow2Layer* layer);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_OPS_MAKE_EMPTY_H_
