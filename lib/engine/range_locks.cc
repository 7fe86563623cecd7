// SPDX-License-Identifier: Apache-2.0
#include "lib/engine/range_locks.h"

#include <algorithm>
#include <vector>

namespace qcow2::internal {

namespace {

// Ranges up to this many bytes (and two clusters, with larger clusters)
// are indexed by where they start; a look-up visits the ranges that start
// within this distance before it. Larger requests are few at a time.
constexpr uint32_t kNarrowSpanBits = 22;  // 4 MiB

}  // namespace

void RangeLockTable::SetGeometry(uint32_t cluster_bits, uint32_t unit_bits) {
  cluster_bits_ = cluster_bits;
  unit_bits_ = unit_bits;
  const uint64_t two_clusters = uint64_t{2} << (cluster_bits - unit_bits);
  const uint64_t span = unit_bits >= kNarrowSpanBits
                            ? 1
                            : uint64_t{1} << (kNarrowSpanBits - unit_bits);
  narrow_span_ = std::max(two_clusters, span);
}

void RangeLockTable::Regeometry(uint32_t cluster_bits, uint32_t unit_bits) {
  std::vector<Request*> all;
  for (const auto& [first, r] : narrow_) all.push_back(r);
  for (const auto& [seq, r] : wide_) all.push_back(r);
  narrow_.clear();
  wide_.clear();
  SetGeometry(cluster_bits, unit_bits);
  for (Request* r : all) {
    SetRange(r, r->lock.fine);
    Index(r);
  }
}

void RangeLockTable::SetRange(Request* r, bool fine) const {
  const uint32_t cluster_bits = cluster_bits_;
  const uint32_t unit_bits = unit_bits_;
  const uint64_t last_byte = r->offset + r->len - 1;
  r->lock.fine = fine;
  if (fine) {
    r->lock.first = r->offset >> unit_bits;
    r->lock.last = last_byte >> unit_bits;
  } else {
    const uint32_t shift = cluster_bits - unit_bits;
    r->lock.first = (r->offset >> cluster_bits) << shift;
    r->lock.last = (((last_byte >> cluster_bits) + 1) << shift) - 1;
  }
}

bool RangeLockTable::Conflicts(const Request* a, const Request* b) {
  if (a->lock.shared && b->lock.shared) return false;
  return a->lock.first <= b->lock.last && b->lock.first <= a->lock.last;
}

void RangeLockTable::Index(Request* r) {
  if (IsNarrow(r)) {
    narrow_.emplace(r->lock.first, r);
  } else {
    wide_.emplace(r->lock.seq, r);
  }
}

void RangeLockTable::Unindex(Request* r) {
  if (!IsNarrow(r)) {
    wide_.erase(r->lock.seq);
    return;
  }
  auto [it, end] = narrow_.equal_range(r->lock.first);
  for (; it != end; ++it) {
    if (it->second == r) {
      narrow_.erase(it);
      return;
    }
  }
}

template <typename Fn>
bool RangeLockTable::AnyOverlapping(uint64_t first, uint64_t last,
                                    Fn fn) const {
  const uint64_t from = first >= narrow_span_ - 1 ? first - (narrow_span_ - 1)
                                                  : 0;
  for (auto it = narrow_.lower_bound(from);
       it != narrow_.end() && it->first <= last; ++it) {
    if (it->second->lock.last >= first && fn(it->second)) return true;
  }
  for (const auto& [seq, other] : wide_) {
    if (other->lock.first <= last && first <= other->lock.last && fn(other)) {
      return true;
    }
  }
  return false;
}

void RangeLockTable::Add(Request* r) {
  r->lock.seq = next_seq_++;
  r->lock.in_table = true;
  Index(r);
  if (!r->lock.granted) waiters_.emplace(r->lock.seq, r);
  if (!r->lock.shared) ++exclusive_;
}

void RangeLockTable::SetLast(Request* r, uint64_t last) {
  Unindex(r);
  r->lock.last = last;
  Index(r);
}

void RangeLockTable::Grant(Request* r) {
  if (r->lock.granted) return;
  r->lock.granted = true;
  waiters_.erase(r->lock.seq);
}

void RangeLockTable::Remove(Request* r, bool grant) {
  if (!r->lock.in_table) return;
  Unindex(r);
  r->lock.in_table = false;
  if (!r->lock.granted) waiters_.erase(r->lock.seq);
  if (!r->lock.shared) --exclusive_;
  if (grant) GrantWaiters();
}

bool RangeLockTable::CanGrant(const Request* r) const {
  if (r->lock.shared && exclusive_ == 0) return true;
  // Later requests normally wait behind r; one may hold a range that
  // overlaps r's only if r widened its range after it was granted.
  return !AnyOverlapping(
      r->lock.first, r->lock.last, [r](const Request* other) {
        return other != r &&
               (other->lock.seq < r->lock.seq || other->lock.granted) &&
               Conflicts(other, r);
      });
}

void RangeLockTable::GrantWaiters() {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    Request* w = it->second;
    if (!CanGrant(w)) {
      ++it;
      continue;
    }
    w->lock.granted = true;
    it = waiters_.erase(it);
    w->waiter->Wake(w);
  }
}

bool RangeLockTable::Widen(Request* r) {
  Unindex(r);
  SetRange(r, false);
  Index(r);
  if (CanGrant(r)) {
    Grant(r);
    return true;
  }
  if (r->lock.granted) {
    r->lock.granted = false;
    waiters_.emplace(r->lock.seq, r);
  }
  r->parked = true;
  // r gave up what it held: earlier requests that waited only for it
  // (they could not go on while a later request held an overlapping
  // range) may go on now, and r waits for them.
  GrantWaiters();
  return false;
}

bool RangeLockTable::HeldWhole(uint64_t first, uint64_t last) const {
  return AnyOverlapping(first, last, [](const Request* other) {
    return other->lock.granted && !other->lock.fine && !other->is_flush();
  });
}

}  // namespace qcow2::internal
