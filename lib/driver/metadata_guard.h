// SPDX-License-Identifier: Apache-2.0
// Checks that keep a qcow2 layer from acting on inconsistent metadata: L2
// entries are validated before any path uses them, and guest data is never
// written over (nor a cluster freed from under) the image's own tables.
#ifndef QCOW2_LIB_DRIVER_METADATA_GUARD_H_
#define QCOW2_LIB_DRIVER_METADATA_GUARD_H_

#include <cstdint>

#include "absl/status/status.h"
#include "lib/driver/qcow2_state.h"

namespace qcow2::internal {

// Stateless: every check reads the shared state only. Each failure is
// kDataLoss naming the file, so that the caller's Fail() marks the image
// corrupt.
class MetadataGuard {
 public:
  explicit MetadataGuard(const Qcow2State* s) : s_(s) {}

  // Checks an L2 entry (and its subcluster bitmap) before it is acted on,
  // by the read and the write path alike: reserved bits, host offsets
  // unaligned, in the header cluster or past the end of the file, COPIED
  // without an offset, inconsistent bitmaps, compressed descriptors outside
  // the image. Returns kDataLoss naming the entry, `guest_offset` and the
  // file.
  absl::Status ValidateEntry(uint64_t entry, uint64_t bitmap,
                             uint64_t guest_offset) const;

  // kDataLoss if the host cluster of `entry` (not compressed) holds
  // metadata: freeing it, or writing it, would destroy that metadata.
  // REQUIRES: the layer is writable (the metadata set exists).
  absl::Status CheckNotMetadata(uint64_t entry, uint64_t guest) const;

  // kDataLoss if guest data written at [host, host + len) would land on
  // the header, the L1 table, an L2 table, the refcount table or a
  // refcount block. O(clusters touched): one hash probe each.
  // REQUIRES: the layer is writable.
  absl::Status CheckDataTarget(uint64_t host, uint64_t len) const;

  // Host offsets at or past this lie past the end of the file: its size at
  // open time, raised by every cluster allocated since.
  uint64_t HostLimit() const;

 private:
  // ValidateEntry for an image with an external data file: no compressed
  // clusters, and every host cluster at its guest cluster's offset.
  absl::Status ValidateDataFileEntry(uint64_t entry, uint64_t bitmap,
                                     uint64_t guest_offset) const;

  const Qcow2State* const s_;  // the layer's; outlives this
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_METADATA_GUARD_H_
