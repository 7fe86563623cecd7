// SPDX-License-Identifier: Apache-2.0
// The guest ranges requests hold, in arrival order: a request may go on
// once no earlier request (holding or waiting), and no later one holding,
// overlaps its range, unless both only read.
#ifndef QCOW2_LIB_ENGINE_RANGE_LOCKS_H_
#define QCOW2_LIB_ENGINE_RANGE_LOCKS_H_

#include <cstddef>
#include <cstdint>
#include <list>

#include "lib/engine/request.h"

namespace qcow2::internal {

// Not thread-safe: the engine calls it under its metadata lock.
class RangeLockTable {
 public:
  // The top's clusters are 2^cluster_bits bytes; ranges are counted in
  // units of 2^unit_bits (unit_bits <= cluster_bits). Set when the top is
  // opened or replaced, with no request in the table.
  void SetGeometry(uint32_t cluster_bits, uint32_t unit_bits) {
    cluster_bits_ = cluster_bits;
    unit_bits_ = unit_bits;
  }
  uint32_t cluster_bits() const { return cluster_bits_; }
  uint32_t unit_bits() const { return unit_bits_; }
  // Sets r->lock to r's own bytes (`fine`) or its whole clusters.
  void SetRange(Request* r, bool fine) const;

  // Appends r (arrival order), granted or not as r->lock.granted says.
  // REQUIRES: r is not in the table; r->lock.shared is set and stays.
  void Add(Request* r);
  // Marks r, in the table, as holding its range (CanGrant said it may).
  void Grant(Request* r);
  // Removes r, and (with `grant`) grants and wakes the waiters it kept
  // out; without, the caller calls GrantWaiters once it has removed all it
  // removes.
  void Remove(Request* r, bool grant = true);
  // Whether r, in the table, may hold its range now.
  bool CanGrant(const Request* r) const;
  // Grants every waiting request that may now go on, waking each.
  void GrantWaiters();
  // A request granted under a byte-range lock that now needs its whole
  // clusters: widens its range. Returns true if it holds them at once;
  // else it is parked until GrantWaiters wakes it.
  bool Widen(Request* r);
  // Whether a request other than a flush's hold has been granted a
  // cluster-wide range overlapping units [first, last].
  bool HeldWhole(uint64_t first, uint64_t last) const;

 private:
  static bool Conflicts(const Request* a, const Request* b);

  std::list<Request*> list_;  // holding or waiting, in arrival order
  // Of the requests in list_: how many wait (not granted), and how many
  // are not shared. With no exclusive request a shared one conflicts with
  // nothing, and with no waiter there is nothing to grant: a table of
  // reads only costs no walk.
  size_t waiting_ = 0;
  size_t exclusive_ = 0;
  uint32_t cluster_bits_ = 16;
  uint32_t unit_bits_ = 16;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_ENGINE_RANGE_LOCKS_H_
