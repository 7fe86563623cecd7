// SPDX-License-Identifier: Apache-2.0
// Plans writes into a qcow2 layer: what to allocate (host clusters, L2
// tables), what to copy from where (copy-on-write), what to write, and
// which L2 entries to change once the data is written. The plan is made
// under the image's metadata lock; its I/O runs without it (lib/engine).
#ifndef QCOW2_LIB_DRIVER_WRITE_PLANNER_H_
#define QCOW2_LIB_DRIVER_WRITE_PLANNER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/io/io_plan.h"
#include "lib/meta/cluster_map.h"
#include "lib/driver/qcow2_state.h"
#include "qcow2/options.h"

namespace qcow2::internal {

class CowPlanner;
class FlushSequencer;
class HeaderWriter;
class HostSpace;
class MetadataGuard;
class PendingClusters;

// PlanWrite and Preallocate check that the layer is writable and open
// (kFailedPrecondition); the other planning methods REQUIRE it.
class WritePlanner {
 public:
  // Clusters one probe looks at when it has no ProbeProgress to go on with.
  static constexpr uint64_t kProbeClusters = 1024;

  // The parts are the layer's and outlive this.
  WritePlanner(Qcow2State* s, const MetadataGuard* guard,
               HeaderWriter* header_writer, HostSpace* host_space,
               FlushSequencer* flusher, CowPlanner* cow,
               PendingClusters* pending)
      : s_(s),
        guard_(guard),
        header_writer_(header_writer),
        host_space_(host_space),
        flusher_(flusher),
        cow_(cow),
        pending_(pending) {}

  // Plans the write of `data` at guest `offset`: allocations happen now
  // (in memory), copy-on-write reads and data writes go into `plan`, and
  // L2 updates into its commits. The caller holds the guest clusters
  // exclusively until the plan is committed or aborted; with `fine`, it
  // holds only the write's own bytes (rounded to kFineLockBytes), which
  // PendingClusters::FineWritable() must have allowed under the same
  // lock. Under a MissDeferral, what planning needs is probed first
  // (ProbeChange), all of the write's clusters, going on from `probe` when
  // given.
  absl::Status PlanWrite(uint64_t offset, absl::Span<const uint8_t> data,
                         IoPlan* plan, bool fine = false,
                         ProbeProgress* probe = nullptr);

  // Plans the write of guest cluster `offset` (cluster-aligned) stored as
  // the compressed cluster `stream` (CompressCluster's output, shorter
  // than a cluster), packed into host clusters as QEMU packs them: each
  // stream starts where the last one ended (on a block of its own when
  // the file needs aligned I/O), runs on into the next host cluster when
  // that one is free, and every host cluster it touches counts it once.
  // The stream is written before the L2 entry names it; an old host
  // cluster the entry named is let go of after the entry changes (QEMU
  // refuses to overwrite an allocated cluster with EIO; we replace it as
  // any allocating write does). With extended L2 entries the bitmap
  // becomes 0. Under a MissDeferral, probes first as PlanWrite does.
  absl::Status PlanWriteCompressed(uint64_t offset,
                                   absl::Span<const uint8_t> stream,
                                   uint64_t guest_len, IoPlan* plan,
                                   ProbeProgress* probe = nullptr);

  // The host cluster a new data cluster for guest `cluster` goes to: its
  // guest offset in an external data file (no refcount), else a free
  // cluster of the image file (freed again if the plan is abandoned).
  // `*virgin`: nothing was ever written there, so it reads as zeros.
  absl::StatusOr<uint64_t> AllocateData(uint64_t cluster, IoPlan* plan,
                                        bool* virgin);

  // PlanWrite's step for the part of the write inside one guest cluster.
  // Errors are returned as they are (not passed to Fail).
  absl::Status PlanWriteCluster(uint64_t cluster, uint64_t in_cluster,
                                absl::Span<const uint8_t> data, IoPlan* plan,
                                bool fine = false);

  // Under a MissDeferral that may defer now (the plan still empty), looks
  // up what changing guest range [offset, +len) will need, changing
  // nothing: its L2 slices, the refcount blocks of host clusters it may
  // free (compressed or shared ones; with `frees_owned`, ours too), and
  // for clusters it covers only in part, the tables below that say what
  // to copy; and, if it may allocate, the refcount blocks the search for a
  // free cluster meets.
  // The first of these not cached stops it with the deferred miss, to be
  // read with no lock held; any other error is left to the planning that
  // follows.
  // With `progress`, every cluster of the range, from where earlier rounds
  // of the request got; else kProbeClusters at most.
  absl::Status ProbeChange(uint64_t offset, uint64_t len, bool frees_owned,
                           ProbeProgress* progress = nullptr);

  // The L2 entry of guest `cluster`, in a table this layer owns alone:
  // allocates a table (fresh, or a private copy of a shared one) if
  // needed, and checks an existing entry before anything is allocated.
  absl::StatusOr<L2Ref> L2ForWrite(uint64_t cluster);
  // Drops the reference the (validated) L2 entry `entry`/`bitmap` of guest
  // offset `guest` holds on its host cluster(s).
  absl::Status ReleaseHost(uint64_t entry, uint64_t bitmap, uint64_t guest);

  // Allocates every guest cluster (metadata) and, for kFalloc/kFull, the
  // host space under it, then flushes. For freshly created images.
  absl::Status Preallocate(Preallocation mode);

  // Preallocates the range [from, to) a grow added (qemu-img resize
  // --preallocation): every guest cluster of it no entry maps gets a data
  // cluster, zeroed on disk (written for kFull, and wherever it lies
  // inside the old file; reserved for kFalloc) and flushed before the
  // entries naming it are set; then flushes. REQUIRES: no backing file
  // (the clusters would hide its data).
  absl::Status PreallocateGrown(uint64_t from, uint64_t to,
                                Preallocation mode);

  // Shrinks the virtual size to `new_size` (a multiple of 512): clears
  // every L2 entry past it and lets go of its host clusters, flushes
  // (entries before counts), then writes the header's size. The emptied
  // L2 tables stay allocated. kUnimplemented with internal snapshots.
  // REQUIRES: no pending clusters (the caller flushed).
  absl::Status Shrink(uint64_t new_size);

 private:
  // Takes `len` bytes (< a cluster) of host space for a compressed
  // stream: in the cluster being packed (s_->compressed_next), or a new
  // one; the refcount of every host cluster the bytes touch goes up by
  // one (in the cache). Returns the host byte offset.
  absl::StatusOr<uint64_t> AllocateCompressedBytes(uint64_t len);
  // Zeroes host clusters [host, +len) for PreallocateGrown.
  absl::Status ZeroHostRun(uint64_t host, uint64_t len, uint64_t old_file_size,
                           Preallocation mode);
  // Writes into subclusters of the cluster at host `entry` (ours, or
  // `fresh` just allocated for it), padding to subcluster boundaries.
  absl::Status PlanSubclusters(const L2Ref& ref, uint64_t entry,
                               uint64_t bitmap, uint64_t cluster,
                               uint64_t in_cluster,
                               absl::Span<const uint8_t> data, bool fresh,
                               bool virgin, IoPlan* plan);
  // One cluster of ProbeChange; counts it in *allocations if changing it
  // may allocate (an L2 table, or a host cluster).
  absl::Status ProbeCluster(uint64_t cluster, bool partial, bool frees_owned,
                            uint64_t* allocations);
  // Puts every slice of a new L2 table at `table` in the cache, dirty:
  // zeros, or a copy of `old_table`'s (when not 0).
  absl::Status FillNewTable(uint64_t table, uint64_t old_table);

  // The layer's state, and the parts this one calls (not owned).
  Qcow2State* const s_;
  const MetadataGuard* const guard_;
  HeaderWriter* const header_writer_;
  HostSpace* const host_space_;
  FlushSequencer* const flusher_;
  CowPlanner* const cow_;
  PendingClusters* const pending_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_WRITE_PLANNER_H_
