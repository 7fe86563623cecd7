// SPDX-License-Identifier: Apache-2.0
#include "lib/engine/stats_registry.h"

#include <algorithm>

namespace qcow2::internal {

void StatsRegistry::Register(Source* s) {
  MutexLock lock(&mu_);
  sources_.push_back(s);
}

void StatsRegistry::Unregister(Source* s) {
  MutexLock lock(&mu_);
  retired_ += s->Snapshot();
  sources_.erase(std::remove(sources_.begin(), sources_.end(), s),
                 sources_.end());
}

void StatsRegistry::Retire(const IoStats& stats) {
  MutexLock lock(&mu_);
  retired_ += stats;
}

IoStats StatsRegistry::Total() const {
  MutexLock lock(&mu_);
  IoStats total = retired_;
  for (const Source* s : sources_) total += s->Snapshot();
  return total;
}

size_t StatsRegistry::live_sources() const {
  MutexLock lock(&mu_);
  return sources_.size();
}

}  // namespace qcow2::internal
