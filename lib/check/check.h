// SPDX-License-Identifier: Apache-2.0
// Refcount consistency check and repair of one qcow2 image: the equivalent
// of `qemu-img check [-r leaks|all]`, with the same verdicts, counters and
// message lines as QEMU 7.2.
//
// What is checked: every host cluster's reference count is recomputed from
// the header, the active L1 table and its L2 tables (standard and extended
// entries; every host cluster a compressed descriptor touches counts one
// reference), the internal snapshot table and each snapshot's L1/L2
// tables, persistent bitmaps, the refcount table and the refcount blocks,
// and compared with the stored counts. Also checked: reserved bits in L1,
// L2 and refcount table entries, alignment of L2 tables, data clusters and
// refcount blocks, references past the end of the file, subcluster bitmaps,
// and the COPIED flag of L1 and L2 entries (set iff the refcount is 1). A
// cluster used as two things (two L2 entries, or an L2 table and a data
// cluster, ...) shows up as "refcount=1 reference=2", as in QEMU, plus a
// descriptive line when metadata is involved.
//
// Repairs (REQUIRES: `file` is writable):
//  - kLeaks: refcounts that are too high are lowered in place; COPIED flags
//    are fixed only when nothing else is wrong (QEMU's rule).
//  - kAll: also too-low refcounts are raised in place and COPIED flags are
//    fixed; preallocated zero clusters with a misaligned offset become plain
//    zero clusters. When the refcount structure itself is broken (a
//    referenced cluster with refcount 0, a bad or shared refcount block,
//    reserved bits in the refcount table) a complete new structure is built:
//    new refcount blocks and table are written past the end of the file and
//    flushed, then the header is switched to them in one write and flushed;
//    the old structure becomes free space. Guest data is never moved or
//    overwritten.
//  - After a repair without remaining corruptions, the dirty and corrupt
//    header bits are cleared.
// Like qemu-img, when anything was repaired the image is checked again
// read-only and that second check's counters are returned (with the
// *_fixed counters of the repair pass).
//
// Memory: one 16-bit counter per host cluster up to the end of the file
// (counts above 65534 spill into a map); images whose file end implies more
// than 2^28 clusters are refused. Refcount blocks are streamed.
//
// Not thread-safe; nothing else may use the image while it is checked.
#ifndef QCOW2_LIB_CHECK_CHECK_H_
#define QCOW2_LIB_CHECK_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "qcow2/file.h"
#include "qcow2/types.h"

namespace qcow2::internal {

// The public types (qcow2/types.h), under the checker's names.
using RepairMode = ::qcow2::RepairMode;
using CheckResult = ::qcow2::CheckReport;

// Most clusters (file end / cluster size) CheckImage accepts.
inline constexpr uint64_t kMaxCheckClusters = 1ull << 28;

// Checks the qcow2 image in `file` and, with `mode` != kNone, repairs it
// (see above). Returns an error status only when the image cannot be
// checked at all: not qcow2 (kInvalidArgument), unreadable or invalid
// header or table pointers (kDataLoss), unsupported features such as
// encryption or an external data file (kUnimplemented), more than
// kMaxCheckClusters clusters (kResourceExhausted), or a failed read of the
// header. Problems found in the image are reported in the result.
absl::StatusOr<CheckResult> CheckImage(File* file, RepairMode mode);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CHECK_CHECK_H_
