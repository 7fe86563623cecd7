// SPDX-License-Identifier: Apache-2.0
// The lock list, driven step by step through the engine's internal API
// with waiters that only record wake-ups: writes that held only their own
// bytes and must widen to whole clusters (RangeLockTable::Widen), and writes
// into one fresh extended-L2 cluster: a stream's, which hold only their own
// bytes, and a lone write, which holds the whole cluster.
#include <algorithm>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "lib/engine/engine.h"
#include "lib/engine/runner.h"
#include "lib/io/io_plan.h"
#include "lib/engine/request.h"
#include "lib/driver/qcow2_layer.h"
#include "qcow2/file.h"
#include "qcow2/image.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::Engine;
using internal::Qcow2Layer;
using internal::Request;

class CountingWaiter : public internal::Waiter {
 public:
  void Wake(Request*) override { ++wakes; }
  int wakes = 0;
};

constexpr uint64_t kCluster = 65536;

void MakeWrite(Request* r, uint64_t offset, const std::vector<uint8_t>& data,
               CountingWaiter* waiter) {
  r->kind = Request::Kind::kWrite;
  r->offset = offset;
  r->len = data.size();
  r->wbuf = data.data();
  r->waiter = waiter;
}

absl::Status SyncRead(Engine* engine, uint64_t offset,
                      absl::Span<uint8_t> buf) {
  Request r;
  r.kind = Request::Kind::kRead;
  r.offset = offset;
  r.len = buf.size();
  r.rbuf = buf.data();
  return internal::RunSync(engine, &r);
}

absl::Status SyncWrite(Engine* engine, uint64_t offset,
                       const std::vector<uint8_t>& data) {
  Request r;
  r.kind = Request::Kind::kWrite;
  r.offset = offset;
  r.len = data.size();
  r.wbuf = data.data();
  return internal::RunSync(engine, &r);
}

// Reads what r's planning deferred (as an executor would), runs its
// planned I/O and finishes it.
void RunAndFinish(Engine* chain, Request* r) {
  while (r->miss.cache != nullptr) {
    r->status = internal::RunOp(r->miss.op, false);
    chain->LoadMiss(r);
  }
  ASSERT_OK(r->status);
  ASSERT_FALSE(r->parked);
  r->status = internal::RunPlanIo(r->plan, &r->stats);
  ASSERT_OK(r->status);
  chain->Finish(r);
}

// Two writes into one cluster wait behind a request that holds the whole
// cluster, each holding only its own bytes. When it is done both are
// granted, and both then find that they need the whole cluster (here: its
// L2 slice left the cache meanwhile, so the byte-range lock can no longer
// be justified). The first waits for the second, which holds an
// overlapping range; the second, widening too, gives its range up and
// must let the first go on rather than wait for it forever.
TEST(LockWidenTest, TwoWritesWideningTogetherBothGoOn) {
  testing::TempDir dir;
  CreateOptions co;
  co.size = 8 << 20;
  co.cluster_size = kCluster;
  const std::string path = dir.File("img.qcow2");
  ASSERT_OK(CreateImage(path, co));
  OpenOptions oo;
  oo.read_write = true;
  oo.l2_slice_bytes = 512;  // 64 entries a slice
  {
    // Cluster 63 (the last of slice 0) is ours; 64 (slice 1) is not.
    ASSERT_OK_AND_ASSIGN(auto image, Image::Open(path, oo));
    ASSERT_OK(image->Write(63 * kCluster, std::vector<uint8_t>(kCluster, 1)));
    ASSERT_OK(image->Close());
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> file, OpenPosixFile(path, FileOptions{.read_only = false}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> chain,
                       Engine::Open(std::move(file), oo));
  Qcow2Layer* top = chain->TopForTesting();
  ASSERT_NE(top, nullptr);

  std::vector<uint8_t> warm(2 * kCluster);  // both slices into the cache
  ASSERT_OK(SyncRead(chain.get(), 63 * kCluster, absl::MakeSpan(warm)));
  // And the refcount block where clusters are allocated (by a write
  // elsewhere), so that D below is planned whole when it begins, with no
  // miss left for its executor to read.
  ASSERT_OK(SyncWrite(chain.get(), 0, std::vector<uint8_t>(kCluster, 5)));

  // D: unaligned, over clusters 63 and 64; 64 needs a new cluster, so D
  // holds both whole.
  CountingWaiter wd, we, ww;
  const std::vector<uint8_t> dd(2 * 4096, 2), de(4096, 3), dw(4096, 4);
  Request d, e, w;
  MakeWrite(&d, 64 * kCluster - 4096 + 1, dd, &wd);
  ASSERT_TRUE(chain->Begin(&d));
  ASSERT_OK(d.status);
  ASSERT_EQ(d.miss.cache, nullptr);
  EXPECT_FALSE(d.lock.fine);
  // E and W: in place into cluster 63, own bytes only, behind D.
  MakeWrite(&e, 63 * kCluster, de, &we);
  MakeWrite(&w, 63 * kCluster + 8192, dw, &ww);
  EXPECT_FALSE(chain->Begin(&e));
  EXPECT_FALSE(chain->Begin(&w));
  EXPECT_TRUE(e.lock.fine);
  EXPECT_TRUE(w.lock.fine);
  // Slice 0 leaves the cache (it is clean; D pins only slice 1).
  ASSERT_OK_AND_ASSIGN(uint64_t table, top->cluster_map().L2TableFor(63));
  top->cluster_map().l2_cache().Invalidate(table, 512);

  RunAndFinish(chain.get(), &d);
  EXPECT_EQ(we.wakes, 1);
  EXPECT_EQ(ww.wakes, 1);
  chain->Plan(&e);  // widens; W holds an overlapping range: E waits
  EXPECT_TRUE(e.parked);
  EXPECT_FALSE(e.lock.fine);
  chain->Plan(&w);  // widens; waits for E, and E may go on now
  EXPECT_TRUE(w.parked);
  EXPECT_EQ(we.wakes, 2);
  chain->Plan(&e);
  RunAndFinish(chain.get(), &e);
  EXPECT_EQ(ww.wakes, 2);
  chain->Plan(&w);
  RunAndFinish(chain.get(), &w);

  std::vector<uint8_t> got(kCluster);
  ASSERT_OK(SyncRead(chain.get(), 63 * kCluster, absl::MakeSpan(got)));
  std::vector<uint8_t> want(kCluster, 1);
  std::fill_n(want.begin(), 4096, 3);
  std::fill_n(want.begin() + 8192, 4096, 4);
  std::fill_n(want.begin() + kCluster - 4096 + 1, 4095, 2);
  EXPECT_EQ(got, want);
  ASSERT_OK(chain->Close());
}

// A fresh 8 MiB image with extended L2 entries, opened by an Engine.
absl::StatusOr<std::unique_ptr<Engine>> OpenFreshExtended(
    const std::string& path) {
  CreateOptions co;
  co.size = 8 << 20;
  co.cluster_size = kCluster;
  co.extended_l2 = true;
  if (absl::Status s = CreateImage(path, co); !s.ok()) return s;
  OpenOptions oo;
  oo.read_write = true;
  absl::StatusOr<std::unique_ptr<File>> file =
      OpenPosixFile(path, FileOptions{.read_only = false});
  if (!file.ok()) return file.status();
  return Engine::Open(std::move(*file), oo);
}

// Closes `chain`, then checks the image with qemu-img and that qemu-img
// reads `want` at guest cluster 5.
void CloseAndCheckCluster5(std::unique_ptr<Engine> chain,
                           const std::string& path,
                           const std::vector<uint8_t>& want) {
  std::vector<uint8_t> got(kCluster);
  ASSERT_OK(SyncRead(chain.get(), 5 * kCluster, absl::MakeSpan(got)));
  EXPECT_EQ(got, want);
  const IoStats st = chain->stats().Total();
  EXPECT_EQ(st.cow_read_bytes, 0u);
  ASSERT_OK(chain->Close());

  testing::CommandResult check = testing::QemuCheck(path);
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all, testing::QemuReadAll(path));
  EXPECT_TRUE(std::equal(want.begin(), want.end(),
                         all.begin() + 5 * kCluster));
}

// Writes of a stream into one fresh extended-L2 cluster: the first
// continues a write into the cluster before, so it defers the cluster's
// L2 entry (it allocates and writes only its own subclusters); the second
// lands in that recently written cluster and is granted while the first
// is still in flight, writing into the same host cluster. They finish in
// the opposite order; the entry is set when neither is in flight.
TEST(FineLockTest, AStreamsWritesIntoOneFreshExtendedL2ClusterRunSideBySide) {
  SKIP_WITHOUT_QEMU();
  testing::TempDir dir;
  const std::string path = dir.File("img.qcow2");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> chain, OpenFreshExtended(path));
  // The stream begins at the end of cluster 4.
  ASSERT_OK(SyncWrite(chain.get(), 5 * kCluster - 4096,
                      std::vector<uint8_t>(4096, 4)));

  CountingWaiter wa, wb;
  const std::vector<uint8_t> da(4096, 5), db(8192, 6);
  Request a, b;
  MakeWrite(&a, 5 * kCluster, da, &wa);
  MakeWrite(&b, 5 * kCluster + 8192, db, &wb);
  ASSERT_TRUE(chain->Begin(&a));
  ASSERT_OK(a.status);
  EXPECT_TRUE(a.lock.fine);
  ASSERT_TRUE(chain->Begin(&b));  // granted beside a
  ASSERT_OK(b.status);
  EXPECT_TRUE(b.lock.fine);
  RunAndFinish(chain.get(), &b);
  RunAndFinish(chain.get(), &a);
  EXPECT_EQ(wa.wakes + wb.wakes, 0);
  EXPECT_EQ(chain->stats().Total().cluster_allocations, 2u);  // 4 and 5

  std::vector<uint8_t> want(kCluster, 0);
  std::copy(da.begin(), da.end(), want.begin());
  std::copy(db.begin(), db.end(), want.begin() + 8192);
  CloseAndCheckCluster5(std::move(chain), path, want);
}

// A lone write into a fresh extended-L2 cluster (one that continues no
// recent write, as random writes do) allocates it holding the whole
// cluster: no pending cluster to set up and commit. A second write into
// the cluster meanwhile waits for it, then writes in place into the same
// host cluster.
TEST(FineLockTest, ALoneWriteIntoAFreshExtendedL2ClusterHoldsItWhole) {
  SKIP_WITHOUT_QEMU();
  testing::TempDir dir;
  const std::string path = dir.File("img.qcow2");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> chain, OpenFreshExtended(path));

  CountingWaiter wa, wb;
  const std::vector<uint8_t> da(4096, 5), db(8192, 6);
  Request a, b;
  MakeWrite(&a, 5 * kCluster + 32768, da, &wa);
  MakeWrite(&b, 5 * kCluster + 8192, db, &wb);
  ASSERT_TRUE(chain->Begin(&a));
  ASSERT_OK(a.status);
  EXPECT_FALSE(a.lock.fine);
  EXPECT_FALSE(chain->Begin(&b));  // waits for a
  RunAndFinish(chain.get(), &a);
  EXPECT_EQ(wb.wakes, 1);
  chain->Plan(&b);
  ASSERT_OK(b.status);
  EXPECT_TRUE(b.lock.fine);  // in place now: the cluster is ours
  RunAndFinish(chain.get(), &b);
  EXPECT_EQ(wa.wakes, 0);
  const IoStats st = chain->stats().Total();
  EXPECT_EQ(st.cluster_allocations, 1u);
  EXPECT_EQ(st.cow_deferred, 0u);

  std::vector<uint8_t> want(kCluster, 0);
  std::copy(da.begin(), da.end(), want.begin() + 32768);
  std::copy(db.begin(), db.end(), want.begin() + 8192);
  CloseAndCheckCluster5(std::move(chain), path, want);
}

}  // namespace
}  // namespace qcow2
