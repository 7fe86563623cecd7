// SPDX-License-Identifier: Apache-2.0
// The snapshot table codec: round trips, QEMU's id choice and lookup, and
// malformed tables refused with errors that say what is wrong.
#include "lib/format/snapshot_table.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/base/endian.h"
#include "lib/format/header.h"
#include "tests/util/test_util.h"

namespace qcow2::internal {
namespace {

// Decodes `count` entries from `bytes`; reads past the end fail.
absl::StatusOr<DecodedSnapshotTable> Decode(const std::vector<uint8_t>& bytes,
                                            uint32_t count,
                                            uint64_t disk_size = 1 << 20) {
  auto read = [&](uint64_t pos, absl::Span<uint8_t> buf) -> absl::Status {
    if (pos + buf.size() > bytes.size()) {
      return absl::DataLossError("read past the end of the table");
    }
    if (!buf.empty()) std::memcpy(buf.data(), bytes.data() + pos, buf.size());
    return absl::OkStatus();
  };
  return DecodeSnapshotTable(read, count, disk_size, "img.qcow2");
}

SnapshotEntry Entry(std::string id, std::string name) {
  SnapshotEntry e;
  e.id = std::move(id);
  e.name = std::move(name);
  e.l1_offset = 0x50000;
  e.l1_size = 3;
  e.date_sec = 1796233111;
  e.date_nsec = 407221000;
  e.vm_clock_nsec = 12345;
  e.disk_size = 1 << 20;
  e.icount = 0;
  return e;
}

TEST(SnapshotTableTest, EncodesAsQemuDoes) {
  // qemu-img 7.2 `snapshot -c s` on a fresh 1 MiB image wrote these bytes
  // (date aside): L1 at 0x40000, one entry, 24 bytes of extra data.
  SnapshotEntry e = Entry("1", "s");
  e.l1_offset = 0x40000;
  e.l1_size = 1;
  e.date_sec = 0x6b1057e0;
  e.date_nsec = 0x3713f1f0;
  e.vm_clock_nsec = 0;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> t, EncodeSnapshotTable({e}));
  const std::vector<uint8_t> qemu = {
      0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x01, 0x00, 0x01, 0x00, 0x01, 0x6b, 0x10, 0x57, 0xe0, 0x37, 0x13,
      0xf1, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x18, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x31, 0x73};
  EXPECT_EQ(t, qemu);
}

TEST(SnapshotTableTest, RoundTripAlignsEntries) {
  SnapshotEntry a = Entry("1", "first");
  SnapshotEntry b = Entry("2", "a longer snapshot name");
  b.vm_state_size = 5ull << 32;  // too big for the 32-bit field
  b.unknown_extra = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> t, EncodeSnapshotTable({a, b}));
  // The second entry starts on an 8-byte boundary.
  const size_t first = 40 + 24 + 1 + 5;
  EXPECT_EQ(LoadBE64(&t[(first + 7) / 8 * 8]), a.l1_offset);
  EXPECT_EQ(LoadBE32(&t[(first + 7) / 8 * 8 + 32]), 0u);  // > 4 GiB: 0
  ASSERT_OK_AND_ASSIGN(DecodedSnapshotTable d, Decode(t, 2));
  ASSERT_EQ(d.entries.size(), 2u);
  EXPECT_EQ(d.size, t.size());
  EXPECT_EQ(d.entries[0].name, "first");
  EXPECT_EQ(d.entries[0].vm_clock_nsec, 12345u);
  EXPECT_EQ(d.entries[1].name, "a longer snapshot name");
  EXPECT_EQ(d.entries[1].vm_state_size, 5ull << 32);
  EXPECT_EQ(d.entries[1].unknown_extra, b.unknown_extra);
  EXPECT_EQ(d.entries[1].extra_data_size, 32u);
  EXPECT_EQ(d.entries[1].icount, 0u);
}

TEST(SnapshotTableTest, ShortExtraDataTakesDefaults) {
  // An entry as QEMU before 1.1 wrote it: no extra data at all.
  std::vector<uint8_t> t(40 + 1 + 2, 0);
  StoreBE64(&t[0], 0x30000);
  StoreBE32(&t[8], 1);
  StoreBE16(&t[12], 1);
  StoreBE16(&t[14], 2);
  StoreBE32(&t[32], 777);
  t[40] = '7';
  t[41] = 'o';
  t[42] = 'k';
  ASSERT_OK_AND_ASSIGN(DecodedSnapshotTable d, Decode(t, 1, 5 << 20));
  EXPECT_EQ(d.entries[0].vm_state_size, 777u);
  EXPECT_EQ(d.entries[0].disk_size, 5u << 20);
  EXPECT_EQ(d.entries[0].icount, kNoIcount);
  EXPECT_EQ(d.entries[0].id, "7");
  EXPECT_EQ(d.entries[0].name, "ok");
}

TEST(SnapshotTableTest, AnEntryWithNoExtraDataIdOrNameDecodes) {
  // Nothing follows the fixed part: the strings are empty (the decoder
  // once handed memchr a null pointer here, which UBSan reports).
  std::vector<uint8_t> t(40, 0);
  StoreBE64(&t[0], 0x30000);
  ASSERT_OK_AND_ASSIGN(DecodedSnapshotTable d, Decode(t, 1));
  ASSERT_EQ(d.entries.size(), 1u);
  EXPECT_EQ(d.entries[0].id, "");
  EXPECT_EQ(d.entries[0].name, "");
  EXPECT_EQ(d.size, 40u);
}

TEST(SnapshotTableTest, MalformedTablesAreRefused) {
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> t,
                       EncodeSnapshotTable({Entry("1", "a")}));
  // More entries than the bytes hold.
  auto r = Decode(t, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  // Extra data over 1 KiB.
  std::vector<uint8_t> big = t;
  StoreBE32(&big[36], 1025);
  r = Decode(big, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("entry 0 has 1025 bytes of extra data"),
            std::string::npos)
      << r.status();
  // Too many snapshots.
  r = Decode(t, kMaxSnapshots + 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("65537 snapshots"), std::string::npos);
  // A table over 64 MiB: entries whose names make it so.
  std::vector<uint8_t> huge;
  std::string name(0xffff, 'n');
  for (int i = 0; i < 1030; ++i) {
    ASSERT_OK(AppendSnapshotEntry(Entry(std::to_string(i), name), &huge));
  }
  r = Decode(huge, 1030);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("past 64 MiB"), std::string::npos)
      << r.status();
  std::vector<SnapshotEntry> many(1030, Entry("1", name));
  EXPECT_EQ(EncodeSnapshotTable(many).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(SnapshotTableTest, NamesTooLongAreRefused) {
  std::vector<uint8_t> t;
  absl::Status s = AppendSnapshotEntry(Entry("1", std::string(65536, 'x')), &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  SnapshotEntry e = Entry("1", "x");
  e.unknown_extra.resize(1001);
  EXPECT_EQ(AppendSnapshotEntry(e, &t).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SnapshotTableTest, StringsEndAtTheirFirstNul) {
  std::vector<uint8_t> t;
  ASSERT_OK(AppendSnapshotEntry(Entry("12", std::string("ab\0cd", 5)), &t));
  ASSERT_OK_AND_ASSIGN(DecodedSnapshotTable d, Decode(t, 1));
  EXPECT_EQ(d.entries[0].name, "ab");
}

TEST(SnapshotTableTest, IdsAndLookupFollowQemu) {
  std::vector<SnapshotEntry> v = {Entry("1", "a"), Entry("7x", "b"),
                                  Entry("3", "7x"), Entry("zz", "3")};
  EXPECT_EQ(NextSnapshotId(v), "8");  // "7x" reads as 7
  EXPECT_EQ(NextSnapshotId({}), "1");
  EXPECT_EQ(FindSnapshotByIdOrName(v, "3"), 2);   // id first
  EXPECT_EQ(FindSnapshotByIdOrName(v, "7x"), 1);  // id "7x", not name
  EXPECT_EQ(FindSnapshotByIdOrName(v, "b"), 1);   // by name
  EXPECT_EQ(FindSnapshotByIdOrName(v, "q"), -1);
}

}  // namespace
}  // namespace qcow2::internal
