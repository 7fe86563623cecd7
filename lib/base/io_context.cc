// SPDX-License-Identifier: Apache-2.0
#include "lib/base/io_context.h"

namespace qcow2::internal {

namespace {
thread_local IoStats* t_stats = nullptr;
}  // namespace

IoStats* CurrentStats() { return t_stats; }
StatsScope::StatsScope(IoStats* stats) : saved_(t_stats) { t_stats = stats; }
StatsScope::~StatsScope() { t_stats = saved_; }

namespace {
thread_local int t_under_lock = 0;
}  // namespace

UnderLockScope::UnderLockScope() { ++t_under_lock; }
UnderLockScope::~UnderLockScope() { --t_under_lock; }

LockReleasedScope::LockReleasedScope() { --t_under_lock; }
LockReleasedScope::~LockReleasedScope() { ++t_under_lock; }

void NoteHostCall() {
  if (t_under_lock > 0) CountMetadata(&IoStats::host_calls_under_lock, 1);
}

}  // namespace qcow2::internal
