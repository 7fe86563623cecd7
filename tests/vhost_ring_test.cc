// SPDX-License-Identifier: Apache-2.0
// serve/vhost/: the vhost-user message decoder and the split-ring walker
// against hand-built messages and rings, well formed and broken.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "serve/vhost/blk.h"
#include "serve/vhost/guest_memory.h"
#include "serve/vhost/protocol.h"
#include "serve/vhost/split_ring.h"
#include "serve/vhost/wire.h"

namespace qcow2::vhost {
namespace {

std::vector<uint8_t> HeaderBytes(uint32_t request, uint32_t flags,
                                 uint32_t size) {
  std::vector<uint8_t> h(kHeaderSize);
  StoreLe32(h.data(), request);
  StoreLe32(h.data() + 4, flags);
  StoreLe32(h.data() + 8, size);
  return h;
}

TEST(VhostProtocol, HeaderChecks) {
  EXPECT_TRUE(DecodeHeader(HeaderBytes(kGetFeatures, 1, 0)).ok());
  EXPECT_FALSE(DecodeHeader(HeaderBytes(kGetFeatures, 0, 0)).ok());
  EXPECT_FALSE(DecodeHeader(HeaderBytes(kGetFeatures, 1 | kFlagReply, 0)).ok());
  EXPECT_FALSE(DecodeHeader(HeaderBytes(kGetFeatures, 1, kMaxPayload + 1)).ok());
}

TEST(VhostProtocol, MemTableShapes) {
  std::vector<uint8_t> p(8 + 32 * 2, 0);
  StoreLe32(p.data(), 2);
  for (int i = 0; i < 2; ++i) {
    StoreLe64(p.data() + 8 + 32 * i, i * 0x10000);       // gpa
    StoreLe64(p.data() + 8 + 32 * i + 8, 0x10000);       // size
    StoreLe64(p.data() + 8 + 32 * i + 16, 0x7f0000000000 + i * 0x10000);
  }
  const int two[2] = {10, 11};
  Header h{kSetMemTable, 1, static_cast<uint32_t>(p.size())};
  auto m = DecodeMessage(h, p, two);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->regions.size(), 2u);
  // One descriptor short.
  EXPECT_FALSE(DecodeMessage(h, p, absl::MakeConstSpan(two, 1)).ok());
  // Overlapping regions.
  StoreLe64(p.data() + 8 + 32, 0x8000);
  auto overlap = DecodeMessage(h, p, two);
  ASSERT_FALSE(overlap.ok());
  EXPECT_NE(overlap.status().message().find("overlaps"), absl::string_view::npos);
}

TEST(VhostProtocol, VringFdAndConfig) {
  std::vector<uint8_t> p(8);
  StoreLe64(p.data(), 1 | kVringNoFd);
  const int fd[1] = {5};
  Header h{kSetVringKick, 1, 8};
  EXPECT_FALSE(DecodeMessage(h, p, fd).ok());  // "no fd" and an fd
  EXPECT_TRUE(DecodeMessage(h, p, {}).ok());
  std::vector<uint8_t> c(12, 0);
  StoreLe32(c.data(), 250);
  StoreLe32(c.data() + 4, 10);
  c.resize(22);
  EXPECT_FALSE(DecodeMessage({kGetConfig, 1, 22}, c, {}).ok());  // past 256
  EXPECT_TRUE(absl::IsUnimplemented(
      DecodeMessage({kSetLogBase, 1, 0}, {}, {}).status()));
}

// Guest memory of one region at guest-physical 0 and front-end address
// kVa, with a ring of 8 entries at its start.
class RingTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kVa = 0x7f0000000000;
  static constexpr uint16_t kNum = 8;
  static constexpr uint64_t kDesc = 0, kAvail = 0x100, kUsed = 0x200;

  void SetUp() override {
    buf_.assign(64 * 1024, 0);
    MemRegion r{0, buf_.size(), kVa, 0};
    uint8_t* base = buf_.data();
    mem_ = GuestMemory::Borrow({&r, 1}, {&base, 1});
  }
  absl::StatusOr<SplitRing> Ring(bool indirect = false) {
    RingConfig c{kNum, kVa + kDesc, kVa + kAvail, kVa + kUsed, 0, false,
                 indirect};
    return SplitRing::Create(mem_.get(), c);
  }
  void Desc(int i, uint64_t addr, uint32_t len, uint16_t flags, uint16_t next,
            uint64_t table = kDesc) {
    uint8_t* d = buf_.data() + table + 16 * i;
    StoreLe64(d, addr);
    StoreLe32(d + 8, len);
    StoreLe16(d + 12, flags);
    StoreLe16(d + 14, next);
  }
  void Offer(uint16_t slot, uint16_t head) {
    StoreLe16(buf_.data() + kAvail + 4 + 2 * slot, head);
    StoreLe16(buf_.data() + kAvail + 2, slot + 1);
  }
  std::vector<uint8_t> buf_;
  std::shared_ptr<const GuestMemory> mem_;
};

TEST_F(RingTest, ReadRequestAcrossDescriptors) {
  // Header split over two descriptors, data and status in one.
  Desc(0, 0x1000, 8, 1, 1);
  Desc(1, 0x1008, 8, 1, 2);
  Desc(2, 0x2000, 4097, 2, 0);
  StoreLe32(buf_.data() + 0x1000, 0);  // VIRTIO_BLK_T_IN
  StoreLe64(buf_.data() + 0x1008, 8);  // sector 8
  Offer(0, 0);
  auto ring = Ring();
  ASSERT_TRUE(ring.ok()) << ring.status();
  ASSERT_TRUE(*ring->HasPending());
  Chain chain;
  ASSERT_TRUE(ring->Pop(&chain).ok());
  auto req = ParseBlkRequest(chain);
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->type, 0u);
  EXPECT_EQ(req->sector, 8u);
  EXPECT_EQ(req->data_bytes, 4096u);
  EXPECT_EQ(req->status, buf_.data() + 0x2000 + 4096);
  ring->PushUsed(chain.head, 4097);
  EXPECT_TRUE(ring->PublishUsed());
  EXPECT_EQ(LoadLe16(buf_.data() + kUsed + 2), 1);
  EXPECT_FALSE(*ring->HasPending());
}

TEST_F(RingTest, LoopIsRefused) {
  Desc(0, 0x1000, 16, 1, 1);
  Desc(1, 0x1000, 16, 1, 0);  // back to 0
  Offer(0, 0);
  auto ring = Ring();
  Chain chain;
  absl::Status s = ring->Pop(&chain);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("longer than"), absl::string_view::npos) << s;
}

TEST_F(RingTest, BufferOutsideMemoryIsRefused) {
  Desc(0, buf_.size() - 8, 16, 0, 0);  // runs 8 bytes past the region
  Offer(0, 0);
  auto ring = Ring();
  Chain chain;
  absl::Status s = ring->Pop(&chain);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("outside guest memory"), absl::string_view::npos);
}

TEST_F(RingTest, NestedIndirectIsRefused) {
  Desc(0, 0x3000, 32, 4, 0);          // indirect table of two
  Desc(0, 0x3000, 16, 4, 0, 0x3000);  // which is indirect again
  Offer(0, 0);
  Chain chain;
  auto plain = Ring(/*indirect=*/false);
  EXPECT_FALSE(plain->Pop(&chain).ok());  // not negotiated
  auto ring = Ring(/*indirect=*/true);
  absl::Status s = ring->Pop(&chain);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("inside an indirect"), absl::string_view::npos);
}

TEST_F(RingTest, AvailIndexTooFarAhead) {
  StoreLe16(buf_.data() + kAvail + 2, kNum + 1);
  auto ring = Ring();
  EXPECT_FALSE(ring->HasPending().ok());
}

TEST_F(RingTest, HeadOutOfRangeAndRingOutsideMemory) {
  Offer(0, kNum);
  auto ring = Ring();
  Chain chain;
  EXPECT_FALSE(ring->Pop(&chain).ok());
  RingConfig c{kNum, kVa + buf_.size() - 64, kVa + kAvail, kVa + kUsed, 0,
               false, false};
  EXPECT_FALSE(SplitRing::Create(mem_.get(), c).ok());
  c.desc = kVa;
  c.num = 6;  // not a power of two
  EXPECT_FALSE(SplitRing::Create(mem_.get(), c).ok());
}

TEST_F(RingTest, ReadableAfterWritableIsRefused) {
  Desc(0, 0x1000, 16, 3, 1);  // writable, NEXT
  Desc(1, 0x1000, 16, 1, 0);
  Offer(0, 0);
  auto ring = Ring();
  Chain chain;
  EXPECT_FALSE(ring->Pop(&chain).ok());
}

TEST(VhostBlk, RangesAndConfig) {
  BlkGeometry g;
  g.capacity_bytes = 1 << 20;
  g.num_queues = 2;
  std::vector<uint8_t> c = BlkConfig(g, true);
  EXPECT_EQ(LoadLe64(c.data()), 2048u);  // capacity in sectors
  EXPECT_EQ(LoadLe16(c.data() + 34), 2);  // num_queues
  EXPECT_EQ(c[32], 1);                    // wce
  g.read_only = true;
  EXPECT_NE(BlkFeatures(g) & (1ull << 5), 0u);   // RO
  EXPECT_EQ(BlkFeatures(g) & (1ull << 13), 0u);  // no DISCARD
}

}  // namespace
}  // namespace qcow2::vhost
