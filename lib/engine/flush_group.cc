// SPDX-License-Identifier: Apache-2.0
#include "lib/engine/flush_group.h"

#include "lib/base/events.h"
#include "lib/base/io_context.h"
#include "lib/driver/qcow2_layer.h"

namespace qcow2::internal {

void FlushGroup::Record(Request* r, Qcow2Layer* top, Mutex* mu) {
  for (;;) {
    if (recorded_ > r->flush.arrival) {
      // Another flush recorded the caches after this one came in: its
      // log holds every metadata change this one must make durable.
      // Wait for that log to be written, then flush the file.
      r->write_back.file = top->meta_file();
      r->write_back.ticket = covering_ticket_;
      r->flush.generation = covering_generation_;
      return;
    }
    if (!recording_) break;
    // Another flush is writing its log: its successor records once, for
    // every flush waiting meanwhile.
    EmitEvent("flush-wait");
    recorded_cv_.Wait(mu);
  }
  absl::StatusOr<FlushSequencer::FlushTicket> t = top->flusher().BeginFlush();
  if (!t.ok()) {
    r->status = t.status();
    return;
  }
  ++recorded_;
  covering_ticket_ = t->write_back;
  covering_generation_ = t->generation;
  r->flush.generation = t->generation;
  if (t->write_back == 0) return;  // nothing recorded (read-only, closed)
  recording_ = true;
  WriteBackFile* meta = top->meta_file();
  {
    // The log is written with the lock let go (and not counted as held).
    mu->Unlock();
    LockReleasedScope released;
    r->status = meta->WriteBack(t->write_back);
    mu->Lock();
  }
  recording_ = false;
  recorded_cv_.SignalAll();
}

}  // namespace qcow2::internal
