// SPDX-License-Identifier: Apache-2.0
// The I/O counters of one image: those of requests and queues that are
// gone, and the live queues', added up on demand (Image::GetStats).
#ifndef QCOW2_LIB_ENGINE_STATS_REGISTRY_H_
#define QCOW2_LIB_ENGINE_STATS_REGISTRY_H_

#include <vector>

#include "absl/base/thread_annotations.h"
#include "lib/base/io_context.h"
#include "lib/base/mutex.h"
#include "qcow2/stats.h"

namespace qcow2::internal {

// Thread-safe.
class StatsRegistry {
 public:
  // A live source of counters (a queue).
  class Source {
   public:
    virtual ~Source() = default;
    virtual IoStats Snapshot() const = 0;
  };
  void Register(Source* s) ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps what `s` counted, then forgets `s`.
  void Unregister(Source* s) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds the counters of a finished synchronous request or call.
  void Retire(const IoStats& stats) ABSL_LOCKS_EXCLUDED(mu_);
  IoStats Total() const ABSL_LOCKS_EXCLUDED(mu_);
  // Live sources (open queues).
  size_t live_sources() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable Mutex mu_;
  std::vector<Source*> sources_ ABSL_GUARDED_BY(mu_);
  IoStats retired_ ABSL_GUARDED_BY(mu_);
};

// Counts the host I/O this thread makes during a call that is not a
// request (Close, Resize, CreateOverlay: metadata written back, the
// header, a truncate) and adds it to `registry` when it ends, so that
// GetStats() sees it.
class CountedCall {
 public:
  explicit CountedCall(StatsRegistry* registry)
      : registry_(registry), scope_(&stats_) {}
  ~CountedCall() { registry_->Retire(stats_); }
  CountedCall(const CountedCall&) = delete;
  CountedCall& operator=(const CountedCall&) = delete;

 private:
  StatsRegistry* const registry_;
  IoStats stats_;
  StatsScope scope_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_ENGINE_STATS_REGISTRY_H_
