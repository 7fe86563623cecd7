// SPDX-License-Identifier: Apache-2.0
// Deferred copy-on-write and byte-range locks (lib/driver/pending_clusters.cc):
// small writes that follow one another into a fresh overlay with standard
// L2 entries fill its clusters without reading the backing file; clusters
// they leave partly covered are filled at the flush; requests that need a
// whole cluster settle it first; writes into one cluster run side by side.
// Every image is checked by qemu-img, and read back through it.
#include <atomic>
#include <future>
#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"
#include "testing/gate_file.h"
#include "testing/model.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::TempDir;

constexpr uint64_t kCluster = 65536;
constexpr uint64_t kDisk = 8 << 20;

// The backing file's bytes: pseudo-random, no zeros to skip.
std::vector<uint8_t> BaseBytes() {
  std::vector<uint8_t> b(kDisk);
  testing::FillPseudoRandom(0, absl::MakeSpan(b));
  for (uint8_t& x : b) x |= 1;
  return b;
}

// A raw backing file and a fresh overlay over it (standard L2 entries
// unless `extended_l2`).
std::unique_ptr<Image> FreshOverlay(const TempDir& dir,
                                    const std::vector<uint8_t>& base,
                                    bool extended_l2 = false,
                                    FileOpener* opener = nullptr) {
  EXPECT_OK(testing::WriteFileBytes(dir.File("base.raw"), base));
  std::filesystem::remove(dir.File("top.qcow2"));
  CreateOptions top;
  top.size = kDisk;
  top.cluster_size = kCluster;
  top.extended_l2 = extended_l2;
  top.backing_file = "base.raw";
  top.backing_format = "raw";
  EXPECT_OK(CreateImage(dir.File("top.qcow2"), top));
  OpenOptions rw;
  rw.read_write = true;
  rw.opener = opener;
  auto image = Image::Open(dir.File("top.qcow2"), rw);
  EXPECT_TRUE(image.ok()) << image.status();
  return image.ok() ? std::move(*image) : nullptr;
}

std::vector<uint8_t> Pattern(uint64_t offset, uint64_t len, uint8_t salt) {
  std::vector<uint8_t> d(len);
  for (uint64_t i = 0; i < len; ++i) {
    d[i] = static_cast<uint8_t>(((offset + i) * 131 + salt) >> 3) | 0x80;
  }
  return d;
}

void Put(std::vector<uint8_t>* model, uint64_t offset,
         const std::vector<uint8_t>& data) {
  std::copy(data.begin(), data.end(), model->begin() + offset);
}

void ExpectReads(Image* image, const std::vector<uint8_t>& model,
                 uint64_t offset, uint64_t len) {
  std::vector<uint8_t> got(len);
  ASSERT_OK(image->Read(offset, absl::MakeSpan(got)));
  ASSERT_EQ(testing::DescribeMismatch(
                absl::MakeConstSpan(model).subspan(offset, len), got, offset),
            "");
}

// qemu-img check finds the image clean and reads `model` from it.
void ExpectQemuSees(const std::string& path,
                    const std::vector<uint8_t>& model) {
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> qemu,
                       testing::QemuCheckedReadAll(path));
  ASSERT_EQ(testing::DescribeMismatch(model, qemu), "");
}

// Each test starts from a fresh overlay over BaseBytes(); `model_` holds
// what the disk must read as.
class DeferredCowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveQemu()) GTEST_SKIP() << "no qemu-img";
    model_ = BaseBytes();
    base_ = model_;
    image_ = FreshOverlay(dir_, model_);
    ASSERT_NE(image_, nullptr);
  }

  // Reads the whole disk back, closes the image, and has qemu-img check
  // it and read it.
  void CloseAndVerify() {
    ExpectReads(image_.get(), model_, 0, kDisk);
    ASSERT_OK(image_->Close());
    image_.reset();
    ExpectQemuSees(dir_.File("top.qcow2"), model_);
  }

  // Reads [offset, +len) and compares it with the model (from any
  // thread: the model's range must not change meanwhile).
  absl::Status ReadMatches(uint64_t offset, uint64_t len) {
    std::vector<uint8_t> got(len);
    absl::Status s = image_->Read(offset, absl::MakeSpan(got));
    if (s.ok() &&
        !std::equal(got.begin(), got.end(), model_.begin() + offset)) {
      s = absl::InternalError(absl::StrCat("read other bytes at ", offset));
    }
    return s;
  }

  // Opens a fresh overlay behind `opener`, and leaves guest cluster `c`
  // pending with its first 4 KiB written (continuing a write into the
  // cluster before). Returns the backing file's gate, or null.
  testing::GateFile* ReopenWithPending(testing::GateOpener* opener,
                                       uint64_t c, uint8_t salt) {
    image_.reset();
    image_ = FreshOverlay(dir_, base_, /*extended_l2=*/false, opener);
    if (image_ == nullptr) return nullptr;
    for (uint64_t off : {c - 4096, c}) {
      const std::vector<uint8_t> d = Pattern(off, 4096, salt);
      EXPECT_OK(image_->Write(off, d));
      Put(&model_, off, d);
    }
    return opener->last();  // opened after the top
  }

  TempDir dir_;
  std::vector<uint8_t> model_;
  std::vector<uint8_t> base_;  // the backing file's bytes
  std::unique_ptr<Image> image_;
};

TEST_F(DeferredCowTest, SequentialSmallWritesFillClustersWithoutCopy) {
  const IoStats before = image_->GetStats();
  // Eight clusters in 4 KiB steps. The first write starts no stream, so
  // its cluster is copied at once; every later cluster is entered by a
  // write that continues the last one, and is filled by the writes alone.
  for (uint64_t off = 0; off < 8 * kCluster; off += 4096) {
    std::vector<uint8_t> d = Pattern(off, 4096, 1);
    ASSERT_OK(image_->Write(off, d));
    Put(&model_, off, d);
  }
  IoStats s = image_->GetStats().Since(before);
  EXPECT_EQ(s.cluster_allocations, 8u);
  EXPECT_EQ(s.cow_deferred, 7u);
  EXPECT_EQ(s.cow_deferred_filled, 0u);
  EXPECT_EQ(s.cow_read_bytes, kCluster - 4096);  // the first cluster only
  EXPECT_EQ(s.host_data_write_bytes, 8 * kCluster);
  ExpectReads(image_.get(), model_, 0, 9 * kCluster);

  // A stream that stops 8 KiB into a cluster: before the flush the rest
  // of that cluster still reads from the backing file; the flush copies
  // it (56 KiB) and commits the cluster.
  const IoStats mid = image_->GetStats();
  for (uint64_t off = 8 * kCluster; off < 8 * kCluster + 8192; off += 4096) {
    std::vector<uint8_t> d = Pattern(off, 4096, 2);
    ASSERT_OK(image_->Write(off, d));
    Put(&model_, off, d);
  }
  ExpectReads(image_.get(), model_, 7 * kCluster, 3 * kCluster);
  ASSERT_OK_AND_ASSIGN(BlockStatus st,
                       image_->GetBlockStatus(8 * kCluster, kCluster));
  EXPECT_EQ(st.length, 8192u);
  ASSERT_OK(image_->Flush());
  s = image_->GetStats().Since(mid);
  EXPECT_EQ(s.cow_deferred, 1u);
  EXPECT_EQ(s.cow_deferred_filled, 1u);
  EXPECT_EQ(s.cow_read_bytes, kCluster - 8192);
  CloseAndVerify();
}

TEST_F(DeferredCowTest, WholeClusterRequestsSettlePendingClustersFirst) {
  // Leave clusters 2..6 pending, each with its first 4 KiB written by a
  // stream, then hit each with a request that needs the whole cluster.
  uint64_t end = 2 * kCluster - 4096;
  ASSERT_OK(image_->Write(end, Pattern(end, 4096, 3)));
  Put(&model_, end, Pattern(end, 4096, 3));
  for (uint64_t c = 2; c <= 6; ++c) {
    const uint64_t off = c * kCluster;
    std::vector<uint8_t> d = Pattern(off, 4096, 4);
    ASSERT_OK(image_->Write(off, d));
    Put(&model_, off, d);
    // Continue the stream from the next cluster's start.
    if (c < 6) {
      const uint64_t tail = (c + 1) * kCluster - 4096;
      ASSERT_OK(image_->Write(tail, Pattern(tail, 4096, 5)));
      Put(&model_, tail, Pattern(tail, 4096, 5));
    }
  }
  const IoStats before = image_->GetStats();
  // Unaligned write (whole-cluster lock).
  std::vector<uint8_t> odd = Pattern(2 * kCluster + 5000, 300, 6);
  ASSERT_OK(image_->Write(2 * kCluster + 5000, odd));
  Put(&model_, 2 * kCluster + 5000, odd);
  // Write-zeroes inside a cluster, over a whole one, discard of one.
  ASSERT_OK(image_->WriteZeroes(3 * kCluster + 4096, 8192, false));
  std::fill_n(model_.begin() + 3 * kCluster + 4096, 8192, 0);
  ASSERT_OK(image_->WriteZeroes(4 * kCluster, kCluster, true));
  std::fill_n(model_.begin() + 4 * kCluster, kCluster, 0);
  ASSERT_OK(image_->Discard(5 * kCluster, kCluster));
  std::fill_n(model_.begin() + 5 * kCluster, kCluster, 0);
  // A write spanning two clusters, one of them pending.
  std::vector<uint8_t> span = Pattern(6 * kCluster - 4096, 12288, 7);
  ASSERT_OK(image_->Write(6 * kCluster - 4096, span));
  Put(&model_, 6 * kCluster - 4096, span);
  // Clusters 2, 3 and 6 are filled; 4 and 5, zeroed and discarded whole,
  // are dropped without a copy.
  const IoStats s = image_->GetStats().Since(before);
  EXPECT_EQ(s.cow_deferred_filled, 3u);
  CloseAndVerify();
}

// Submits `n` requests through `submit(i, done)` keeping up to `depth` in
// flight, and polls until all have completed with OK.
template <typename Submit>
void RunQueued(Queue* q, int n, int depth, Submit submit) {
  std::atomic<int> done{0}, failed{0};
  int next = 0;
  while (done.load() < n) {
    while (next < n && next - done.load() < depth) {
      ASSERT_OK(submit(next, [&](absl::Status s) {
        if (!s.ok()) {
          ADD_FAILURE() << s;
          failed++;
        }
        done++;
      }));
      ++next;
    }
    q->Poll(1);
  }
  EXPECT_EQ(failed.load(), 0);
}

TEST_F(DeferredCowTest, QueuedSequentialWritesShareEachCluster) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Queue> q, image_->CreateQueue());
  const IoStats before = image_->GetStats();
  // 4 MiB in 4 KiB writes, 32 in flight: writes into one cluster run side
  // by side, and only the first cluster is copied.
  const int n = static_cast<int>((4 << 20) / 4096);
  std::vector<std::vector<uint8_t>> bufs(n);
  for (int i = 0; i < n; ++i) {
    bufs[i] = Pattern(uint64_t{4096} * i, 4096, 8);
    Put(&model_, uint64_t{4096} * i, bufs[i]);
  }
  RunQueued(q.get(), n, 32, [&](int i, Completion done) {
    return q->SubmitWrite(uint64_t{4096} * i, bufs[i], std::move(done));
  });
  RunQueued(q.get(), 1, 1, [&](int, Completion done) {
    return q->SubmitFlush(std::move(done));
  });
  const IoStats s = image_->GetStats().Since(before);
  EXPECT_EQ(s.cluster_allocations, (4u << 20) / kCluster);
  EXPECT_EQ(s.cow_deferred_filled, 0u);
  EXPECT_LE(s.cow_read_bytes, kCluster);
  EXPECT_GE(s.cow_deferred, (4u << 20) / kCluster - 2);
  q.reset();
  CloseAndVerify();
}

// With extended L2 nothing is copied anyway; the new cluster's L2 entry
// waits only for the writes in flight into it, so a stream's writes into
// one cluster need not wait for the first (tests/lock_widen_test.cc). The
// stream's very first write continues nothing: it holds its cluster whole
// and defers nothing. Subclusters the stream did not cover keep what they
// were (here: zeros, and the backing file).
TEST_F(DeferredCowTest, ExtendedL2StreamsDeferOnlyTheEntry) {
  image_.reset();
  image_ = FreshOverlay(dir_, model_, /*extended_l2=*/true);
  ASSERT_NE(image_, nullptr);
  ASSERT_OK(image_->WriteZeroes(2 * kCluster + 8192, 8192, false));
  std::fill_n(model_.begin() + 2 * kCluster + 8192, 8192, 0);
  const IoStats before = image_->GetStats();
  for (uint64_t off = 2 * kCluster - 4096; off < 2 * kCluster + 8192;
       off += 4096) {
    std::vector<uint8_t> d = Pattern(off, 4096, 30);
    ASSERT_OK(image_->Write(off, d));
    Put(&model_, off, d);
  }
  IoStats s = image_->GetStats().Since(before);
  EXPECT_EQ(s.cow_deferred, 1u);  // cluster 2 (1 took the first write)
  EXPECT_EQ(s.cow_read_bytes, 0u);
  ExpectReads(image_.get(), model_, kCluster, 3 * kCluster);
  ASSERT_OK_AND_ASSIGN(BlockStatus st,
                       image_->GetBlockStatus(2 * kCluster + 8192, 8192));
  EXPECT_TRUE(st.zero);

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Queue> q, image_->CreateQueue());
  // Reads of a cluster while a deferred write into it is in flight: the
  // subclusters it does not cover read as the old entry says (zeros where
  // it says so, the backing file elsewhere).
  ASSERT_OK(image_->WriteZeroes(3 * kCluster + 8192, 8192, false));
  std::fill_n(model_.begin() + 3 * kCluster + 8192, 8192, 0);
  const std::vector<uint8_t> edge = Pattern(3 * kCluster - 4096, 4096, 32);
  ASSERT_OK(image_->Write(3 * kCluster - 4096, edge));
  Put(&model_, 3 * kCluster - 4096, edge);
  const std::vector<uint8_t> held = Pattern(3 * kCluster, 4096, 33);
  std::atomic<bool> held_done{false};
  ASSERT_OK(q->SubmitWrite(3 * kCluster, held, [&](absl::Status st) {
    EXPECT_OK(st);
    held_done = true;
  }));
  ExpectReads(image_.get(), model_, 3 * kCluster + 4096, kCluster - 4096);
  while (!held_done.load()) q->Poll(1);
  Put(&model_, 3 * kCluster, held);

  // Through a queue, 32 in flight: every cluster after the first is
  // deferred, none is filled, nothing is read.
  const uint64_t start = 4 * kCluster;
  const int n = 256;  // 1 MiB
  std::vector<std::vector<uint8_t>> bufs(n);
  for (int i = 0; i < n; ++i) {
    bufs[i] = Pattern(start + uint64_t{4096} * i, 4096, 31);
    Put(&model_, start + uint64_t{4096} * i, bufs[i]);
  }
  const IoStats mid = image_->GetStats();
  RunQueued(q.get(), n, 32, [&](int i, Completion done) {
    return q->SubmitWrite(start + uint64_t{4096} * i, bufs[i],
                          std::move(done));
  });
  q.reset();
  ASSERT_OK(image_->Flush());
  s = image_->GetStats().Since(mid);
  EXPECT_EQ(s.cow_read_bytes, 0u);
  EXPECT_EQ(s.cow_deferred_filled, 0u);
  EXPECT_GE(s.cow_deferred, 14u);
  CloseAndVerify();
}

// A flush does not wait for writes in flight into a pending cluster (they
// may belong to a queue nobody polls until the flush returns): it writes
// their bytes itself, fills the rest and commits the cluster.
TEST_F(DeferredCowTest, FlushCommitsPendingClustersWithWritesInFlight) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Queue> q, image_->CreateQueue());
  const std::vector<uint8_t> first = Pattern(kCluster - 4096, 4096, 20);
  ASSERT_OK(image_->Write(kCluster - 4096, first));
  Put(&model_, kCluster - 4096, first);
  // Continues the stream into cluster 1: deferred, and left in flight.
  const std::vector<uint8_t> second = Pattern(kCluster, 8192, 21);
  Put(&model_, kCluster, second);
  std::atomic<bool> done{false};
  ASSERT_OK(q->SubmitWrite(kCluster, second, [&](absl::Status s) {
    EXPECT_OK(s);
    done = true;
  }));
  const IoStats before = image_->GetStats();
  ASSERT_OK(image_->Flush());  // same thread: the queue is not polled
  const IoStats s = image_->GetStats().Since(before);
  EXPECT_EQ(s.cow_deferred_filled, 1u);
  EXPECT_EQ(s.cow_read_bytes, kCluster - 8192);
  while (!done.load()) q->Poll(1);
  q.reset();
  CloseAndVerify();
}

// Holds the reads that fill a pending cluster whose first 4 KiB were
// written: the other 60 KiB, from the backing file.
constexpr testing::GateSpec kFillRead{.read_size = kCluster - 4096};

// A flush fills pending clusters with no lock held: while its read of
// the backing file is held, requests elsewhere complete, and a write into
// the cluster being filled waits for the fill (else the fill's old bytes
// would land over it).
TEST_F(DeferredCowTest, FlushFillsPendingClustersWithoutTheLock) {
  testing::GateOpener opener(kFillRead);
  const uint64_t c = 3 * kCluster;
  testing::GateFile* base_file = ReopenWithPending(&opener, c, 30);
  ASSERT_NE(base_file, nullptr);
  Image* image = image_.get();
  const IoStats before = image->GetStats();
  // Into a unit the fill copies from the backing file.
  const std::vector<uint8_t> into = Pattern(c + 5 * 4096, 4096, 31);
  std::thread writer;
  const std::vector<uint8_t> whole = Pattern(9 * kCluster, kCluster, 32);
  const std::vector<uint8_t> in_place = Pattern(c - 8192, 4096, 33);
  Put(&model_, 9 * kCluster, whole);
  Put(&model_, c - 8192, in_place);
  testing::HoldAndExpectGoesOn(
      base_file, [&] { ASSERT_OK(image->Flush()); },
      [&] {
        // A read across the pending cluster, a new cluster written whole,
        // and a write in place.
        absl::Status s = ReadMatches(c - 4096, 8192);
        if (s.ok()) s = image->Write(9 * kCluster, whole);
        if (s.ok()) s = image->Write(c - 8192, in_place);
        // Then the write into the cluster being filled, let go with the
        // fill a moment later.
        writer = std::thread(
            [&] { ASSERT_OK(image->Write(c + 5 * 4096, into)); });
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return s;
      },
      "a flush's fill of a pending cluster");
  writer.join();
  Put(&model_, c + 5 * 4096, into);
  const IoStats st = image->GetStats().Since(before);
  EXPECT_EQ(st.cow_deferred_filled, 1u);
  EXPECT_EQ(st.cow_read_bytes, kCluster - 4096);
  CloseAndVerify();
}

// A flush that meets a request granted a pending cluster whole but not
// planned yet (its queue not polled since) fills that cluster with no
// lock held, as any other (it filled it under the lock before). The
// request, planned meanwhile, waits for the fill: written before it, its
// bytes in the cluster would be overwritten by the fill's copy.
TEST_F(DeferredCowTest, AFlushFillsAClusterHeldWholeWithoutTheLock) {
  testing::GateOpener opener(kFillRead);
  const uint64_t c = 3 * kCluster;
  testing::GateFile* base_file = ReopenWithPending(&opener, c, 70);
  ASSERT_NE(base_file, nullptr);
  Image* image = image_.get();
  const IoStats before = image->GetStats();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Queue> q, image->CreateQueue());
  // A read of the pending cluster's other 60 KiB (from the backing file,
  // held), then a write across the cluster and the one before, which
  // holds both whole and waits for the read.
  base_file->Arm();
  std::thread reader(
      [&] { EXPECT_OK(ReadMatches(c + 4096, kCluster - 4096)); });
  ASSERT_TRUE(base_file->WaitBlocked());
  const std::vector<uint8_t> across = Pattern(c - 8192, 16384, 71);
  int done = 0;
  ASSERT_OK(q->SubmitWrite(c - 8192, across, [&](absl::Status s) {
    EXPECT_OK(s);
    ++done;
  }));
  // The read completes and the write is granted its clusters; its queue,
  // which plans it, is not polled yet.
  base_file->Release();
  reader.join();
  EXPECT_EQ(done, 0);
  base_file->Arm();
  std::thread flusher([&] { ASSERT_OK(image->Flush()); });
  ASSERT_TRUE(base_file->WaitBlocked());  // the fill's read
  std::future<absl::Status> read = std::async(
      std::launch::async, [&] { return ReadMatches(9 * kCluster, 4096); });
  EXPECT_EQ(read.wait_for(std::chrono::seconds(20)),
            std::future_status::ready)
      << "a read waited for the flush's fill: it held the lock";
  q->Poll(0);  // the write is planned, and waits for the fill
  EXPECT_EQ(done, 0);
  base_file->Release();
  flusher.join();
  EXPECT_OK(read.get());
  q->Drain();
  EXPECT_EQ(done, 1);
  Put(&model_, c - 8192, across);
  EXPECT_EQ(image->GetStats().Since(before).host_calls_under_lock, 0u);
  q.reset();
  CloseAndVerify();
}

// A flush that begins while an earlier flush fills a pending cluster
// returns only after that fill is committed: the writes it covers may be
// in that cluster, whose L2 entry the fill sets.
TEST_F(DeferredCowTest, ALaterFlushWaitsForAnEarlierFill) {
  testing::GateOpener opener(kFillRead);
  testing::GateFile* base_file = ReopenWithPending(&opener, 3 * kCluster, 40);
  ASSERT_NE(base_file, nullptr);
  Image* image = image_.get();
  base_file->Arm();
  std::thread first([&] { ASSERT_OK(image->Flush()); });
  ASSERT_TRUE(base_file->WaitBlocked());
  std::atomic<bool> second_saw_release{false};
  std::thread second([&] {
    ASSERT_OK(image->Flush());
    second_saw_release = base_file->released();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  base_file->Release();
  first.join();
  second.join();
  EXPECT_TRUE(second_saw_release)
      << "a flush returned while an earlier flush still filled a cluster";
  CloseAndVerify();
}

// Write-zeroes over part of a cluster copies the rest of it with no lock
// held, as a write does: while its read of the backing file is held,
// requests elsewhere complete.
TEST_F(DeferredCowTest, PartialWriteZeroesCopyWithoutTheLock) {
  image_.reset();
  // The copy of the 56 KiB after the zeroed 4 KiB of the cluster's second.
  testing::GateOpener opener({.read_size = kCluster - 8192});
  image_ = FreshOverlay(dir_, base_, /*extended_l2=*/false, &opener);
  ASSERT_NE(image_, nullptr);
  Image* image = image_.get();
  testing::GateFile* base_file = opener.last();
  const uint64_t c = 5 * kCluster;
  const std::vector<uint8_t> whole = Pattern(9 * kCluster, kCluster, 60);
  testing::HoldAndExpectGoesOn(
      base_file, [&] { ASSERT_OK(image->WriteZeroes(c + 4096, 4096, false)); },
      [&] {
        absl::Status s = ReadMatches(c - 8192, 8192);
        if (s.ok()) s = image->Write(9 * kCluster, whole);
        return s;
      },
      "a partial write-zeroes' copy-on-write");
  std::fill_n(model_.begin() + c + 4096, 4096, 0);
  Put(&model_, 9 * kCluster, whole);
  CloseAndVerify();
}

// With extended L2 entries too (2 KiB subclusters), write-zeroes over
// part of a subcluster copies the rest of it with no lock held, whether
// one end of the range or both are partial: while the copy's 1 KiB read of
// the backing file is held, requests elsewhere complete. (Both ends into
// a cluster with no host cluster become one planned write of zero bytes
// over the range; one end is planned, and the whole subclusters between
// get their zero flags at once.) Before, those bytes were written under
// the lock.
TEST_F(DeferredCowTest, PartialSubclusterWriteZeroesCopyWithoutTheLock) {
  image_.reset();
  testing::GateOpener opener({.read_size = 1024});
  image_ = FreshOverlay(dir_, base_, /*extended_l2=*/true, &opener);
  ASSERT_NE(image_, nullptr);
  Image* image = image_.get();
  testing::GateFile* base_file = opener.last();
  // Both ends partial; then the head alone.
  const std::pair<uint64_t, uint64_t> ranges[] = {
      {5 * kCluster + 1024, 6144}, {6 * kCluster + 1024, 5120}};
  for (const auto& range : ranges) {
    const uint64_t at = range.first;
    const uint64_t len = range.second;  // (clang 14 captures no bindings)
    const std::vector<uint8_t> whole = Pattern(9 * kCluster, at, 60);
    testing::HoldAndExpectGoesOn(
        base_file, [&] { ASSERT_OK(image->WriteZeroes(at, len, false)); },
        [&] {
          absl::Status s = ReadMatches(kCluster - 8192, 8192);
          if (s.ok()) s = image->Write(9 * kCluster, whole);
          return s;
        },
        "a partial-subcluster write-zeroes' copy-on-write");
    std::fill_n(model_.begin() + at, len, 0);
    Put(&model_, 9 * kCluster, whole);
  }
  EXPECT_EQ(image->GetStats().host_calls_under_lock, 0u);
  CloseAndVerify();
}

// Write-zeroes over part of a compressed cluster of an extended-L2 image
// (no subclusters until it is copied) plans the copy: the old contents
// are read and decompressed, the range zeroed, and the whole cluster
// written with no lock held. Before, that copy was read and written under
// the lock. The image is made by qemu-io, which writes compressed
// clusters; qemu-img checks and reads the result.
TEST(ZeroIntoCompressed, TheCopyIsPlanned) {
  if (!testing::HaveQemu()) GTEST_SKIP() << "needs qemu-img and qemu-io";
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  testing::QemuImageSpec spec;
  spec.size = 8 << 20;
  spec.extended_l2 = true;
  ASSERT_OK(testing::QemuCreate(path, spec));
  ASSERT_OK(testing::QemuIo(path, {"write -c -P 7 0 64k",
                                    "write -P 8 64k 64k"}));
  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(path, oo));
  // A partial 2 KiB subcluster at either end, two whole ones between; then
  // the same in the second cluster, in place.
  ASSERT_OK(image->WriteZeroes(1024, 6144, false));
  ASSERT_OK(image->WriteZeroes(kCluster + 1024, 6144, false));
  EXPECT_EQ(image->GetStats().host_calls_under_lock, 0u);
  ASSERT_OK(image->Close());
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                       testing::QemuCheckedReadAll(path));
  std::vector<uint8_t> want(2 * kCluster, 7);
  std::fill(want.begin() + kCluster, want.end(), 8);
  std::fill_n(want.begin() + 1024, 6144, 0);
  std::fill_n(want.begin() + kCluster + 1024, 6144, 0);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin()));
}

// Version 2 images have no zero flag: write-zeroes over whole clusters
// writes zero bytes. Those writes are planned and run with no lock held,
// whether they copy into the overlay (a backing file below) or zero a
// cluster of ours in place (a zero-range call). Before, they ran under
// the lock.
TEST(ZeroOnVersion2, ZeroBytesArePlanned) {
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  const std::string top = dir.File("top.qcow2");
  CreateOptions co;
  co.size = 4 << 20;
  co.cluster_size = kCluster;
  co.compat = "0.10";
  ASSERT_OK(CreateImage(base, co));
  {
    OpenOptions oo;
    oo.read_write = true;
    ASSERT_OK_AND_ASSIGN(auto image, Image::Open(base, oo));
    ASSERT_OK(image->Write(0, std::vector<uint8_t>(4 * kCluster, 3)));
    ASSERT_OK(image->Close());
  }
  co.backing_file = "base.qcow2";
  co.backing_format = "qcow2";
  ASSERT_OK(CreateImage(top, co));
  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(top, oo));
  ASSERT_OK(image->Write(2 * kCluster, std::vector<uint8_t>(kCluster, 4)));
  // Over a backing file: cluster 1 gets a cluster of zeros, cluster 2
  // (ours) zeros in place.
  ASSERT_OK(image->WriteZeroes(kCluster, 2 * kCluster, false));
  EXPECT_EQ(image->GetStats().host_calls_under_lock, 0u);
  ASSERT_OK(image->Close());
  // No backing file: a cluster of ours is kept, zeroed by a zero-range call.
  ASSERT_OK_AND_ASSIGN(image, Image::Open(base, oo));
  ASSERT_OK(image->WriteZeroes(3 * kCluster, kCluster, false));
  EXPECT_EQ(image->GetStats().host_calls_under_lock, 0u);
  EXPECT_EQ(image->GetStats().host_zero_ops, 1u);
  ASSERT_OK(image->Close());
  if (!testing::HaveQemu()) return;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all,
                       testing::QemuCheckedReadAll(top));
  std::vector<uint8_t> want(4 * kCluster, 3);
  std::fill_n(want.begin() + kCluster, 2 * kCluster, 0);
  std::fill_n(want.begin() + 3 * kCluster, kCluster, 0);  // from the base
  EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin()));
}

// Opens the top image behind a gate on 512-byte reads (its L2 slices, as
// opened below) and the backing file behind one on the 60 KiB reads that
// fill a cluster whose first 4 KiB were written.
class TwoGates : public FileOpener {
 public:
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const FileOptions& opts) override {
    auto f = OpenPosixFile(path, opts);
    if (!f.ok()) return f.status();
    const bool top = path.ends_with(".qcow2");
    auto g = std::make_unique<testing::GateFile>(
        std::move(*f), top ? testing::GateSpec{.read_size = 512} : kFillRead);
    (top ? top_ : base_) = g.get();
    return std::unique_ptr<File>(std::move(g));
  }
  testing::GateFile* top_ = nullptr;
  testing::GateFile* base_ = nullptr;
};

// A write holding whole a pending cluster it covers in part fills the
// cluster before it plans itself, as a stage of its own run with no lock
// held (it made the fill's read and write under the lock before). A flush
// that comes meanwhile waits for that fill, whose L2 entry it must write;
// the write then plans, its L2 miss read without the lock too.
TEST_F(DeferredCowTest, AWriteFillsAClusterItHoldsWholeWithoutTheLock) {
  image_.reset();
  // 64 MiB over the 8 MiB backing file, with 512-byte L2 slices (4 MiB
  // of guest space each), two of them cached.
  CreateOptions co;
  co.size = 64 << 20;
  co.cluster_size = kCluster;
  co.backing_file = "base.raw";
  co.backing_format = "raw";
  std::filesystem::remove(dir_.File("top.qcow2"));
  ASSERT_OK(CreateImage(dir_.File("top.qcow2"), co));
  model_.resize(64 << 20, 0);
  {
    // The L2 table on disk, so that its slices are read from there.
    OpenOptions rw;
    rw.read_write = true;
    ASSERT_OK_AND_ASSIGN(auto first, Image::Open(dir_.File("top.qcow2"), rw));
    const std::vector<uint8_t> d = Pattern(32 << 20, kCluster, 49);
    ASSERT_OK(first->Write(32 << 20, d));
    Put(&model_, 32 << 20, d);
    ASSERT_OK(first->Close());
  }
  TwoGates gates;
  OpenOptions oo;
  oo.read_write = true;
  oo.opener = &gates;
  oo.l2_slice_bytes = 512;
  oo.l2_cache_bytes = 2 * 512;
  ASSERT_OK_AND_ASSIGN(image_, Image::Open(dir_.File("top.qcow2"), oo));
  Image* image = image_.get();
  const IoStats before = image->GetStats();
  const uint64_t c = 64 * kCluster;  // the first cluster of slice 1
  std::vector<uint8_t> buf(4096);
  ASSERT_OK(image->Read(c + 8192, absl::MakeSpan(buf)));  // slice 1 cached
  for (uint64_t off : {c - 4096, c}) {  // c's cluster is left pending
    const std::vector<uint8_t> d = Pattern(off, 4096, 50);
    ASSERT_OK(image->Write(off, d));
    Put(&model_, off, d);
  }
  ASSERT_EQ(image->GetStats().Since(before).cow_deferred, 1u);
  // Slice 0 leaves the cache.
  for (uint64_t slice = 2; slice < 16; ++slice) {
    ASSERT_OK(image->Read(slice << 22, absl::MakeSpan(buf)));
  }
  // Across clusters 63 and 64: it holds both whole. Cluster 64 is filled
  // first (the read of its other 60 KiB is held here), then the write is
  // planned, cluster 63's slice read without the lock.
  const std::vector<uint8_t> across = Pattern(c - 8192, 16384, 51);
  gates.base_->Arm();
  const IoStats mid = image->GetStats();
  std::atomic<bool> flushed{false};
  std::thread writer([&] { ASSERT_OK(image->Write(c - 8192, across)); });
  ASSERT_TRUE(gates.base_->WaitBlocked());  // the fill's read
  std::thread flusher([&] {
    ASSERT_OK(image->Flush());
    flushed = true;
  });
  // A read elsewhere completes meanwhile: the lock is free.
  std::future<absl::Status> read = std::async(std::launch::async, [&] {
    return image->Read(8 << 20, absl::MakeSpan(buf));
  });
  EXPECT_EQ(read.wait_for(std::chrono::seconds(20)),
            std::future_status::ready)
      << "a read waited for the fill: it held the lock";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(flushed.load()) << "the flush did not wait for the fill";
  gates.base_->Release();
  EXPECT_OK(read.get());
  writer.join();
  flusher.join();
  EXPECT_EQ(image->GetStats().Since(mid).host_calls_under_lock, 0u);
  Put(&model_, c - 8192, across);
  std::vector<uint8_t> got(4 * kCluster);
  ASSERT_OK(image->Read(c - 2 * kCluster, absl::MakeSpan(got)));
  EXPECT_EQ(testing::DescribeMismatch(
                absl::MakeConstSpan(model_).subspan(c - 2 * kCluster,
                                                    got.size()),
                got, c - 2 * kCluster),
            "");
  ASSERT_OK(image->Close());
  image_.reset();
  ExpectQemuSees(dir_.File("top.qcow2"), model_);
}

// Several threads, each with its own queue, stream small writes into
// interleaved clusters while another reads and flushes: every read sees
// either the backing file's bytes or the one write's bytes, and the final
// image_ is what the writes made it.
TEST_F(DeferredCowTest, StreamsReadsAndFlushesFromManyQueues) {
  constexpr int kWriters = 3;
  constexpr uint64_t kRegion = 2 << 20;  // each writer's share
  std::vector<std::vector<uint8_t>> data(kWriters);
  for (int w = 0; w < kWriters; ++w) {
    // Writer w streams 4..12 KiB writes through [w * kRegion, +kRegion),
    // skipping every fifth cluster's second half (left for the flush).
    data[w] = Pattern(w * kRegion, kRegion, static_cast<uint8_t>(9 + w));
  }
  std::atomic<bool> stop{false};
  std::atomic<int> bad_reads{0};
  std::vector<std::thread> threads;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> written(kWriters);
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      auto q = image_->CreateQueue();
      ASSERT_TRUE(q.ok());
      std::vector<std::pair<uint64_t, uint64_t>> ops;
      testing::TestRng rng(77 + w);
      for (uint64_t off = 0; off < kRegion;) {
        const uint64_t len = 4096 * rng.Range(1, 3);
        const uint64_t c = off / kCluster;
        if (c % 5 == 4 && off % kCluster >= kCluster / 2) {
          off = (c + 1) * kCluster;
          continue;
        }
        ops.push_back({off, std::min(len, kRegion - off)});
        off += len;
      }
      written[w] = ops;
      RunQueued(q->get(), static_cast<int>(ops.size()), 16,
                [&](int i, Completion done) {
                  const auto [off, len] = ops[i];
                  return (*q)->SubmitWrite(
                      w * kRegion + off,
                      absl::MakeConstSpan(data[w]).subspan(off, len),
                      std::move(done));
                });
    });
  }
  threads.emplace_back([&] {
    auto q = image_->CreateQueue();
    ASSERT_TRUE(q.ok());
    testing::TestRng rng(5);
    std::vector<uint8_t> buf(3 * 4096);
    while (!stop.load()) {
      const uint64_t off = rng.Uniform(kWriters * kRegion / 4096 - 3) * 4096;
      std::atomic<bool> done{false};
      ASSERT_OK((*q)->SubmitRead(off, absl::MakeSpan(buf),
                                 [&](absl::Status s) {
                                   EXPECT_OK(s);
                                   done = true;
                                 }));
      while (!done.load()) (*q)->Poll(1);
      for (uint64_t i = 0; i < buf.size(); i += 4096) {
        const uint64_t at = off + i;
        const uint64_t w = at / kRegion;
        const bool is_base = std::equal(buf.begin() + i, buf.begin() + i + 4096,
                                        base_.begin() + at);
        const bool is_new =
            std::equal(buf.begin() + i, buf.begin() + i + 4096,
                       data[w].begin() + (at - w * kRegion));
        if (!is_base && !is_new) bad_reads++;
      }
      if (rng.OneIn(8)) {
        std::atomic<bool> flushed{false};
        ASSERT_OK((*q)->SubmitFlush([&](absl::Status s) {
          EXPECT_OK(s);
          flushed = true;
        }));
        while (!flushed.load()) (*q)->Poll(1);
      }
    }
  });
  for (int w = 0; w < kWriters; ++w) threads[w].join();
  stop = true;
  threads.back().join();
  EXPECT_EQ(bad_reads.load(), 0);
  for (int w = 0; w < kWriters; ++w) {
    for (const auto& [off, len] : written[w]) {
      std::copy_n(data[w].begin() + off, len,
                  model_.begin() + w * kRegion + off);
    }
  }
  ASSERT_OK(image_->Flush());
  CloseAndVerify();
}

}  // namespace
}  // namespace qcow2
