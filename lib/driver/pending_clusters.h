// SPDX-License-Identifier: Apache-2.0
// Writes under a byte-range lock, and deferred copy-on-write: the clusters
// of a qcow2 layer that hold guest data in a new host cluster but wait for
// their L2 entry ("pending"), and the rules that let a write hold only its
// own bytes.
//
// A write may hold only its own bytes (rounded to kFineLockBytes) rather
// than its whole clusters when, for every cluster it touches, nothing but
// those bytes will be written and no other request's plan can be made
// stale:
//  - the cluster is ours (COPIED data; with extended L2, every subcluster
//    touched allocated or covered whole): the write goes in place;
//  - the cluster is *pending*: given a host cluster by an earlier write
//    that deferred its copy-on-write (below);
//  - the write may defer its cluster's L2 entry (no host cluster here;
//    the write partial and aligned to kFineLockBytes, and with extended
//    L2 to subclusters; with standard L2 a backing chain; and, with
//    `stream`, the write continuing a recent write or landing in a
//    recently written cluster). A lone write into a new cluster holds
//    the whole cluster instead: with extended L2 that is cheaper than a
//    pending cluster, and with standard L2 it copies at once what a
//    flush would copy later.
// A deferred write allocates the host cluster and writes only its own
// bytes; the cluster stays out of the L2 table, *pending*, with a map of
// which kFineLockBytes units hold guest data. Reads map covered units to
// the new cluster and the rest as the old entry says. With standard L2,
// when writes have covered every unit and none is in flight, the L2
// entry is set: a run of small sequential writes fills a cluster without
// reading the backing file (deferred copy-on-write). With extended L2
// the entry is set, covered subclusters allocated, as soon as no write
// is in flight: the stream's other writes into the cluster need not wait
// for its first.
// The index of pending clusters is a part of its own (PendingIndex), which
// the reader consults to map them; this part makes and settles them.
// A flush (or a cluster-wide request on the cluster, or Close) copies
// the uncovered units from the chain below (standard L2 only) and sets
// the entry; a flush does not wait for writes in flight into the cluster
// (they may belong to another queue, whose thread must poll to finish
// them): it writes their bytes too (PlanFill). A flush plans the fill
// under the lock and its executor carries it out without it; while it
// does, the cluster is *filling* and writes into it need the whole
// cluster, which the flush holds in the lock list (Chain::PlanFill).
#ifndef QCOW2_LIB_DRIVER_PENDING_CLUSTERS_H_
#define QCOW2_LIB_DRIVER_PENDING_CLUSTERS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/io/io_plan.h"
#include "lib/layer/layer.h"
#include "lib/meta/cluster_map.h"
#include "lib/driver/pending_index.h"
#include "lib/driver/qcow2_state.h"

namespace qcow2::internal {

class CowPlanner;
class FlushSequencer;
class HeaderWriter;
class HostSpace;
class MetadataGuard;

// Every method runs under the image's metadata lock. Clusters become
// pending only in a writable layer (PlanPendingWrite REQUIRES one); in any
// other, the other methods find none.
class PendingClusters {
 public:
  static constexpr uint32_t kFineLockBits = PendingIndex::kFineLockBits;
  static constexpr uint64_t kFineLockBytes = PendingIndex::kFineLockBytes;
  // At most this many clusters are pending at once.
  static constexpr size_t kMaxPending = 128;
  using UnitBits = PendingIndex::UnitBits;

  // The parts are the layer's and outlive this; `index` is changed by
  // this part alone.
  PendingClusters(Qcow2State* s, const MetadataGuard* guard,
                  PendingIndex* index, CowPlanner* cow,
                  FlushSequencer* flusher, HostSpace* host_space,
                  HeaderWriter* header_writer)
      : s_(s),
        guard_(guard),
        index_(index),
        cow_(cow),
        flusher_(flusher),
        host_space_(host_space),
        header_writer_(header_writer) {}

  // Whether a write of guest range [offset, +len) may hold only its own
  // bytes (see above); false for a layer not writable, closed or marked
  // corrupt. Looks at cached metadata only (no I/O).
  bool FineWritable(uint64_t offset, uint64_t len, bool stream);
  // Remembers where a write ends, for the `stream` test above.
  void NoteWriteBegun(uint64_t offset, uint64_t len);

  bool empty() const { return index_->empty(); }
  bool Contains(uint64_t cluster) const { return index_->Contains(cluster); }
  // The pending clusters, in guest order.
  std::vector<uint64_t> Clusters() const { return index_->Clusters(); }
  // Whether a pending cluster lies in guest range [offset, +len).
  bool HasPendingIn(uint64_t offset, uint64_t len) const {
    return index_->HasPendingIn(offset, len, s_->geometry().cluster_bits);
  }

  // Plans a write of `data` at `in_cluster` into pending `cluster`, or
  // allocates its host cluster and makes it pending (FineWritable allowed
  // the write to defer the L2 entry). The plan's commit or abort ends the
  // write; the last write to end commits a covered cluster. `ref` is the
  // cluster's entry as WritePlanner::L2ForWrite just returned it, given
  // when the cluster is not pending yet (kInternal if it is missing then).
  // REQUIRES: the caller holds the write's bytes (fine lock).
  absl::Status PlanPendingWrite(uint64_t cluster, uint64_t in_cluster,
                                absl::Span<const uint8_t> data, IoPlan* plan,
                                L2Ref* ref = nullptr);

  // Fills and commits every pending cluster (a flush, Close), writes in
  // flight into them included: see Materialize. No-op for a layer not
  // writable, closed or marked corrupt.
  absl::Status SettleAllPending();
  // The layer's flush: SettleAllPending, then FlushSequencer::Flush (the
  // metadata written back in order, the file flushed).
  absl::Status SettleAndFlush();
  // Plans the fill of a pending cluster into `plan`: reads of its
  // uncovered units from the chain below (standard L2 only), their writes
  // into its host cluster, and writes of copies of the bytes of writes in
  // flight into it. Marks it filling until the plan's commit (which sets
  // its L2 entry) or abort (which leaves it pending). The caller holds the
  // lock, and keeps other requests off the whole cluster until then.
  absl::Status PlanFill(uint64_t cluster, IoPlan* plan);
  // PlanFill, carried out at once (blocking I/O, under the caller's lock)
  // and committed.
  absl::Status Materialize(uint64_t cluster);
  // For a request that holds guest range [offset, +len) whole (a write
  // not allowed a byte-range lock, write-zeroes, discard), before it
  // plans: drops the pending clusters inside the range whole (their host
  // clusters freed) and plans the fill of those it covers in part into
  // `plan` (PlanFill), or commits such a fill at once when it has nothing
  // to copy. The caller carries out the plan, commits it, and only then
  // plans the request, which finds no pending cluster in its range.
  absl::Status PlanFillsFor(uint64_t offset, uint64_t len, IoPlan* plan);
  // Materializes the pending clusters in guest range [offset, +len); with
  // `drop_whole`, those inside it whole are dropped instead (the caller
  // overwrites them), their host clusters freed.
  // With `fills`, the fills are planned into it instead (PlanFillsFor).
  absl::Status SettlePendingIn(uint64_t offset, uint64_t len, bool drop_whole,
                               IoPlan* fills = nullptr);

 private:
  using PendingWrite = PendingIndex::Write;
  using PendingCluster = PendingIndex::Cluster;
  // A write in flight as one word, (guest cluster, first unit): a cluster
  // is below 2^55 (guest offsets below 2^64, clusters of 512 bytes or
  // more), a unit below 2^9 (clusters of 2 MiB or less).
  static constexpr uint32_t kUnitKeyBits = 9;
  static_assert(((2u << 20) >> kFineLockBits) <= (1u << kUnitKeyBits));
  static uint64_t WriteKey(uint64_t cluster, uint64_t unit) {
    return cluster << kUnitKeyBits | unit;
  }
  // What a write may do under a byte-range lock in one cluster (see the
  // file comment): nothing, write in place, write into the pending
  // cluster, or defer the cluster's L2 entry.
  enum class FineKind { kNone, kInPlace, kPending, kDefer };

  // FineWritable's test for the part of a write inside one cluster.
  FineKind ClassifyFine(uint64_t cluster, uint64_t in_cluster, uint64_t len,
                        bool stream);
  // The end of a PlanPendingWrite write (commit or abort): the units it
  // covered first are uncovered again when it failed. Commits
  // the cluster when no write into it is in flight and it is covered
  // (with extended L2: covered at all), and frees it when nothing covers
  // it.
  absl::Status FinishPendingWrite(uint64_t key, bool ok);  // WriteKey
  // Sets a pending cluster's L2 entry: every unit holds its data (standard
  // L2), or covered subclusters become allocated (extended L2).
  absl::Status CommitPending(uint64_t cluster);

  // The layer's state, and the parts this one calls (not owned).
  Qcow2State* const s_;
  const MetadataGuard* const guard_;
  PendingIndex* const index_;
  CowPlanner* const cow_;
  FlushSequencer* const flusher_;
  HostSpace* const host_space_;
  HeaderWriter* const header_writer_;
  // Where the last few writes begun end (guest offsets), for FineWritable.
  std::array<uint64_t, 8> recent_ends_{};
  size_t recent_next_ = 0;  // the slot of recent_ends_ written next
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_PENDING_CLUSTERS_H_
