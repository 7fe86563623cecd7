// SPDX-License-Identifier: Apache-2.0
// Group commit of flushes: a flush records the metadata write-back (the
// log of cache writes and file flushes, Qcow2Layer::BeginFlush) and writes
// it with no lock held; flushes that come in while a log is written share
// the next one, and a flush recorded after another came in covers it.
#ifndef QCOW2_LIB_ENGINE_FLUSH_GROUP_H_
#define QCOW2_LIB_ENGINE_FLUSH_GROUP_H_

#include <cstdint>

#include "lib/base/mutex.h"
#include "lib/engine/request.h"

namespace qcow2::internal {

class Qcow2Layer;

// Guarded by the engine's metadata lock, which Record lets go while it
// writes.
class FlushGroup {
 public:
  // Notes a flush as planned: any flush recorded from now on covers it.
  void Join(Request* r) {
    r->flush.record = true;
    r->flush.arrival = recorded_;
  }
  // r's metadata write-back, by its executor, `mu` held (and let go while
  // a log is written): if a flush recorded since r was planned, its log
  // covers r, which then only waits for that log (r->write_back is set to
  // it); else, once no other flush is writing its log, records one and
  // writes it. The wait is for a thread writing a log, never for a queue
  // to be polled.
  void Record(Request* r, Qcow2Layer* top, Mutex* mu)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

 private:
  uint64_t recorded_ = 0;  // flushes recorded so far
  // The last one's log ticket and quarantine generation.
  uint64_t covering_ticket_ = 0;
  uint64_t covering_generation_ = 0;
  bool recording_ = false;  // a flush is writing its log
  CondVar recorded_cv_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_ENGINE_FLUSH_GROUP_H_
