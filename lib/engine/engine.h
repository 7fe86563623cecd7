// SPDX-License-Identifier: Apache-2.0
// The request engine of one open image: its chain, the metadata lock that
// guards it, and the steps every guest request goes through. Implements the
// public Image.
//
// Every request goes: Begin (takes its guest range in arrival order; plans
// when it has it) -> the plan's I/O, by any executor, with no lock ->
// Finish (commits or aborts, lets waiting requests go). On the way,
// planning may leave a deferred miss to read (LoadMiss), a fill of pending
// clusters to run (FinishFill), a file growth to reserve (Grow), a flush's
// metadata write-back to record (RecordFlush) or another round to plan
// (NextRound). lib/engine/runner.cc drives those steps, the same way for
// synchronous calls and for queues.
#ifndef QCOW2_LIB_ENGINE_ENGINE_H_
#define QCOW2_LIB_ENGINE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/base/io_context.h"
#include "lib/base/mutex.h"
#include "lib/chain/chain.h"
#include "lib/driver/snapshots.h"
#include "lib/engine/flush_group.h"
#include "lib/engine/miss_table.h"
#include "lib/engine/range_locks.h"
#include "lib/engine/request.h"
#include "lib/engine/stats_registry.h"

namespace qcow2::internal {

class Qcow2Layer;

// The range-lock geometry for a chain's top: its clusters, counted in
// units of PendingClusters::kFineLockBits (a raw top has no clusters: 64
// KiB). Requests already in the table are ranged again by it.
void SetLockGeometry(Chain* chain, RangeLockTable* locks);

// Holds an engine's metadata lock, and marks the thread as holding it for
// the host-call accounting (UnderLockScope).
class ABSL_SCOPED_LOCKABLE EngineLock {
 public:
  explicit EngineLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu)
      : lock_(mu) {}
  ~EngineLock() ABSL_UNLOCK_FUNCTION() {}
  EngineLock(const EngineLock&) = delete;
  EngineLock& operator=(const EngineLock&) = delete;

 private:
  MutexLock lock_;
  UnderLockScope under_lock_;
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Open(
      std::unique_ptr<File> top, const OpenOptions& opts);

  // --- Request steps. Thread-safe; each takes the lock for its part.

  // For a compressed write (r->compressed, wbuf/len one guest cluster, or
  // the disk's last part of one): checks it as Validate does, and that the
  // top is qcow2 (kUnimplemented for raw) and the range one whole cluster
  // (kInvalidArgument); then, with no lock held, compresses the cluster
  // (zero-padded) with the image's compression type into r->stream, or
  // clears r->compressed when that saves nothing. Thread-safe; the caller
  // then runs r as any request.
  absl::Status PrepareCompressed(Request* r) ABSL_LOCKS_EXCLUDED(mu_);

  // Checks the request (closed, writable, range) without queuing it.
  absl::Status Validate(const Request& r) const ABSL_LOCKS_EXCLUDED(mu_);
  // Returns true if the request was planned (or failed: see r->status) and
  // its I/O may start; false if it waits for overlapping requests, in
  // which case r->waiter->Wake(r) is called later and the owner calls
  // Plan(r). With `rejected`, a request that fails Validate's checks is
  // not taken at all: the error goes to *rejected (r->status untouched)
  // and Begin returns true; one lock hold does both.
  bool Begin(Request* r, absl::Status* rejected = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Plan(Request* r) ABSL_LOCKS_EXCLUDED(mu_);
  // After planning left r->miss.cache set: the executor has run
  // r->miss.op (a read, with no lock held; its error, if any, in
  // r->status). Takes the entry into the cache and plans r again, which
  // may leave another miss to fetch.
  void LoadMiss(Request* r) ABSL_LOCKS_EXCLUDED(mu_);
  // After a round of a long write-zeroes or discard (r->zero_more): the
  // executor has run r->plan (its error, if any, in r->status). Commits
  // it and plans the next round, which may leave a miss to fetch or park
  // r like any planning; the metadata the commits wrote out goes into the
  // next round's log. On error, r->zero_more is cleared.
  void NextRound(Request* r) ABSL_LOCKS_EXCLUDED(mu_);
  // Called by the executor with no lock held, before r's I/O: reserves
  // the file's growth the plan asked for (IoPlan::grow_file), blocking.
  // When the file cannot reserve, takes the lock and grows it there
  // (Qcow2Layer::GrowWithoutReserve); an error of that lands in r->status.
  void Grow(Request* r) ABSL_LOCKS_EXCLUDED(mu_);
  // After a flush (or a request, PlanFillRound) planned the fill of
  // pending clusters (r->fill.active): the executor has run r->plan (its
  // error, if any, in r->status). Commits or abandons the fill, lets the
  // clusters go, and plans the flush's metadata write-back, or the
  // request itself (which may then defer a miss or park, as any planning).
  void FinishFill(Request* r) ABSL_LOCKS_EXCLUDED(mu_);
  // A flush's metadata write-back, by its executor with no lock held:
  // see FlushGroup::Record.
  void RecordFlush(Request* r) ABSL_LOCKS_EXCLUDED(mu_);
  // Commits (or aborts) under the lock, then writes with no lock held any
  // metadata the commits had to write out.
  void Finish(Request* r) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Whole-image operations (take the lock).
  absl::StatusOr<BlockStatus> GetBlockStatus(uint64_t offset,
                                             uint64_t max_len)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Resize(uint64_t new_size) ABSL_LOCKS_EXCLUDED(mu_);
  // Grows (then preallocates the new range, with a mode) or shrinks: see
  // Image::Resize.
  absl::Status ResizePreallocated(uint64_t new_size, Preallocation prealloc)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Close() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CreateOverlay(const std::string& path,
                             const CreateOptions& opts,
                             Chain::ImageCreator create)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<LayerInfo> GetChainInfo() const ABSL_LOCKS_EXCLUDED(mu_);
  // Flushes the top, then rewrites its backing name and format: see
  // Image::ChangeBackingFile.
  absl::Status ChangeBackingFile(const std::string& name,
                                 const std::string& format)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Internal snapshots of the top layer (lib/driver/snapshots.h); all but
  // the listing refuse while a Queue is open (engine_snapshots.cc).
  absl::StatusOr<std::vector<SnapshotEntry>> ListSnapshots() const
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<SnapshotEntry> CreateSnapshot(const NewSnapshot& sn)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ApplySnapshot(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DeleteSnapshot(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Persistent dirty bitmaps of the top layer (engine_bitmaps.cc): the
  // live ones its DirtyBitmaps keeps, marked under this lock as writes
  // are planned (a read-only top's are loaded on first use).
  absl::StatusOr<std::vector<BitmapInfo>> ListBitmaps() const
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<BitmapStatus> GetBitmapStatus(const std::string& name,
                                               uint64_t offset,
                                               uint64_t max_len) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The bits and granularity (log2) of bitmap `name`, for a merge.
  absl::StatusOr<std::pair<std::vector<uint8_t>, uint32_t>> BitmapBits(
      const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `edit` on the top layer of an open read-write qcow2 image, under
  // the lock (kFailedPrecondition / kUnimplemented otherwise).
  absl::Status EditBitmaps(absl::FunctionRef<absl::Status(Qcow2Layer*)> edit)
      ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  int length() const ABSL_LOCKS_EXCLUDED(mu_);
  bool writable() const { return writable_; }

  // --- Live stream and commit (engine_live.cc), run by one job at a
  // time beside any requests. While a job runs, the chain's layers 1..
  // stay as they are: CreateOverlay, Resize and ChangeBackingFile refuse
  // (kFailedPrecondition).
  //
  // Starts a job over the layers down to `base` (1 <= base <= length();
  // base == length() is the whole chain): checks the chain is open,
  // writable and its top qcow2, and that no other job runs. `what` names
  // the job in errors.
  absl::Status BeginLiveJob(const char* what, int base)
      ABSL_LOCKS_EXCLUDED(mu_);
  void EndLiveJob() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a layer at depth 1 .. below-1 allocates guest bytes at
  // `offset`: Chain::AllocatedAbove, under the lock.
  absl::StatusOr<uint64_t> AllocatedAbove(int below, uint64_t offset,
                                          uint64_t max_len, bool* allocated)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Reads guest bytes through the chain from depth 1 (the layers under
  // the top, which no request changes), planned under the lock and read
  // with none held.
  absl::Status ReadBelowTop(uint64_t offset, absl::Span<uint8_t> buf)
      ABSL_LOCKS_EXCLUDED(mu_) {
    return ReadFrom(1, offset, buf);
  }
  // Guest bytes read through the chain from layer `depth` down, with no
  // range lock: the caller keeps them from changing.
  absl::Status ReadFrom(int depth, uint64_t offset, absl::Span<uint8_t> buf)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Live stream's copy-on-read of [offset, +len): holds the range
  // cluster-wide in the range-lock table (after every earlier request
  // that overlaps it, before every later one), finds what the top does
  // not allocate and a layer at depth 1 .. below-1 does, reads it through
  // the chain and writes it into the top as a guest write would (under
  // the same hold, so no guest write can land between the read and the
  // write), then lets the range go. Adds the bytes copied to *copied.
  absl::Status Populate(uint64_t offset, uint64_t len, int below,
                        uint64_t* copied) ABSL_LOCKS_EXCLUDED(mu_);
  // A live commit's writer of layer `depth`: an engine of its own over
  // that layer's file, opened again for writing (by the path the chain
  // opened it by, through the chain's opener) with the chain's options
  // and the layer's own backing chain, image locks off: the chain's
  // descriptor takes the write lock for it (Chain::LockForWrite). The chain's read-only layer keeps
  // its caches: they go stale only for ranges the layers above hide.
  absl::StatusOr<std::unique_ptr<Engine>> OpenLayerWriter(int depth)
      ABSL_LOCKS_EXCLUDED(mu_);
  // After the writer is closed, when no switch follows (an error, a
  // cancel): layer `depth`'s locks back to a backing file's.
  void EndLayerWriter(int depth) ABSL_LOCKS_EXCLUDED(mu_);
  // The switch that ends a live stream (reopen_last false: layers
  // 1..last leave the chain, the top's backing is the layer below them)
  // or a live commit (true: layers 1..last-1 leave and layer `last`, the
  // base, is opened afresh). Holds the whole disk in the range-lock table
  // (every request planned against the old layers has finished; later
  // ones wait), flushes the top, rewrites its backing name and format in
  // one header write (Qcow2Layer::header_writer), and swaps the layers
  // in the same lock hold; then lets the queues go on.
  absl::Status SwitchBacking(int last, bool reopen_last)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- Active commit (engine_live.cc): the top and the layers under it
  // down to `base` committed into `base`, which then becomes the top.
  // Starts (granule > 0) or stops (0) the log of guest changes: every
  // write, write-zeroes and discard that finishes marks the granules it
  // touched.
  void SetDirtyLog(uint64_t granule) ABSL_LOCKS_EXCLUDED(mu_);
  // The offsets of the granules marked dirty, in order.
  std::vector<uint64_t> DirtyGranules() const ABSL_LOCKS_EXCLUDED(mu_);
  // Copies what layers 0..base-1 allocate in [offset, +len) (granules of
  // the dirty log, whole) into `writer`, read through the chain: under a
  // hold of the range (none when `held`: the caller holds the disk),
  // after clearing its dirty marks, so that a guest change that lands
  // after the read marks it again.
  absl::Status CopyActive(uint64_t offset, uint64_t len, int base,
                          Engine* writer, bool held, uint64_t* copied)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The switch: with guest flushes drained and parked and the whole disk
  // held, runs `last_copy` (what is still dirty, then the writer closed),
  // then makes the layer at `base`, reopened read-write, the top; the
  // layers above it leave the chain (flushed, marked clean, unlocked, kept
  // open until the chain is destroyed). On any failure the chain is as it
  // was.
  absl::Status PivotActive(int base,
                           absl::FunctionRef<absl::Status()> last_copy)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Queues register here so that GetStats() can add up their counters.
  StatsRegistry& stats() { return stats_; }

  // The top layer, for tests that drive the engine step by step; it must
  // not be used while another thread runs a request.
  Qcow2Layer* TopForTesting() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return chain_->top_qcow2();
  }

 private:
  // Image::Resize to a smaller size: the top qcow2 layer's Shrink.
  absl::Status ShrinkLocked(uint64_t new_size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ResizePreallocated's work on the image itself (not its data file).
  absl::Status ResizeLocked(uint64_t new_size, Preallocation prealloc)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  explicit Engine(std::unique_ptr<Chain> chain);
  // Validate's checks, under the lock.
  absl::Status CheckLocked(const Request& r) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kFailedPrecondition naming `what` while a live job runs.
  absl::Status RefuseDuringLiveJob(const char* what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes [offset, +len) cluster-wide in the range-lock table, blocking
  // until it is granted (engine_live.cc). Released by ReleaseHold.
  std::unique_ptr<Request> Hold(uint64_t offset, uint64_t len)
      ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseHold(Request* hold) ABSL_LOCKS_EXCLUDED(mu_);
  void MarkDirtyLocked(uint64_t offset, uint64_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndPivotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void PlanLocked(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `plan` for r with metadata misses deferred (MissDeferral) and,
  // on a miss, drops the partial plan and sets r->miss (or parks r).
  void PlanDeferringMisses(Request* r, absl::FunctionRef<absl::Status()> plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs r's commits in order; the first error (through the top's Fail)
  // stops them.
  absl::Status RunCommits(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A request counted in unfinished_ has done its last write;
  // after Close, the last one drops the image locks.
  void RequestEndedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The top layer for a snapshot change: open, writable, qcow2, and no
  // Queue open.
  absl::StatusOr<Qcow2Layer*> SnapshotTarget(const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The top layer with its bitmaps loaded, for reading bitmap `name`:
  // kNotFound naming it for a raw top (null when `name` is empty).
  absl::StatusOr<Qcow2Layer*> BitmapSource(const std::string& name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- The fill stage (engine_fill.cc).
  // A flush's first step: plans the fill of the top's pending clusters
  // into r->plan, each held in the range-lock table (r->fill.holds) until
  // FinishFill, so that no later request touches it meanwhile. Clusters
  // that an earlier request holds whole are filled with no hold: that
  // request waits for the fill before it plans (PlanFillRound). Sets
  // r->fill.active if there is I/O to run.
  void PlanFill(Request* r, Qcow2Layer* top)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a request that holds its range whole plans (a write without a
  // byte-range lock, write-zeroes, discard): plans the fill of pending
  // clusters it covers in part (Qcow2Layer::PlanFillsFor) as a stage of
  // its own, which its executor runs at once, blocking, with no lock held
  // (as a flush's fill) before FinishFill plans the request. Returns true
  // when r's planning stops here: a fill to run, a deferred miss, a
  // parked request (while another fill runs, r waits for it), or an
  // error.
  bool PlanFillRound(Request* r, Qcow2Layer* top)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the fill stage: aborts or commits, releases the fill's holds.
  void EndFill(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Entries read for a request and dropped as possibly stale before it
  // stops deferring and reads under the lock.
  static constexpr int kMaxStaleMisses = 3;

  mutable Mutex mu_;
  const std::unique_ptr<Chain> chain_ ABSL_PT_GUARDED_BY(mu_);
  const bool writable_;
  // A layer of the chain is LUKS-encrypted (at open): requests must be
  // in whole 512-byte sectors.
  bool encrypted_ = false;
  // Requests holding or waiting for guest ranges, in arrival order.
  RangeLockTable locks_ ABSL_GUARDED_BY(mu_);
  // Deferred misses being read.
  MissTable misses_ ABSL_GUARDED_BY(mu_);
  // The request whose fill is in flight (a flush's, or one planned by
  // PlanFillRound), and the requests waiting for it.
  Request* filling_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<Request*> fill_waiters_ ABSL_GUARDED_BY(mu_);
  // Group commit of flushes' metadata write-backs.
  FlushGroup flushes_ ABSL_GUARDED_BY(mu_);
  // A live stream or commit runs (BeginLiveJob).
  bool live_job_ ABSL_GUARDED_BY(mu_) = false;
  // Active commit: the dirty log (granule 0: off), one bit per granule.
  uint64_t dirty_granule_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> dirty_bits_ ABSL_GUARDED_BY(mu_);
  // Guest flushes between their first plan and Finish; while pivoting_,
  // new ones park in pivot_waiters_ (their plans name the top's files and
  // write-back, which the switch replaces).
  int flushes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool pivoting_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Request*> pivot_waiters_ ABSL_GUARDED_BY(mu_);
  CondVar flushes_done_;
  // Requests begun (Begin) and not finished (Finish): I/O
  // of ours that may still reach the files. Close drops the image locks
  // only when it is zero.
  int unfinished_ ABSL_GUARDED_BY(mu_) = 0;
  StatsRegistry stats_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_ENGINE_ENGINE_H_
