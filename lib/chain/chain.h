// A backing chain: the top image and the files under it, opened with the
// safety rules for untrusted backing names. Implements the public Image.
#ifndef QCOW2_LIB_CHAIN_CHAIN_H_
#define QCOW2_LIB_CHAIN_CHAIN_H_

#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "lib/chain/backing_map.h"
#include "lib/layer/layer.h"
#include "lib/engine/request.h"
#include "qcow2/image.h"

namespace qcow2::internal {

class MetadataCache;
class MissDeferral;
class Qcow2Layer;
class WriteBackFile;

// Resolves a backing file name stored in an image against the directory of
// the image that names it. Refuses protocol prefixes (json:, nbd:, ...).
absl::StatusOr<std::string> ResolveBackingName(const std::string& image_name,
                                               const std::string& backing);

// Opens one file as a layer of the given format ("qcow2", "raw", or ""
// to probe).
absl::StatusOr<std::unique_ptr<Layer>> OpenLayer(std::unique_ptr<File> file,
                                                 const std::string& format,
                                                 const OpenOptions& opts);

class Chain {
 public:
  static absl::StatusOr<std::unique_ptr<Chain>> Open(std::unique_ptr<File> top,
                                                     const OpenOptions& opts);
  ~Chain();

  // Caller holds mu_ (or nothing can change the chain concurrently).
  uint64_t size() const { return layers_[0]->size(); }
  int length() const { return static_cast<int>(layers_.size()); }
  // The same for callers from outside (take mu_).
  uint64_t LockedSize() const {
    std::lock_guard<std::mutex> lock(mu_);
    UnderLockScope under_lock;
    return size();
  }
  int LockedLength() const {
    std::lock_guard<std::mutex> lock(mu_);
    UnderLockScope under_lock;
    return length();
  }
  Layer* layer(int depth) { return layers_[depth].get(); }
  bool writable() const { return writable_; }

  // Plans reading guest bytes through the chain starting at `depth` into
  // `dest`. Bytes past the end of a layer read as zeros. Caller holds mu_.
  absl::Status PlanRead(int depth, uint64_t offset, uint8_t* dest,
                        uint64_t len, IoPlan* plan, IoCategory category);
  // Whether guest bytes [offset, +len) read as zeros through the chain
  // from `depth` down, judged from metadata alone (no data is read: data
  // that happens to be zero counts as data). Caller holds mu_.
  absl::StatusOr<bool> ReadsAsZero(int depth, uint64_t offset, uint64_t len);

  // --- The request engine (lib/engine/chain_engine.cc; the fill stage
  // and flush recording in chain_fill.cc). Every guest request goes:
  // Begin (takes its guest clusters in arrival order; plans when it has
  // them) -> the plan's I/O, by any executor, with no lock -> Finish
  // (commits or aborts, lets waiting requests go). Flushes plan a
  // metadata write-back, then the executor flushes r->flush_file.

  // Checks the request (closed, writable, range) without queuing it.
  absl::Status Validate(const Request& r) const;
  // Returns true if the request was planned (or failed: see r->status) and
  // its I/O may start; false if it waits for overlapping requests, in
  // which case r->waiter->Wake(r) is called later and the owner calls
  // Plan(r).
  bool Begin(Request* r);
  void Plan(Request* r);
  // Commits (or aborts) under the lock, then writes with no lock held any
  // metadata the commits had to write out (recorded: DeferEvictions).
  void Finish(Request* r);
  // After planning left r->miss_cache set: the executor has run
  // r->miss_op (a read, with no lock held; its error, if any, in
  // r->status). Takes the entry into the cache and plans r again, which
  // may leave another miss to fetch.
  void LoadMiss(Request* r);
  // After a round of a long write-zeroes or discard (r->zero_more): the
  // executor has run r->plan (its error, if any, in r->status). Commits
  // it and plans the next round, which may leave a miss to fetch or park
  // r like any planning; the metadata the commits wrote out goes into the
  // next round's log. On error, r->zero_more is cleared.
  void NextRound(Request* r);
  // Called by the executor with no lock held, before r's I/O: reserves
  // the file's growth the plan asked for (IoPlan::grow_file), blocking.
  // When the file cannot reserve, takes the lock and grows it there
  // (Qcow2Layer::GrowWithoutReserve); an error of that lands in r->status.
  void Grow(Request* r);
  // After a flush (or a request, PlanFillRound) planned the fill of
  // pending clusters (r->filling): the executor has run r->plan (its
  // error, if any, in r->status). Commits or abandons the fill, lets the
  // clusters go, and plans the flush's metadata write-back, or the
  // request itself (which may then defer a miss or park, as any planning).
  void FinishFill(Request* r);
  // A flush's metadata write-back, by its executor with no lock held
  // (group commit): if a flush recorded the caches since this one was
  // planned, its log covers this one, which only waits for that log to be
  // written; else, once no other flush is writing its log, records one
  // (Qcow2Layer::BeginFlush) and writes it. Flushes that come in while a
  // log is written thus share the next one. The wait is for a thread
  // writing a log, never for a queue to be polled.
  void RecordFlush(Request* r);

  // Runs a request to the end on this thread with blocking I/O.
  absl::Status RunSync(Request* r);

  // Queues register so that GetStats() can add up their counters.
  class StatsSource {
   public:
    virtual ~StatsSource() = default;
    virtual IoStats Snapshot() const = 0;
  };
  void Register(StatsSource* q);
  void Unregister(StatsSource* q);
  IoStats Stats() const;

  // Public Image operations (take mu_).
  absl::Status Read(uint64_t offset, absl::Span<uint8_t> buf);
  absl::Status Write(uint64_t offset, absl::Span<const uint8_t> data);
  absl::Status WriteZeroes(uint64_t offset, uint64_t len, bool unmap);
  absl::Status Discard(uint64_t offset, uint64_t len);
  absl::Status Resize(uint64_t new_size);
  absl::Status Flush();
  absl::Status Close();
  absl::StatusOr<BlockStatus> GetBlockStatus(uint64_t offset, uint64_t max_len);
  absl::Status CreateOverlay(const std::string& path,
                             const CreateOptions& opts);
  std::vector<LayerInfo> GetChainInfo() const;

 private:
  Chain() = default;
  absl::Status CheckRange(uint64_t offset, uint64_t len) const;
  absl::Status CheckWritable() const;
  Qcow2Layer* top_qcow2();
  // GetBlockStatus's walk down the layers, under mu_.
  absl::StatusOr<BlockStatus> BlockStatusLocked(uint64_t offset,
                                                uint64_t max_len);
  // The top's metadata write-back file, if it is a writable qcow2 layer.
  WriteBackFile* TopWriteBack();
  // Lets the top layer read the layers below for copy-on-write.
  void ConnectBacking();

  // Below the top of a chain of three or more, reads and what reads as
  // zeros are looked up in backing_map_ (one cached lookup instead of a
  // walk down the layers).
  bool ThroughBackingMap(int depth) const {
    return depth == 1 && length() > 2;
  }
  // PlanRead below the top through backing_map_ (deep chains).
  absl::Status PlanBackingRead(uint64_t offset, uint8_t* dest, uint64_t len,
                               IoPlan* plan, IoCategory category);
  // The piece of backing_map_ holding `offset`; if the map does not hold
  // it yet, resolves what it lacks of the aligned resolve_window_ around
  // `offset` first.
  absl::StatusOr<BackingMap::Piece> BackingPieceAt(uint64_t offset);
  // 1 MiB, or less when an L2 slice of a layer below maps less (clusters
  // under 2 KiB, or small slices), but never under one granule.
  static constexpr uint64_t kMaxResolveWindow = 1 << 20;
  uint64_t resolve_window_ = kMaxResolveWindow;

  void PlanLocked(Request* r);
  void FinishLocked(Request* r);
  // Runs r's commits in order; the first error (through the top's Fail)
  // stops them. Caller holds mu_.
  absl::Status RunCommits(Request* r);
  // A flush's first step: plans the fill of the top's pending clusters
  // into r->plan, each held in the lock list (r->fill_locks) until
  // FinishFill, so that no later request touches it meanwhile. Clusters
  // that an earlier request holds whole are filled with no hold: that
  // request waits for the fill before it plans (PlanFillRound). Sets
  // r->filling if there is I/O to run.
  void PlanFill(Request* r, Qcow2Layer* top);
  // Ends the fill stage: aborts or commits, releases the fill locks.
  void EndFill(Request* r);
  // Before a request that holds its range whole plans (a write without a
  // byte-range lock, write-zeroes, discard): plans the fill of pending
  // clusters it covers in part (Qcow2Layer::PlanFillsFor) as a stage of
  // its own, which its executor runs at once, blocking, with no lock held
  // (as a flush's fill) before FinishFill plans the request. Returns true
  // when r's planning stops here: a fill to run (r->filling), a deferred
  // miss, a parked request (while another fill runs, r waits for it in
  // fill_waiters_), or an error.
  bool PlanFillRound(Request* r, Qcow2Layer* top);
  // The request whose fill is in flight (a flush's, or one planned by
  // PlanFillRound), and the requests waiting for it.
  Request* filling_ = nullptr;
  std::vector<Request*> fill_waiters_;
  // Group commit (RecordFlush): flushes recorded so far, the last one's
  // log and quarantine generation, and whether a flush is writing its log.
  uint64_t flushes_recorded_ = 0;
  uint64_t covering_ticket_ = 0;
  uint64_t covering_generation_ = 0;
  bool flush_recording_ = false;
  std::condition_variable flush_recorded_cv_;
  // The read of a deferred miss, into a buffer `buffers` owns; and the
  // error of a failed one, naming what was read.
  static IoOp MissRead(const MissDeferral& deferral, IoPlan* buffers);
  static absl::Status MissReadError(const MetadataCache* cache,
                                    uint64_t offset, const absl::Status& s);
  // Runs `plan` for r with metadata misses deferred (MissDeferral) and,
  // on a miss, drops the partial plan and sets r->miss_*.
  void PlanDeferringMisses(Request* r, absl::FunctionRef<absl::Status()> plan);
  // Entries read for a request and dropped as possibly stale before it
  // stops deferring and reads under the lock.
  static constexpr int kMaxStaleMisses = 3;
  // Deferred misses being read, by (cache, offset read): who reads it, and
  // the requests of the same executor that met it meanwhile and wait.
  struct MissInFlight {
    const Waiter* reader = nullptr;
    std::vector<Request*> parked;
  };
  absl::flat_hash_map<std::pair<const void*, uint64_t>, MissInFlight>
      misses_in_flight_;
  absl::Status ClosedError() const;
  bool Conflicts(const Request* a, const Request* b) const;
  // Whether r, in the lock list, may hold its range: no earlier request
  // (holding or waiting) and no later one holding conflicts with it.
  bool CanGrant(const Request* r) const;
  void GrantWaiters();
  // The top's cluster size, and the unit lock ranges are counted in.
  uint32_t LockClusterBits() const;
  uint32_t LockUnitBits() const;
  void SetLockRange(Request* r, bool fine) const;
  // A write planned under a byte-range lock that now needs its whole
  // clusters: widens its range. Returns true if it holds them at once;
  // else it is parked until GrantWaiters wakes it.
  bool WidenLock(Request* r);

  mutable std::mutex mu_;
  // Requests holding or waiting for guest clusters, in arrival order.
  std::list<Request*> lock_list_;
  std::vector<StatsSource*> sources_;
  IoStats retired_stats_;  // sync calls and queues gone
  std::vector<std::unique_ptr<Layer>> layers_;  // [0] is the top
  std::vector<std::string> resolved_backing_;   // per layer, "" if none
  // Resolutions of layers_[1..]: used once there are two or more of them.
  BackingMap backing_map_;
  OpenOptions opts_;
  bool writable_ = false;
  bool closed_ = false;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CHAIN_CHAIN_H_
