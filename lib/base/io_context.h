// SPDX-License-Identifier: Apache-2.0
// The I/O context of the calling thread: whose counters metadata I/O is
// charged to, and whether the thread holds an image's metadata lock.
//
// Thread-locals, owned here and nowhere else. Who sets them:
//  - StatsScope: the request engine (lib/engine), around planning and
//    committing one request, so that metadata I/O made on the way (cache
//    misses read at once, write-backs) counts in that request's IoStats;
//    GetBlockStatus likewise.
//  - UnderLockScope: every holder of an image's metadata lock
//    (engine::ChainLock), so that host calls made meanwhile
//    (NoteHostCall, from AccountedFile) are counted as
//    IoStats::host_calls_under_lock.
#ifndef QCOW2_LIB_BASE_IO_CONTEXT_H_
#define QCOW2_LIB_BASE_IO_CONTEXT_H_

#include <cstdint>

#include "qcow2/stats.h"

namespace qcow2::internal {

// The counters of the request being planned or committed on this thread
// (metadata I/O is counted there). nullptr outside a request.
IoStats* CurrentStats();
class StatsScope {
 public:
  explicit StatsScope(IoStats* stats);
  ~StatsScope();
  StatsScope(const StatsScope&) = delete;
  StatsScope& operator=(const StatsScope&) = delete;

 private:
  IoStats* saved_;
};

// Adds `n` to counter `field` of the current request, if any.
inline void CountMetadata(uint64_t IoStats::*field, uint64_t n) {
  if (IoStats* s = CurrentStats()) s->*field += n;
}

// Marks the thread as holding an image's metadata lock (the engine's
// mutex) while it lives. Host file calls made meanwhile count as
// IoStats::host_calls_under_lock of the current request (NoteHostCall).
class UnderLockScope {
 public:
  UnderLockScope();
  ~UnderLockScope();
  UnderLockScope(const UnderLockScope&) = delete;
  UnderLockScope& operator=(const UnderLockScope&) = delete;
};

// While it lives, the thread that holds the metadata lock has let it go
// for a while (host calls are not counted as made under it).
// REQUIRES: an UnderLockScope is live on this thread.
class LockReleasedScope {
 public:
  LockReleasedScope();
  ~LockReleasedScope();
  LockReleasedScope(const LockReleasedScope&) = delete;
  LockReleasedScope& operator=(const LockReleasedScope&) = delete;
};

// Called at each host call the library makes on a file (AccountedFile).
void NoteHostCall();

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_BASE_IO_CONTEXT_H_
