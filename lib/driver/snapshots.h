// SPDX-License-Identifier: Apache-2.0
// Internal snapshots of a qcow2 layer: list, create, apply (revert to) and
// delete, as QEMU's block/qcow2-snapshot.c does them, through the layer's
// own refcounts, L2 cache and header writer.
//
// Every operation first flushes the layer, and leaves it flushed. The
// order of the writes (docs/snapshots.md) keeps the image consistent at a
// power cut: before the one header write that commits the change, only
// clusters leak; after it, the old structures are let go of.
//
// Not thread-safe: called under the image's metadata lock, with no request
// in flight (the engine refuses while a Queue is open).
#ifndef QCOW2_LIB_DRIVER_SNAPSHOTS_H_
#define QCOW2_LIB_DRIVER_SNAPSHOTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/format/header.h"
#include "lib/format/snapshot_table.h"
#include "qcow2/file.h"
#include "qcow2/types.h"

namespace qcow2::internal {

class Qcow2Layer;

// What a new snapshot records besides the image's state.
struct NewSnapshot {
  std::string name;
  std::string id;  // "" = QEMU's choice (largest numeric id + 1)
  uint32_t date_sec = 0;
  uint32_t date_nsec = 0;
  uint64_t vm_clock_nsec = 0;
  uint64_t icount = 0;  // qemu-img records 0
};

// REQUIRES for the three below: the layer is writable.
// Returns the entry as written. kAlreadyExists for an id in use;
// kOutOfRange past 65536 snapshots or a 64 MiB table.
absl::StatusOr<SnapshotEntry> CreateSnapshot(Qcow2Layer* layer,
                                             const NewSnapshot& sn);
// Reverts the active image to the snapshot whose id, else whose name, is
// `key` (the disk size becomes the snapshot's). kNotFound if none.
absl::Status ApplySnapshot(Qcow2Layer* layer, const std::string& key);
// Deletes the snapshot whose id, else whose name, is `key`. kNotFound if
// none.
absl::Status DeleteSnapshot(Qcow2Layer* layer, const std::string& key);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_SNAPSHOTS_H_
