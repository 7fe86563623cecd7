// One guest request as the engine carries it: what was asked, the guest
// clusters it holds, its plan, and its result.
#ifndef QCOW2_LIB_ENGINE_REQUEST_H_
#define QCOW2_LIB_ENGINE_REQUEST_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "lib/io/io_plan.h"
#include "qcow2/queue.h"
#include "qcow2/stats.h"

namespace qcow2::internal {

class MetadataCache;
class WriteBackFile;
struct Request;

// Told when a request that had to wait for overlapping requests may go on.
// Called with the image's metadata lock held, from any thread: it must only
// hand the request over (never call back into the image).
class Waiter {
 public:
  virtual ~Waiter() = default;
  virtual void Wake(Request* r) = 0;
};

struct Request {
  enum Kind : uint8_t { kRead, kWrite, kWriteZeroes, kDiscard, kFlush };

  Kind kind = kRead;
  uint64_t offset = 0;
  uint64_t len = 0;
  uint8_t* rbuf = nullptr;        // kRead
  const uint8_t* wbuf = nullptr;  // kWrite
  bool unmap = false;             // kWriteZeroes
  Completion done;

  // Guest range [lock_first, lock_last] of the top image, in units of
  // Chain::LockUnitBits(), held shared (reads) or exclusive, in arrival
  // order. Whole clusters, unless `lock_fine` (reads, and writes that
  // Qcow2Layer::FineWritable allows): the request's own bytes.
  uint64_t lock_first = 0;
  uint64_t lock_last = 0;
  bool lock_fine = false;
  // Set while Begin plans r under the same lock hold in which it found r
  // fit for a byte-range lock (nothing can have changed: no recheck).
  bool fine_just_checked = false;
  bool lock_shared = false;
  bool lock_granted = false;
  bool in_lock_list = false;
  Waiter* waiter = nullptr;

  IoPlan plan;
  // A metadata cache miss that planning deferred (MissDeferral): the
  // executor reads `miss_op` with no lock held and calls Chain::LoadMiss,
  // which plans again. `miss_cache` is null when nothing is missing.
  MetadataCache* miss_cache = nullptr;
  uint64_t miss_offset = 0;  // the entry wanted (miss_op may read more)
  uint64_t miss_epoch = 0;
  IoOp miss_op;
  // Entries fetched for this request, pinned until it is planned, so that
  // each round of planning gets further than the last however small the
  // cache is.
  std::vector<std::shared_ptr<void>> pinned;
  int stale_misses = 0;   // entries read but dropped as possibly stale
  // r waits (r->waiter->Wake, then Chain::Plan) before it plans again:
  // planning met a miss another request of the same executor is already
  // reading, or a write under a byte-range lock needs its whole clusters
  // and must wait for them.
  bool parked = false;
  bool counted = false;   // guest counters added (once per request)
  // Write-zeroes and discard: how much of the range's whole clusters is
  // zeroed already, by rounds of planning that stopped at a deferred miss
  // or at the end of a round (Qcow2Layer::Zero).
  uint64_t zero_done = 0;
  // The plan is one round of a long range: once its I/O is done, the
  // executor calls Chain::NextRound, which commits it and plans the next.
  bool zero_more = false;
  // A write: how far the probe before its planning got (ProbeChange).
  ProbeProgress probe;
  File* flush_file = nullptr;  // kFlush: the file to flush
  // kFlush with pending clusters (deferred copy-on-write) to fill first:
  // while `filling`, the plan holds the fill's I/O and `fill_locks` hold
  // the clusters in the lock list. The executor runs the plan at once,
  // blocking, with no lock held (another flush may wait for it), then
  // calls Chain::FinishFill, which commits it and plans the flush proper.
  // A request holding its range whole fills the pending clusters it
  // covers in part the same way (Chain::PlanFillRound), with no
  // fill_locks: FinishFill then plans the request itself.
  bool filling = false;
  bool filled = false;
  // kFlush: the executor calls Chain::RecordFlush, which records the
  // metadata write-back unless a flush recorded after `flush_arrival`
  // (Chain::flushes_recorded_ when this one was planned) covers it.
  bool record_flush = false;
  uint64_t flush_arrival = 0;
  std::vector<std::unique_ptr<Request>> fill_locks;
  IoOp flush_op;
  uint64_t flush_generation = 0;
  // Host clusters the flush released: Chain::Finish discards them with no
  // lock held, then makes them reusable.
  std::vector<std::pair<uint64_t, uint64_t>> released;
  // Metadata writes recorded while the request was planned (a flush's
  // write-back, evictions) and carried out by its executor, with no lock
  // held, before the request's own I/O: WriteBack(write_back_ticket).
  WriteBackFile* write_back_file = nullptr;
  uint64_t write_back_ticket = 0;
  // The same, recorded while the request's commits ran: Chain::Finish
  // writes it once it has let the lock go.
  uint64_t commit_write_back = 0;
  absl::Status status;
  IoStats stats;

  // Executor state.
  int pending = 0;  // ops in flight
  int phase = 0;
  void* owner = nullptr;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_ENGINE_REQUEST_H_
