// SPDX-License-Identifier: Apache-2.0
// The read side of a qcow2 layer: maps guest ranges to extents through the
// L1 and L2 tables (and the pending clusters' index), checking every entry
// it meets,
// and reads compressed clusters, decompressing each once.
#ifndef QCOW2_LIB_DRIVER_EXTENT_READER_H_
#define QCOW2_LIB_DRIVER_EXTENT_READER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/io/io_plan.h"
#include "lib/layer/layer.h"
#include "lib/meta/cluster_map.h"
#include "lib/driver/metadata_guard.h"
#include "lib/driver/pending_index.h"
#include "lib/driver/qcow2_state.h"

namespace qcow2::internal {

class ExtentReader {
 public:
  // The parts are the layer's and outlive this. The reader only looks at
  // `pending` (PendingClusters changes it).
  ExtentReader(Qcow2State* s, const MetadataGuard* guard,
               const PendingIndex* pending)
      : s_(s), guard_(guard), pending_(pending) {}

  // Layer::Map: the run of one kind starting at guest `offset`, at most
  // `max_len` bytes. A run goes on across the entries of one L2 slice.
  // REQUIRES: offset < the virtual size, max_len > 0.
  absl::StatusOr<Extent> Map(uint64_t offset, uint64_t max_len);

  // Maps within the one cluster whose L2 entry `ref` names, starting at
  // `offset`, after checking the entry (MetadataGuard::ValidateEntry).
  absl::StatusOr<Extent> MapInCluster(const L2Ref& ref, uint64_t offset,
                                      uint64_t max_len);

  // Copies guest bytes at `offset` out of the compressed cluster of L2
  // entry `entry` into `buf`, through a one-cluster memo (decompressing
  // only when the entry differs from the last one).
  // REQUIRES: `buf` does not cross the cluster's end.
  absl::Status ReadFromCompressed(uint64_t entry, uint64_t offset,
                                  absl::Span<uint8_t> buf);

  // Plans reading guest bytes [offset, offset+len) out of one compressed
  // cluster into `dest` (decompressing each cluster once per plan; the
  // plan's commit refreshes the memo).
  absl::Status PlanCompressedRead(uint64_t entry, uint64_t offset,
                                  uint8_t* dest, uint64_t len, IoPlan* plan,
                                  IoCategory category);

 private:
  // kFailedPrecondition for a locked encrypted image (Qcow2State::locked).
  absl::Status CheckUnlocked() const;
  // Maps inside the pending cluster `p` that holds guest `offset`: covered
  // units to its new host cluster, the rest as its old L2 entry says.
  absl::StatusOr<Extent> MapPending(const PendingIndex::Cluster& p,
                                    uint64_t offset, uint64_t max_len);
  // Reads and decompresses the cluster of `entry` into `cluster_out`.
  absl::Status ReadCompressed(uint64_t entry, uint8_t* cluster_out);

  // The layer's state, and the parts this one calls (not owned).
  Qcow2State* const s_;
  const MetadataGuard* const guard_;
  const PendingIndex* const pending_;
  // The most recently decompressed cluster, for small sequential reads.
  uint64_t decompressed_entry_ = 0;
  std::vector<uint8_t> decompressed_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_EXTENT_READER_H_
