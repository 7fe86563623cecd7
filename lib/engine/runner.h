// SPDX-License-Identifier: Apache-2.0
// The one place a request's lifecycle is written down: the stages every
// request goes through (Stage, in request.h) and the runner that moves it
// from one to the next, whoever carries out its I/O. The synchronous calls
// (RunSync) and the io_uring queues (lib/engine/queue_impl.cc) differ only in
// their Executor.
#ifndef QCOW2_LIB_ENGINE_RUNNER_H_
#define QCOW2_LIB_ENGINE_RUNNER_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "absl/status/status.h"
#include "lib/engine/engine.h"
#include "lib/engine/request.h"

namespace qcow2::internal {

// Carries out a request's I/O.
class Executor {
 public:
  enum class OpType : uint8_t { kRead, kWrite, kFlush };
  virtual ~Executor() = default;
  // Carries out `op` for r, either at once, blocking (its bytes counted in
  // r->stats, an error in r->status), or issued with ++r->pending, in
  // which case the executor sets r's error, if any, and calls Advance
  // again once r->pending is back to 0.
  virtual void Issue(Request* r, IoOp* op, OpType type) = 0;
  // r is finished (Engine::Finish ran): its result is r->status.
  virtual void Done(Request* r) = 0;
};

// A Waiter the waiting thread blocks on: Wait() returns once Wake has
// been called since the last Wait returned.
class BlockingWaiter : public Waiter {
 public:
  void Wake(Request* r) override;
  void Wait();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool woken_ = false;
};

// Moves r from r->stage through its stages while none of its I/O is in
// flight. Returns when r waits for I/O (r->pending > 0), when it is parked
// (r->parked: its waiter is told when it may go on; the owner then calls
// Engine::Plan and Advance again from Stage::kPlanned), or when it is done
// (r->stage == Stage::kDone, after x->Done(r)).
void Advance(Engine* engine, Executor* x, Request* r);

// Runs r to the end on this thread with blocking I/O.
absl::Status RunSync(Engine* engine, Request* r);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_ENGINE_RUNNER_H_
