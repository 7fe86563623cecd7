// SPDX-License-Identifier: Apache-2.0
// L2 cache misses are read with no lock held (MissDeferral): the cache
// defers a miss only while the request's plan is empty, drops an entry
// that may have gone stale while it was read, and a request blocked in such
// a read does not hold up other requests on the same image.
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <thread>

#include "gtest/gtest.h"
#include "lib/meta/metadata_cache.h"
#include "lib/io/io_plan.h"
#include "testing/memory_file.h"
#include "lib/base/endian.h"
#include "qcow2/image.h"
#include "testing/gate_file.h"
#include "testing/model.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::IoPlan;
using internal::MemoryFile;
using internal::MemoryStore;
using internal::MetadataCache;
using internal::MissDeferral;
using testing::TempDir;

// The bytes at [off, off+len) of a disk written in `unit`-sized pieces,
// each filled with FillPseudoRandom seeded by its offset.
std::vector<uint8_t> Pattern(uint64_t unit, uint64_t off, size_t len) {
  std::vector<uint8_t> piece(unit);
  testing::FillPseudoRandom(off / unit * unit, absl::MakeSpan(piece));
  const auto at = piece.begin() + static_cast<ptrdiff_t>(off % unit);
  return std::vector<uint8_t>(at, at + static_cast<ptrdiff_t>(len));
}

std::unique_ptr<MemoryFile> NewMemoryFile(uint64_t size) {
  auto store = std::make_shared<MemoryStore>();
  auto f = std::make_unique<MemoryFile>("mem", store, false);
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<uint8_t>(i / 512 + 1);
  EXPECT_TRUE(f->WriteAt(0, bytes).ok());
  return f;
}

// Writes that follow each other on the file are joined; so are their
// buffers where they follow each other in memory (the clusters of one
// guest buffer): a 4 MiB write of 64 KiB clusters is one write of one
// buffer, not 64 (as many iovecs cost the kernel more per write, enough to
// show in a page-cache workload). Buffers apart in memory stay apart.
TEST(IoPlan, CoalescedWritesJoinBuffersThatFollowInMemory) {
  std::vector<uint8_t> guest(4 * 4096), other(4096);
  IoPlan plan;
  for (int i = 0; i < 3; ++i) {
    internal::IoOp op;
    op.offset = 65536 + i * 4096;
    op.Add(guest.data() + i * 4096, 4096);
    plan.writes.push_back(std::move(op));
  }
  internal::IoOp apart;
  apart.offset = 65536 + 3 * 4096;
  apart.Add(other.data(), 4096);
  plan.writes.push_back(std::move(apart));
  plan.CoalesceWrites();
  ASSERT_EQ(plan.writes.size(), 1u);
  const internal::IoOp& op = plan.writes[0];
  EXPECT_EQ(op.offset, 65536u);
  EXPECT_EQ(op.bytes, 4u * 4096);
  ASSERT_EQ(op.iov.size(), 2u);
  EXPECT_EQ(op.iov[0].iov_base, guest.data());
  EXPECT_EQ(op.iov[0].iov_len, 3u * 4096);
  EXPECT_EQ(op.iov[1].iov_base, other.data());
}

// A MemoryFile that asks for O_DIRECT alignment, as a file opened with
// cache=none does.
class AlignedMemoryFile : public MemoryFile {
 public:
  using MemoryFile::MemoryFile;
  uint32_t alignment() const override { return 4096; }
};

// Writes of 64 KiB clusters from one guest buffer, one after the other.
void ClusterWrites(File* file, const std::vector<uint8_t>& guest,
                   bool first_fill, IoPlan* plan) {
  for (size_t i = 0; i < guest.size() / 65536; ++i) {
    internal::IoOp op;
    op.file = file;
    op.offset = 0x50000 + i * 65536;
    op.first_fill = first_fill;
    op.Add(guest.data() + i * 65536, 65536);
    op.guest_bytes = 65536;
    plan->writes.push_back(std::move(op));
  }
}

// First fills of a buffered file are joined up to kFirstFillMaxBytes (the
// size of the folios they make, io_plan.cc); overwrites, and any write to
// an O_DIRECT file, are joined whole.
TEST(IoPlan, FirstFillsOfABufferedFileAreJoinedUpToTheirLimit) {
  std::vector<uint8_t> guest(4 << 20);
  auto store = std::make_shared<MemoryStore>();
  MemoryFile buffered("mem", store, false);
  AlignedMemoryFile direct("mem", store, false);

  IoPlan fills;
  ClusterWrites(&buffered, guest, true, &fills);
  fills.CoalesceWrites();
  constexpr uint64_t kMax = IoPlan::kFirstFillMaxBytes;
  ASSERT_EQ(fills.writes.size(), guest.size() / kMax);
  for (size_t i = 0; i < fills.writes.size(); ++i) {
    const internal::IoOp& op = fills.writes[i];
    EXPECT_EQ(op.offset, 0x50000 + i * kMax);
    EXPECT_EQ(op.bytes, kMax);
    EXPECT_EQ(op.guest_bytes, kMax);
    ASSERT_EQ(op.iov.size(), 1u);
    EXPECT_EQ(op.iov[0].iov_base, guest.data() + i * kMax);
  }

  IoPlan overwrites;
  ClusterWrites(&buffered, guest, false, &overwrites);
  overwrites.CoalesceWrites();
  ASSERT_EQ(overwrites.writes.size(), 1u);
  EXPECT_EQ(overwrites.writes[0].bytes, guest.size());

  IoPlan to_direct;
  ClusterWrites(&direct, guest, true, &to_direct);
  to_direct.CoalesceWrites();
  ASSERT_EQ(to_direct.writes.size(), 1u);
  EXPECT_EQ(to_direct.writes[0].bytes, guest.size());
}

TEST(MissDeferralCache, DefersOnlyWhileThePlanIsEmpty) {
  auto file = NewMemoryFile(8192);
  MetadataCache cache(file.get(), 512, 4, "L2 table");
  IoPlan plan;
  {
    MissDeferral d(&plan);
    absl::StatusOr<MetadataCache::Handle> h = cache.Get(1024, true);
    EXPECT_EQ(h.status().code(), absl::StatusCode::kUnavailable);
    ASSERT_TRUE(d.deferred());
    EXPECT_EQ(d.cache, &cache);
    EXPECT_EQ(d.offset, 1024u);
    // Read "without the lock", then hand it back.
    std::vector<uint8_t> buf(512);
    ASSERT_OK(file->ReadAt(1024, absl::MakeSpan(buf)));
    ASSERT_OK_AND_ASSIGN(MetadataCache::Handle e,
                         cache.InsertLoaded(1024, 1024, d.epoch, buf));
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->data[0], 3);
  }
  {
    // Now cached: no deferral.
    MissDeferral d(&plan);
    ASSERT_OK_AND_ASSIGN(MetadataCache::Handle h, cache.Get(1024, true));
    EXPECT_FALSE(d.deferred());
    EXPECT_EQ(h->data[511], 3);
  }
  {
    // Without may_defer, or with a plan that already holds work, a miss is
    // read at once.
    MissDeferral d(&plan);
    ASSERT_OK_AND_ASSIGN(MetadataCache::Handle h, cache.Get(2048));
    EXPECT_EQ(h->data[0], 5);
    plan.aborts.push_back([] {});
    ASSERT_OK_AND_ASSIGN(h, cache.Get(3072, true));
    EXPECT_EQ(h->data[0], 7);
    EXPECT_FALSE(d.deferred());
  }
  {
    // A read's deferral: a miss is deferred though the plan holds work.
    MissDeferral d(&plan, /*even_with_work=*/true);
    EXPECT_EQ(cache.Get(3584, true).status().code(),
              absl::StatusCode::kUnavailable);
    EXPECT_TRUE(d.deferred());
    EXPECT_EQ(d.offset, 3584u);
  }
  // No deferral installed: read at once.
  ASSERT_OK_AND_ASSIGN(MetadataCache::Handle h, cache.Get(4096, true));
  EXPECT_EQ(h->data[0], 9);
}

TEST(MissDeferralCache, EntryThatMayBeStaleIsDropped) {
  auto file = NewMemoryFile(8192);
  MetadataCache cache(file.get(), 512, 4, "L2 table");
  IoPlan plan;
  uint64_t epoch;
  {
    MissDeferral d(&plan);
    ASSERT_FALSE(cache.Get(0, true).ok());
    epoch = d.epoch;
  }
  std::vector<uint8_t> old(512);
  ASSERT_OK(file->ReadAt(0, absl::MakeSpan(old)));
  // Meanwhile another request loads the entry, changes it and writes it
  // back, and the entry leaves the cache.
  {
    ASSERT_OK_AND_ASSIGN(MetadataCache::Handle h, cache.Get(0));
    h->data[0] = 0xee;
    h->MarkAllDirty();
  }
  ASSERT_OK(cache.Flush());
  cache.Invalidate(0, 512);
  ASSERT_OK_AND_ASSIGN(MetadataCache::Handle e,
                       cache.InsertLoaded(0, 0, epoch, old));
  EXPECT_EQ(e, nullptr) << "bytes read before the write-back were taken";
  ASSERT_OK_AND_ASSIGN(MetadataCache::Handle now, cache.Get(0));
  EXPECT_EQ(now->data[0], 0xee);

  // An entry another reader cached meanwhile is returned as it is.
  {
    MissDeferral d(&plan);
    ASSERT_FALSE(cache.Get(512, true).ok());
    epoch = d.epoch;
  }
  ASSERT_OK_AND_ASSIGN(MetadataCache::Handle other, cache.Get(512));
  other->data[1] = 0x42;
  std::vector<uint8_t> bytes(512, 0);
  ASSERT_OK_AND_ASSIGN(e, cache.InsertLoaded(512, 512, epoch, bytes));
  EXPECT_EQ(e, other);
  EXPECT_EQ(e->data[1], 0x42);
}

TEST(MissDeferralCache, ReadAheadBringsInTheWholeUnit) {
  auto file = NewMemoryFile(8192);
  MetadataCache cache(file.get(), 512, 16, "L2 table");
  cache.set_readahead(2048);
  IoPlan plan;
  MissDeferral d(&plan);
  ASSERT_FALSE(cache.Get(2560, true).ok());
  ASSERT_TRUE(d.deferred());
  EXPECT_EQ(d.offset, 2560u);
  EXPECT_EQ(d.read_start, 2048u);
  EXPECT_EQ(d.read_len, 2048u);
  std::vector<uint8_t> unit(2048);
  ASSERT_OK(file->ReadAt(2048, absl::MakeSpan(unit)));
  ASSERT_OK_AND_ASSIGN(MetadataCache::Handle e,
                       cache.InsertLoaded(2048, 2560, d.epoch, unit));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->data[0], 6);
  // Every entry of the unit is cached now: no further miss.
  MissDeferral again(&plan);
  for (uint64_t off = 2048; off < 4096; off += 512) {
    ASSERT_OK_AND_ASSIGN(MetadataCache::Handle h, cache.Get(off, true));
    EXPECT_EQ(h->data[0], off / 512 + 1);
  }
  EXPECT_FALSE(again.deferred());
  // A cache too small for four units reads the entry alone.
  MetadataCache small(file.get(), 512, 8, "L2 table");
  small.set_readahead(2048);
  MissDeferral d2(&plan);
  ASSERT_FALSE(small.Get(2560, true).ok());
  EXPECT_EQ(d2.read_start, 2560u);
  EXPECT_EQ(d2.read_len, 512u);
}

// Requests whose metadata is cached: a read at 5000, and the write of `b`
// (1000 bytes) at 3000, in place.
std::function<absl::Status()> ReadAndWriteCached(
    Image* image, const std::vector<uint8_t>& b) {
  return [image, &b] {
    std::vector<uint8_t> r(1000);
    absl::Status s = image->Read(5000, absl::MakeSpan(r));
    if (s.ok()) s = image->Write(3000, b);
    return s;
  };
}

// Creates a qcow2 image of `disk` bytes with `cluster`-byte clusters,
// written all over in 1 MiB pieces (Pattern(1 MiB, ...)), and returns it
// open read-write.
std::unique_ptr<Image> CreateFilled(const std::string& path, uint64_t disk,
                                    uint32_t cluster = 65536) {
  CreateOptions co;
  co.size = disk;
  co.cluster_size = cluster;
  EXPECT_OK(CreateImage(path, co));
  OpenOptions oo;
  oo.read_write = true;
  absl::StatusOr<std::unique_ptr<Image>> image = Image::Open(path, oo);
  EXPECT_OK(image.status());
  if (!image.ok()) return nullptr;
  std::vector<uint8_t> chunk(1 << 20);
  for (uint64_t off = 0; off < disk; off += chunk.size()) {
    testing::FillPseudoRandom(off, absl::MakeSpan(chunk));
    EXPECT_OK((*image)->Write(off, chunk));
  }
  return std::move(*image);
}

// A 64 MiB image made by CreateFilled, open again with 512-byte L2
// slices (4 MiB of guest space each; guest I/O here is never 512 bytes)
// behind a gate on 512-byte reads, and a cache too small to read whole
// tables ahead (a miss reads one slice). Slice 0 is cached.
class SliceMiss : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.File("img.qcow2");
    {
      std::unique_ptr<Image> image = CreateFilled(path_, 64 << 20);
      ASSERT_NE(image, nullptr);
      ASSERT_OK(image->Close());
    }
    OpenOptions oo;
    oo.read_write = true;
    oo.l2_slice_bytes = 512;
    oo.l2_cache_bytes = 64 << 10;
    oo.opener = &opener_;
    ASSERT_OK_AND_ASSIGN(image_, Image::Open(path_, oo));
    gate_ = opener_.last();
    std::vector<uint8_t> buf(1000);
    ASSERT_OK(image_->Read(0, absl::MakeSpan(buf)));
  }

  TempDir dir_;
  std::string path_;
  testing::GateOpener opener_{{.read_size = 512}};
  std::unique_ptr<Image> image_;
  testing::GateFile* gate_ = nullptr;
};

// While one request waits for an L2 slice to come off the disk, requests
// whose metadata is cached go on: before misses were deferred, the read
// ran under the image's metadata lock and everything waited for it.
TEST_F(SliceMiss, RequestsGoOnWhileAnL2SliceIsRead) {
  Image* image = image_.get();
  testing::GateFile* gate = gate_;
  const std::string& path = path_;
  std::vector<uint8_t> buf(1000), want(1000);

  gate->Arm();
  const uint64_t far = 40 << 20;  // slice 10, not cached
  std::vector<uint8_t> far_buf(1000);
  std::thread blocked(
      [&] { ASSERT_OK(image->Read(far, absl::MakeSpan(far_buf))); });
  ASSERT_TRUE(gate->WaitBlocked());
  // Reads and writes whose slice is cached complete while the miss waits.
  auto others = std::async(std::launch::async, [&] {
    std::vector<uint8_t> b(1000);
    absl::Status s = image->Read(5000, absl::MakeSpan(b));
    testing::FillPseudoRandom(3000, absl::MakeSpan(b));
    if (s.ok()) s = image->Write(3000, b);
    return s;
  });
  const bool went_on =
      others.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  gate->Release();
  blocked.join();
  EXPECT_TRUE(went_on) << "a request waited for another's L2 read";
  ASSERT_OK(others.get());
  EXPECT_EQ(far_buf, Pattern(1 << 20, far, far_buf.size()));
  ASSERT_OK(image->Read(3000, absl::MakeSpan(buf)));
  testing::FillPseudoRandom(3000, absl::MakeSpan(want));
  EXPECT_EQ(buf, want);
  const IoStats st = image->GetStats();
  EXPECT_EQ(st.guest_read_ops, 4u);  // counted once each, however planned
  EXPECT_EQ(st.l2_read_bytes, 2u * 512);
  ASSERT_OK(image->Close());
  if (testing::HaveQemu()) {
    testing::CommandResult check = testing::QemuCheck(path);
    EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  }
}

// A read across two L2 slices, the first cached, reads the second with no
// lock held, though its plan already holds the first part: requests
// elsewhere complete meanwhile. Before, that second miss was read under
// the lock.
TEST_F(SliceMiss, ALongReadReadsItsSecondSliceWithoutTheLock) {
  Image* image = image_.get();
  testing::GateFile* gate = gate_;
  std::vector<uint8_t> buf(1000);
  const uint64_t across = (4 << 20) - 65536;  // the last cluster of slice 0
  std::vector<uint8_t> long_buf(2 * 65536);
  std::vector<uint8_t> b(1000);
  testing::FillPseudoRandom(7, absl::MakeSpan(b));
  testing::HoldAndExpectGoesOn(
      gate, [&] { ASSERT_OK(image->Read(across, absl::MakeSpan(long_buf))); },
      ReadAndWriteCached(image, b),
      "another read's second L2 slice");
  std::vector<uint8_t> want = Pattern(1 << 20, across, 65536);
  const std::vector<uint8_t> second = Pattern(1 << 20, 4 << 20, 65536);
  want.insert(want.end(), second.begin(), second.end());
  EXPECT_EQ(long_buf, want);
  ASSERT_OK(image->Read(3000, absl::MakeSpan(buf)));
  EXPECT_EQ(buf, b);
  ASSERT_OK(image->Close());
  if (testing::HaveQemu()) {
    testing::CommandResult check = testing::QemuCheck(path_);
    EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  }
}

// A write across two L2 slices, the first cached, reads the second before
// it plans anything, with no lock held: requests elsewhere complete
// meanwhile. Before, the plan already held the in-place write into the
// first cluster when the second slice missed, and it was read under the
// lock.
TEST_F(SliceMiss, ALongWriteReadsItsSecondSliceWithoutTheLock) {
  Image* image = image_.get();
  const uint64_t across = (4 << 20) - 65536;  // the last cluster of slice 0
  std::vector<uint8_t> data(2 * 65536);
  testing::FillPseudoRandom(21, absl::MakeSpan(data));
  std::vector<uint8_t> b(1000);
  testing::FillPseudoRandom(7, absl::MakeSpan(b));
  testing::HoldAndExpectGoesOn(
      gate_, [&] { ASSERT_OK(image->Write(across, data)); },
      ReadAndWriteCached(image, b),
      "another write's second L2 slice");
  EXPECT_EQ(image->GetStats().host_calls_under_lock, 0u);
  ASSERT_OK(image->Close());
  if (!testing::HaveQemu()) return;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                       testing::QemuCheckedReadAll(path_));
  EXPECT_TRUE(std::equal(data.begin(), data.end(), all.begin() + across));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), all.begin() + 3000));
}

// A discard reads the L2 slice it changes before it changes anything,
// with no lock held: requests elsewhere complete meanwhile. Before,
// write-zeroes and discard read their tables under the lock.
TEST_F(SliceMiss, ADiscardReadsItsL2SliceWithoutTheLock) {
  Image* image = image_.get();
  const uint64_t far = 40 << 20;  // slice 10, not cached
  std::vector<uint8_t> b(1000);
  testing::FillPseudoRandom(7, absl::MakeSpan(b));
  testing::HoldAndExpectGoesOn(
      gate_, [&] { ASSERT_OK(image->Discard(far, 65536)); },
      ReadAndWriteCached(image, b),
      "a discard's L2 slice");
  EXPECT_EQ(image->GetStats().host_calls_under_lock, 0u);
  std::vector<uint8_t> r(65536);
  ASSERT_OK(image->Read(far, absl::MakeSpan(r)));
  EXPECT_EQ(r, std::vector<uint8_t>(65536, 0));
  const IoStats st = image->GetStats();
  EXPECT_EQ(st.guest_discard_ops, 1u);  // counted once, however planned
  ASSERT_OK(image->Close());
  if (!testing::HaveQemu()) return;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                       testing::QemuCheckedReadAll(path_));
  EXPECT_TRUE(std::all_of(all.begin() + far, all.begin() + far + 65536,
                          [](uint8_t c) { return c == 0; }));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), all.begin() + 3000));
}

// A block-status query (what `convert` and `map` walk an image with, and
// a backup tool beside a running guest) reads an L2 slice not cached with
// no lock held: requests elsewhere complete meanwhile. Before, it read
// the slice under the lock.
TEST_F(SliceMiss, BlockStatusReadsItsL2SliceWithoutTheLock) {
  Image* image = image_.get();
  const uint64_t far = 40 << 20;  // slice 10, not cached
  std::vector<uint8_t> b(1000);
  testing::FillPseudoRandom(7, absl::MakeSpan(b));
  const IoStats before = image->GetStats();
  BlockStatus bs;
  testing::HoldAndExpectGoesOn(
      gate_,
      [&] { ASSERT_OK_AND_ASSIGN(bs, image->GetBlockStatus(far, 1 << 20)); },
      ReadAndWriteCached(image, b), "a block status's L2 slice");
  const IoStats st = image->GetStats();
  EXPECT_EQ(st.host_calls_under_lock, 0u);
  EXPECT_EQ(st.l2_read_bytes - before.l2_read_bytes, 512u);
  EXPECT_EQ(bs.offset, far);
  EXPECT_EQ(bs.length, 1u << 20);  // written in one piece: contiguous
  EXPECT_TRUE(bs.data);
  EXPECT_EQ(bs.depth, 0);
  // The same answer as a walk that found the slice cached.
  ASSERT_OK_AND_ASSIGN(BlockStatus again, image->GetBlockStatus(far, 1 << 20));
  EXPECT_EQ(again.host_offset, bs.host_offset);
  EXPECT_EQ(again.length, bs.length);
  std::vector<uint8_t> r(1000);
  ASSERT_OK(image->Read(far, absl::MakeSpan(r)));
  EXPECT_EQ(r, Pattern(1 << 20, far, r.size()));
  ASSERT_OK(image->Close());
  if (!testing::HaveQemu()) return;
  testing::CommandResult check = testing::QemuCheck(path_);
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
}

// A slice read for a block-status query that evicts a slice changed and
// not yet written writes it out after the lock is let go, not under it;
// the change reaches the disk in order all the same.
TEST(MissDeferral, BlockStatusWritesWhatItEvictsWithoutTheLock) {
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  {
    std::unique_ptr<Image> image = CreateFilled(path, 64 << 20);
    ASSERT_NE(image, nullptr);
    ASSERT_OK(image->Close());
  }
  OpenOptions oo;
  oo.read_write = true;
  oo.l2_slice_bytes = 512;  // 4 MiB of guest space each
  oo.l2_cache_bytes = 4 * 512;
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(path, oo));
  // Four slices changed, the cache full of them.
  for (uint64_t k = 0; k < 4; ++k) {
    ASSERT_OK(image->Discard(k * (4 << 20), 65536));
  }
  const uint64_t far = 40 << 20;
  ASSERT_OK_AND_ASSIGN(BlockStatus bs, image->GetBlockStatus(far, 1 << 20));
  EXPECT_TRUE(bs.data);
  EXPECT_EQ(bs.length, 1u << 20);
  EXPECT_GT(image->GetStats().l2_write_bytes, 0u) << "nothing was evicted";
  EXPECT_EQ(image->GetStats().host_calls_under_lock, 0u);
  // Each discarded cluster reads as zeros, through us and through qemu.
  ASSERT_OK_AND_ASSIGN(bs, image->GetBlockStatus(0, 1 << 20));
  EXPECT_TRUE(bs.zero);
  EXPECT_EQ(bs.length, 65536u);
  ASSERT_OK(image->Close());
  if (!testing::HaveQemu()) return;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                       testing::QemuCheckedReadAll(path));
  for (uint64_t k = 0; k < 4; ++k) {
    const auto at = all.begin() + static_cast<ptrdiff_t>(k * (4 << 20));
    EXPECT_TRUE(std::all_of(at, at + 65536, [](uint8_t c) { return c == 0; }))
        << "slice " << k;
    const std::vector<uint8_t> rest =
        Pattern(1 << 20, k * (4 << 20) + 65536, 4096);
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(), at + 65536));
  }
}

// A discard that frees a host cluster reads the refcount block of that
// cluster before it changes anything, with no lock held: requests
// elsewhere complete meanwhile. Before, the free read it under the lock.
TEST(MissDeferral, AFreedClustersRefcountBlockIsReadWithoutTheLock) {
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  {
    // 4 KiB clusters: a refcount block (16-bit) covers 8 MiB of the file.
    std::unique_ptr<Image> image = CreateFilled(path, 32 << 20, 4096);
    ASSERT_NE(image, nullptr);
    ASSERT_OK(image->Close());
  }
  // Gated: 4 KiB reads (refcount blocks; L2 slices are 512 bytes, read
  // one at a time from a cache too small to read ahead, and no guest read
  // here is 4 KiB). The refcount cache holds four blocks.
  testing::GateOpener opener({.read_size = 4096});
  OpenOptions oo;
  oo.read_write = true;
  oo.l2_slice_bytes = 512;
  oo.l2_cache_bytes = 8192;
  oo.refcount_cache_bytes = 4 * 4096;
  oo.opener = &opener;
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(path, oo));
  const IoStats before = image->GetStats();
  std::vector<uint8_t> b(1000);
  testing::FillPseudoRandom(7, absl::MakeSpan(b));
  ASSERT_OK(image->Write(3000, b));  // in place: no refcount needed
  const uint64_t mid = 12 << 20;     // host near 12 MiB: block 1
  testing::HoldAndExpectGoesOn(
      opener.last(), [&] { ASSERT_OK(image->Discard(mid, 65536)); },
      ReadAndWriteCached(image.get(), b),
      "a discard's refcount block");
  EXPECT_EQ(image->GetStats().host_calls_under_lock, 0u);
  EXPECT_GT(image->GetStats().refcount_read_bytes,
            before.refcount_read_bytes);
  ASSERT_OK(image->Close());
  if (!testing::HaveQemu()) return;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                       testing::QemuCheckedReadAll(path));
  EXPECT_TRUE(std::all_of(all.begin() + mid, all.begin() + mid + 65536,
                          [](uint8_t c) { return c == 0; }));
  const std::vector<uint8_t> rest = Pattern(1 << 20, mid + 65536, 65536);
  EXPECT_TRUE(std::equal(rest.begin(), rest.end(), all.begin() + mid + 65536));
}

// A write that outgrows the refcount table moves it, and frees the old
// table's clusters: the refcount block that counts them is read, before
// anything changes, with no lock held. Before, that block (long evicted
// from a cache of four) was read under the lock in the middle of the
// table's growth.
TEST(MissDeferral, RefcountTableGrowthReadsItsBlockWithoutTheLock) {
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  // 512-byte clusters with 64-bit refcounts: a block counts 64 clusters
  // (32 KiB) and the first table's 64 entries 2 MiB of the file.
  CreateOptions co;
  co.size = 8 << 20;
  co.cluster_size = 512;
  co.refcount_bits = 64;
  ASSERT_OK(CreateImage(path, co));
  OpenOptions oo;
  oo.read_write = true;
  oo.refcount_cache_bytes = 4 * 512;
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(path, oo));
  std::vector<uint8_t> data(4 << 20);
  testing::FillPseudoRandom(53, absl::MakeSpan(data));
  for (uint64_t off = 0; off < data.size(); off += 65536) {
    ASSERT_OK(image->Write(
        off, absl::MakeConstSpan(data.data() + off, 65536)));
  }
  EXPECT_EQ(image->GetStats().host_calls_under_lock, 0u);
  ASSERT_OK(image->Close());
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> file, testing::ReadFileBytes(path));
  ASSERT_GE(file.size(), 64u);
  EXPECT_GT(internal::LoadBE32(&file[56]), 1u) << "the table did not grow";
  if (!testing::HaveQemu()) return;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                       testing::QemuCheckedReadAll(path));
  EXPECT_TRUE(std::equal(data.begin(), data.end(), all.begin()));
}

// A discard of many more clusters than one probe looks at (1,024) goes a
// window at a time, each window's tables read with no lock held before it
// is changed: no host call is made under the lock, however far the range
// reaches into tables not cached. Before, only the first window's were.
// A 32 MiB image made by CreateFilled with 4 KiB clusters (8,192 of them,
// eight times what one probe window looks at), open read-write with
// 512-byte L2 slices (64 clusters each) and room for all of them.
std::unique_ptr<Image> OpenManyClusters(TempDir& dir, std::string* path) {
  *path = dir.File("img.qcow2");
  std::unique_ptr<Image> image = CreateFilled(*path, 32 << 20, 4096);
  EXPECT_NE(image, nullptr);
  if (image == nullptr) return nullptr;
  EXPECT_OK(image->Close());
  OpenOptions oo;
  oo.read_write = true;
  oo.l2_slice_bytes = 512;
  oo.l2_cache_bytes = 256 << 10;
  absl::StatusOr<std::unique_ptr<Image>> open = Image::Open(*path, oo);
  EXPECT_OK(open.status());
  return open.ok() ? std::move(*open) : nullptr;
}

TEST(MissDeferral, ALongDiscardReadsEveryWindowsTablesWithoutTheLock) {
  TempDir dir;
  std::string path;
  const uint64_t disk = 32 << 20;
  std::unique_ptr<Image> image = OpenManyClusters(dir, &path);
  ASSERT_NE(image, nullptr);
  const uint64_t from = 4096 + 512;  // a partial cluster at either end
  const uint64_t len = disk - from - 1024;
  ASSERT_OK(image->Discard(from, len));
  const IoStats st = image->GetStats();
  EXPECT_GT(st.l2_read_bytes, 8u * 512);
  EXPECT_EQ(st.host_calls_under_lock, 0u);
  EXPECT_EQ(st.guest_discard_ops, 1u);
  std::vector<uint8_t> got(disk);
  ASSERT_OK(image->Read(0, absl::MakeSpan(got)));
  const std::vector<uint8_t> head = Pattern(1 << 20, 0, from);
  EXPECT_TRUE(std::equal(head.begin(), head.end(), got.begin()));
  EXPECT_TRUE(std::all_of(got.begin() + from, got.begin() + from + len,
                          [](uint8_t c) { return c == 0; }));
  const std::vector<uint8_t> tail = Pattern(1 << 20, from + len, 1024);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), got.begin() + from + len));
  ASSERT_OK(image->Close());
  if (!testing::HaveQemu()) return;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                       testing::QemuCheckedReadAll(path));
  EXPECT_EQ(all, got);
}

// A write over more clusters than a window (an 8 MiB write of 4 KiB
// clusters, in place) probes all of them before it plans, going on from
// where each round stopped: every L2 slice it needs is read with no lock
// held. Before, the probe looked at the first 1,024 clusters only.
TEST(MissDeferral, ALongWriteReadsAllItsTablesWithoutTheLock) {
  TempDir dir;
  std::string path;
  std::unique_ptr<Image> image = OpenManyClusters(dir, &path);
  ASSERT_NE(image, nullptr);
  std::vector<uint8_t> data(8 << 20);
  testing::FillPseudoRandom(41, absl::MakeSpan(data));
  const uint64_t at = (12 << 20) + 512;
  ASSERT_OK(image->Write(at, data));
  const IoStats st = image->GetStats();
  EXPECT_GE(st.l2_read_bytes, 32u * 512);
  EXPECT_EQ(st.host_calls_under_lock, 0u);
  ASSERT_OK(image->Close());
  if (!testing::HaveQemu()) return;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                       testing::QemuCheckedReadAll(path));
  EXPECT_TRUE(std::equal(data.begin(), data.end(), all.begin() + at));
  const std::vector<uint8_t> before = Pattern(1 << 20, at - 512, 512);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), all.begin() + at - 512));
}

// A small write into an overlay whose backing file's L2 slice for the
// cluster is not cached reads that slice before it allocates anything,
// with no lock held: requests elsewhere complete meanwhile. Before, the
// copy-on-write planned after the allocation read it under the lock.
TEST(MissDeferral, CopyOnWriteSourceTableIsReadWithoutTheLock) {
  TempDir dir;
  {
    std::unique_ptr<Image> base =
        CreateFilled(dir.File("base.qcow2"), 64 << 20);
    ASSERT_NE(base, nullptr);
    ASSERT_OK(base->Close());
  }
  const std::string top = dir.File("top.qcow2");
  CreateOptions co;
  co.size = 64 << 20;
  co.cluster_size = 65536;
  co.backing_file = "base.qcow2";
  co.backing_format = "qcow2";
  ASSERT_OK(CreateImage(top, co));
  testing::GateOpener opener({.read_size = 512});
  OpenOptions oo;
  oo.read_write = true;
  oo.l2_slice_bytes = 512;
  oo.l2_cache_bytes = 64 << 10;
  oo.opener = &opener;
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(top, oo));
  testing::GateFile* base_gate = opener.last();  // opened after the top
  std::vector<uint8_t> small(4096);
  testing::FillPseudoRandom(11, absl::MakeSpan(small));
  ASSERT_OK(image->Write(4096, small));  // cluster 0 ours, slices cached
  const uint64_t far = (40 << 20) + 4096;  // base slice 10, not cached
  std::vector<uint8_t> in_place(4096);
  testing::FillPseudoRandom(12, absl::MakeSpan(in_place));
  testing::HoldAndExpectGoesOn(
      base_gate, [&] { ASSERT_OK(image->Write(far, small)); },
      [&] {
        std::vector<uint8_t> r(4096);
        absl::Status s = image->Read(4096, absl::MakeSpan(r));
        if (s.ok() && r != small) s = absl::InternalError("read other bytes");
        if (s.ok()) s = image->Write(8192, in_place);
        return s;
      },
      "another write's copy-on-write source table");
  ASSERT_OK(image->Close());
  if (!testing::HaveQemu()) return;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                       testing::QemuCheckedReadAll(top));
  std::vector<uint8_t> want = Pattern(1 << 20, 0, 65536);
  std::copy(small.begin(), small.end(), want.begin() + 4096);
  std::copy(in_place.begin(), in_place.end(), want.begin() + 8192);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin()));
  want = Pattern(1 << 20, far - 4096, 65536);
  std::copy(small.begin(), small.end(), want.begin() + 4096);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin() + far - 4096));
}

// A chain of `disk` bytes: a base made by CreateFilled and four overlays
// on it, overlay d owning the 64 KiB cluster d of every MiB (written with
// Pattern(64 KiB, ...)); with `top_overlay`, an empty overlay on top of
// those. Returns the top's path.
std::string CreateChain(TempDir& dir, uint64_t disk, bool top_overlay) {
  std::string top = dir.File("base.qcow2");
  std::unique_ptr<Image> image = CreateFilled(top, disk);
  EXPECT_NE(image, nullptr);
  if (image == nullptr) return top;
  CreateOptions ov;
  ov.cluster_size = 65536;
  for (int d = 1; d <= 4; ++d) {
    top = dir.File("ov" + std::to_string(d) + ".qcow2");
    EXPECT_OK(image->CreateOverlay(top, ov));
    std::vector<uint8_t> c(65536);
    for (uint64_t off = uint64_t(d) * 65536; off < disk; off += 1 << 20) {
      testing::FillPseudoRandom(off, absl::MakeSpan(c));
      EXPECT_OK(image->Write(off, c));
    }
  }
  if (top_overlay) {
    top = dir.File("top.qcow2");
    EXPECT_OK(image->CreateOverlay(top, ov));
  }
  EXPECT_OK(image->Close());
  return top;
}

// What guest offset `off` of CreateChain's chain holds.
uint64_t ChainUnit(uint64_t off) {
  const uint64_t in_mib = (off % (1 << 20)) / 65536;
  return in_mib >= 1 && in_mib <= 4 ? 65536 : 1 << 20;
}

// Small writes into an overlay over a chain with cold caches look up,
// before they allocate, every table the copy from below will read, so
// that all of them are read with no lock held: no host call is made
// under the lock. (Below a chain's top, a copy reads through the backing
// map, which resolves a whole window of the chain at once; the probe of
// what reads as zeros once walked the layers for the cluster alone.)
TEST(MissDeferral, CopiesThroughAColdChainReadNoTableUnderTheLock) {
  TempDir dir;
  const uint64_t disk = 32 << 20;
  const std::string top = CreateChain(dir, disk, /*top_overlay=*/true);
  // 512-byte slices (4 MiB of guest space), one at a time (a cache too
  // small to read whole tables ahead).
  OpenOptions oo;
  oo.read_write = true;
  oo.l2_slice_bytes = 512;
  oo.l2_cache_bytes = 64 << 10;
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(top, oo));
  std::vector<uint8_t> small(4096);
  testing::FillPseudoRandom(31, absl::MakeSpan(small));
  // First into every slice, a cluster the uppermost overlay below holds:
  // whether it reads as zeros is known from that overlay alone, while the
  // copy's window also needs the layers under it. Then anywhere.
  std::vector<uint64_t> offsets;
  for (uint64_t at = 0; at < disk; at += 4 << 20) {
    offsets.push_back(at + 4 * 65536 + 1024);
  }
  for (int i = 0; i < 64; ++i) {
    offsets.push_back((uint64_t(i) * 7919 * 4096 + 1024) % (disk - 8192));
  }
  for (uint64_t off : offsets) ASSERT_OK(image->Write(off, small));
  const IoStats st = image->GetStats();
  EXPECT_GT(st.l2_read_bytes, 0u);
  EXPECT_EQ(st.host_calls_under_lock, 0u);
  // Each 4 KiB written, and the bytes around it copied from below.
  for (uint64_t off : offsets) {
    std::vector<uint8_t> got(8192);
    ASSERT_OK(image->Read(off - 1024, absl::MakeSpan(got)));
    EXPECT_TRUE(std::equal(small.begin(), small.end(), got.begin() + 1024))
        << off;
    const uint64_t after = off + 4096;
    bool overwritten = false;  // by a later write nearby
    for (uint64_t o : offsets) {
      overwritten |= o < after + 3072 && after < o + 4096;
    }
    if (overwritten) continue;
    EXPECT_EQ(std::vector<uint8_t>(got.begin() + 5120, got.end()),
              Pattern(ChainUnit(after), after, 3072))
        << off;
  }
  ASSERT_OK(image->Close());
  if (testing::HaveQemu()) {
    testing::CommandResult check = testing::QemuCheck(top);
    EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  }
}

// Through queues, with io_uring: reads through a chain with cold caches
// read each L2 slice once, count each request once, and return the data.
TEST(MissDeferral, QueueReadsThroughAColdChain) {
  TempDir dir;
  const uint64_t disk = 32 << 20;
  const std::string top = CreateChain(dir, disk, /*top_overlay=*/false);
  OpenOptions oo;
  oo.l2_slice_bytes = 512;
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(top, oo));
  ASSERT_OK_AND_ASSIGN(auto q, image->CreateQueue());
  const int n = 256;
  std::vector<std::vector<uint8_t>> bufs(n, std::vector<uint8_t>(4096));
  std::atomic<int> failed{0};
  for (int i = 0; i < n; ++i) {
    while (q->in_flight() >= 32) q->Poll(1);
    const uint64_t off = (uint64_t(i) * 7919 * 4096) % disk;
    ASSERT_OK(
        q->SubmitRead(off, absl::MakeSpan(bufs[i]), [&failed](absl::Status s) {
          if (!s.ok()) ++failed;
        }));
  }
  q->Drain();
  EXPECT_EQ(failed.load(), 0);
  for (int i = 0; i < n; ++i) {
    const uint64_t off = (uint64_t(i) * 7919 * 4096) % disk;
    ASSERT_EQ(bufs[i], Pattern(ChainUnit(off), off, 4096)) << off;
  }
  const IoStats st = q->stats();
  EXPECT_EQ(st.guest_read_ops, uint64_t{n});
  // Each of the five files has one L2 table (a 64 KiB cluster, of which
  // 32 MiB of disk uses the first eight 512-byte slices). The first miss
  // reads it whole, once: the misses of other requests meanwhile wait for
  // that read, and nothing is written back that could make it stale.
  EXPECT_EQ(st.l2_read_bytes, 5u * 65536);
  EXPECT_EQ(st.l2_read_bytes % 512, 0u);
}

}  // namespace
}  // namespace qcow2
