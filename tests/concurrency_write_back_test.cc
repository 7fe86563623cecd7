// SPDX-License-Identifier: Apache-2.0
// A flush's metadata write-back runs without the image's lock
// (lib/meta/write_back_file.h): the write-back file's ordering rules, and
// requests going on while a flush writes metadata.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/meta/metadata_cache.h"
#include "lib/meta/write_back_file.h"
#include "testing/memory_file.h"
#include "lib/base/events.h"
#include "qcow2/image.h"
#include "testing/gate_file.h"
#include "testing/model.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::MemoryFile;
using internal::MemoryStore;
using internal::WriteBackFile;
using ::testing::ElementsAre;
using testing::ExpectGoesOnWhileHeld;
using testing::HoldAndExpectGoesOn;
using testing::GateFile;
using testing::GateOpener;
using testing::TempDir;

// A file that logs what reaches it ("w<offset>", "flush"), and can fail
// its Nth operation once.
class OpLogFile : public File {
 public:
  OpLogFile()
      : inner_("mem", std::make_shared<MemoryStore>(), /*read_only=*/false) {}

  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) override {
    return inner_.ReadAt(offset, buf);
  }
  absl::Status WriteAt(uint64_t offset,
                       absl::Span<const uint8_t> data) override {
    if (absl::Status s = Op(absl::StrCat("w", offset)); !s.ok()) return s;
    return inner_.WriteAt(offset, data);
  }
  absl::Status Flush() override { return Op("flush"); }
  absl::StatusOr<uint64_t> Size() override { return inner_.Size(); }
  absl::Status Truncate(uint64_t size) override {
    if (absl::Status s = Op(absl::StrCat("truncate", size)); !s.ok()) return s;
    return inner_.Truncate(size);
  }
  const std::string& name() const override { return inner_.name(); }

  std::vector<std::string>* ops = &own_ops_;
  int fail_at = 0;  // 1-based; 0: never

 private:
  absl::Status Op(std::string what) {
    if (++count_ == fail_at) return absl::InternalError("injected fault");
    ops->push_back(std::move(what));
    return absl::OkStatus();
  }

  MemoryFile inner_;
  std::vector<std::string> own_ops_;
  int count_ = 0;
};

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()),
                             s.size());
}

TEST(WriteBackFile, RecordedWritesReachTheFileOnlyAtWriteBack) {
  OpLogFile base;
  WriteBackFile wb(&base);
  wb.BeginRecord();
  ASSERT_OK(wb.WriteAt(0, Bytes("aaaa")));
  ASSERT_OK(wb.Flush());
  ASSERT_OK(wb.WriteAt(8, Bytes("bbbb")));
  const uint64_t ticket = wb.EndRecord();
  EXPECT_TRUE(base.ops->empty());
  EXPECT_EQ(wb.queued(), 1u);
  ASSERT_OK(wb.WriteBack(ticket));
  EXPECT_THAT(*base.ops, ElementsAre("w0", "flush", "w8"));
  EXPECT_EQ(wb.queued(), 0u);
  std::vector<uint8_t> got(12);
  ASSERT_OK(base.ReadAt(0, absl::MakeSpan(got)));
  EXPECT_EQ(std::string(got.begin(), got.end()),
            std::string("aaaa\0\0\0\0bbbb", 12));
  // Written once: the ticket is done.
  ASSERT_OK(wb.WriteBack(ticket));
  EXPECT_EQ(base.ops->size(), 3u);
  // A recording with nothing in it queues nothing.
  wb.BeginRecord();
  EXPECT_EQ(wb.EndRecord(), ticket);
}

TEST(WriteBackFile, OtherWritesWaitForQueuedLogs) {
  OpLogFile base;
  WriteBackFile wb(&base);
  wb.BeginRecord();
  ASSERT_OK(wb.WriteAt(0, Bytes("old")));
  ASSERT_OK(wb.Flush());
  wb.EndRecord();
  // A write outside a recording (an eviction, say) writes the queued log
  // first, so the disk never sees it out of order.
  ASSERT_OK(wb.WriteAt(0, Bytes("new")));
  EXPECT_THAT(*base.ops, ElementsAre("w0", "flush", "w0"));
  std::vector<uint8_t> got(3);
  ASSERT_OK(base.ReadAt(0, absl::MakeSpan(got)));
  EXPECT_EQ(std::string(got.begin(), got.end()), "new");
  // Size changes are not recorded.
  wb.BeginRecord();
  EXPECT_EQ(wb.Truncate(4096).code(), absl::StatusCode::kInternal);
  wb.EndRecord();
}

TEST(WriteBackFile, AFailedLogStaysQueuedAndIsWrittenFirst) {
  OpLogFile base;
  base.fail_at = 2;  // the flush of the first log
  WriteBackFile wb(&base);
  wb.BeginRecord();
  ASSERT_OK(wb.WriteAt(0, Bytes("one")));
  ASSERT_OK(wb.Flush());
  ASSERT_OK(wb.WriteAt(8, Bytes("two")));
  const uint64_t first = wb.EndRecord();
  absl::Status s = wb.WriteBack(first);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("injected fault"));
  EXPECT_EQ(wb.queued(), 1u);
  wb.BeginRecord();
  ASSERT_OK(wb.WriteAt(16, Bytes("three")));
  const uint64_t second = wb.EndRecord();
  EXPECT_GT(second, first);
  ASSERT_OK(wb.WriteBack(second));
  // The first log again, whole, then the second.
  EXPECT_THAT(*base.ops, ElementsAre("w0", "w0", "flush", "w8", "w16"));
  EXPECT_EQ(wb.queued(), 0u);
}

TEST(WriteBackFile, EventsAndPinsFollowTheLog) {
  OpLogFile base;
  std::vector<std::string> seen;
  base.ops = &seen;
  internal::EventHook hook = [&](std::string_view e) {
    seen.push_back("event:" + std::string(e));
  };
  internal::SetEventHook(&hook);
  WriteBackFile wb(&base);
  auto pinned = std::make_shared<int>(7);
  std::weak_ptr<int> watch = pinned;
  wb.Pin(pinned);  // not recording: nothing kept
  wb.BeginRecord();
  internal::EmitEvent("l2-update");
  ASSERT_OK(wb.WriteAt(0, Bytes("x")));
  wb.Pin(pinned);
  internal::EmitEvent("flush");
  const uint64_t ticket = wb.EndRecord();
  internal::EmitEvent("after");  // not recording: straight to the hook
  pinned.reset();
  EXPECT_FALSE(watch.expired()) << "the log let go of its entry early";
  EXPECT_THAT(seen, ElementsAre("event:after"));
  ASSERT_OK(wb.WriteBack(ticket));
  internal::SetEventHook(nullptr);
  EXPECT_THAT(
      seen, ElementsAre("event:after", "event:l2-update", "w0", "event:flush"));
  EXPECT_TRUE(watch.expired());
}

// An entry whose recorded write-back is still queued is not evicted: read
// again from the file, it would come back stale.
// Each installation lets a request record a bounded number of
// write-backs; nested ones have their own.
TEST(WriteBackFile, DeferEvictionsHasABudget) {
  EXPECT_FALSE(WriteBackFile::DeferEvictions::Spend());
  {
    WriteBackFile::DeferEvictions outer;
    for (int i = 0; i < WriteBackFile::DeferEvictions::kBudget; ++i) {
      EXPECT_TRUE(WriteBackFile::DeferEvictions::Spend()) << i;
    }
    EXPECT_FALSE(WriteBackFile::DeferEvictions::Spend());
    {
      WriteBackFile::DeferEvictions inner;
      EXPECT_TRUE(WriteBackFile::DeferEvictions::Spend());
    }
    EXPECT_FALSE(WriteBackFile::DeferEvictions::Spend());
  }
  EXPECT_FALSE(WriteBackFile::DeferEvictions::Active());
}

// A cache of four 512-byte entries over a WriteBackFile over an OpLogFile
// of eight, entry 0 changed to `byte` (dirty), nothing logged yet.
struct CacheOverLog {
  explicit CacheOverLog(uint8_t byte)
      : wb(&base), cache(&wb, 512, 4, "L2 table") {
    EXPECT_OK(base.WriteAt(0, std::vector<uint8_t>(8 * 512, 1)));
    base.ops->clear();
    absl::StatusOr<internal::MetadataCache::Handle> h = cache.Get(0);
    EXPECT_OK(h.status());
    if (!h.ok()) return;
    (*h)->data[0] = byte;
    (*h)->MarkDirty(0, 1);
  }
  OpLogFile base;
  WriteBackFile wb;
  internal::MetadataCache cache;
};

TEST(WriteBackFile, ACacheKeepsEntriesUntilTheirWriteBack) {
  CacheOverLog t(0xab);
  OpLogFile& base = t.base;
  WriteBackFile& wb = t.wb;
  internal::MetadataCache& cache = t.cache;
  EXPECT_EQ(cache.read_file(), &base);
  wb.BeginRecord();
  ASSERT_OK(cache.Flush());
  const uint64_t ticket = wb.EndRecord();
  for (uint64_t off = 512; off < 8 * 512; off += 512) {
    ASSERT_OK(cache.Get(off).status());
  }
  EXPECT_TRUE(base.ops->empty());
  ASSERT_OK_AND_ASSIGN(internal::MetadataCache::Handle h, cache.Get(0));
  EXPECT_EQ(h->data[0], 0xab) << "evicted before its write-back, read stale";
  ASSERT_OK(wb.WriteBack(ticket));
  std::vector<uint8_t> got(1);
  ASSERT_OK(base.ReadAt(0, absl::MakeSpan(got)));
  EXPECT_EQ(got[0], 0xab);
}

// While the file records (a write's planning, a new L2 table), making room
// writes a dirty entry into the log and keeps it cached: read again from
// the disk before the log is written, it would be stale.
TEST(WriteBackFile, RoomMadeWhileRecordingKeepsWhatItWrites) {
  CacheOverLog t(0xcd);
  OpLogFile& base = t.base;
  WriteBackFile& wb = t.wb;
  internal::MetadataCache& cache = t.cache;
  wb.BeginRecord();
  // Entries 1 to 7 into a cache of 4: the dirty entry 0 is the least
  // recently used.
  for (uint64_t off = 512; off < 8 * 512; off += 512) {
    ASSERT_OK(cache.Get(off).status());
  }
  const uint64_t ticket = wb.EndRecord();
  EXPECT_TRUE(base.ops->empty());
  EXPECT_NE(cache.Peek(0), nullptr) << "written into a log, then dropped";
  ASSERT_OK_AND_ASSIGN(internal::MetadataCache::Handle h, cache.Get(0));
  EXPECT_EQ(h->data[0], 0xcd);
  ASSERT_OK(wb.WriteBack(ticket));
  EXPECT_THAT(*base.ops, ElementsAre("w0"));
}

constexpr uint64_t kCluster = 65536;

std::vector<uint8_t> Fill(uint64_t seed, size_t len) {
  std::vector<uint8_t> v(len);
  testing::FillPseudoRandom(seed, absl::MakeSpan(v));
  return v;
}

absl::StatusOr<std::unique_ptr<Image>> OpenReadWrite(const std::string& path,
                                                     FileOpener* opener) {
  OpenOptions oo;
  oo.read_write = true;
  oo.opener = opener;
  return Image::Open(path, oo);
}

// Reads the cluster at `offset`: an error unless it holds Fill(offset).
absl::Status ReadIsFill(Image* image, uint64_t offset) {
  std::vector<uint8_t> buf(kCluster);
  absl::Status s = image->Read(offset, absl::MakeSpan(buf));
  if (s.ok() && buf != Fill(offset, kCluster)) {
    s = absl::InternalError(absl::StrCat("read other bytes at ", offset));
  }
  return s;
}

// Creates a 64 MiB image with 64 KiB clusters (and lazy refcounts, if
// `lazy`) and writes Fill(offset) over the cluster at each of `offsets`.
void CreateWritten(const std::string& path,
                   const std::vector<uint64_t>& offsets, bool lazy = false) {
  CreateOptions co;
  co.size = 64 << 20;
  co.cluster_size = kCluster;
  co.lazy_refcounts = lazy;
  ASSERT_OK(CreateImage(path, co));
  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image, Image::Open(path, oo));
  for (uint64_t offset : offsets) {
    ASSERT_OK(image->Write(offset, Fill(offset, kCluster)));
  }
  ASSERT_OK(image->Close());
}

void CheckWithQemu(const std::string& path,
                   const std::vector<std::pair<uint64_t, uint64_t>>& written) {
  if (!testing::HaveQemu()) return;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                       testing::QemuCheckedReadAll(path));
  for (const auto& [offset, len] : written) {
    const std::vector<uint8_t> want = Fill(offset, len);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin() + offset))
        << "qemu reads other bytes at " << offset;
  }
}

// A 64 MiB image whose first cluster is written (its L2 table is on disk),
// open with a new cluster written after that: the next
// flush writes a refcount block, flushes the file, writes an L2 slice.
// StartFlush() starts that flush on a thread of its own and returns once
// it is held at its first file flush.
class FlushWriteBack : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.File("img.qcow2");
    ASSERT_NO_FATAL_FAILURE(CreateWritten(path_, {0}));
    OpenOptions oo;
    oo.read_write = true;
    oo.opener = &opener_;
    ASSERT_OK_AND_ASSIGN(image_, Image::Open(path_, oo));
    gate_ = opener_.last();
    ASSERT_OK(image_->Write(kCluster, Fill(kCluster, kCluster)));
  }

  void StartFlush() {
    gate_->Arm();
    flusher_ = std::thread([this] { ASSERT_OK(image_->Flush()); });
    ASSERT_TRUE(gate_->WaitBlocked());
  }

  void ReleaseFlush() {
    gate_->Release();
    flusher_.join();
  }

  // Reads cluster 1 back, then writes its first 4 KiB again, in place
  // (the same bytes): neither changes metadata.
  absl::Status ReadAndWriteInPlace() {
    absl::Status s = ReadIsFill(image_.get(), kCluster);
    if (s.ok()) s = image_->Write(kCluster, Fill(kCluster, 4096));
    return s;
  }

  TempDir dir_;
  std::string path_;
  GateOpener opener_{{.flush = true}};
  std::unique_ptr<Image> image_;
  GateFile* gate_ = nullptr;
  std::thread flusher_;
};

// While a flush waits for the file flush between its refcount and L2
// writes, allocating writes and reads complete: before the write-back was
// taken out of the lock, everything waited for it.
TEST_F(FlushWriteBack, RequestsGoOnWhileAFlushWritesMetadata) {
  ASSERT_NO_FATAL_FAILURE(StartFlush());
  Image* image = image_.get();
  ExpectGoesOnWhileHeld(
      gate_, flusher_,
      [&] {
        // A new cluster (allocated in memory, its data written) and a read.
        absl::Status s =
            image->Write(5 * kCluster, Fill(5 * kCluster, kCluster));
        std::vector<uint8_t> buf(kCluster);
        if (s.ok()) s = image->Read(kCluster, absl::MakeSpan(buf));
        if (s.ok() && buf != Fill(kCluster, kCluster)) {
          s = absl::InternalError("read other bytes");
        }
        return s;
      },
      "a flush's metadata write-back");
  ASSERT_OK(image->Close());
  CheckWithQemu(
      path_, {{0, kCluster}, {kCluster, kCluster}, {5 * kCluster, kCluster}});
}

// A flush that begins while an earlier one still writes metadata returns
// only after that write-back: writes it covers may be in the earlier log.
TEST_F(FlushWriteBack, ALaterFlushWaitsForAnEarlierWriteBack) {
  ASSERT_NO_FATAL_FAILURE(StartFlush());
  Image* image = image_.get();
  GateFile* gate = gate_;
  std::atomic<bool> second_saw_release{false};
  std::thread second([&] {
    ASSERT_OK(image->Write(6 * kCluster, Fill(6 * kCluster, kCluster)));
    ASSERT_OK(image->Flush());
    second_saw_release = gate->released();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ReleaseFlush();
  second.join();
  EXPECT_TRUE(second_saw_release)
      << "a flush returned while an earlier flush's metadata was unwritten";
  ASSERT_OK(image->Close());
  CheckWithQemu(
      path_, {{0, kCluster}, {kCluster, kCluster}, {6 * kCluster, kCluster}});
}

// Group commit: flushes that come in while a flush writes its log wait,
// and then one of them records a single log for all; the others only wait
// for that log and flush the file. Four flushes, two logs.
TEST_F(FlushWriteBack, FlushesThatWaitShareOneLog) {
  std::atomic<int> waits{0}, logs{0};
  internal::EventHook hook = [&](std::string_view event) {
    if (event == "flush-wait") waits++;
    if (event == "flush") logs++;
  };
  internal::SetEventHook(&hook);
  ASSERT_NO_FATAL_FAILURE(StartFlush());  // its log held at a file flush
  Image* image = image_.get();
  std::vector<std::thread> flushers;
  for (uint64_t c : {5, 6, 7}) {
    flushers.emplace_back([image, c] {
      ASSERT_OK(image->Write(c * kCluster, Fill(c * kCluster, kCluster)));
      ASSERT_OK(image->Flush());
    });
  }
  for (int i = 0; i < 3000 && waits.load() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(waits.load(), 3) << "the later flushes did not wait";
  ReleaseFlush();
  for (std::thread& t : flushers) t.join();
  internal::SetEventHook(nullptr);
  EXPECT_EQ(logs.load(), 2) << "flushes that waited recorded one log each";
  ASSERT_OK(image->Close());
  CheckWithQemu(path_, {{0, kCluster},
                        {kCluster, kCluster},
                        {5 * kCluster, kCluster},
                        {6 * kCluster, kCluster},
                        {7 * kCluster, kCluster}});
}

// A flush hands the clusters it releases back to the file system with no
// lock held, and they stay out of reach until then: while that discard is
// held, other requests complete, and a new cluster written meanwhile is
// not the one being discarded (its bytes would be punched out).
TEST(ReleasedDiscard, RequestsGoOnWhileAFlushDiscardsFreedClusters) {
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  ASSERT_NO_FATAL_FAILURE(CreateWritten(path, {0, kCluster}));
  GateOpener opener({.discard = true});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image,
                       OpenReadWrite(path, &opener));
  GateFile* gate = opener.last();
  ASSERT_OK(image->Discard(0, kCluster));  // its host cluster quarantined
  HoldAndExpectGoesOn(
      gate, [&] { ASSERT_OK(image->Flush()); },
      [&] {
        absl::Status s = ReadIsFill(image.get(), kCluster);
        const uint64_t fresh = 5 * kCluster;
        if (s.ok()) s = image->Write(fresh, Fill(fresh, kCluster));
        return s;
      },
      "a flush's discard of freed clusters");
  ASSERT_OK(image->Close());
  CheckWithQemu(path, {{kCluster, kCluster}, {5 * kCluster, kCluster}});
}

// A discard that frees a cluster after an allocation must first write the
// L2 cache out (new entries and their refcounts before the freed
// cluster's refcount can drop). It records that write-back while planned,
// and its executor writes it with no lock held: while it is held at its
// file flush, a read and an in-place write complete.
TEST_F(FlushWriteBack, RequestsGoOnWhileADiscardWritesTheCacheItNeedsFirst) {
  Image* image = image_.get();
  HoldAndExpectGoesOn(
      gate_, [&] { ASSERT_OK(image->Discard(0, kCluster)); },
      [&] { return ReadAndWriteInPlace(); },
      "a discard's metadata write-back");
  ASSERT_OK(image->Close());
  CheckWithQemu(path_, {{kCluster, kCluster}});
  if (testing::HaveQemu()) {
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all, testing::QemuReadAll(path_));
    EXPECT_TRUE(std::all_of(all.begin(), all.begin() + kCluster,
                            [](uint8_t b) { return b == 0; }));
  }
}

// The mirror case, in a commit: after a discard the refcounts wait for
// the L2 cache, so an allocating write's commit must write both out
// before its new entry may depend on its refcount. The commit records
// that write-back and the write's executor writes it once it has let the
// lock go: while it is held at its file flush, a read and an in-place
// write complete.
TEST_F(FlushWriteBack, RequestsGoOnWhileACommitWritesTheCacheItNeedsFirst) {
  Image* image = image_.get();
  ASSERT_OK(image->Discard(0, kCluster));
  HoldAndExpectGoesOn(
      gate_,
      [&] {
        ASSERT_OK(image->Write(5 * kCluster, Fill(5 * kCluster, kCluster)));
      },
      [&] { return ReadAndWriteInPlace(); },
      "a commit's metadata write-back");
  ASSERT_OK(image->Close());
  CheckWithQemu(path_, {{kCluster, kCluster}, {5 * kCluster, kCluster}});
}

// A request that evicts dirty L2 slices from a full cache writes them back
// after planning, with no lock held: while that write-back is held at its
// file flush, other requests complete. Before, the eviction wrote (and
// flushed) under the lock.
TEST(EvictionWriteBack, RequestsGoOnWhileAnEvictionIsWritten) {
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  constexpr uint64_t kSlice = 64 * kCluster;
  std::vector<std::pair<uint64_t, uint64_t>> written;
  // The L2 table on disk, naming a cluster in each of slices 0 to 5.
  std::vector<uint64_t> first;
  for (uint64_t i = 0; i < 6; ++i) {
    first.push_back(i * kSlice);
    if (i != 2) written.push_back({i * kSlice, kCluster});
  }
  ASSERT_NO_FATAL_FAILURE(CreateWritten(path, first));
  GateOpener opener({.flush = true});
  OpenOptions oo;
  oo.read_write = true;
  oo.opener = &opener;
  // 512-byte slices (64 clusters, 4 MiB of guest space each); room for 4.
  oo.l2_slice_bytes = 512;
  oo.l2_cache_bytes = 4 * 512;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image, Image::Open(path, oo));
  GateFile* gate = opener.last();
  // Slices 0 to 3 cached and dirty (new clusters, data written).
  for (uint64_t i = 0; i < 4; ++i) {
    const uint64_t at = i * kSlice + kCluster;
    ASSERT_OK(image->Write(at, Fill(at, kCluster)));
    written.push_back({at, kCluster});
  }
  // Slice 5 is not cached: room is made for it by evicting.
  const uint64_t evicting_at = 5 * kSlice + kCluster;
  HoldAndExpectGoesOn(
      gate,
      [&] {
        ASSERT_OK(image->Write(evicting_at, Fill(evicting_at, kCluster)));
      },
      [&] {
        // A read and an in-place write, in slices still cached.
        absl::Status s = ReadIsFill(image.get(), kSlice);
        if (s.ok()) s = image->Write(2 * kSlice, Fill(7, kCluster));
        return s;
      },
      "another's eviction");
  written.push_back({5 * kSlice + kCluster, kCluster});
  ASSERT_OK(image->Close());
  CheckWithQemu(path, written);
  if (testing::HaveQemu()) {
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all, testing::QemuReadAll(path));
    const std::vector<uint8_t> want = Fill(7, kCluster);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin() + 2 * kSlice));
  }
}

// A write whose allocation needs a refcount block that is not cached reads
// it with no lock held, as an L2 miss is read: other requests complete
// while that read is held.
TEST(RefcountMiss, RequestsGoOnWhileARefcountBlockIsRead) {
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  ASSERT_NO_FATAL_FAILURE(CreateWritten(path, {0}));
  // Refcount blocks are one cluster; nothing else here reads 64 KiB once
  // the L2 table is cached.
  GateOpener opener({.read_size = kCluster});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image,
                       OpenReadWrite(path, &opener));
  GateFile* gate = opener.last();
  std::vector<uint8_t> buf(4096);
  ASSERT_OK(image->Read(0, absl::MakeSpan(buf)));  // the L2 table, cached
  HoldAndExpectGoesOn(
      gate,
      [&] {
        ASSERT_OK(image->Write(3 * kCluster, Fill(3 * kCluster, kCluster / 2)));
      },
      [&] {
        std::vector<uint8_t> b(4096);
        absl::Status s = image->Read(8192, absl::MakeSpan(b));
        const std::vector<uint8_t> want = Fill(0, kCluster);
        if (s.ok() && !std::equal(b.begin(), b.end(), want.begin() + 8192)) {
          s = absl::InternalError("read other bytes");
        }
        // In place: no allocation.
        if (s.ok()) s = image->Write(4096, std::vector<uint8_t>(4096, 0x5a));
        return s;
      },
      "another's refcount read");
  ASSERT_OK(image->Close());
  if (!testing::HaveQemu()) return;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                       testing::QemuCheckedReadAll(path));
  std::vector<uint8_t> want = Fill(0, kCluster);
  std::fill(want.begin() + 4096, want.begin() + 8192, 0x5a);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin()));
  want = Fill(3 * kCluster, kCluster / 2);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin() + 3 * kCluster));
}

// The first write into an image with lazy refcounts sets the header's
// dirty bit, written and flushed before anything the write changes. Its
// executor writes that update with no lock held: a read completes while
// the update's flush is held. A second write waits for the update before
// its own I/O (its bytes must not reach the disk first).
TEST(HeaderWriteBack, RequestsGoOnWhileTheFirstWriteUpdatesTheHeader) {
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  ASSERT_NO_FATAL_FAILURE(CreateWritten(path, {0}, /*lazy=*/true));
  GateOpener opener({.flush = true});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image,
                       OpenReadWrite(path, &opener));
  GateFile* gate = opener.last();
  std::thread second;
  std::atomic<bool> second_before_release{false};
  HoldAndExpectGoesOn(
      gate,
      [&] { ASSERT_OK(image->Write(kCluster, Fill(kCluster, kCluster))); },
      [&] {
        absl::Status s = ReadIsFill(image.get(), 0);
        second = std::thread([&] {
          EXPECT_OK(image->Write(2 * kCluster, Fill(2 * kCluster, kCluster)));
          if (!gate->released()) second_before_release = true;
        });
        // Time for a second write that did not wait to get done.
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        return s;
      },
      "the first write's header update");
  second.join();
  EXPECT_FALSE(second_before_release)
      << "a write completed before the header update was written";
  EXPECT_EQ(image->GetStats().host_calls_under_lock, 0u);
  // The dirty bit is on disk while the image is open.
  std::vector<uint8_t> header(80);
  {
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(header.data()), header.size());
  }
  EXPECT_EQ(header[79] & 1, 1) << "dirty bit not set";
  ASSERT_OK(image->Close());
  CheckWithQemu(path, {{0, kCluster}, {kCluster, kCluster},
                       {2 * kCluster, kCluster}});
}

// After an internal snapshot, the active L1 entries name L2 tables the
// snapshot shares. The first write into one copies the table: the copy's
// L1 entry is written by the next flush, after the copy, with the shared
// table's reference dropped after that (and the references of clusters
// the copy lets go of). Before, the copy was written, flushed and linked
// under the lock, so every queue waited for two file flushes.
TEST(SharedTableCopy, IsLinkedByTheNextFlushWithoutTheLock) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  ASSERT_NO_FATAL_FAILURE(CreateWritten(path, {0, kCluster}));
  testing::CommandResult r =
      testing::Run({"qemu-img", "snapshot", "-c", "s1", path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  {
    OpenOptions oo;
    oo.read_write = true;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image, Image::Open(path, oo));
    // Into the shared table: a new cluster, and over a shared cluster
    // (copy-on-write, the shared one let go of).
    ASSERT_OK(image->Write(2 * kCluster, Fill(7, kCluster)));
    ASSERT_OK(image->Write(kCluster, Fill(8, 4096)));
    ASSERT_OK(image->Flush());
    EXPECT_EQ(image->GetStats().host_calls_under_lock, 0u);
    ASSERT_OK(image->Close());
  }
  // qemu-img finds the image clean (every reference counted once) and
  // reads the new bytes; the snapshot still reads the old ones.
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                       testing::QemuCheckedReadAll(path));
  std::vector<uint8_t> want = Fill(kCluster, kCluster);
  const std::vector<uint8_t> eight = Fill(8, 4096);
  std::copy(eight.begin(), eight.end(), want.begin());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin() + kCluster));
  want = Fill(7, kCluster);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin() + 2 * kCluster));
  const std::string snap = dir.File("snap.raw");
  r = testing::Run({"qemu-img", "convert", "-O", "raw", "-l",
                    "snapshot.name=s1", path, snap});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> old, testing::ReadFileBytes(snap));
  for (uint64_t at : {uint64_t{0}, kCluster}) {
    want = Fill(at, kCluster);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), old.begin() + at))
        << "the snapshot reads other bytes at " << at;
  }
  EXPECT_TRUE(std::all_of(old.begin() + 2 * kCluster,
                          old.begin() + 3 * kCluster,
                          [](uint8_t b) { return b == 0; }));
}

// Metadata written out while a write is planned or committed (a new L2
// table's slices pushing others out of a small cache, a cache written
// before a dependency the other way) goes into one log per step, for the
// request's executor: with caches far smaller than what one request
// touches, no host call is made under the lock. Before, a request past
// its budget of 16 write-outs made the rest under the lock.
class TinyCaches : public ::testing::Test {
 protected:
  std::unique_ptr<Image> Open(const std::string& path) {
    OpenOptions oo;
    oo.read_write = true;
    oo.l2_slice_bytes = 512;  // 128 slices to an L2 table
    oo.l2_cache_bytes = 4 * 512;
    oo.refcount_cache_bytes = 4 * kCluster;
    absl::StatusOr<std::unique_ptr<Image>> image = Image::Open(path, oo);
    EXPECT_OK(image.status());
    return image.ok() ? std::move(*image) : nullptr;
  }

  // Flushes and closes `image`, which made no host call under the lock;
  // returns what qemu-img reads of it (checked clean), or nothing without
  // qemu.
  static std::vector<uint8_t> CloseAndRead(std::unique_ptr<Image> image,
                                           const std::string& path) {
    EXPECT_OK(image->Flush());
    EXPECT_EQ(image->GetStats().host_calls_under_lock, 0u);
    EXPECT_OK(image->Close());
    if (!testing::HaveQemu()) return {};
    absl::StatusOr<std::vector<uint8_t>> all =
        testing::QemuCheckedReadAll(path);
    EXPECT_OK(all.status());
    return all.ok() ? std::move(*all) : std::vector<uint8_t>();
  }

  TempDir dir_;
};

TEST_F(TinyCaches, NewTablesAreWrittenOutWithoutTheLock) {
  const std::string path = dir_.File("img.qcow2");
  CreateOptions co;
  co.size = 16 << 20;
  co.cluster_size = 4096;  // an L2 table: 8 slices, 2 MiB of disk
  ASSERT_OK(CreateImage(path, co));
  std::unique_ptr<Image> image = Open(path);
  ASSERT_NE(image, nullptr);
  // One write under five new tables: 40 new slices into a cache of 4.
  const uint64_t at = (1 << 20) + 512;
  const std::vector<uint8_t> want = Fill(at, 8 << 20);
  ASSERT_OK(image->Write(at, want));
  const std::vector<uint8_t> all = CloseAndRead(std::move(image), path);
  if (all.empty()) return;
  EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin() + at));
}

// The same for write-zeroes over a backing file, which sets zero flags in
// new tables (its own planning is not one log: its range has no bound).
TEST_F(TinyCaches, ZeroFlagsInNewTablesAreWrittenOutWithoutTheLock) {
  const std::string base = dir_.File("base.qcow2");
  std::vector<uint64_t> clusters;
  std::vector<uint8_t> want;  // what the overlay reads, zeros aside
  for (uint64_t at = 0; at < (16 << 20); at += kCluster) {
    clusters.push_back(at);
    const std::vector<uint8_t> fill = Fill(at, kCluster);
    want.insert(want.end(), fill.begin(), fill.end());
  }
  ASSERT_NO_FATAL_FAILURE(CreateWritten(base, clusters));
  const std::string path = dir_.File("img.qcow2");
  CreateOptions co;
  co.size = 16 << 20;
  co.cluster_size = 4096;
  co.backing_file = base;
  co.backing_format = "qcow2";
  ASSERT_OK(CreateImage(path, co));
  std::unique_ptr<Image> image = Open(path);
  ASSERT_NE(image, nullptr);
  ASSERT_OK(image->WriteZeroes(1 << 20, 8 << 20, /*may_unmap=*/false));
  const std::vector<uint8_t> all = CloseAndRead(std::move(image), path);
  if (all.empty()) return;
  std::fill(want.begin() + (1 << 20), want.begin() + (9 << 20), 0);
  EXPECT_TRUE(all == want) << "qemu reads other bytes";
}

// A write whose allocations outgrow the refcount table: the new table,
// its blocks and the header that names it are written in order by the
// request's executor.
TEST_F(TinyCaches, RefcountTableGrowthIsWrittenWithoutTheLock) {
  const std::string path = dir_.File("img.qcow2");
  CreateOptions co;
  co.size = 16 << 20;
  co.cluster_size = 512;  // a refcount table cluster covers 2 MiB
  co.refcount_bits = 64;
  ASSERT_OK(CreateImage(path, co));
  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image, Image::Open(path, oo));
  const std::vector<uint8_t> data = Fill(5, 6 << 20);
  std::atomic<int> grown{0};
  internal::EventHook hook = [&](std::string_view event) {
    if (event == "refcount-table-grow") grown++;
  };
  internal::SetEventHook(&hook);
  ASSERT_OK(image->Write(4096, data));
  internal::SetEventHook(nullptr);
  EXPECT_GT(grown.load(), 0);
  const std::vector<uint8_t> all = CloseAndRead(std::move(image), path);
  if (all.empty()) return;
  EXPECT_TRUE(std::equal(data.begin(), data.end(), all.begin() + 4096));
}

// Discard and write-zeroes over a long range of allocated clusters: every
// L2 slice changes and every host cluster is let go of, far more metadata
// than the caches hold. The range is changed in rounds, each one log for
// the request's executor. Before, past 16 write-outs a request made the
// rest under the lock.
class TinyCachesOverData : public TinyCaches,
                           public ::testing::WithParamInterface<const char*> {
 protected:
  void SetUp() override {
    path_ = dir_.File("img.qcow2");
    CreateOptions co;
    co.size = 32 << 20;
    co.cluster_size = 4096;  // a refcount block covers 8 MiB of the file
    // Version 2 has no zero flag: zero bytes are written into the kept
    // clusters, and planned writes stop misses from being deferred.
    co.compat = GetParam();
    ASSERT_OK(CreateImage(path_, co));
    OpenOptions oo;
    oo.read_write = true;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image,
                         Image::Open(path_, oo));
    want_ = Fill(11, co.size);
    ASSERT_OK(image->Write(0, want_));
    ASSERT_OK(image->Close());
  }

  // Runs `change` on a queue (the executor writes each round's log), then
  // checks the image with qemu-img: it reads `want_` with [from, to)
  // zeroed.
  void RunAndCheck(const std::function<absl::Status(Queue*,
                                                     Completion)>& change,
                   uint64_t from, uint64_t to, bool tiny = true) {
    OpenOptions roomy;
    roomy.read_write = true;
    std::unique_ptr<Image> image =
        tiny ? Open(path_) : std::move(*Image::Open(path_, roomy));
    ASSERT_NE(image, nullptr);
    if (!tiny) {
      // The L2 tables cached: no miss ends a planning round early.
      std::vector<uint8_t> all(want_.size());
      ASSERT_OK(image->Read(0, absl::MakeSpan(all)));
    }
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Queue> q, image->CreateQueue({}));
    absl::Status result = absl::InternalError("not completed");
    ASSERT_OK(change(q.get(), [&](absl::Status s) { result = s; }));
    q->Drain();
    ASSERT_OK(result);
    q.reset();
    const std::vector<uint8_t> all = CloseAndRead(std::move(image), path_);
    if (all.empty()) return;
    std::fill(want_.begin() + from, want_.begin() + to, 0);
    EXPECT_TRUE(all == want_) << "qemu reads other bytes";
  }

  std::string path_;
  std::vector<uint8_t> want_;
};

TEST_P(TinyCachesOverData, LongDiscardWritesOutWithoutTheLock) {
  const uint64_t from = (1 << 20) + 4096, to = (29 << 20) + 4096;
  RunAndCheck(
      [&](Queue* q, Completion done) {
        return q->SubmitDiscard(from, to - from, std::move(done));
      },
      from, to);
}

TEST_P(TinyCachesOverData, LongWriteZeroesWritesOutWithoutTheLock) {
  // Zero flags, the clusters kept; and ends that are parts of clusters.
  const uint64_t from = (1 << 20) + 100, to = (29 << 20) + 5000;
  RunAndCheck(
      [&](Queue* q, Completion done) {
        return q->SubmitWriteZeroes(from, to - from, /*unmap=*/false,
                                    std::move(done));
      },
      from, to);
}

TEST_P(TinyCachesOverData, LongUnmappingWriteZeroesWithoutTheLock) {
  const uint64_t from = 0, to = 32 << 20;
  RunAndCheck(
      [&](Queue* q, Completion done) {
        return q->SubmitWriteZeroes(from, to - from, /*unmap=*/true,
                                    std::move(done));
      },
      from, to);
}

// With the tables cached, no miss ends a planning early: rounds of four
// windows each (two here) on version 3, zero flags set and the clusters
// kept.
TEST_P(TinyCachesOverData, LongWriteZeroesIntoRoomyCaches) {
  const uint64_t from = 4096, to = (32 << 20) - 4096;
  RunAndCheck(
      [&](Queue* q, Completion done) {
        return q->SubmitWriteZeroes(from, to - from, /*unmap=*/false,
                                    std::move(done));
      },
      from, to, /*tiny=*/false);
}

// A request queued behind a long write-zeroes into its range waits for
// every round of it (the range is held from the first round to the last);
// one outside the range does not change what the zeroing does. On version
// 2 each round writes zeros (a zero-range call per cluster kept), so the
// queue plans what waits between rounds.
TEST_P(TinyCachesOverData, RoundsKeepTheirRangeFromLaterRequests) {
  std::unique_ptr<Image> image = Open(path_);
  ASSERT_NE(image, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Queue> q, image->CreateQueue({}));
  const uint64_t from = 1 << 20, to = 31 << 20;
  const uint64_t inside = to - 8192, outside = to + 4096;
  const std::vector<uint8_t> a = Fill(21, 4096), b = Fill(22, 4096);
  int completed = 0;
  auto done = [&](absl::Status s) {
    EXPECT_OK(s);
    ++completed;
  };
  ASSERT_OK(q->SubmitWriteZeroes(from, to - from, /*unmap=*/false, done));
  ASSERT_OK(q->SubmitWrite(inside, a, done));
  ASSERT_OK(q->SubmitWrite(outside, b, done));
  q->Drain();
  EXPECT_EQ(completed, 3);
  q.reset();
  std::fill(want_.begin() + from, want_.begin() + to, 0);
  std::copy(a.begin(), a.end(), want_.begin() + inside);
  std::copy(b.begin(), b.end(), want_.begin() + outside);
  std::vector<uint8_t> ours(want_.size());
  ASSERT_OK(image->Read(0, absl::MakeSpan(ours)));
  EXPECT_TRUE(ours == want_) << "we read other bytes";
  const std::vector<uint8_t> all = CloseAndRead(std::move(image), path_);
  if (all.empty()) return;
  EXPECT_TRUE(all == want_) << "qemu reads other bytes";
}

// Over a backing file, which a version 2 overlay cannot mark zero: every
// cluster is allocated and written with zeros, committed round by round.
TEST_P(TinyCachesOverData, LongWriteZeroesIntoAnOverlayWithoutTheLock) {
  const std::string base = dir_.File("base.qcow2");
  ASSERT_EQ(std::rename(path_.c_str(), base.c_str()), 0);
  CreateOptions co;
  co.size = 32 << 20;
  co.cluster_size = 4096;
  co.compat = GetParam();
  co.backing_file = base;
  co.backing_format = "qcow2";
  ASSERT_OK(CreateImage(path_, co));
  const uint64_t from = (3 << 20) + 512, to = (27 << 20) - 512;
  RunAndCheck(
      [&](Queue* q, Completion done) {
        return q->SubmitWriteZeroes(from, to - from, /*unmap=*/false,
                                    std::move(done));
      },
      from, to);
}

INSTANTIATE_TEST_SUITE_P(Compat, TinyCachesOverData,
                         ::testing::Values("1.1", "0.10"),
                         [](const auto& info) {
                           return std::string(info.param[0] == '1' ? "v3"
                                                                   : "v2");
                         });

TEST_F(TinyCaches, WritesOverCompressedClustersWriteOutWithoutTheLock) {
  SKIP_WITHOUT_QEMU();
  // 2 MiB of compressible data, compressed by qemu-img: every cluster
  // rewritten below is allocated anew and its compressed one let go of,
  // so the L2 and refcount caches wait on each other in turn.
  const std::string raw = dir_.File("src.raw");
  std::vector<uint8_t> src(2 << 20);
  for (size_t i = 0; i < src.size(); ++i) {
    src[i] = static_cast<uint8_t>(i / 4096);
  }
  ASSERT_OK(testing::WriteFileBytes(raw, src));
  const std::string path = dir_.File("img.qcow2");
  testing::CommandResult r = testing::Run(
      {"qemu-img", "convert", "-c", "-f", "raw", "-O", "qcow2", raw, path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::unique_ptr<Image> image = Open(path);
  ASSERT_NE(image, nullptr);
  const std::vector<uint8_t> data = Fill(3, 1 << 20);
  ASSERT_OK(image->Write(kCluster / 2, data));
  const std::vector<uint8_t> all = CloseAndRead(std::move(image), path);
  std::copy(data.begin(), data.end(), src.begin() + kCluster / 2);
  EXPECT_TRUE(all == src) << "qemu reads other bytes";
}

}  // namespace
}  // namespace qcow2
