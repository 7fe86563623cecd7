// A qcow2 image file as one layer of a chain: open-time validation, the
// read-side mapping and, when opened writable, the write path
// (qcow2_write.cc) and refcounts (lib/refcount).
#ifndef QCOW2_LIB_QCOW2_QCOW2_LAYER_H_
#define QCOW2_LIB_QCOW2_QCOW2_LAYER_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "lib/meta/write_back_file.h"
#include "lib/layer/layer.h"
#include "lib/meta/cluster_map.h"
#include "lib/meta/metadata_set.h"
#include "lib/io/io_plan.h"
#include "lib/format/header.h"
#include "lib/meta/refcounts.h"
#include "qcow2/options.h"

namespace qcow2::internal {

class Qcow2Layer : public Layer {
 public:
  // Reads and validates the header and loads the L1 table. With
  // `opts.read_write`, also refuses images that must not be written.
  static absl::StatusOr<std::unique_ptr<Qcow2Layer>> Open(
      std::unique_ptr<File> file, const OpenOptions& opts);

  ~Qcow2Layer() override;

  uint64_t size() const override { return header_.size; }
  File* file() override { return file_.get(); }
  const std::string& filename() const override { return file_->name(); }
  absl::StatusOr<Extent> Map(uint64_t offset, uint64_t max_len) override;
  absl::Status ReadExtent(const Extent& e, uint64_t extent_start,
                          uint64_t offset, absl::Span<uint8_t> buf) override;
  LayerInfo Info() const override;
  std::string backing_file() const override { return header_.backing_file; }
  std::string backing_format() const override {
    return header_.backing_format.value_or("");
  }

  const Header& header() const { return header_; }
  const Geometry& geometry() const { return map_->geometry(); }
  ClusterMap& cluster_map() { return *map_; }
  Refcounts* refcounts() { return refcounts_.get(); }
  bool writable() const { return writable_; }

  // Plans reading guest bytes [offset, offset+len) out of one compressed
  // cluster into `dest` (decompressing each cluster once per plan).
  absl::Status PlanCompressedRead(uint64_t entry, uint64_t offset,
                                  uint8_t* dest, uint64_t len, IoPlan* plan,
                                  IoCategory category);

  // --- Write side (qcow2_write.cc, qcow2_plan.cc, qcow2_zero.cc).
  // REQUIRES: writable().

  // Plans reads of guest bytes from the chain below this layer (for
  // copy-on-write) into `dest`.
  using BackingPlanner = std::function<absl::Status(
      uint64_t offset, uint8_t* dest, uint64_t len, IoPlan* plan)>;
  // Whether guest bytes [offset, +len) read as zeros from the chain below,
  // judged from metadata alone (zero or unallocated everywhere down).
  using BackingZero =
      std::function<absl::StatusOr<bool>(uint64_t offset, uint64_t len)>;
  void set_backing(BackingPlanner planner, BackingZero zero) {
    backing_ = std::move(planner);
    backing_zero_ = std::move(zero);
  }
  bool has_backing() const { return static_cast<bool>(backing_); }

  // Plans the write of `data` at guest `offset`: allocations happen now
  // (in memory), copy-on-write reads and data writes go into `plan`, and
  // L2 updates into its commits. The caller holds the guest clusters
  // exclusively until the plan is committed or aborted; with `fine`, it
  // holds only the write's own bytes (rounded to kFineLockBytes), which
  // FineWritable() must have allowed under the same lock. Under a
  // MissDeferral, what planning needs is probed first (ProbeChange), all
  // of the write's clusters, going on from `probe` when given.
  absl::Status PlanWrite(uint64_t offset, absl::Span<const uint8_t> data,
                         IoPlan* plan, bool fine = false,
                         ProbeProgress* probe = nullptr);

  // --- Writes under a byte-range lock, and deferred copy-on-write
  // (qcow2_pending.cc).
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
  //    L2 to subclusters; with standard L2 a backing chain and, with
  //    `stream`, the write continuing a recent write or landing in a
  //    recently written cluster).
  // A deferred write allocates the host cluster and writes only its own
  // bytes; the cluster stays out of the L2 table, *pending*, with a map of
  // which kFineLockBytes units hold guest data. Reads map covered units to
  // the new cluster and the rest as the old entry says. With standard L2,
  // when writes have covered every unit and none is in flight, the L2
  // entry is set: a run of small sequential writes fills a cluster without
  // reading the backing file (deferred copy-on-write). With extended L2
  // the entry is set, covered subclusters allocated, as soon as no write
  // is in flight: other writes into the cluster need not wait for the first.
  // A flush (or a cluster-wide request on the cluster, or Close) copies
  // the uncovered units from the chain below (standard L2 only) and sets
  // the entry; a flush does not wait for writes in flight into the cluster
  // (they may belong to another queue, whose thread must poll to finish
  // them): it writes their bytes too (PlanFill). A flush plans the fill
  // under the lock and its executor carries it out without it; while it
  // does, the cluster is *filling* and writes into it need the whole
  // cluster, which the flush holds in the lock list (Chain::PlanFill).
  static constexpr uint32_t kFineLockBits = 12;
  static constexpr uint64_t kFineLockBytes = uint64_t{1} << kFineLockBits;
  // At most this many clusters are pending at once.
  static constexpr size_t kMaxPending = 128;
  bool FineWritable(uint64_t offset, uint64_t len, bool stream);
  // Remembers where a write ends, for the `stream` test above.
  void NoteWriteBegun(uint64_t offset, uint64_t len);
  // Fills and commits every pending cluster (a flush, Close), writes in
  // flight into them included: see Materialize.
  absl::Status SettleAllPending();
  // The pending clusters, in guest order.
  std::vector<uint64_t> PendingClusters() const;
  // Whether a pending cluster lies in guest range [offset, +len).
  bool HasPendingIn(uint64_t offset, uint64_t len) const;
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
  // Makes the range read as zeros; with `free_clusters`, host clusters of
  // fully covered clusters are released. Metadata changes are made at
  // once. Zero bytes written into part of a cluster (or, with extended
  // L2, of a subcluster), and into whole clusters on version 2 images (no
  // zero flag there), are planned into `plan`: the caller runs and commits
  // it, holding the clusters.
  //
  // Under a MissDeferral, the range is changed a window of kProbeClusters
  // at a time, each probed first (ProbeChange): a miss there stops the
  // call with the deferred miss, and `*done` says how far it got; call
  // again with the same `done` once the entry is in.
  //
  // With `more`, the call also stops after a window that put I/O into the
  // plan, or after kZeroRoundWindows windows, and sets `*more` when part
  // of the range is left: the caller carries out and commits the plan,
  // then calls again with the same `done` and an empty plan. So a long
  // range is changed in rounds, each bounded in the metadata it touches
  // and the time it holds the caller's lock.
  absl::Status Zero(uint64_t offset, uint64_t len, bool free_clusters,
                    IoPlan* plan, uint64_t* done = nullptr,
                    bool* more = nullptr);
  static constexpr int kZeroRoundWindows = 4;
  absl::Status Flush() override;
  // Flush in three steps, so that the metadata write-back and the file
  // flush run without the caller's lock:
  //  - BeginFlush (under the lock) records the metadata write-back: the
  //    writes and file flushes it takes, in order (WriteBackFile);
  //  - the caller, with no lock held, calls meta_file()->WriteBack(ticket),
  //    then flushes file();
  //  - FinishFlush(generation), under the lock again, releases the clusters
  //    freed before BeginFlush. With `to_discard`, their discard is left
  //    to the caller: DiscardReleased(*to_discard) with no lock held, then
  //    EndDiscard(*to_discard) under it, which makes them reusable.
  struct FlushTicket {
    uint64_t generation = 0;
    uint64_t write_back = 0;
  };
  absl::StatusOr<FlushTicket> BeginFlush();
  void FinishFlush(
      uint64_t generation,
      std::vector<std::pair<uint64_t, uint64_t>>* to_discard = nullptr);
  void DiscardReleased(
      const std::vector<std::pair<uint64_t, uint64_t>>& ranges);
  void EndDiscard(const std::vector<std::pair<uint64_t, uint64_t>>& ranges);

  // A plan's grow (IoPlan::grow_file) could not reserve (`reserve`: no
  // fallocate, or no room): under the lock, makes the file long enough by
  // a size change instead, to past every cluster allocated so far (no
  // write in flight lies beyond that), and after kUnimplemented grows
  // under the lock from then on.
  absl::Status GrowWithoutReserve(const absl::Status& reserve);
  // Every metadata write goes through this file (see BeginFlush).
  WriteBackFile* meta_file() { return meta_.get(); }
  absl::Status Close() override;
  Qcow2Layer* AsQcow2() override { return this; }
  // Grows the virtual size, reallocating the L1 table if needed.
  absl::Status Grow(uint64_t new_size);
  // Marks the image corrupt on kDataLoss and returns `s`.
  absl::Status Fail(absl::Status s);

  // Allocates every guest cluster (metadata) and, for kFalloc/kFull, the
  // host space under it. For freshly created images.
  absl::Status Preallocate(Preallocation mode);

  // Rewrites the fixed header fields (not the extensions) and flushes.
  absl::Status WriteHeaderFields();

  // The write-back ticket of the first write's header update (autoclear
  // bits, lazy refcounts' dirty bit) while it is recorded and not yet
  // written, else 0. No guest write may reach the disk before it: a write
  // planned meanwhile waits for the ticket, as its recorder does.
  uint64_t UnwrittenHeaderTicket();

 private:
  Qcow2Layer(std::unique_ptr<File> file, Header header, uint64_t file_size);

  // Maps within one cluster starting at `offset`.
  absl::StatusOr<Extent> MapInCluster(const L2Ref& ref, uint64_t offset,
                                      uint64_t max_len);
  // Checks an L2 entry (and its subcluster bitmap) before it is acted on,
  // by the read and the write path alike: reserved bits, host offsets
  // unaligned, in the header cluster or past the end of the file, COPIED
  // without an offset, inconsistent bitmaps, compressed descriptors outside
  // the image. Returns kDataLoss naming the entry, `guest_offset` and the
  // file.
  absl::Status ValidateEntry(uint64_t entry, uint64_t bitmap,
                             uint64_t guest_offset) const;
  // Host offsets at or past this lie past the end of the file: its size at
  // open time, raised by every cluster allocated since.
  uint64_t HostLimit() const;
  absl::Status ReadCompressed(uint64_t entry, uint8_t* cluster_out);
  // Copies guest bytes out of a compressed cluster through the one-cluster
  // memo below (decompressing only when the entry differs).
  absl::Status ReadFromCompressed(uint64_t entry, uint64_t offset,
                                  absl::Span<uint8_t> buf);

  absl::Status OpenForWriting(const OpenOptions& opts);
  // Recomputes every refcount from the metadata (dirty images).
  static absl::Status RebuildRefcounts(File* file);

  // Write helpers.
  absl::Status PrepareWrite();
  // Deferred copy-on-write (qcow2_pending.cc).
  struct PendingWrite {
    uint64_t id;
    uint64_t in_cluster;
    const uint8_t* data;  // the request's buffer, valid until it finishes
    uint64_t len;
  };
  struct PendingCluster {
    L2Ref ref;             // the cluster's L2 entry, pinned
    uint64_t host = 0;     // the host cluster given to it
    std::vector<uint64_t> covered;  // one bit per kFineLockBytes unit
    uint32_t covered_units = 0;
    std::vector<PendingWrite> in_flight;  // planned, not finished
    bool virgin = false;  // the host cluster never held anything
    // A fill planned by PlanFill is in flight: the fill, not the last
    // write to finish, commits the cluster.
    bool filling = false;
  };
  enum class FineKind { kNone, kInPlace, kPending, kDefer };
  FineKind ClassifyFine(uint64_t cluster, uint64_t in_cluster, uint64_t len,
                        bool stream);
  // Plans a write of `data` into a pending cluster, or allocates one.
  absl::Status PlanPendingWrite(uint64_t cluster, uint64_t in_cluster,
                                absl::Span<const uint8_t> data, IoPlan* plan);
  // The end of such a write (commit or abort): `newly` holds the units it
  // covered first, uncovered again when it failed. Commits the cluster when
  // no write into it is in flight and it is covered (with extended L2:
  // covered at all), and frees it when nothing covers it.
  absl::Status FinishPendingWrite(uint64_t cluster, uint64_t id,
                                  const std::vector<uint64_t>& newly, bool ok);
  // Sets a pending cluster's L2 entry: every unit holds its data (standard
  // L2), or covered subclusters become allocated (extended L2).
  absl::Status CommitPending(uint64_t cluster);
  // Materializes the pending clusters in guest range [offset, +len); with
  // `drop_whole`, those inside it whole are dropped instead (the caller
  // overwrites them), their host clusters freed.
  // With `fills`, the fills are planned into it instead (PlanFillsFor).
  absl::Status SettlePendingIn(uint64_t offset, uint64_t len, bool drop_whole,
                               IoPlan* fills = nullptr);
  // The length of [offset, +len) before the first pending cluster after
  // `offset`'s own.
  uint64_t ClipAtPending(uint64_t offset, uint64_t len) const;
  // Maps inside a pending cluster.
  absl::StatusOr<Extent> MapPending(PendingCluster& p, uint64_t offset,
                                    uint64_t max_len);
  absl::StatusOr<L2Ref> L2ForWrite(uint64_t cluster);
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
  // One cluster of ProbeChange; counts it in *allocations if changing it
  // may allocate (an L2 table, or a host cluster).
  absl::Status ProbeCluster(uint64_t cluster, bool partial, bool frees_owned,
                            uint64_t* allocations);
  static constexpr uint64_t kProbeClusters = 1024;
  absl::Status PlanWriteCluster(uint64_t cluster, uint64_t in_cluster,
                                absl::Span<const uint8_t> data, IoPlan* plan,
                                bool fine = false);
  // Writes into subclusters of the cluster at host `entry` (ours, or
  // `fresh` just allocated for it), padding to subcluster boundaries.
  absl::Status PlanSubclusters(const L2Ref& ref, uint64_t entry,
                               uint64_t bitmap, uint64_t cluster,
                               uint64_t in_cluster,
                               absl::Span<const uint8_t> data, bool fresh,
                               bool virgin, IoPlan* plan);
  // Whether guest range [offset, +len) inside one cluster whose L2 entry is
  // `entry`/`bitmap` reads as zeros, judged from metadata alone. A copy of
  // such a range into a never-written host cluster can be skipped.
  absl::StatusOr<bool> KnownZero(uint64_t entry, uint64_t bitmap,
                                 uint64_t offset, uint64_t len);
  // Plans filling `dest` with the current contents of guest range
  // [offset, +len) inside one cluster whose L2 entry is `entry`/`bitmap`.
  absl::Status PlanReadOld(uint64_t entry, uint64_t bitmap, uint64_t offset,
                           uint8_t* dest, uint64_t len, IoPlan* plan);
  // Drops the reference the (validated) L2 entry `entry`/`bitmap` of guest
  // offset `guest` holds on its host cluster(s).
  absl::Status ReleaseHost(uint64_t entry, uint64_t bitmap, uint64_t guest);
  // Puts every slice of a new L2 table at `table` in the cache, dirty:
  // zeros, or a copy of `old_table`'s (when not 0).
  absl::Status FillNewTable(uint64_t table, uint64_t old_table);
  // kDataLoss if the host cluster of `entry` (not compressed) holds
  // metadata: freeing it, or writing it, would destroy that metadata.
  absl::Status CheckNotMetadata(uint64_t entry, uint64_t guest) const;
  // kDataLoss if guest data written at [host, host + len) would land on
  // the header, the L1 table, an L2 table, the refcount table or a
  // refcount block. O(clusters touched): one hash probe each.
  absl::Status CheckDataTarget(uint64_t host, uint64_t len) const;
  // Makes the file at least `end` bytes long, growing it ahead in steps
  // (a quarter of its length, 1 MiB to 256 MiB). A direct write that
  // extends a file waits on Linux file systems for every direct write in
  // flight; with the file grown ahead, writes into new clusters land
  // inside it and stay concurrent. The step is reserved where the file can
  // (fallocate for POSIX files), so such writes do not allocate blocks
  // either. Close() gives back what was not used.
  //
  // The step is only recorded in `plan` (IoPlan::grow_file): the executor
  // reserves it with no lock held (File::Reserve) before the plan's
  // writes; a fallocate of 256 MiB takes tens of milliseconds. Where
  // Reserve is not implemented, the file grows here (File::Extend).
  absl::Status GrowAhead(uint64_t end, IoPlan* plan);
  // Called when a write into the host cluster at `host` has committed (a
  // new cluster) or is planned (in place): the file must keep that
  // cluster.
  void NoteDataWritten(uint64_t host) {
    data_end_ = std::max(data_end_, host + map_->geometry().cluster_size);
  }
  absl::Status WriteL1Entry(uint64_t index);
  // Makes every new L2 table and its refcount durable, then writes the L1
  // entries that name them (the L1 part of a flush).
  absl::Status WriteL1Entries();
  absl::Status OrderL2AfterAllocation();
  // Zero's walk over [offset, +len), changing as it goes.
  absl::Status ZeroRange(uint64_t offset, uint64_t len, bool free_clusters,
                         IoPlan* plan);
  absl::Status ZeroCluster(uint64_t cluster, bool free_clusters,
                           IoPlan* plan);
  absl::Status ZeroSubclusters(uint64_t cluster, uint64_t in_cluster,
                               uint64_t len, IoPlan* plan);
  // Whether [offset, +len) of this layer reads as zeros from metadata
  // alone (zero, or unallocated with no backing file).
  absl::StatusOr<bool> ReadsAsZeroHere(uint64_t offset, uint64_t len);

  std::unique_ptr<File> file_;
  // Over file_, for every metadata write and file flush of the layer's
  // own; guest data goes to file_ directly.
  std::unique_ptr<WriteBackFile> meta_;
  Header header_;
  uint64_t file_size_;
  // The file's length as last set by GrowAhead (0: never grown), perhaps
  // still being reserved by a plan's executor.
  uint64_t grown_to_ = 0;
  // File::Reserve said kUnimplemented: GrowAhead extends under the lock.
  bool reserve_unsupported_ = false;
  // L1 indices of new L2 tables whose entry is set in memory but not yet
  // written (WriteL1Entries writes them at the next flush).
  std::vector<uint64_t> unwritten_l1_entries_;
  // Private copies of shared L2 tables (an internal snapshot's) among
  // them: until the new entry is durable, the disk's L1 entry still names
  // the shared table. So the shared tables, and every host cluster an entry
  // of a copy lets go of (named by the shared table too), lose their
  // reference only then (WriteL1Entries).
  absl::flat_hash_set<uint64_t> unlinked_copies_;  // L1 indices
  // (host offset, length) of each reference dropped at that point.
  std::vector<std::pair<uint64_t, uint64_t>> deferred_releases_;
  // End of the furthest host cluster written to: new clusters when their
  // write commits, clusters already ours when a write into them is planned.
  uint64_t data_end_ = 0;
  // Metadata clusters (writable layers only); map_ and refcounts_ keep it
  // up to date.
  std::unique_ptr<MetadataSet> metadata_;
  std::unique_ptr<ClusterMap> map_;
  std::unique_ptr<Refcounts> refcounts_;
  BackingPlanner backing_;
  BackingZero backing_zero_;
  bool writable_ = false;
  bool prepared_ = false;  // dirty bit / autoclear handled
  uint64_t header_ticket_ = 0;  // see UnwrittenHeaderTicket()
  bool lazy_refcounts_ = false;
  bool closed_ = false;
  bool marked_corrupt_ = false;  // by Fail(); caches were abandoned

  absl::flat_hash_map<uint64_t, PendingCluster> pending_;  // by guest cluster
  uint64_t pending_write_ids_ = 0;
  // Where the last few writes begun end (guest offsets), for FineWritable.
  std::array<uint64_t, 8> recent_ends_{};
  size_t recent_next_ = 0;

  // The most recently decompressed cluster, for small sequential reads.
  uint64_t decompressed_entry_ = 0;
  std::vector<uint8_t> decompressed_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_QCOW2_QCOW2_LAYER_H_
