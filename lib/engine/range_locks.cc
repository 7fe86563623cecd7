// SPDX-License-Identifier: Apache-2.0
#include "lib/engine/range_locks.h"

namespace qcow2::internal {

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

void RangeLockTable::Add(Request* r) {
  r->lock.pos = list_.insert(list_.end(), r);
  r->lock.in_table = true;
  if (!r->lock.granted) ++waiting_;
  if (!r->lock.shared) ++exclusive_;
}

void RangeLockTable::Grant(Request* r) {
  if (r->lock.granted) return;
  r->lock.granted = true;
  --waiting_;
}

void RangeLockTable::Remove(Request* r, bool grant) {
  if (!r->lock.in_table) return;
  list_.erase(r->lock.pos);
  r->lock.in_table = false;
  if (!r->lock.granted) --waiting_;
  if (!r->lock.shared) --exclusive_;
  if (grant) GrantWaiters();
}

bool RangeLockTable::CanGrant(const Request* r) const {
  if (r->lock.shared && exclusive_ == 0) return true;
  bool before = true;
  for (const Request* other : list_) {
    if (other == r) {
      before = false;
      continue;
    }
    // Later requests normally wait behind r; one may hold a range that
    // overlaps r's only if r widened its range after it was granted.
    if ((before || other->lock.granted) && Conflicts(other, r)) return false;
  }
  return true;
}

void RangeLockTable::GrantWaiters() {
  if (waiting_ == 0) return;
  for (Request* w : list_) {
    if (w->lock.granted || !CanGrant(w)) continue;
    Grant(w);
    w->waiter->Wake(w);
  }
}

bool RangeLockTable::Widen(Request* r) {
  SetRange(r, false);
  const bool granted = CanGrant(r);
  if (granted) {
    Grant(r);
    return true;
  }
  if (r->lock.granted) {
    r->lock.granted = false;
    ++waiting_;
  }
  r->parked = true;
  // r gave up what it held: earlier requests that waited only for it
  // (they could not go on while a later request held an overlapping
  // range) may go on now, and r waits for them.
  GrantWaiters();
  return false;
}

bool RangeLockTable::HeldWhole(uint64_t first, uint64_t last) const {
  for (const Request* other : list_) {
    if (other->lock.granted && !other->lock.fine && !other->is_flush() &&
        other->lock.first <= last && first <= other->lock.last) {
      return true;
    }
  }
  return false;
}

}  // namespace qcow2::internal
