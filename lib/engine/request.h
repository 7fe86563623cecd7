// SPDX-License-Identifier: Apache-2.0
// One guest request as the engine carries it: what was asked, the guest
// range it holds, its plan, where it is in its lifecycle, and its result.
#ifndef QCOW2_LIB_ENGINE_REQUEST_H_
#define QCOW2_LIB_ENGINE_REQUEST_H_

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "lib/io/io_plan.h"
#include "qcow2/types.h"
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

// Where a request is in its lifecycle (lib/engine/runner.cc drives it
// through these in order; kMissRead loops back to kPlanned, and so does
// kRoundDone for each further round of a long write-zeroes or discard).
enum class Stage : uint8_t {
  kPlanned,    // planning ran: a miss to read, a wait, or I/O to start
  kMissRead,   // reading a deferred metadata miss (Request::miss)
  kReads,      // the plan's reads in flight
  kWrites,     // its after-read steps done, its writes in flight
  kFileFlush,  // a flush's file flush in flight
  kRoundDone,  // the I/O is done: another round, or Finish
  kDone,       // finished (Engine::Finish ran)
};

const char* StageName(Stage s);

// The guest range a request holds in the engine's range-lock table, in
// units of Engine::LockUnitBits(), shared (reads) or exclusive, granted in
// arrival order.
struct RangeLock {
  uint64_t first = 0;
  uint64_t last = 0;
  // The request's own bytes (reads, and writes that
  // Qcow2Layer::FineWritable allows), not its whole clusters.
  bool fine = false;
  // Set while Begin plans the request in the same lock hold that found it
  // fit for a byte-range lock (nothing can have changed: no recheck).
  bool fine_just_checked = false;
  bool shared = false;
  // The range is held already, cluster-wide, by a hold of its caller's
  // (Engine::Populate): the request takes no place in the table.
  bool preheld = false;
  bool granted = false;
  bool in_table = false;
  // Arrival number, given when the request enters the table: the order
  // the table grants in.
  uint64_t seq = 0;
};

// A metadata cache miss that planning deferred (MissDeferral): the
// executor reads `op` with no lock held and calls Engine::LoadMiss, which
// plans again. `cache` is null when nothing is missing.
struct DeferredMiss {
  MetadataCache* cache = nullptr;
  uint64_t offset = 0;  // the entry wanted (op may read more)
  uint64_t epoch = 0;
  IoOp op;
  // Entries read but dropped as possibly stale; past a bound the request
  // stops deferring and reads under the lock.
  int stale = 0;
};

// A flush's state: the file to flush, the group commit it joins, and the
// host clusters it releases.
struct FlushState {
  File* file = nullptr;
  // The top's external data file, or null: flushed (blocking, no lock
  // held) before the metadata write-back, which may name its clusters.
  File* data_file = nullptr;
  // The executor calls Engine::RecordFlush, which records the metadata
  // write-back unless a flush recorded after `arrival` (the count of
  // flushes recorded when this one was planned) covers it.
  bool record = false;
  uint64_t arrival = 0;
  uint64_t generation = 0;
  // Counted in Engine::flushes_in_flight_ (from its first plan to Finish),
  // which an active commit's switch waits to see drop to zero.
  bool counted = false;
  IoOp op;
  // Host clusters the flush released: Engine::Finish discards them with
  // no lock held, then makes them reusable.
  std::vector<std::pair<uint64_t, uint64_t>> released;
};

// Filling pending clusters (deferred copy-on-write) before a flush, or
// before a request that holds them whole plans: while `active`, the plan
// holds the fill's I/O, which the executor runs at once, blocking, with no
// lock held (another flush may wait for it), then calls
// Engine::FinishFill. A flush's `holds` keep the clusters in the range-lock
// table meanwhile.
struct FillState {
  bool active = false;
  bool done = false;  // a flush planned its fill already
  std::vector<std::unique_ptr<Request>> holds;
};

// Metadata writes recorded while the request was planned (a flush's
// write-back, evictions) and carried out by its executor, with no lock
// held, before the request's own I/O: file->WriteBack(ticket).
struct WriteBackTicket {
  WriteBackFile* file = nullptr;
  uint64_t ticket = 0;
  // The same, recorded while the request's commits ran: Engine::Finish
  // writes it once it has let the lock go.
  uint64_t after_commit = 0;
};

struct Request {
  enum class Kind : uint8_t { kRead, kWrite, kWriteZeroes, kDiscard, kFlush };

  // What was asked.
  Kind kind = Kind::kRead;
  uint64_t offset = 0;
  uint64_t len = 0;
  uint8_t* rbuf = nullptr;        // kRead
  const uint8_t* wbuf = nullptr;  // kWrite
  // A vectored read or write (Queue::SubmitReadv/Writev) of two or more
  // segments: a copy of the caller's iovec array (the buffers stay the
  // caller's), `len` bytes in all. A read is planned segment by segment
  // straight into them (ForEachSegment); a write is planned against the
  // stand-in buffer ScatterBase() and its ops are pointed into the
  // segments before they are issued (MapIntoSegments, lib/io/io_plan.h).
  // Such a write holds its whole clusters: the deferred copy-on-write of a
  // byte-range write keeps a contiguous pointer to the guest data.
  std::vector<iovec> segs;
  bool unmap = false;             // kWriteZeroes
  // kWrite of one guest cluster stored compressed
  // (Engine::PrepareCompressed compressed wbuf into `stream`, with no lock
  // held, for the top layer `compressed_for`). A cluster that does not
  // compress is a plain write: `compressed` is cleared.
  bool compressed = false;
  std::vector<uint8_t> stream;
  const void* compressed_for = nullptr;
  Completion done;

  RangeLock lock;
  Waiter* waiter = nullptr;  // told when a wait ends
  IoPlan plan;
  DeferredMiss miss;
  // Entries fetched for this request, pinned until it is planned, so that
  // each round of planning gets further than the last however small the
  // cache is.
  std::vector<std::shared_ptr<void>> pinned;
  // The request waits (waiter->Wake, then Engine::Plan) before it plans
  // again: planning met a miss another request of the same executor is
  // already reading, a fill in flight, or a write under a byte-range lock
  // needs its whole clusters and must wait for them.
  bool parked = false;
  bool counted = false;  // guest counters added (once per request)
  // Write-zeroes and discard: how much of the range's whole clusters is
  // zeroed already, by rounds that stopped at a deferred miss or at the
  // end of a round (Qcow2Layer::Zero); and whether the plan is one round
  // of several (the executor then calls Engine::NextRound).
  uint64_t zero_done = 0;
  bool zero_more = false;
  // A write: how far the probe before its planning got (ProbeChange).
  ProbeProgress probe;
  FlushState flush;
  FillState fill;
  WriteBackTicket write_back;

  absl::Status status;
  IoStats stats;

  // Executor state.
  Stage stage = Stage::kPlanned;
  int pending = 0;       // ops in flight
  void* owner = nullptr;  // the queue, or null for a synchronous call

  bool is_flush() const { return kind == Kind::kFlush; }
  // A write whose data is in `segs` (wbuf is ScatterBase()).
  bool scattered_write() const {
    return kind == Kind::kWrite && !segs.empty();
  }
  bool is_read() const { return kind == Kind::kRead; }
  // Changes the disk (write, write-zeroes, discard).
  bool changes() const { return !is_read() && !is_flush(); }
};

// Calls fn(guest offset, buffer, length) for each piece of a read's buffer
// in order: its segments (a vectored read), or rbuf whole. Stops at the
// first error.
template <typename Fn>
absl::Status ForEachSegment(const Request& r, Fn&& fn) {
  if (r.segs.empty()) return fn(r.offset, r.rbuf, r.len);
  uint64_t pos = r.offset;
  for (const iovec& v : r.segs) {
    if (v.iov_len == 0) continue;
    absl::Status s = fn(pos, static_cast<uint8_t*>(v.iov_base),
                        static_cast<uint64_t>(v.iov_len));
    if (!s.ok()) return s;
    pos += v.iov_len;
  }
  return absl::OkStatus();
}

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_ENGINE_REQUEST_H_
