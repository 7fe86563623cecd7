// SPDX-License-Identifier: Apache-2.0
// The index of a qcow2 layer's pending clusters: guest clusters given a
// new host cluster by a write that deferred their L2 entry (deferred
// copy-on-write, pending_clusters.h), with the map of which kFineLockBytes
// units hold guest data and the writes in flight into each. The reader
// consults it read-only (ExtentReader::Map); PendingClusters, which makes
// and settles pending clusters, is the only part that changes it.
#ifndef QCOW2_LIB_DRIVER_PENDING_INDEX_H_
#define QCOW2_LIB_DRIVER_PENDING_INDEX_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "lib/meta/cluster_map.h"

namespace qcow2::internal {

// Used under the image's metadata lock, as the layer is.
class PendingIndex {
 public:
  static constexpr uint32_t kFineLockBits = 12;
  static constexpr uint64_t kFineLockBytes = uint64_t{1} << kFineLockBits;
  // One bit per kFineLockBytes unit of a cluster, for clusters of up to
  // 2 MiB (qcow2's largest): fixed, so that a write allocates none.
  using UnitBits = std::array<uint64_t, (2u << 20) / kFineLockBytes / 64>;

  static bool TestBit(const UnitBits& bits, uint64_t i) {
    return (bits[i / 64] >> (i % 64)) & 1;
  }

  // A write planned into a pending cluster. The writes in flight into one
  // cluster hold disjoint byte ranges (kFineLockBytes units), so where a
  // write starts names it among them.
  struct Write {
    uint64_t in_cluster = 0;        // where the write starts in its cluster
    const uint8_t* data = nullptr;  // the request's buffer, valid until it
                                    // finishes
    uint64_t len = 0;               // bytes
    UnitBits newly{};  // the units it covered first (uncovered on failure)
  };
  struct Cluster {
    L2Ref ref;                                // the cluster's L2 entry, pinned
    uint64_t host = 0;                        // the host cluster given to it
    UnitBits covered{};                       // one bit per kFineLockBytes unit
    uint32_t covered_units = 0;               // bits set in `covered`
    absl::InlinedVector<Write, 1> in_flight;  // planned, not finished
    bool virgin = false;  // the host cluster never held anything
    // A fill planned by PendingClusters::PlanFill is in flight: the fill,
    // not the last write to finish, commits the cluster.
    bool filling = false;
  };

  bool empty() const { return clusters_.empty(); }
  size_t size() const { return clusters_.size(); }
  bool Contains(uint64_t cluster) const { return clusters_.contains(cluster); }
  // The pending cluster `cluster` (a guest cluster number), or null.
  const Cluster* Find(uint64_t cluster) const;
  Cluster* Find(uint64_t cluster);
  // The pending clusters, in guest order.
  std::vector<uint64_t> Clusters() const;
  // The pending clusters in [first, last] (guest cluster numbers), in
  // order: probed one by one when the range is short, else found by a
  // walk of the map.
  absl::InlinedVector<uint64_t, 4> Between(uint64_t first, uint64_t last) const;
  // Whether a pending cluster lies in guest range [offset, +len), for
  // clusters of 2^`cluster_bits` bytes.
  bool HasPendingIn(uint64_t offset, uint64_t len, uint32_t cluster_bits) const;
  // The length of [offset, +len) before the first pending cluster after
  // `offset`'s own.
  uint64_t ClipAtPending(uint64_t offset, uint64_t len,
                         uint32_t cluster_bits) const;

  // Makes `cluster` pending (built in place, not moved) and returns it.
  Cluster& Add(uint64_t cluster) {
    return clusters_.try_emplace(cluster).first->second;
  }
  void Remove(uint64_t cluster) { clusters_.erase(cluster); }

 private:
  absl::flat_hash_map<uint64_t, Cluster> clusters_;  // by guest cluster
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_PENDING_INDEX_H_
