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
#ifndef QCOW2_LIB_DRIVER_CHECK_H_
#define QCOW2_LIB_DRIVER_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "qcow2/file.h"

namespace qcow2::internal {

enum class RepairMode { kNone, kLeaks, kAll };

// Most clusters (file end / cluster size) CheckImage accepts.
inline constexpr uint64_t kMaxCheckClusters = 1ull << 28;

struct CheckResult {
  uint64_t corruptions = 0, leaks = 0, check_errors = 0;
  uint64_t corruptions_fixed = 0, leaks_fixed = 0;
  uint64_t image_end_offset = 0, total_clusters = 0, allocated_clusters = 0,
           fragmented_clusters = 0, compressed_clusters = 0;
  // Human lines, in order, like the ones qemu-img prints to stderr
  // ("ERROR cluster 5 refcount=1 reference=2", "Leaked cluster 9
  // refcount=1 reference=0", "Repairing ...").
  std::vector<std::string> messages;
  // Non-empty when the check stopped before the end (QEMU's check returns
  // -errno; qemu-img then prints "Check failed: <this>" and exits 1). The
  // counters are then partial.
  std::string failure;
  // True when a repair changed something and the image was checked a
  // second time; messages[recheck_first_message...] are that check's.
  bool rechecked = false;
  size_t recheck_first_message = 0;
};

// Checks the qcow2 image in `file` and, with `mode` != kNone, repairs it
// (see above). Returns an error status only when the image cannot be
// checked at all: not qcow2 (kInvalidArgument), unreadable or invalid
// header or table pointers (kDataLoss), unsupported features such as
// encryption or an external data file (kUnimplemented), more than
// kMaxCheckClusters clusters (kResourceExhausted), or a failed read of the
// header. Problems found in the image are reported in the result.
absl::StatusOr<CheckResult> CheckImage(File* file, RepairMode mode);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_CHECK_H_
