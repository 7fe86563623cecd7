// SPDX-License-Identifier: Apache-2.0
// The guest ranges requests hold, in arrival order: a request may go on
// once no earlier request (holding or waiting), and no later one holding,
// overlaps its range, unless both only read.
#ifndef QCOW2_LIB_ENGINE_RANGE_LOCKS_H_
#define QCOW2_LIB_ENGINE_RANGE_LOCKS_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/btree_map.h"
#include "lib/engine/request.h"

namespace qcow2::internal {

// Not thread-safe: the engine calls it under its metadata lock.
//
// Requests are indexed by range, so that a check costs the requests near
// it, not every request in the table: many writers keep hundreds in it at
// once (16 NBD connections of 16 threads each), and a check runs when a
// request arrives and, for each waiter, whenever one leaves.
class RangeLockTable {
 public:
  // The top's clusters are 2^cluster_bits bytes; ranges are counted in
  // units of 2^unit_bits (unit_bits <= cluster_bits). Set when the top is
  // opened or replaced, with no request in the table.
  void SetGeometry(uint32_t cluster_bits, uint32_t unit_bits);
  // SetGeometry for a top that replaced another (an active commit's
  // switch): every request in the table is ranged again by its own bytes
  // or, if not `fine`, its whole clusters in the new geometry. A fine
  // write checks again whether it may stay fine when it is planned.
  void Regeometry(uint32_t cluster_bits, uint32_t unit_bits);
  uint32_t cluster_bits() const { return cluster_bits_; }
  uint32_t unit_bits() const { return unit_bits_; }
  // Sets r->lock to r's own bytes (`fine`) or its whole clusters.
  // REQUIRES: r is not in the table (Widen re-ranges one that is).
  void SetRange(Request* r, bool fine) const;

  // Appends r (arrival order), granted or not as r->lock.granted says.
  // REQUIRES: r is not in the table; r->lock.shared is set and stays.
  void Add(Request* r);
  // Moves the last unit of r's range, in the table, to `last` (a fill's
  // hold that takes in the next cluster).
  void SetLast(Request* r, uint64_t last);
  // Marks r, in the table, as holding its range (CanGrant said it may).
  void Grant(Request* r);
  // Removes r, and (with `grant`) grants and wakes the waiters it kept
  // out; without, the caller calls GrantWaiters once it has removed all it
  // removes.
  void Remove(Request* r, bool grant = true);
  // Whether r, in the table, may hold its range now.
  bool CanGrant(const Request* r) const;
  // Grants every waiting request that may now go on, in arrival order,
  // waking each.
  void GrantWaiters();
  // A request granted under a byte-range lock that now needs its whole
  // clusters: widens its range. Returns true if it holds them at once;
  // else it is parked until GrantWaiters wakes it.
  bool Widen(Request* r);
  // Whether a request other than a flush's hold has been granted a
  // cluster-wide range overlapping units [first, last].
  bool HeldWhole(uint64_t first, uint64_t last) const;

  size_t size() const { return narrow_.size() + wide_.size(); }
  size_t waiting() const { return waiters_.size(); }

 private:
  static bool Conflicts(const Request* a, const Request* b);
  bool IsNarrow(const Request* r) const {
    return r->lock.last - r->lock.first < narrow_span_;
  }
  void Index(Request* r);
  void Unindex(Request* r);
  // Calls fn(other) for requests in the table whose range overlaps units
  // [first, last], until fn returns true; returns whether one did.
  template <typename Fn>
  bool AnyOverlapping(uint64_t first, uint64_t last, Fn fn) const;

  // Ranges of fewer than narrow_span_ units, by first unit: those that can
  // overlap [first, last] start in [first - narrow_span_ + 1, last].
  absl::btree_multimap<uint64_t, Request*> narrow_;
  // Longer ranges (large requests), by arrival: checked one by one.
  absl::btree_map<uint64_t, Request*> wide_;
  // The requests not granted, by arrival.
  absl::btree_map<uint64_t, Request*> waiters_;
  uint64_t next_seq_ = 0;
  // How many requests in the table are not shared. With no exclusive one
  // a shared request conflicts with nothing: a table of reads costs no
  // look-up.
  size_t exclusive_ = 0;
  uint32_t cluster_bits_ = 16;
  uint32_t unit_bits_ = 16;
  uint64_t narrow_span_ = 64;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_ENGINE_RANGE_LOCKS_H_
