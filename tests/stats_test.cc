// SPDX-License-Identifier: Apache-2.0
// The I/O counters (qcow2/stats.h) are exact on small scripted workloads:
// every host byte a guest request causes is counted once, under the right
// heading.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "qcow2/file.h"
#include "qcow2/image.h"
#include "testing/model.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::TempDir;

constexpr uint64_t kCluster = 65536;
constexpr uint64_t kDisk = 16 << 20;

// An empty image of kDisk bytes with kCluster clusters, no backing file.
absl::Status CreateEmpty(const std::string& path) {
  CreateOptions co;
  co.size = kDisk;
  co.cluster_size = kCluster;
  return CreateImage(path, co);
}

OpenOptions ReadWrite() {
  OpenOptions rw;
  rw.read_write = true;
  return rw;
}

// Runs of one byte value in an otherwise zero disk.
struct Fill {
  uint64_t offset, len;
  uint8_t byte;
};

// qemu-img check finds `path` clean, and qemu-img reads the whole disk as
// zeros except `fills`.
void ExpectQemuSees(const std::string& path, std::vector<Fill> fills) {
  testing::CommandResult check = testing::QemuCheck(path);
  EXPECT_EQ(check.exit_code, 0) << check.out;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> qemu, testing::QemuReadAll(path));
  ASSERT_EQ(qemu.size(), kDisk);
  std::vector<uint8_t> want(kDisk, 0);
  for (const Fill& f : fills) {
    std::fill_n(want.begin() + f.offset, f.len, f.byte);
  }
  for (uint64_t i = 0; i < kDisk; ++i) {
    ASSERT_EQ(qemu[i], want[i]) << "guest offset " << i;
  }
}

// A backing file written everywhere, and a fresh overlay over it.
std::unique_ptr<Image> FreshOverlay(const TempDir& dir, bool extended_l2) {
  CreateOptions base;
  base.size = kDisk;
  EXPECT_OK(CreateImage(dir.File("base.qcow2"), base));
  OpenOptions rw;
  rw.read_write = true;
  {
    auto b = Image::Open(dir.File("base.qcow2"), rw);
    EXPECT_TRUE(b.ok());
    std::vector<uint8_t> chunk(1 << 20);
    for (uint64_t off = 0; off < kDisk; off += chunk.size()) {
      testing::FillPseudoRandom(off, absl::MakeSpan(chunk));
      EXPECT_OK((*b)->Write(off, chunk));
    }
    EXPECT_OK((*b)->Close());
  }
  CreateOptions top;
  top.size = kDisk;
  top.cluster_size = kCluster;
  top.extended_l2 = extended_l2;
  top.backing_file = "base.qcow2";
  top.backing_format = "qcow2";
  EXPECT_OK(CreateImage(dir.File("top.qcow2"), top));
  auto image = Image::Open(dir.File("top.qcow2"), rw);
  EXPECT_TRUE(image.ok()) << image.status();
  return std::move(*image);
}

TEST(StatsTest, SmallWriteIntoFreshClusterCopiesTheRest) {
  TempDir dir;
  auto image = FreshOverlay(dir, false);
  const IoStats before = image->GetStats();
  std::vector<uint8_t> data(4096, 0xab);
  // Inside cluster 3, 8 KiB in: a head of 8 KiB and a tail of 52 KiB.
  ASSERT_OK(image->Write(3 * kCluster + 8192, data));
  const IoStats s = image->GetStats().Since(before);
  EXPECT_EQ(s.guest_write_ops, 1u);
  EXPECT_EQ(s.guest_write_bytes, 4096u);
  EXPECT_EQ(s.cow_read_bytes, kCluster - 4096);
  EXPECT_EQ(s.host_data_read_bytes, 0u);
  EXPECT_EQ(s.host_data_write_bytes, 4096u);
  EXPECT_EQ(s.cow_write_bytes, kCluster - 4096);
  EXPECT_EQ(s.cluster_allocations, 1u);
  EXPECT_EQ(s.cow_head_copies, 1u);
  EXPECT_EQ(s.cow_tail_copies, 1u);
  EXPECT_EQ(s.cow_skipped_full, 0u);
  // Metadata of a first write into an empty overlay: a new L2 table. It
  // and the refcount block that counts it wait in memory, and its L1 entry
  // too, until the next flush: no metadata write and no file flush yet.
  EXPECT_EQ(s.l2_table_allocations, 1u);
  EXPECT_EQ(s.metadata_write_bytes(), 0u);
  EXPECT_EQ(s.host_flushes, 0u);
  EXPECT_EQ(s.host_write_bytes(), kCluster);

  // The flush writes the 4 KiB of the refcount block that changed, then
  // the whole new L2 table once, then the L1 entry that names it. No
  // header write: lazy refcounts are off.
  const IoStats mid = image->GetStats();
  ASSERT_OK(image->Flush());
  const IoStats f = image->GetStats().Since(mid);
  EXPECT_EQ(f.guest_flush_ops, 1u);
  EXPECT_EQ(f.l2_write_bytes, kCluster);
  EXPECT_EQ(f.refcount_write_bytes, 4096u);
  EXPECT_EQ(f.l1_write_bytes, 8u);
  EXPECT_EQ(f.header_write_bytes, 0u);
  EXPECT_EQ(f.host_data_write_bytes + f.cow_write_bytes, 0u);
  // Data and refcounts durable before the table; the table before its L1
  // entry; then the final flush.
  EXPECT_EQ(f.host_flushes, 3u);

  // The cluster is ours now: the next small write goes in place.
  const IoStats again = image->GetStats();
  ASSERT_OK(image->Write(3 * kCluster + 32768, data));
  const IoStats t = image->GetStats().Since(again);
  EXPECT_EQ(t.cow_read_bytes, 0u);
  EXPECT_EQ(t.cow_write_bytes, 0u);
  EXPECT_EQ(t.host_data_write_bytes, 4096u);
  EXPECT_EQ(t.cluster_allocations, 0u);
  EXPECT_EQ(t.metadata_write_bytes(), 0u);

  // The data is right, as qemu-img sees it too.
  ASSERT_OK(image->Close());
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> qemu,
                       testing::QemuReadAll(dir.File("top.qcow2")));
  std::vector<uint8_t> expect(kDisk);
  testing::FillPseudoRandom(0, absl::MakeSpan(expect).subspan(0, 1 << 20));
  for (int i = 0; i < 4096; ++i) {
    ASSERT_EQ(qemu[3 * kCluster + 8192 + i], 0xab);
    ASSERT_EQ(qemu[3 * kCluster + 32768 + i], 0xab);
  }
  EXPECT_EQ(qemu[3 * kCluster + 8191], expect[3 * kCluster + 8191]);
  EXPECT_EQ(qemu[3 * kCluster + 12288], expect[3 * kCluster + 12288]);
}

TEST(StatsTest, WholeClusterWriteSkipsTheCopy) {
  TempDir dir;
  auto image = FreshOverlay(dir, false);
  std::vector<uint8_t> data(kCluster, 0x5a);
  ASSERT_OK(image->Write(0, std::vector<uint8_t>(4096, 1)));  // L2 table
  const IoStats before = image->GetStats();
  ASSERT_OK(image->Write(5 * kCluster, data));
  const IoStats s = image->GetStats().Since(before);
  EXPECT_EQ(s.cow_read_bytes, 0u);
  EXPECT_EQ(s.cow_write_bytes, 0u);
  EXPECT_EQ(s.host_data_write_bytes, kCluster);
  EXPECT_EQ(s.cow_skipped_full, 1u);
  EXPECT_EQ(s.cluster_allocations, 1u);
  EXPECT_EQ(s.metadata_write_bytes(), 0u);  // until the next flush
}

// A flush after one allocation writes the 4 KiB of the refcount block that
// holds the changed count, here past the block's first 4 KiB (64-bit
// counts: cluster 600's sits at byte 4800), and qemu-img agrees with it.
TEST(StatsTest, FlushWritesTheChangedPartOfARefcountBlock) {
  TempDir dir;
  const std::string path = dir.File("big.qcow2");
  CreateOptions co;
  co.size = 64 << 20;
  co.cluster_size = kCluster;
  co.refcount_bits = 64;
  ASSERT_OK(CreateImage(path, co));
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(path, ReadWrite()));
  // 600 clusters of data: the next host cluster lies past index 600.
  ASSERT_OK(image->Write(0, std::vector<uint8_t>(600 * kCluster, 1)));
  ASSERT_OK(image->Flush());
  const IoStats before = image->GetStats();
  ASSERT_OK(image->Write(620 * kCluster, std::vector<uint8_t>(kCluster, 2)));
  ASSERT_OK(image->Flush());
  const IoStats s = image->GetStats().Since(before);
  EXPECT_EQ(s.cluster_allocations, 1u);
  EXPECT_EQ(s.refcount_write_bytes, 4096u);
  ASSERT_OK(image->Close());
  testing::CommandResult check = testing::QemuCheck(path);
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
}

TEST(StatsTest, SubclusterWriteCopiesNothing) {
  TempDir dir;
  auto image = FreshOverlay(dir, true);
  ASSERT_OK(image->Write(0, std::vector<uint8_t>(4096, 1)));  // L2 table
  const IoStats before = image->GetStats();
  // 64 KiB clusters have 2 KiB subclusters: 4 KiB aligned covers two.
  ASSERT_OK(image->Write(7 * kCluster + 8192, std::vector<uint8_t>(4096, 2)));
  const IoStats s = image->GetStats().Since(before);
  EXPECT_EQ(s.cow_read_bytes, 0u);
  EXPECT_EQ(s.cow_write_bytes, 0u);
  EXPECT_EQ(s.host_data_write_bytes, 4096u);
  EXPECT_EQ(s.cluster_allocations, 1u);
  // A lone write into a new cluster: it held the whole cluster, so its
  // L2 entry was not deferred.
  EXPECT_EQ(s.cow_deferred, 0u);
  // A 1 KiB write pads to its 2 KiB subcluster.
  const IoStats mid = image->GetStats();
  ASSERT_OK(image->Write(9 * kCluster + 512, std::vector<uint8_t>(1024, 3)));
  const IoStats t = image->GetStats().Since(mid);
  EXPECT_EQ(t.cow_read_bytes, 1024u);
  EXPECT_EQ(t.cow_write_bytes, 1024u);
  EXPECT_EQ(t.host_data_write_bytes, 1024u);
  ASSERT_OK(image->Close());
  testing::CommandResult check = testing::QemuCheck(dir.File("top.qcow2"));
  EXPECT_EQ(check.exit_code, 0) << check.out;
}

TEST(StatsTest, ReadsAndQueueCountersAddUp) {
  TempDir dir;
  auto image = FreshOverlay(dir, false);
  ASSERT_OK(image->Write(0, std::vector<uint8_t>(kCluster, 1)));
  const IoStats before = image->GetStats();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Queue> q, image->CreateQueue());
  // 8 KiB from the overlay's cluster 0 and 8 KiB from the backing file.
  std::vector<uint8_t> a(8192), b(8192);
  int done = 0;
  ASSERT_OK(q->SubmitRead(kCluster - 8192, absl::MakeSpan(a),
                          [&](absl::Status s) { EXPECT_OK(s); ++done; }));
  ASSERT_OK(q->SubmitRead(kCluster, absl::MakeSpan(b),
                          [&](absl::Status s) { EXPECT_OK(s); ++done; }));
  q->Drain();
  EXPECT_EQ(done, 2);
  const IoStats qs = q->stats();
  EXPECT_EQ(qs.guest_read_ops, 2u);
  EXPECT_EQ(qs.guest_read_bytes, 16384u);
  EXPECT_EQ(qs.host_data_read_bytes, 16384u);
  EXPECT_EQ(qs.cow_read_bytes, 0u);
  EXPECT_EQ(qs.host_write_bytes(), 0u);
  const IoStats is = image->GetStats().Since(before);
  EXPECT_EQ(is.guest_read_bytes, qs.guest_read_bytes);
  EXPECT_EQ(is.host_data_read_bytes, qs.host_data_read_bytes);
  q.reset();
  // A queue's counters stay in the image total after it is gone.
  EXPECT_EQ(image->GetStats().Since(before).guest_read_ops, 2u);
}

// Into a host cluster the file never held, padding that reads as zeros in
// the chain is not written (QEMU leaves it too); a reused cluster still
// gets its padding, since its old bytes would show through.
TEST(StatsTest, ZeroPaddingIntoNeverWrittenClusterIsSkipped) {
  TempDir dir;
  const std::string path = dir.File("empty.qcow2");
  ASSERT_OK(CreateEmpty(path));
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(path, ReadWrite()));
  ASSERT_OK(image->Write(0, std::vector<uint8_t>(4096, 1)));  // L2 table
  const std::vector<uint8_t> data(4096, 0xab);

  const IoStats before = image->GetStats();
  ASSERT_OK(image->Write(3 * kCluster + 8192, data));
  IoStats s = image->GetStats().Since(before);
  EXPECT_EQ(s.cluster_allocations, 1u);
  EXPECT_EQ(s.host_data_write_bytes, 4096u);
  EXPECT_EQ(s.cow_write_bytes, 0u);
  EXPECT_EQ(s.cow_read_bytes, 0u);
  EXPECT_EQ(s.cow_skipped_zero, 2u);  // head and tail
  EXPECT_EQ(s.cow_head_copies + s.cow_tail_copies, 0u);

  // Fill cluster 5 and discard it: once a flush has made the discard
  // durable, the next allocation reuses that cluster, whose old bytes are
  // not zeros, so its padding is written.
  ASSERT_OK(image->Write(5 * kCluster, std::vector<uint8_t>(kCluster, 0xcd)));
  ASSERT_OK(image->Flush());
  ASSERT_OK(image->Discard(5 * kCluster, kCluster));
  ASSERT_OK(image->Flush());
  const IoStats mid = image->GetStats();
  ASSERT_OK(image->Write(9 * kCluster + 8192, data));
  s = image->GetStats().Since(mid);
  EXPECT_EQ(s.cluster_allocations, 1u);
  EXPECT_EQ(s.cow_skipped_zero, 0u);
  EXPECT_EQ(s.cow_write_bytes, kCluster - 4096);
  EXPECT_EQ(s.cow_read_bytes, 0u);  // zeros come from memory

  ASSERT_OK(image->Close());
  ExpectQemuSees(path, {{0, 4096, 1},
                        {3 * kCluster + 8192, 4096, 0xab},
                        {9 * kCluster + 8192, 4096, 0xab}});
}

// Over a backing file, only padding that reads as zeros all the way down
// (unallocated or zero clusters) is skipped; backing data is copied.
TEST(StatsTest, ZeroPaddingSkipLooksThroughTheChain) {
  TempDir dir;
  CreateOptions base;
  base.size = kDisk;
  ASSERT_OK(CreateImage(dir.File("base.qcow2"), base));
  OpenOptions rw;
  rw.read_write = true;
  {
    ASSERT_OK_AND_ASSIGN(auto b, Image::Open(dir.File("base.qcow2"), rw));
    ASSERT_OK(b->Write(kCluster, std::vector<uint8_t>(kCluster, 0x11)));
    ASSERT_OK(b->WriteZeroes(2 * kCluster, kCluster, false));
    ASSERT_OK(b->Close());
  }
  for (bool extended_l2 : {false, true}) {
    SCOPED_TRACE(extended_l2 ? "extended L2" : "standard L2");
    const std::string top_path =
        dir.File(extended_l2 ? "top-x.qcow2" : "top.qcow2");
    CreateOptions top;
    top.size = kDisk;
    top.cluster_size = kCluster;
    top.extended_l2 = extended_l2;
    top.backing_file = "base.qcow2";
    top.backing_format = "qcow2";
    ASSERT_OK(CreateImage(top_path, top));
    ASSERT_OK_AND_ASSIGN(auto image, Image::Open(top_path, rw));
    // 1 KiB into the middle of a subcluster, so extended L2 pads too.
    const std::vector<uint8_t> data(1024, 0xab);
    const uint64_t in = 8192 + 512;
    IoStats before = image->GetStats();
    ASSERT_OK(image->Write(kCluster + in, data));  // backing data
    IoStats s = image->GetStats().Since(before);
    EXPECT_EQ(s.cow_skipped_zero, 0u);
    EXPECT_GT(s.cow_read_bytes, 0u);
    for (uint64_t c : {2, 3}) {  // a zero cluster; nothing allocated
      before = image->GetStats();
      ASSERT_OK(image->Write(c * kCluster + in, data));
      s = image->GetStats().Since(before);
      EXPECT_EQ(s.cow_skipped_zero, 2u) << "cluster " << c;
      EXPECT_EQ(s.cow_read_bytes, 0u) << "cluster " << c;
      EXPECT_EQ(s.cow_write_bytes, 0u) << "cluster " << c;
    }
    ASSERT_OK(image->Close());
    testing::CommandResult check = testing::QemuCheck(top_path);
    EXPECT_EQ(check.exit_code, 0) << check.out;
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> qemu,
                         testing::QemuReadAll(top_path));
    for (uint64_t i = 0; i < 4 * kCluster; ++i) {
      const uint64_t c = i / kCluster, at = i % kCluster;
      uint8_t want = c == 1 ? 0x11 : 0;
      if (c >= 1 && at >= in && at < in + 1024) want = 0xab;
      ASSERT_EQ(qemu[i], want) << "guest offset " << i;
    }
  }
}

// New clusters land inside the file: it is grown ahead of allocation (a
// direct write that extends a file waits for every write in flight), and
// Close() gives back what was never used.
TEST(StatsTest, FileGrowsAheadOfAllocationAndShrinksBackAtClose) {
  TempDir dir;
  const std::string path = dir.File("grow.qcow2");
  ASSERT_OK(CreateEmpty(path));
  const uint64_t created = std::filesystem::file_size(path);
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(path, ReadWrite()));
  ASSERT_OK(image->Write(7 * kCluster, std::vector<uint8_t>(4096, 7)));
  // Header, refcount table and block, L1 table and the new L2 table
  // precede the data cluster; the file now reaches well past it.
  const uint64_t grown = std::filesystem::file_size(path);
  EXPECT_GE(grown, created + (1u << 20));
  ASSERT_OK(image->Close());
  const uint64_t closed = std::filesystem::file_size(path);
  EXPECT_LT(closed, grown);
  EXPECT_EQ(closed % kCluster, 0u);
  // The file ends with the data cluster, the last one allocated.
  testing::CommandResult check = testing::QemuCheck(path);
  EXPECT_TRUE(absl::StrContains(
      check.out, absl::StrCat("\"image-end-offset\": ", closed)))
      << check.out;
  ExpectQemuSees(path, {{7 * kCluster, 4096, 7}});
}

// A cluster whose tail was never written may end past the end of the file;
// a later session's write there goes in place, past the size the file had
// at open. Giving back the grown room at close must keep it (found by
// fuzz_ops: fuzz/regressions/fuzz_ops/close-truncated-in-place-tail).
TEST(StatsTest, InPlaceWritePastTheOpenSizeSurvivesClose) {
  TempDir dir;
  const std::string path = dir.File("tail.qcow2");
  ASSERT_OK(CreateEmpty(path));
  OpenOptions rw;
  rw.read_write = true;
  {
    ASSERT_OK_AND_ASSIGN(auto image, Image::Open(path, rw));
    ASSERT_OK(image->Write(0, std::vector<uint8_t>(4096, 1)));
    ASSERT_OK(image->Close());
  }
  // The data cluster is the file's last; end the file 4 KiB into it (what
  // a crash before the close leaves, or a zeroing write that never grew
  // the file): the rest reads as zeros either way.
  uint64_t before = std::filesystem::file_size(path);
  ASSERT_EQ(before % kCluster, 0u);
  before -= kCluster - 4096;
  std::filesystem::resize_file(path, before);
  ASSERT_EQ(testing::QemuCheck(path).exit_code, 0);
  {
    ASSERT_OK_AND_ASSIGN(auto image, Image::Open(path, rw));
    // In place, past the file's end (the write grows the file ahead to
    // the end of that cluster and beyond).
    ASSERT_OK(image->Write(32768, std::vector<uint8_t>(4096, 2)));
    ASSERT_OK(image->Close());
  }
  EXPECT_GT(std::filesystem::file_size(path), before);
  ExpectQemuSees(path, {{0, 4096, 1}, {32768, 4096, 2}});
}

// Write-zeroes and discard on a raw file are one zero-range call each, run
// by the queue's ring.
TEST(StatsTest, RawZeroRangeThroughQueue) {
  TempDir dir;
  const std::string path = dir.File("disk.raw");
  CreateOptions co;
  co.format = ImageFormat::kRaw;
  co.size = 4 << 20;
  ASSERT_OK(CreateImage(path, co));
  OpenOptions rw;
  rw.read_write = true;
  rw.format = "raw";
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(path, rw));
  ASSERT_OK(image->Write(0, std::vector<uint8_t>(4 << 20, 0x77)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Queue> q, image->CreateQueue());
  absl::Status z, d;
  ASSERT_OK(q->SubmitWriteZeroes(4096, 65536, false,
                                 [&](absl::Status s) { z = s; }));
  ASSERT_OK(q->SubmitDiscard(1 << 20, 8192, [&](absl::Status s) { d = s; }));
  q->Drain();
  ASSERT_OK(z);
  ASSERT_OK(d);
  const IoStats st = q->stats();
  EXPECT_EQ(st.host_zero_ops, 2u);
  EXPECT_EQ(st.host_zero_bytes, 65536u + 8192u);
  EXPECT_EQ(st.host_data_write_bytes, 0u);
  std::vector<uint8_t> back(4 << 20);
  ASSERT_OK(image->Read(0, absl::MakeSpan(back)));
  for (uint64_t i = 0; i < back.size(); ++i) {
    const bool zero = (i >= 4096 && i < 4096 + 65536) ||
                      (i >= (1 << 20) && i < (1 << 20) + 8192);
    ASSERT_EQ(back[i], zero ? 0 : 0x77) << i;
  }
}

// A File of the test's own (neither the library's POSIX file nor a test
// double of testing/): bytes in a vector, with no Reserve, so the library
// grows it by Extend under the image's lock.
class VectorFile : public File {
 public:
  explicit VectorFile(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}

  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) override {
    std::lock_guard<std::mutex> lock(mu_);
    size_t have = 0;
    if (offset < bytes_.size()) {
      have = std::min<uint64_t>(buf.size(), bytes_.size() - offset);
      std::memcpy(buf.data(), bytes_.data() + offset, have);
    }
    std::memset(buf.data() + have, 0, buf.size() - have);
    return absl::OkStatus();
  }
  absl::Status WriteAt(uint64_t offset,
                       absl::Span<const uint8_t> data) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (offset + data.size() > bytes_.size()) {
      bytes_.resize(offset + data.size());
    }
    std::copy(data.begin(), data.end(), bytes_.begin() + offset);
    return absl::OkStatus();
  }
  absl::Status Flush() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++flushes_;
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Size() override {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_.size();
  }
  absl::Status Truncate(uint64_t size) override {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_.resize(size);
    return absl::OkStatus();
  }
  const std::string& name() const override { return name_; }

  int flushes() {
    std::lock_guard<std::mutex> lock(mu_);
    return flushes_;
  }

 private:
  const std::string name_ = "vector-file";
  std::mutex mu_;
  std::vector<uint8_t> bytes_;
  int flushes_ = 0;
};

// Close() writes what the caches still hold (an L2 slice, a refcount
// block, the header) and truncates the file: GetStats() counts it, as it
// counts a flush's writes.
TEST(StatsTest, CloseCountsTheMetadataItWrites) {
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  ASSERT_OK(CreateEmpty(path));
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(path, ReadWrite()));
  ASSERT_OK(image->Write(3 * kCluster, std::vector<uint8_t>(kCluster, 0x5a)));
  const IoStats before = image->GetStats();
  EXPECT_EQ(before.l2_write_bytes, 0u);  // still in the cache
  ASSERT_OK(image->Close());
  const IoStats s = image->GetStats().Since(before);
  EXPECT_GT(s.l2_write_bytes, 0u);
  EXPECT_GT(s.refcount_write_bytes, 0u);
  EXPECT_GT(s.host_flushes, 0u);
  EXPECT_EQ(s.guest_write_ops, 0u);
  ASSERT_OK_AND_ASSIGN(auto all, testing::QemuCheckedReadAll(path));
  for (uint64_t i = 0; i < kCluster; ++i) {
    ASSERT_EQ(all[3 * kCluster + i], 0x5a) << "byte " << 3 * kCluster + i;
  }
}

// Host calls are counted whoever implements the File: the library wraps
// every layer's file (AccountedFile), so an embedder's store is counted
// under the lock as the library's own files are.
TEST(StatsTest, AnEmbeddersFileIsCounted) {
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  ASSERT_OK(CreateEmpty(path));
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  ASSERT_FALSE(bytes.empty());
  auto owned = std::make_unique<VectorFile>(std::move(bytes));
  VectorFile* const file = owned.get();
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(std::move(owned), ReadWrite()));
  const IoStats before = image->GetStats();
  // A new L2 table and a data cluster past the end of the file: with no
  // Reserve, the file is grown by Extend with the lock held.
  const std::vector<uint8_t> data(kCluster, 0x3c);
  ASSERT_OK(image->Write(8 << 20, data));
  ASSERT_OK(image->Flush());
  const IoStats s = image->GetStats().Since(before);
  EXPECT_GT(s.host_calls_under_lock, 0u);
  // The ordinary counters, for this file too.
  EXPECT_EQ(s.host_data_write_bytes, kCluster);
  EXPECT_EQ(s.l2_write_bytes, kCluster);
  EXPECT_GT(s.metadata_write_bytes(), 0u);
  EXPECT_GT(s.host_flushes, 0u);
  EXPECT_GT(file->flushes(), 0);
  std::vector<uint8_t> back(kCluster);
  ASSERT_OK(image->Read(8 << 20, absl::MakeSpan(back)));
  EXPECT_EQ(back, data);
  ASSERT_OK(image->Close());
}

}  // namespace
}  // namespace qcow2
