// SPDX-License-Identifier: Apache-2.0
// RangeLockTable against a model of its rule written the plainest way (a
// list in arrival order, walked whole for every check): random requests
// arrive, leave, widen and grow, and after each step the table must grant,
// wake and answer exactly as the model does.
#include "lib/engine/range_locks.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "lib/engine/request.h"

namespace qcow2::internal {
namespace {

constexpr uint32_t kClusterBits = 16;
constexpr uint32_t kUnitBits = 12;
constexpr uint64_t kUnitsPerCluster = uint64_t{1} << (kClusterBits - kUnitBits);

class RecordingWaiter : public Waiter {
 public:
  void Wake(Request* r) override { woken.push_back(r); }
  std::vector<Request*> woken;
};

// The rule, as plainly as it can be said.
class Model {
 public:
  struct Entry {
    Request* r;
    uint64_t first, last;
    bool shared, granted, fine, hold;
  };

  void Add(Request* r, bool granted) {
    list_.push_back({r, r->lock.first, r->lock.last, r->lock.shared, granted,
                     r->lock.fine, r->is_flush()});
  }
  Entry* Find(const Request* r) {
    for (Entry& e : list_) {
      if (e.r == r) return &e;
    }
    return nullptr;
  }
  bool CanGrant(const Request* r) {
    const Entry* self = Find(r);
    bool before = true;
    for (const Entry& e : list_) {
      if (e.r == r) {
        before = false;
        continue;
      }
      const bool overlap = e.first <= self->last && self->first <= e.last;
      if ((before || e.granted) && overlap && !(e.shared && self->shared)) {
        return false;
      }
    }
    return true;
  }
  std::vector<Request*> GrantWaiters() {
    std::vector<Request*> woken;
    for (Entry& e : list_) {
      if (e.granted || !CanGrant(e.r)) continue;
      e.granted = true;
      woken.push_back(e.r);
    }
    return woken;
  }
  std::vector<Request*> Remove(const Request* r) {
    list_.erase(std::find_if(list_.begin(), list_.end(),
                             [r](const Entry& e) { return e.r == r; }));
    return GrantWaiters();
  }
  // Returns whether r holds its widened range at once.
  bool Widen(const Request* r, std::vector<Request*>* woken) {
    Entry* e = Find(r);
    e->fine = false;
    e->first = (r->offset >> kClusterBits) * kUnitsPerCluster;
    e->last = ((((r->offset + r->len - 1) >> kClusterBits) + 1) *
               kUnitsPerCluster) - 1;
    if (CanGrant(r)) {
      e->granted = true;
      return true;
    }
    e->granted = false;
    *woken = GrantWaiters();
    return false;
  }
  bool HeldWhole(uint64_t first, uint64_t last) const {
    for (const Entry& e : list_) {
      if (e.granted && !e.fine && !e.hold && e.first <= last &&
          first <= e.last) {
        return true;
      }
    }
    return false;
  }
  const std::vector<Entry>& list() const { return list_; }

 private:
  std::vector<Entry> list_;
};

// A random guest range: mostly a few units, some up to a few clusters,
// and some wider than the table's narrow index (4 MiB = 1024 units).
void RandomRange(std::mt19937_64* rng, uint64_t* offset, uint64_t* len) {
  const uint64_t unit = uint64_t{1} << kUnitBits;
  const uint64_t first = (*rng)() % 6000;
  const int kind = static_cast<int>((*rng)() % 10);
  uint64_t units;
  if (kind < 6) {
    units = 1 + (*rng)() % 8;
  } else if (kind < 9) {
    units = 1 + (*rng)() % 1100;
  } else {
    units = 1000 + (*rng)() % 3000;
  }
  *offset = first * unit + (*rng)() % unit;
  *len = units * unit - (*offset % unit);
}

void ExpectSameState(const RangeLockTable& table, const Model& model) {
  size_t waiting = 0;
  for (const Model::Entry& e : model.list()) {
    SCOPED_TRACE(testing::Message() << "request [" << e.first << ", "
                                    << e.last << "]");
    EXPECT_EQ(e.r->lock.granted, e.granted);
    EXPECT_EQ(e.r->lock.first, e.first);
    EXPECT_EQ(e.r->lock.last, e.last);
    EXPECT_TRUE(e.r->lock.in_table);
    if (!e.granted) ++waiting;
  }
  EXPECT_EQ(table.size(), model.list().size());
  EXPECT_EQ(table.waiting(), waiting);
}

class RangeLocksModelTest : public testing::TestWithParam<uint64_t> {};

TEST_P(RangeLocksModelTest, GrantsAndWakesAsTheModel) {
  std::mt19937_64 rng(GetParam());
  RangeLockTable table;
  table.SetGeometry(kClusterBits, kUnitBits);
  Model model;
  RecordingWaiter waiter;
  std::vector<std::unique_ptr<Request>> all;
  auto in_table = [&] {
    std::vector<Request*> out;
    for (const Model::Entry& e : model.list()) out.push_back(e.r);
    return out;
  };
  for (int step = 0; step < 4000 && !HasFailure(); ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    const std::vector<Request*> present = in_table();
    const int op = static_cast<int>(rng() % 100);
    waiter.woken.clear();
    if (op < 40 || present.size() < 4) {
      // A request arrives, as Engine::Begin adds it.
      auto r = std::make_unique<Request>();
      const int kind = static_cast<int>(rng() % 10);
      r->kind = kind < 4   ? Request::Kind::kRead
                : kind < 9 ? Request::Kind::kWrite
                           : Request::Kind::kFlush;  // a fill's hold
      RandomRange(&rng, &r->offset, &r->len);
      r->waiter = &waiter;
      table.SetRange(r.get(), r->is_read() || rng() % 2 == 0);
      r->lock.shared = !(r->kind == Request::Kind::kWrite);
      r->lock.granted = r->is_flush();  // holds never wait
      table.Add(r.get());
      model.Add(r.get(), r->lock.granted);
      if (!r->lock.granted) {
        const bool can = table.CanGrant(r.get());
        ASSERT_EQ(can, model.CanGrant(r.get()));
        if (can) {
          table.Grant(r.get());
          model.Find(r.get())->granted = true;
        }
      }
      all.push_back(std::move(r));
    } else if (op < 75) {
      // One leaves; the ones it kept out are woken, in arrival order.
      Request* r = present[rng() % present.size()];
      table.Remove(r);
      EXPECT_FALSE(r->lock.in_table);
      EXPECT_EQ(waiter.woken, model.Remove(r));
    } else if (op < 85) {
      // A granted write under a byte-range lock widens to its clusters.
      std::vector<Request*> fine;
      for (Request* r : present) {
        if (r->lock.granted && r->lock.fine &&
            r->kind == Request::Kind::kWrite) {
          fine.push_back(r);
        }
      }
      if (fine.empty()) continue;
      Request* r = fine[rng() % fine.size()];
      std::vector<Request*> expected_woken;
      const bool expected = model.Widen(r, &expected_woken);
      EXPECT_EQ(table.Widen(r), expected);
      EXPECT_EQ(waiter.woken, expected_woken);
    } else if (op < 90) {
      // A fill's hold takes in the next clusters.
      std::vector<Request*> holds;
      for (Request* r : present) {
        if (r->is_flush()) holds.push_back(r);
      }
      if (holds.empty()) continue;
      Request* r = holds[rng() % holds.size()];
      const uint64_t last =
          r->lock.last + kUnitsPerCluster * (1 + rng() % 400);
      table.SetLast(r, last);
      model.Find(r)->last = last;
      // Nothing is granted by a hold that grows; a later waiter that a
      // grant pass would now refuse stays as it was.
    } else if (op < 95) {
      uint64_t offset, len;
      RandomRange(&rng, &offset, &len);
      const uint64_t first = offset >> kUnitBits;
      const uint64_t last = (offset + len - 1) >> kUnitBits;
      EXPECT_EQ(table.HeldWhole(first, last), model.HeldWhole(first, last));
    } else {
      table.GrantWaiters();
      EXPECT_EQ(waiter.woken, model.GrantWaiters());
    }
    ExpectSameState(table, model);
  }
  // Drain: everything leaves, and every waiter is granted on the way.
  for (Request* r : in_table()) {
    waiter.woken.clear();
    table.Remove(r);
    EXPECT_EQ(waiter.woken, model.Remove(r));
  }
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.waiting(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Seeds, RangeLocksModelTest,
                         testing::Values(1, 2, 3, 42, 1234, 99991));

// A request ranged wider than the narrow index still meets one that starts
// far before it, and one inside it.
TEST(RangeLocksTest, WideRangesMeetNarrowOnes) {
  RangeLockTable table;
  table.SetGeometry(kClusterBits, kUnitBits);
  RecordingWaiter waiter;
  Request wide, inside, after;
  for (Request* r : {&wide, &inside, &after}) {
    r->kind = Request::Kind::kWrite;
    r->waiter = &waiter;
  }
  wide.offset = 0;
  wide.len = uint64_t{64} << 20;  // 16,384 units
  inside.offset = uint64_t{40} << 20;
  inside.len = 4096;
  after.offset = uint64_t{64} << 20;  // the first byte past `wide`
  after.len = 4096;
  for (Request* r : {&wide, &inside, &after}) {
    table.SetRange(r, /*fine=*/true);
    table.Add(r);
  }
  EXPECT_TRUE(table.CanGrant(&wide));
  table.Grant(&wide);
  EXPECT_FALSE(table.CanGrant(&inside));
  EXPECT_TRUE(table.CanGrant(&after));
  table.Grant(&after);
  table.Remove(&wide);
  EXPECT_EQ(waiter.woken, std::vector<Request*>{&inside});
  EXPECT_TRUE(inside.lock.granted);
}

}  // namespace
}  // namespace qcow2::internal
