// SPDX-License-Identifier: Apache-2.0
// Tests for the qcow2 header codec (lib/format/header.{h,cc}): decoding
// hand-built v2/v3 headers field by field, EncodeHeader round trips, the
// layout QEMU writes (qemu-img as the oracle) and one clear error per
// malformed or unsupported field.
#include "lib/format/header.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/endian.h"
#include "tests/util/test_util.h"

namespace qcow2::internal {
namespace {

using ::qcow2::testing::CommandResult;
using ::qcow2::testing::ReadFileBytes;
using ::qcow2::testing::RetryQemuKeyTiming;
using ::qcow2::testing::Run;
using ::qcow2::testing::TempDir;
using ::qcow2::testing::WriteFileBytes;
using ::testing::HasSubstr;

constexpr char kFile[] = "img.qcow2";
constexpr uint32_t kUnknownMagic = 0x12345678;
constexpr uint32_t kUnknownMagic2 = 0xabcdef01;

std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

void Put32(std::vector<uint8_t>& b, size_t off, uint32_t v) {
  StoreBE32(&b[off], v);
}
void Put64(std::vector<uint8_t>& b, size_t off, uint64_t v) {
  StoreBE64(&b[off], v);
}

// ---------------------------------------------------------------------------
// A hand-written header image, independent of EncodeHeader.

struct Ext {
  uint32_t magic;
  std::vector<uint8_t> data;
};

// A feature-name table extension: 48-byte entries {type, bit, name[46]}.
Ext FeatureTable(const std::vector<FeatureName>& names) {
  Ext e{kExtFeatureNames, std::vector<uint8_t>(names.size() * 48, 0)};
  for (size_t i = 0; i < names.size(); ++i) {
    e.data[i * 48] = names[i].type;
    e.data[i * 48 + 1] = names[i].bit;
    std::copy_n(names[i].name.begin(),
                std::min<size_t>(46, names[i].name.size()),
                e.data.begin() + i * 48 + 2);
  }
  return e;
}

struct Spec {
  uint32_t magic = kQcowMagic;
  uint32_t version = 3;
  uint32_t cluster_bits = 16;
  uint64_t size = 1ull << 30;
  uint32_t crypt_method = 0;
  uint32_t l1_size = 2;
  uint64_t l1_table_offset = 0x30000;
  uint64_t refcount_table_offset = 0x10000;
  uint32_t refcount_table_clusters = 1;
  uint32_t nb_snapshots = 0;
  uint64_t snapshots_offset = 0;
  uint64_t incompatible = 0;
  uint64_t compatible = 0;
  uint64_t autoclear = 0;
  uint32_t refcount_order = 4;
  uint32_t header_length = 112;
  uint8_t compression_type = 0;
  std::vector<uint8_t> tail;  // bytes 105..header_length
  std::vector<Ext> exts;      // written in this order after the header
  bool end_marker = true;
  size_t gap = 0;  // bytes between the extension area and the backing name
  std::string backing_file;
};

// Lays `s` out in one cluster at the documented offsets. The file the
// default Spec describes is 0x40000 bytes: header, refcount table at
// 0x10000, a refcount block at 0x20000, L1 at 0x30000.
std::vector<uint8_t> Build(const Spec& s) {
  std::vector<uint8_t> b(size_t{1} << s.cluster_bits, 0);
  Put32(b, 0, s.magic);
  Put32(b, 4, s.version);
  Put32(b, 20, s.cluster_bits);
  Put64(b, 24, s.size);
  Put32(b, 32, s.crypt_method);
  Put32(b, 36, s.l1_size);
  Put64(b, 40, s.l1_table_offset);
  Put64(b, 48, s.refcount_table_offset);
  Put32(b, 56, s.refcount_table_clusters);
  Put32(b, 60, s.nb_snapshots);
  Put64(b, 64, s.snapshots_offset);
  size_t pos = 72;
  if (s.version >= 3) {
    Put64(b, 72, s.incompatible);
    Put64(b, 80, s.compatible);
    Put64(b, 88, s.autoclear);
    Put32(b, 96, s.refcount_order);
    Put32(b, 100, s.header_length);
    if (s.header_length > 104) b[104] = s.compression_type;
    std::copy(s.tail.begin(), s.tail.end(), b.begin() + 105);
    pos = s.header_length;
  }
  for (const Ext& e : s.exts) {
    Put32(b, pos, e.magic);
    Put32(b, pos + 4, static_cast<uint32_t>(e.data.size()));
    std::copy(e.data.begin(), e.data.end(), b.begin() + pos + 8);
    pos += 8 + (e.data.size() + 7) / 8 * 8;
  }
  if (s.end_marker) pos += 8;  // already zero
  pos += s.gap;
  if (!s.backing_file.empty()) {
    std::copy(s.backing_file.begin(), s.backing_file.end(), b.begin() + pos);
    Put64(b, 8, pos);
    Put32(b, 16, static_cast<uint32_t>(s.backing_file.size()));
  }
  return b;
}

// A v3 header using every field with a distinct value, and one extension of
// each kind, in the order QEMU writes them.
Spec RichSpec() {
  Spec s;
  s.cluster_bits = 16;
  s.size = (5ull << 30) + 4096;  // 81921 clusters: 11 L1 entries
  s.l1_size = 16;
  s.l1_table_offset = 0x30000;
  s.refcount_table_offset = 0x10000;
  s.refcount_table_clusters = 2;
  s.nb_snapshots = 3;
  s.snapshots_offset = 0x40000;
  s.incompatible = kIncompatDirty | kIncompatCompression;
  s.compatible = kCompatLazyRefcounts | (1ull << 7);
  s.autoclear = kAutoclearBitmaps;
  s.refcount_order = 5;
  s.header_length = 112;
  s.compression_type = 1;
  s.exts = {
      {kExtBackingFormat, Bytes("qcow2")},
      {kExtDataFile, Bytes("data.raw")},
      {kExtCrypto, {0, 0, 0, 0, 0, 0x05, 0, 0, 0, 0, 0, 0, 0, 0x1f, 0x90, 0}},
      FeatureTable({{0, 0, "dirty bit"},
                    {0, 3, "compression type"},
                    {1, 0, "lazy refcounts"},
                    {2, 0, "bitmaps"}}),
      {kExtBitmaps, std::vector<uint8_t>(24, 0x42)},
      {kUnknownMagic, Bytes("hello")},
      {kUnknownMagic2, {}},
  };
  s.backing_file = "base image.qcow2";
  return s;
}
constexpr uint64_t kRichFileSize = 0x50000;

absl::StatusOr<Header> Decode(const std::vector<uint8_t>& b) {
  return DecodeHeader(b, kFile);
}

// Every decoded field and extension, for round-trip comparisons.
void ExpectSameHeader(const Header& a, const Header& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.backing_file_size, b.backing_file_size);
  EXPECT_EQ(a.cluster_bits, b.cluster_bits);
  EXPECT_EQ(a.size, b.size);
  EXPECT_EQ(a.crypt_method, b.crypt_method);
  EXPECT_EQ(a.l1_size, b.l1_size);
  EXPECT_EQ(a.l1_table_offset, b.l1_table_offset);
  EXPECT_EQ(a.refcount_table_offset, b.refcount_table_offset);
  EXPECT_EQ(a.refcount_table_clusters, b.refcount_table_clusters);
  EXPECT_EQ(a.nb_snapshots, b.nb_snapshots);
  EXPECT_EQ(a.snapshots_offset, b.snapshots_offset);
  EXPECT_EQ(a.incompatible_features, b.incompatible_features);
  EXPECT_EQ(a.compatible_features, b.compatible_features);
  EXPECT_EQ(a.autoclear_features, b.autoclear_features);
  EXPECT_EQ(a.refcount_order, b.refcount_order);
  EXPECT_EQ(a.header_length, b.header_length);
  EXPECT_EQ(a.compression_type, b.compression_type);
  EXPECT_EQ(a.tail, b.tail);
  EXPECT_EQ(a.backing_file, b.backing_file);
  EXPECT_EQ(a.backing_format, b.backing_format);
  EXPECT_EQ(a.data_file, b.data_file);
  ASSERT_EQ(a.feature_names.size(), b.feature_names.size());
  for (size_t i = 0; i < a.feature_names.size(); ++i) {
    EXPECT_EQ(a.feature_names[i].type, b.feature_names[i].type) << i;
    EXPECT_EQ(a.feature_names[i].bit, b.feature_names[i].bit) << i;
    EXPECT_EQ(a.feature_names[i].name, b.feature_names[i].name) << i;
  }
  ASSERT_EQ(a.other_extensions.size(), b.other_extensions.size());
  for (size_t i = 0; i < a.other_extensions.size(); ++i) {
    EXPECT_EQ(a.other_extensions[i].magic, b.other_extensions[i].magic) << i;
    EXPECT_EQ(a.other_extensions[i].data, b.other_extensions[i].data) << i;
  }
}

// The encoded header must equal `expected` over its length, and `expected`
// must be zero after that up to the end of the cluster.
void ExpectEncodesTo(const Header& h, const std::vector<uint8_t>& expected,
                     size_t expected_used) {
  absl::StatusOr<std::vector<uint8_t>> enc = EncodeHeader(h);
  ASSERT_TRUE(enc.ok()) << enc.status();
  EXPECT_EQ(enc->size(), expected_used);
  ASSERT_LE(enc->size(), expected.size());
  for (size_t i = 0; i < enc->size(); ++i) {
    ASSERT_EQ((*enc)[i], expected[i]) << "first difference at byte " << i;
  }
  for (size_t i = enc->size(); i < expected.size(); ++i) {
    ASSERT_EQ(expected[i], 0) << "reference has data past the encoded "
                                 "header at byte "
                              << i;
  }
}

void CheckError(const absl::Status& s, absl::StatusCode code,
                const std::vector<std::string>& substrings) {
  ASSERT_FALSE(s.ok()) << "expected " << absl::StatusCodeToString(code);
  EXPECT_EQ(s.code(), code) << s;
  const std::string msg(s.message());
  EXPECT_THAT(msg, HasSubstr(kFile));
  for (const std::string& sub : substrings) EXPECT_THAT(msg, HasSubstr(sub));
}

// ---------------------------------------------------------------------------
// Decoding valid headers.

TEST(DecodeHeaderTest, ReadsEveryV3Field) {
  const Spec s = RichSpec();
  const std::vector<uint8_t> b = Build(s);
  ASSERT_OK_AND_ASSIGN(Header h, Decode(b));
  EXPECT_EQ(h.version, 3u);
  EXPECT_EQ(h.cluster_bits, 16u);
  EXPECT_EQ(h.cluster_size(), 65536u);
  EXPECT_EQ(h.size, (5ull << 30) + 4096);
  EXPECT_EQ(h.crypt_method, 0u);
  EXPECT_EQ(h.l1_size, 16u);
  EXPECT_EQ(h.l1_table_offset, 0x30000u);
  EXPECT_EQ(h.refcount_table_offset, 0x10000u);
  EXPECT_EQ(h.refcount_table_clusters, 2u);
  EXPECT_EQ(h.nb_snapshots, 3u);
  EXPECT_EQ(h.snapshots_offset, 0x40000u);
  EXPECT_EQ(h.incompatible_features, kIncompatDirty | kIncompatCompression);
  EXPECT_EQ(h.compatible_features, kCompatLazyRefcounts | (1ull << 7));
  EXPECT_EQ(h.autoclear_features, kAutoclearBitmaps);
  EXPECT_EQ(h.refcount_order, 5u);
  EXPECT_EQ(h.refcount_bits(), 32u);
  EXPECT_EQ(h.header_length, 112u);
  EXPECT_EQ(h.compression_type, 1);
  EXPECT_EQ(h.tail, std::vector<uint8_t>(7, 0));
  EXPECT_FALSE(h.extended_l2());
  EXPECT_EQ(h.l2_entry_size(), 8u);
  EXPECT_EQ(h.l2_entries(), 8192u);

  // Extensions.
  EXPECT_EQ(h.backing_format, "qcow2");
  EXPECT_EQ(h.data_file, "data.raw");
  ASSERT_EQ(h.feature_names.size(), 4u);
  EXPECT_EQ(h.feature_names[1].type, 0);
  EXPECT_EQ(h.feature_names[1].bit, 3);
  EXPECT_EQ(h.feature_names[1].name, "compression type");
  EXPECT_EQ(h.feature_names[3].type, 2);
  EXPECT_EQ(h.FeatureNameFor(1, 0), "lazy refcounts");
  EXPECT_EQ(h.FeatureNameFor(2, 0), "bitmaps");
  EXPECT_EQ(h.FeatureNameFor(0, 5), "");
  ASSERT_EQ(h.other_extensions.size(), 4u);  // crypto, bitmaps, 2 unknown
  EXPECT_EQ(h.other_extensions[0].magic, kExtCrypto);
  EXPECT_EQ(h.other_extensions[0].data, s.exts[2].data);
  EXPECT_EQ(h.other_extensions[1].magic, kExtBitmaps);
  EXPECT_EQ(h.other_extensions[1].data, std::vector<uint8_t>(24, 0x42));
  EXPECT_EQ(h.other_extensions[2].magic, kUnknownMagic);
  EXPECT_EQ(h.other_extensions[2].data, Bytes("hello"));  // unpadded
  EXPECT_EQ(h.other_extensions[3].magic, kUnknownMagic2);
  EXPECT_TRUE(h.other_extensions[3].data.empty());

  // Backing file name.
  EXPECT_EQ(h.backing_file, "base image.qcow2");
  EXPECT_EQ(h.backing_file_size, 16u);
  EXPECT_EQ(h.backing_file_offset, LoadBE64(&b[8]));
  EXPECT_GT(h.backing_file_offset, 112u);

  EXPECT_OK(ValidateHeaderTables(h, kRichFileSize, kFile));
}

TEST(DecodeHeaderTest, ReadsV2Header) {
  Spec s;
  s.version = 2;
  s.cluster_bits = 12;
  s.size = 100 << 20;  // 25600 clusters of 4 KiB, 512 per L2: 50 L1 entries
  s.l1_size = 50;
  s.l1_table_offset = 0x3000;
  s.refcount_table_offset = 0x1000;
  s.refcount_table_clusters = 1;
  s.exts = {{kExtBackingFormat, Bytes("raw")}};
  s.backing_file = "/images/base.raw";
  std::vector<uint8_t> b = Build(s);
  // v2 has no feature words: whatever follows byte 72 is extensions.
  ASSERT_OK_AND_ASSIGN(Header h, Decode(b));
  EXPECT_EQ(h.version, 2u);
  EXPECT_EQ(h.cluster_bits, 12u);
  EXPECT_EQ(h.size, 100u << 20);
  EXPECT_EQ(h.l1_size, 50u);
  EXPECT_EQ(h.l1_table_offset, 0x3000u);
  EXPECT_EQ(h.refcount_table_offset, 0x1000u);
  EXPECT_EQ(h.refcount_table_clusters, 1u);
  EXPECT_EQ(h.incompatible_features, 0u);
  EXPECT_EQ(h.compatible_features, 0u);
  EXPECT_EQ(h.autoclear_features, 0u);
  EXPECT_EQ(h.refcount_order, 4u);  // v2 is always 16-bit refcounts
  EXPECT_EQ(h.header_length, kV2HeaderLength);
  EXPECT_EQ(h.compression_type, 0);
  EXPECT_TRUE(h.tail.empty());
  EXPECT_EQ(h.backing_format, "raw");
  EXPECT_EQ(h.backing_file, "/images/base.raw");
  EXPECT_EQ(h.backing_file_offset, 72u + 16 + 8);
  EXPECT_OK(CheckFeatures(h, kFile));
  EXPECT_OK(ValidateHeaderTables(h, 0x4000, kFile));
}

TEST(DecodeHeaderTest, MinimalV3HeaderOf104Bytes) {
  Spec s;
  s.header_length = 104;
  ASSERT_OK_AND_ASSIGN(Header h, Decode(Build(s)));
  EXPECT_EQ(h.header_length, 104u);
  EXPECT_EQ(h.compression_type, 0);
  EXPECT_TRUE(h.tail.empty());
  EXPECT_TRUE(h.backing_file.empty());
  EXPECT_FALSE(h.backing_format.has_value());
  EXPECT_TRUE(h.other_extensions.empty());
  EXPECT_OK(CheckFeatures(h, kFile));
  EXPECT_OK(ValidateHeaderTables(h, 0x40000, kFile));
}

TEST(DecodeHeaderTest, KeepsHeaderTailBytes) {
  Spec s;
  s.header_length = 128;
  s.compression_type = 1;
  s.incompatible = kIncompatCompression;
  for (int i = 0; i < 23; ++i) s.tail.push_back(static_cast<uint8_t>(0xa0 + i));
  s.exts = {{kUnknownMagic, Bytes("x")}};
  s.backing_file = "b";
  ASSERT_OK_AND_ASSIGN(Header h, Decode(Build(s)));
  EXPECT_EQ(h.header_length, 128u);
  EXPECT_EQ(h.compression_type, 1);
  EXPECT_EQ(h.tail, s.tail);
  ASSERT_EQ(h.other_extensions.size(), 1u);
  EXPECT_EQ(h.backing_file_offset, 128u + 16 + 8);
  EXPECT_EQ(h.backing_file, "b");
}

TEST(DecodeHeaderTest, BackingNameRightAfterHeaderWithoutExtensions) {
  // Old writers put the name straight after the header, with no end
  // marker: the extension area is empty and the name is not parsed as one.
  for (uint32_t version : {2u, 3u}) {
    SCOPED_TRACE(version);
    Spec s;
    s.version = version;
    s.end_marker = false;
    s.backing_file = "base.qcow2";
    ASSERT_OK_AND_ASSIGN(Header h, Decode(Build(s)));
    EXPECT_EQ(h.backing_file_offset, version == 2 ? 72u : 112u);
    EXPECT_EQ(h.backing_file, "base.qcow2");
    EXPECT_TRUE(h.other_extensions.empty());
    EXPECT_FALSE(h.backing_format.has_value());
  }
}

TEST(DecodeHeaderTest, ExtensionAreaMayEndWithoutEndMarker) {
  // As in QEMU, the last extension may end exactly where the backing name
  // starts, padded or not.
  for (const std::string& fmt :
       {std::string("qcow2"), std::string("rawfmt_8")}) {
    SCOPED_TRACE(fmt);
    Spec s;
    s.exts = {{kExtBackingFormat, Bytes(fmt)}};
    s.end_marker = false;
    s.backing_file = "base.qcow2";
    std::vector<uint8_t> b = Build(s);
    ASSERT_OK_AND_ASSIGN(Header h, Decode(b));
    EXPECT_EQ(h.backing_format, fmt);
    EXPECT_EQ(h.backing_file, "base.qcow2");

    // Unpadded: the name starts right after the 5 bytes of "qcow2".
    if (fmt.size() % 8 != 0) {
      uint64_t off = 112 + 8 + fmt.size();
      std::fill(b.begin() + 112 + 16, b.end(), 0);
      std::copy_n("base.qcow2", 10, b.begin() + off);
      Put64(b, 8, off);
      ASSERT_OK_AND_ASSIGN(Header h2, Decode(b));
      EXPECT_EQ(h2.backing_format, fmt);
      EXPECT_EQ(h2.backing_file, "base.qcow2");
    }
  }
}

TEST(DecodeHeaderTest, ExtensionsMayFillTheWholeCluster) {
  // No backing file: the area runs to the end of the cluster, and an
  // extension ending flush with it needs no end marker.
  Spec s;
  s.cluster_bits = 9;
  s.size = 1 << 20;
  s.l1_size = 32;
  s.exts = {{kUnknownMagic, std::vector<uint8_t>(512 - 112 - 8, 7)}};
  s.end_marker = false;
  ASSERT_OK_AND_ASSIGN(Header h, Decode(Build(s)));
  ASSERT_EQ(h.other_extensions.size(), 1u);
  EXPECT_EQ(h.other_extensions[0].data.size(), 392u);
}

TEST(DecodeHeaderTest, EndMarkerStopsParsing) {
  Spec s;
  s.exts = {{kUnknownMagic, Bytes("a")}};
  std::vector<uint8_t> b = Build(s);
  // Garbage after the end marker is not an extension.
  Put32(b, 112 + 16 + 8, kUnknownMagic2);
  Put32(b, 112 + 16 + 12, 0xffffffff);
  ASSERT_OK_AND_ASSIGN(Header h, Decode(b));
  ASSERT_EQ(h.other_extensions.size(), 1u);
  EXPECT_EQ(h.other_extensions[0].magic, kUnknownMagic);
}

TEST(DecodeHeaderTest, FeatureNamesAreNotNulTerminatedWhenFull) {
  const std::string name46(46, 'n');
  Spec s;
  s.exts = {FeatureTable({{0, 9, name46}, {1, 63, "short"}})};
  ASSERT_OK_AND_ASSIGN(Header h, Decode(Build(s)));
  ASSERT_EQ(h.feature_names.size(), 2u);
  EXPECT_EQ(h.feature_names[0].name, name46);
  EXPECT_EQ(h.feature_names[1].name, "short");
  EXPECT_EQ(h.FeatureNameFor(1, 63), "short");
}

TEST(DecodeHeaderTest, ExtendedL2Geometry) {
  Spec s;
  s.cluster_bits = 14;
  s.incompatible = kIncompatExtendedL2;
  s.size = 1ull << 30;
  s.l1_size = 64;  // 65536 clusters, 1024 per L2
  s.refcount_table_offset = 0x4000;
  s.l1_table_offset = 0xc000;
  ASSERT_OK_AND_ASSIGN(Header h, Decode(Build(s)));
  EXPECT_TRUE(h.extended_l2());
  EXPECT_EQ(h.l2_entry_size(), 16u);
  EXPECT_EQ(h.l2_entries(), 1024u);
  EXPECT_OK(CheckFeatures(h, kFile));
  EXPECT_OK(ValidateHeaderTables(h, 0x10000, kFile));
  h.l1_size = 63;
  EXPECT_FALSE(ValidateHeaderTables(h, 0x10000, kFile).ok());
}

TEST(DecodeHeaderTest, ClusterSizeLimits) {
  for (uint32_t bits : {9u, 21u}) {
    Spec s;
    s.cluster_bits = bits;
    s.backing_file = "b";
    ASSERT_OK_AND_ASSIGN(Header h, Decode(Build(s)));
    EXPECT_EQ(h.cluster_size(), uint64_t{1} << bits);
  }
}

TEST(DecodeHeaderTest, HeaderLengthMayFillTheCluster) {
  Spec s;
  s.cluster_bits = 9;
  s.size = 1 << 20;
  s.l1_size = 32;
  s.header_length = 512;
  s.end_marker = false;
  ASSERT_OK_AND_ASSIGN(Header h, Decode(Build(s)));
  EXPECT_EQ(h.header_length, 512u);
  EXPECT_EQ(h.tail.size(), 512u - 105);
}

TEST(RequiredL1EntriesTest, Geometry) {
  EXPECT_EQ(RequiredL1Entries(0, 16, 8), 0u);
  EXPECT_EQ(RequiredL1Entries(1, 16, 8), 1u);
  EXPECT_EQ(RequiredL1Entries(512ull << 20, 16, 8), 1u);  // 8192 clusters
  EXPECT_EQ(RequiredL1Entries((512ull << 20) + 1, 16, 8), 2u);
  EXPECT_EQ(RequiredL1Entries(512ull << 20, 16, 16), 2u);
  EXPECT_EQ(RequiredL1Entries(1ull << 30, 9, 8), 32768u);
  EXPECT_EQ(RequiredL1Entries(1ull << 62, 21, 8), 1ull << 23);
}

// ---------------------------------------------------------------------------
// Encoding.

TEST(EncodeHeaderTest, ReproducesHandBuiltBytes) {
  // RichSpec lists its extensions in QEMU's order, so the encoder must give
  // back the very same bytes.
  const std::vector<uint8_t> b = Build(RichSpec());
  ASSERT_OK_AND_ASSIGN(Header h, Decode(b));
  ExpectEncodesTo(h, b, h.backing_file_offset + h.backing_file_size);
}

TEST(EncodeHeaderTest, RoundTripPreservesEverything) {
  Spec s = RichSpec();
  s.header_length = 136;
  for (int i = 0; i < 136 - 105; ++i)
    s.tail.push_back(static_cast<uint8_t>(i + 1));
  ASSERT_OK_AND_ASSIGN(Header h, Decode(Build(s)));
  ASSERT_EQ(h.tail, s.tail);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> enc, EncodeHeader(h));
  ASSERT_LE(enc.size(), h.cluster_size());
  enc.resize(h.cluster_size(), 0);
  ASSERT_OK_AND_ASSIGN(Header h2, Decode(enc));
  ExpectSameHeader(h, h2);
  EXPECT_EQ(h2.header_length, 136u);
  EXPECT_EQ(h2.backing_file_offset, h.backing_file_offset);
  // And a second round is byte-stable.
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> enc2, EncodeHeader(h2));
  enc2.resize(h.cluster_size(), 0);
  EXPECT_EQ(enc, enc2);
}

TEST(EncodeHeaderTest, RoundTripV2) {
  Spec s;
  s.version = 2;
  s.exts = {{kExtBackingFormat, Bytes("qcow2")}, {kUnknownMagic, Bytes("v2")}};
  s.backing_file = "base.qcow2";
  const std::vector<uint8_t> b = Build(s);
  ASSERT_OK_AND_ASSIGN(Header h, Decode(b));
  ExpectEncodesTo(h, b, h.backing_file_offset + h.backing_file_size);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> enc, EncodeHeader(h));
  enc.resize(h.cluster_size(), 0);
  ASSERT_OK_AND_ASSIGN(Header h2, Decode(enc));
  ExpectSameHeader(h, h2);
}

TEST(EncodeHeaderTest, FromStructAndBackAgain) {
  Header h;
  h.cluster_bits = 14;  // extended L2 needs 16 KiB clusters
  h.size = 10 << 20;
  h.l1_size = 1;
  h.l1_table_offset = 0xc000;
  h.refcount_table_offset = 0x4000;
  h.refcount_table_clusters = 1;
  h.incompatible_features = kIncompatExtendedL2;
  h.refcount_order = 6;
  h.backing_file = "dir/base.qcow2";
  h.backing_format = "qcow2";
  h.feature_names = {{0, 4, "extended L2 entries"}};
  h.other_extensions = {{kUnknownMagic, Bytes("keep")}};
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> enc, EncodeHeader(h));
  EXPECT_EQ(LoadBE32(&enc[0]), kQcowMagic);
  EXPECT_EQ(LoadBE32(&enc[100]), 112u);  // default header_length
  // Extensions start at 112: backing format, feature table, unknown, end.
  EXPECT_EQ(LoadBE32(&enc[112]), kExtBackingFormat);
  EXPECT_EQ(LoadBE32(&enc[112 + 16]), kExtFeatureNames);
  EXPECT_EQ(LoadBE32(&enc[112 + 16 + 56]), kUnknownMagic);
  EXPECT_EQ(LoadBE64(&enc[112 + 16 + 56 + 16]), 0u);
  EXPECT_EQ(LoadBE64(&enc[8]), 112u + 16 + 56 + 16 + 8);
  EXPECT_EQ(LoadBE32(&enc[16]), 14u);
  EXPECT_EQ(enc.size(), 112u + 16 + 56 + 16 + 8 + 14);
  enc.resize(h.cluster_size(), 0);
  ASSERT_OK_AND_ASSIGN(Header h2, Decode(enc));
  EXPECT_OK(ValidateHeaderTables(h2, 0x10000, kFile));
  h.tail.assign(7, 0);  // header bytes 105..111 decode as a zero tail
  h.backing_file_offset = h2.backing_file_offset;
  h.backing_file_size = 14;
  ExpectSameHeader(h, h2);
}

TEST(EncodeHeaderTest, RefusesWhatDoesNotFit) {
  Header h;
  h.cluster_bits = 9;
  h.backing_file = std::string(1024, 'x');
  absl::StatusOr<std::vector<uint8_t>> r = EncodeHeader(h);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("1023"));

  h.backing_file = std::string(400, 'x');  // 112 + 8 + 400 > 512
  r = EncodeHeader(h);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);

  h.backing_file.clear();
  h.other_extensions = {{kUnknownMagic, std::vector<uint8_t>(512, 0)}};
  r = EncodeHeader(h);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);

  // Exactly full: 112 + 8 + 384 + 8 (end marker) = 512.
  h.other_extensions = {{kUnknownMagic, std::vector<uint8_t>(384, 1)}};
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> enc, EncodeHeader(h));
  EXPECT_EQ(enc.size(), 512u);
}

TEST(EncodeHeaderTest, RefusesInvalidLayoutFields) {
  Header h;
  h.cluster_bits = 30;
  EXPECT_FALSE(EncodeHeader(h).ok());
  h.cluster_bits = 9;
  h.header_length = 1 << 20;
  h.tail.assign(1 << 20, 0xff);  // must not be copied past the buffer
  EXPECT_FALSE(EncodeHeader(h).ok());
  h.header_length = 100;
  EXPECT_FALSE(EncodeHeader(h).ok());
  h.tail.clear();
  h.header_length = 112;
  h.version = 4;
  EXPECT_FALSE(EncodeHeader(h).ok());
}

// ---------------------------------------------------------------------------
// Malformed and unsupported headers: each field its own error.

struct BadCase {
  std::string name;
  std::function<void(Spec&)> edit;                   // before Build
  std::function<void(std::vector<uint8_t>&)> patch;  // after Build
  absl::StatusCode code;
  std::vector<std::string> substrings;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

std::string CaseName(const ::testing::TestParamInfo<BadCase>& info) {
  return info.param.name;
}

constexpr auto kDataLoss = absl::StatusCode::kDataLoss;
constexpr auto kUnimplemented = absl::StatusCode::kUnimplemented;

void NoEdit(Spec&) {}
void NoPatch(std::vector<uint8_t>&) {}

std::function<void(std::vector<uint8_t>&)> Set32(size_t off, uint32_t v) {
  return [=](std::vector<uint8_t>& b) { Put32(b, off, v); };
}
std::function<void(std::vector<uint8_t>&)> Set64(size_t off, uint64_t v) {
  return [=](std::vector<uint8_t>& b) { Put64(b, off, v); };
}
void WithBacking(Spec& s) {
  s.exts = {{kExtBackingFormat, Bytes("qcow2")}};
  s.backing_file = "base.qcow2";  // at 112 + 16 + 8 = 136
}

std::vector<BadCase> DecodeCases() {
  return {
      {"BadMagic",
       NoEdit,
       Set32(0, 0x514649fc),
       kDataLoss,
       {"magic", "0x514649fc"}},
      {"Version1", NoEdit, Set32(4, 1), kUnimplemented, {"version 1"}},
      {"Version4", NoEdit, Set32(4, 4), kUnimplemented, {"version 4"}},
      {"ClusterBits8", NoEdit, Set32(20, 8), kDataLoss, {"cluster_bits 8"}},
      {"ClusterBits22", NoEdit, Set32(20, 22), kDataLoss, {"cluster_bits 22"}},
      {"ClusterBitsHuge",
       NoEdit,
       Set32(20, 64),
       kDataLoss,
       {"cluster_bits 64"}},
      {"HeaderLength96",
       NoEdit,
       Set32(100, 96),
       kDataLoss,
       {"header_length 96", "104"}},
      {"HeaderLength100",
       NoEdit,
       Set32(100, 100),
       kDataLoss,
       {"header_length 100", "104"}},
      {"HeaderLength108",
       NoEdit,
       Set32(100, 108),
       kDataLoss,
       {"header_length 108", "multiple of 8"}},
      {"HeaderLengthBeyondCluster",
       NoEdit,
       Set32(100, 65536 + 8),
       kDataLoss,
       {"header_length 65544", "cluster size 65536"}},
      {"HeaderLengthHuge",
       NoEdit,
       Set32(100, 0xfffffff8),
       kDataLoss,
       {"header_length 4294967288"}},
      {"RefcountOrder7", NoEdit, Set32(96, 7), kDataLoss, {"refcount_order 7"}},
      {"CompressionType2",
       [](Spec& s) {
         s.compression_type = 2;
         s.incompatible = kIncompatCompression;
       },
       NoPatch,
       kUnimplemented,
       {"compression_type 2"}},
      {"CompressionBitWithZlib",
       [](Spec& s) { s.incompatible = kIncompatCompression; },
       NoPatch,
       kDataLoss,
       {"compression type bit is set", "compression_type is 0"}},
      {"ZstdWithoutCompressionBit",
       [](Spec& s) { s.compression_type = 1; },
       NoPatch,
       kDataLoss,
       {"compression type bit is clear", "compression_type is 1"}},
      {"ExtendedL2ClusterBits13",
       [](Spec& s) {
         s.cluster_bits = 13;
         s.incompatible = kIncompatExtendedL2;
       },
       NoPatch,
       kDataLoss,
       {"extended L2", "cluster_bits is 13"}},
      {"BackingNameSize1024",
       WithBacking,
       Set32(16, 1024),
       kDataLoss,
       {"backing file name too long", "1024"}},
      {"BackingNamePastCluster",
       WithBacking,
       Set64(8, 65536 - 4),
       kDataLoss,
       {"backing file name at byte 65532", "outside the header cluster"}},
      {"BackingNameOffsetPastCluster",
       WithBacking,
       Set64(8, 1ull << 40),
       kDataLoss,
       {"backing file name at byte 1099511627776", "outside"}},
      {"BackingNameOffsetOverflow",
       WithBacking,
       Set64(8, ~uint64_t{0} - 3),
       kDataLoss,
       {"backing file name", "outside the header cluster"}},
      {"BackingNameInsideHeader",
       WithBacking,
       Set64(8, 64),
       kDataLoss,
       {"backing_file_offset 64", "inside the header"}},
      {"BackingNameSizeWithoutOffset",
       NoEdit,
       Set32(16, 5),
       kDataLoss,
       {"backing_file_offset 0", "inside the header"}},
      {"BackingNameInsideV2Header",
       [](Spec& s) {
         s.version = 2;
         WithBacking(s);
       },
       Set64(8, 40),
       kDataLoss,
       {"backing_file_offset 40", "header_length 72"}},
      {"ExtensionLengthOverflowsCluster",
       [](Spec& s) {
         s.exts = {{kUnknownMagic, Bytes("12345678")}};
       },
       Set32(116, 65536),
       kDataLoss,
       {"header extension 0x12345678", "length 65536", "overflows"}},
      {"ExtensionLengthRunsIntoBackingName",
       [](Spec& s) {
         s.exts = {{kUnknownMagic, Bytes("12345678")}};
         s.backing_file = "base.qcow2";  // area is [112, 136)
       },
       Set32(116, 24),
       kDataLoss,
       {"header extension 0x12345678", "length 24", "overflows",
        "ends at byte 136"}},
      {"ExtensionLengthHuge",
       [](Spec& s) {
         s.exts = {{kUnknownMagic, Bytes("12345678")}};
       },
       Set32(116, 0xffffffff),
       kDataLoss,
       {"header extension 0x12345678", "length 4294967295"}},
      {"ExtensionHeaderRunsPastArea",
       [](Spec& s) {
         s.exts = {{kUnknownMagic, Bytes("12345678")}};
         s.end_marker = false;
         s.gap = 4;  // area is [112, 132): 4 bytes left after the extension
         s.backing_file = "base.qcow2";
       },
       NoPatch,
       kDataLoss,
       {"header extension at byte 128", "runs past the extension area"}},
      {"ExtensionAreaTooSmallForAnyHeader",
       [](Spec& s) {
         s.end_marker = false;
         s.gap = 4;  // area is [112, 116)
         s.backing_file = "base.qcow2";
       },
       NoPatch,
       kDataLoss,
       {"header extension at byte 112", "runs past the extension area"}},
      {"FeatureTableLength50",
       [](Spec& s) {
         s.exts = {{kExtFeatureNames, std::vector<uint8_t>(50, 0)}};
       },
       NoPatch,
       kDataLoss,
       {"feature name table length 50", "48"}},
      {"DuplicateBackingFormat",
       [](Spec& s) {
         s.exts = {{kExtBackingFormat, Bytes("qcow2")},
                   {kExtBackingFormat, Bytes("raw")}};
       },
       NoPatch,
       kDataLoss,
       {"duplicate backing format"}},
      {"DuplicateDataFile",
       [](Spec& s) {
         s.exts = {{kExtDataFile, Bytes("a")}, {kExtDataFile, Bytes("b")}};
       },
       NoPatch,
       kDataLoss,
       {"duplicate external data file"}},
  };
}

class DecodeHeaderErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(DecodeHeaderErrorTest, NamesTheField) {
  const BadCase& c = GetParam();
  Spec s;
  c.edit(s);
  std::vector<uint8_t> b = Build(s);
  c.patch(b);
  absl::StatusOr<Header> h = Decode(b);
  CheckError(h.status(), c.code, c.substrings);
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeHeaderErrorTest,
                         ::testing::ValuesIn(DecodeCases()), CaseName);

TEST(DecodeHeaderTest, TooShortBuffer) {
  std::vector<uint8_t> b = Build(Spec());
  b.resize(71);
  CheckError(Decode(b).status(), kDataLoss, {"71 bytes", "shorter"});
}

TEST(DecodeHeaderTest, ValidBaselineDecodes) {
  // The base every error case above starts from is itself valid, so each
  // error comes from its one edited field.
  Spec s;
  ASSERT_OK_AND_ASSIGN(Header h, Decode(Build(s)));
  EXPECT_OK(CheckFeatures(h, kFile));
  EXPECT_OK(ValidateHeaderTables(h, 0x40000, kFile));
  WithBacking(s);
  ASSERT_OK_AND_ASSIGN(h, Decode(Build(s)));
  EXPECT_EQ(h.backing_file_offset, 136u);
  s.exts = {{kUnknownMagic, Bytes("12345678")}};
  ASSERT_OK_AND_ASSIGN(h, Decode(Build(s)));
  EXPECT_EQ(h.other_extensions.size(), 1u);
}

// CheckFeatures: unsupported features are kUnimplemented and named.
std::vector<BadCase> FeatureCases() {
  return {
      {"UnknownIncompatibleBit5",
       [](Spec& s) { s.incompatible = kIncompatDirty | (1ull << 5); },
       NoPatch,
       kUnimplemented,
       {"incompatible feature bit 5"}},
      {"UnknownIncompatibleBit5Named",
       [](Spec& s) {
         s.incompatible = 1ull << 5;
         s.exts = {FeatureTable({{0, 4, "extended L2 entries"},
                                 {1, 5, "not this one"},
                                 {0, 5, "frobnicated clusters"}})};
       },
       NoPatch,
       kUnimplemented,
       {"incompatible feature bit 5", "frobnicated clusters"}},
      {"UnknownIncompatibleBit63",
       [](Spec& s) { s.incompatible = 1ull << 63; },
       NoPatch,
       kUnimplemented,
       {"incompatible feature bit 63"}},
      {"AesEncryption",
       [](Spec& s) { s.crypt_method = 1; },
       NoPatch,
       kUnimplemented,
       {"encrypted images are not supported", "crypt_method 1", "AES"}},
      {"LuksEncryption",
       [](Spec& s) {
         s.crypt_method = 2;
         s.exts = {{kExtCrypto, std::vector<uint8_t>(16, 0)}};
       },
       NoPatch,
       kUnimplemented,
       {"encrypted images are not supported", "crypt_method 2", "LUKS"}},
      {"UnknownCryptMethod",
       [](Spec& s) { s.crypt_method = 3; },
       NoPatch,
       kUnimplemented,
       {"encrypted images", "crypt_method 3"}},
      {"ExternalDataFile",
       [](Spec& s) {
         s.incompatible = kIncompatDataFile;
         s.exts = {{kExtDataFile, Bytes("disk.raw")}};
       },
       NoPatch,
       kUnimplemented,
       {"external data file", "disk.raw"}},
      {"ExternalDataFileWithoutName",
       [](Spec& s) { s.incompatible = kIncompatDataFile; },
       NoPatch,
       kDataLoss,
       {"external data file bit is set", "no data file"}},
      {"RawDataFileBitWithoutDataFile",
       [](Spec& s) { s.autoclear = kAutoclearDataFileRaw; },
       NoPatch,
       kDataLoss,
       {"raw external data bit is set"}},
  };
}

class CheckFeaturesErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(CheckFeaturesErrorTest, NamesTheFeature) {
  const BadCase& c = GetParam();
  Spec s;
  c.edit(s);
  std::vector<uint8_t> b = Build(s);
  c.patch(b);
  ASSERT_OK_AND_ASSIGN(Header h, Decode(b));  // decodes, but is refused
  CheckError(CheckFeatures(h, kFile), c.code, c.substrings);
}

INSTANTIATE_TEST_SUITE_P(Cases, CheckFeaturesErrorTest,
                         ::testing::ValuesIn(FeatureCases()), CaseName);

TEST(CheckFeaturesTest, AcceptsKnownAndOptionalBits) {
  Spec s;
  s.cluster_bits = 14;
  s.incompatible = kIncompatDirty | kIncompatCorrupt | kIncompatCompression |
                   kIncompatExtendedL2;
  s.compression_type = 1;
  s.compatible = ~uint64_t{0};  // unknown compatible bits are ignorable
  // Unknown autoclear bits get cleared; the raw external data bit needs a
  // data file (QEMU refuses it alone: RawDataFileBitWithoutDataFile).
  s.autoclear = ~kAutoclearDataFileRaw;
  ASSERT_OK_AND_ASSIGN(Header h, Decode(Build(s)));
  EXPECT_OK(CheckFeatures(h, kFile));
}

// ValidateHeaderTables: the default Spec's tables in a 0x40000-byte file.
struct TableCase {
  std::string name;
  std::function<void(Header&, uint64_t&)> edit;
  std::vector<std::string> substrings;
};

void PrintTo(const TableCase& c, std::ostream* os) { *os << c.name; }

std::string TableCaseName(const ::testing::TestParamInfo<TableCase>& info) {
  return info.param.name;
}

std::vector<TableCase> TableCases() {
  using H = Header;
  using U = uint64_t;
  return {
      {"L1TooSmallForSize",
       [](H& h, U&) { h.l1_size = 1; },
       {"l1_size 1", "too small", "1073741824"}},
      {"L1TooSmallAfterResize",
       [](H& h, U&) { h.size = (1ull << 30) + 1; },
       {"l1_size 2", "too small"}},
      {"L1Above32MiB",
       [](H& h, U& fs) {
         h.l1_size = (32u << 20) / 8 + 1;
         fs = 1ull << 40;
       },
       {"l1_size 4194305", "32 MiB"}},
      {"RefcountTableClusters0",
       [](H& h, U&) { h.refcount_table_clusters = 0; },
       {"refcount_table_clusters", "0"}},
      {"RefcountTableAbove8MiB",
       [](H& h, U& fs) {
         h.refcount_table_clusters = 129;  // 129 * 64 KiB > 8 MiB
         fs = 1ull << 40;
       },
       {"refcount_table_clusters 129", "8 MiB"}},
      {"NbSnapshots65537",
       [](H& h, U&) {
         h.nb_snapshots = 65537;
         h.snapshots_offset = 0x40000;
       },
       {"nb_snapshots 65537", "65536"}},
      {"L1Misaligned",
       [](H& h, U&) { h.l1_table_offset = 0x30200; },
       {"L1 table offset 0x30200", "not cluster aligned"}},
      {"RefcountTableMisaligned",
       [](H& h, U&) { h.refcount_table_offset = 0x10008; },
       {"refcount table offset 0x10008", "not cluster aligned"}},
      {"L1PastEndOfFile",
       [](H& h, U&) { h.l1_table_offset = 0x40000; },
       {"L1 table at 0x40000", "past the end of the file"}},
      {"L1PartlyPastEndOfFile",
       [](H& h, U& fs) { fs = 0x30000 + 8; },  // 2 entries need 16 bytes
       {"L1 table at 0x30000", "past the end of the file"}},
      {"RefcountTablePastEndOfFile",
       [](H& h, U&) { h.refcount_table_offset = 0x50000; },
       {"refcount table at 0x50000", "past the end of the file"}},
      {"L1OverlapsHeader",
       [](H& h, U&) { h.l1_table_offset = 0; },
       {"L1 table at 0x0", "overlaps the header"}},
      {"RefcountTableOverlapsHeader",
       [](H& h, U&) { h.refcount_table_offset = 0; },
       {"refcount table at 0x0", "overlaps the header"}},
      {"L1OverlapsRefcountTable",
       [](H& h, U&) { h.l1_table_offset = 0x10000; },
       {"L1 table at 0x10000", "overlaps the refcount table"}},
      {"L1OverlapsRefcountTableTail",
       [](H& h, U&) {
         h.refcount_table_clusters = 3;  // 0x10000..0x40000
         h.l1_table_offset = 0x30000;
       },
       {"L1 table at 0x30000", "overlaps the refcount table"}},
      {"L1EndOverflows64Bits",
       [](H& h, U& fs) {
         h.size = 1ull << 20;
         h.l1_size = 8193;  // 65544 bytes
         h.l1_table_offset = ~uint64_t{0xffff};
         fs = ~uint64_t{0};
       },
       {"L1 table at 0xffffffffffff0000", "overflows"}},
      {"RefcountTableEndOverflows64Bits",
       [](H& h, U& fs) {
         h.refcount_table_clusters = 2;
         h.refcount_table_offset = ~uint64_t{0xffff};
         fs = ~uint64_t{0};
       },
       {"refcount table at 0xffffffffffff0000", "overflows"}},
      {"L1Above2To56",
       [](H& h, U& fs) {
         h.l1_table_offset = 1ull << 56;
         fs = ~uint64_t{0};
       },
       {"L1 table at 0x100000000000000", "2^56"}},
      {"L1EndAbove2To56",
       [](H& h, U& fs) {
         h.l1_table_offset = (1ull << 56) - 0x10000;
         h.l1_size = 8193;
         fs = ~uint64_t{0};
       },
       {"L1 table at 0xffffffffff0000", "2^56"}},
      {"RefcountTableAbove2To56",
       [](H& h, U& fs) {
         h.refcount_table_offset = 1ull << 60;
         fs = ~uint64_t{0};
       },
       {"refcount table at 0x1000000000000000", "2^56"}},
      {"SnapshotTableMisaligned",
       [](H& h, U&) {
         h.nb_snapshots = 1;
         h.snapshots_offset = 0x20100;
       },
       {"snapshot table offset 0x20100", "not cluster aligned"}},
      {"EmptySnapshotTableMisaligned",
       [](H& h, U&) { h.snapshots_offset = 0x20100; },
       {"snapshot table offset 0x20100", "not cluster aligned"}},
      {"SnapshotTablePastEndOfFile",
       [](H& h, U&) {
         h.nb_snapshots = 2;
         h.snapshots_offset = 0x40000;
       },
       {"snapshot table at 0x40000", "past the end of the file"}},
      {"SnapshotTableOverlapsL1",
       [](H& h, U&) {
         h.nb_snapshots = 2;
         h.snapshots_offset = 0x30000;
       },
       {"snapshot table at 0x30000", "overlaps the L1 table"}},
      {"SnapshotTableAbove2To56",
       [](H& h, U& fs) {
         h.nb_snapshots = 1;
         h.snapshots_offset = 1ull << 57;
         fs = ~uint64_t{0};
       },
       {"snapshot table", "2^56"}},
      {"VirtualSize2To63",
       [](H& h, U&) { h.size = 1ull << 63; },
       {"virtual size 9223372036854775808", "too large"}},
      {"VirtualSizeMax",
       [](H& h, U&) { h.size = ~uint64_t{0}; },
       {"virtual size", "too large"}},
  };
}

class ValidateTablesErrorTest : public ::testing::TestWithParam<TableCase> {};

TEST_P(ValidateTablesErrorTest, NamesTheTable) {
  ASSERT_OK_AND_ASSIGN(Header h, Decode(Build(Spec())));
  uint64_t file_size = 0x40000;
  ASSERT_OK(ValidateHeaderTables(h, file_size, kFile));
  GetParam().edit(h, file_size);
  CheckError(ValidateHeaderTables(h, file_size, kFile), kDataLoss,
             GetParam().substrings);
}

INSTANTIATE_TEST_SUITE_P(Cases, ValidateTablesErrorTest,
                         ::testing::ValuesIn(TableCases()), TableCaseName);

TEST(ValidateHeaderTablesTest, AcceptsBoundaryValues) {
  ASSERT_OK_AND_ASSIGN(Header h, Decode(Build(Spec())));
  // An empty image: no L1 table at all.
  Header empty = h;
  empty.size = 0;
  empty.l1_size = 0;
  empty.l1_table_offset = 0;
  EXPECT_OK(ValidateHeaderTables(empty, 0x30000, kFile));
  // L1 exactly at the limits.
  Header big = h;
  big.l1_size = (32u << 20) / 8;
  big.l1_table_offset = 0x30000;
  EXPECT_OK(ValidateHeaderTables(big, 0x30000 + (32u << 20), kFile));
  // Refcount table of exactly 8 MiB, snapshots at the limit.
  Header rt = h;
  rt.refcount_table_clusters = 128;
  rt.refcount_table_offset = 0x40000;
  rt.nb_snapshots = 65536;
  rt.snapshots_offset = 0x40000 + (8u << 20);
  EXPECT_OK(ValidateHeaderTables(rt, 0x40000 + (8u << 20) + 65536 * 40, kFile));
  // Adjacent tables do not overlap; the L1 may end exactly at EOF.
  Header adj = h;
  adj.l1_table_offset = 0x20000;
  EXPECT_OK(ValidateHeaderTables(adj, 0x20000 + 16, kFile));
}

// ---------------------------------------------------------------------------
// qemu-img as the oracle.

// The value of "key" in qemu-img's JSON (first occurrence, quotes
// stripped), or "<absent>".
std::string JsonValue(const std::string& json, const std::string& key) {
  const std::string needle = "\"" + key + "\": ";
  size_t p = json.find(needle);
  if (p == std::string::npos) return "<absent>";
  p += needle.size();
  if (json[p] == '"') {
    size_t e = json.find('"', p + 1);
    return json.substr(p + 1, e - p - 1);
  }
  size_t e = json.find_first_of(",\n}", p);
  return json.substr(p, e - p);
}

// The first cluster of a file, zero padded (what the open path passes).
absl::StatusOr<std::vector<uint8_t>> Cluster0(const std::string& path) {
  absl::StatusOr<std::vector<uint8_t>> all = ReadFileBytes(path);
  if (!all.ok()) return all.status();
  if (all->size() < 24) return absl::DataLossError("short file");
  uint32_t bits = std::min<uint32_t>(LoadBE32(&(*all)[20]), 21);
  all->resize(size_t{1} << std::max<uint32_t>(bits, 9), 0);
  return all;
}

void QemuImg(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"qemu-img"};
  argv.insert(argv.end(), args.begin(), args.end());
  // Callers making LUKS images pick a slow hash so QEMU's first PBKDF2
  // timing run spans scheduler ticks; a failed timing is tried again.
  CommandResult r = RetryQemuKeyTiming([&] { return Run(argv); });
  ASSERT_EQ(r.exit_code, 0) << "qemu-img " << args[0] << ": " << r.err;
}

// Decodes `path` and checks it against `qemu-img info`, the table checks,
// and that EncodeHeader writes QEMU's very bytes back.
void CheckAgainstQemu(const std::string& path, Header* out) {
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> c0, Cluster0(path));
  ASSERT_OK_AND_ASSIGN(Header h, Decode(c0));
  CommandResult info = Run({"qemu-img", "info", "--output=json", path});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  const std::string& j = info.out;
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };

  EXPECT_EQ(JsonValue(j, "virtual-size"), std::to_string(h.size));
  EXPECT_EQ(JsonValue(j, "cluster-size"), std::to_string(h.cluster_size()));
  EXPECT_EQ(JsonValue(j, "backing-filename"),
            h.backing_file.empty() ? "<absent>" : h.backing_file);
  EXPECT_EQ(JsonValue(j, "backing-filename-format"),
            h.backing_format.value_or("<absent>"));
  EXPECT_EQ(JsonValue(j, "compat"), h.version == 2 ? "0.10" : "1.1");
  EXPECT_EQ(JsonValue(j, "compression-type"),
            h.compression_type == 1 ? "zstd" : "zlib");
  EXPECT_EQ(JsonValue(j, "refcount-bits"), std::to_string(h.refcount_bits()));
  EXPECT_EQ(JsonValue(j, "dirty-flag"),
            flag(h.incompatible_features & kIncompatDirty));
  EXPECT_EQ(JsonValue(j, "encrypted"), h.crypt_method ? "true" : "<absent>");
  EXPECT_EQ(JsonValue(j, "data-file"), h.data_file.value_or("<absent>"));
  if (h.version >= 3) {
    EXPECT_EQ(JsonValue(j, "lazy-refcounts"),
              flag(h.compatible_features & kCompatLazyRefcounts));
    EXPECT_EQ(JsonValue(j, "corrupt"),
              flag(h.incompatible_features & kIncompatCorrupt));
    EXPECT_EQ(JsonValue(j, "extended-l2"), flag(h.extended_l2()));
    EXPECT_EQ(JsonValue(j, "data-file-raw"),
              h.data_file ? flag(h.autoclear_features & kAutoclearDataFileRaw)
                          : "<absent>");
    const bool bitmaps_ext = std::any_of(
        h.other_extensions.begin(), h.other_extensions.end(),
        [](const RawExtension& e) { return e.magic == kExtBitmaps; });
    EXPECT_EQ(JsonValue(j, "bitmaps") != "<absent>", bitmaps_ext);
    EXPECT_EQ((h.autoclear_features & kAutoclearBitmaps) != 0, bitmaps_ext);
  }

  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> file, ReadFileBytes(path));
  EXPECT_OK(ValidateHeaderTables(h, file.size(), path));

  // QEMU writes the whole cluster: the header, extensions, end marker and
  // backing name, zeros after. Our encoder must agree up to the name's end.
  size_t used =
      h.backing_file.empty() ? 0 : h.backing_file_offset + h.backing_file_size;
  if (used == 0) {
    // Without a name: through the end marker.
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> enc, EncodeHeader(h));
    used = enc.size();
  }
  ExpectEncodesTo(h, c0, used);
  if (out) *out = std::move(h);
}

struct QemuCase {
  std::string name;
  std::vector<std::string> options;  // for -o, joined with ','
  bool backing = true;
  std::string size = "1G";
  std::vector<std::vector<std::string>> after;  // more qemu-img commands
  std::function<void(const Header&)> check;
};

void PrintTo(const QemuCase& c, std::ostream* os) { *os << c.name; }

std::string QemuCaseName(const ::testing::TestParamInfo<QemuCase>& info) {
  return info.param.name;
}

std::vector<QemuCase> QemuCases() {
  return {
      {"ZstdCluster4K",
       {"cluster_size=4096", "compression_type=zstd"},
       true,
       "1G",
       {},
       [](const Header& h) {
         EXPECT_EQ(h.cluster_bits, 12u);
         EXPECT_EQ(h.compression_type, 1);
         EXPECT_EQ(h.incompatible_features, kIncompatCompression);
         // QEMU leaves the feature table out at 4 KiB clusters and below.
         EXPECT_TRUE(h.feature_names.empty());
         EXPECT_EQ(h.l1_size, RequiredL1Entries(1ull << 30, 12, 8));
         EXPECT_OK(CheckFeatures(h, "top"));
       }},
      {"ZstdExtendedL2Cluster16K",
       {"cluster_size=16384", "compression_type=zstd", "extended_l2=on"},
       true,
       "1G",
       {},
       [](const Header& h) {
         EXPECT_EQ(h.cluster_bits, 14u);
         EXPECT_TRUE(h.extended_l2());
         EXPECT_EQ(h.incompatible_features,
                   kIncompatCompression | kIncompatExtendedL2);
         EXPECT_EQ(h.l1_size, RequiredL1Entries(1ull << 30, 14, 16));
         // QEMU's feature table names every feature it knows.
         EXPECT_EQ(h.FeatureNameFor(0, 4), "extended L2 entries");
         EXPECT_EQ(h.FeatureNameFor(0, 3), "compression type");
         EXPECT_EQ(h.FeatureNameFor(1, 0), "lazy refcounts");
         EXPECT_EQ(h.FeatureNameFor(2, 0), "bitmaps");
         EXPECT_OK(CheckFeatures(h, "top"));
       }},
      {"Default64KLazyRefcount64",
       {"lazy_refcounts=on", "refcount_bits=64"},
       true,
       "3G",
       {},
       [](const Header& h) {
         EXPECT_EQ(h.cluster_bits, 16u);
         EXPECT_EQ(h.refcount_order, 6u);
         EXPECT_EQ(h.compatible_features, kCompatLazyRefcounts);
         EXPECT_EQ(h.header_length, 112u);
       }},
      {"Refcount1Cluster2M",
       {"cluster_size=2M", "refcount_bits=1"},
       false,
       "10G",
       {},
       [](const Header& h) {
         EXPECT_EQ(h.cluster_bits, 21u);
         EXPECT_EQ(h.refcount_order, 0u);
         EXPECT_TRUE(h.backing_file.empty());
         EXPECT_EQ(h.backing_file_offset, 0u);
       }},
      {"Cluster512",
       {"cluster_size=512"},
       true,
       "64M",
       {},
       [](const Header& h) { EXPECT_EQ(h.cluster_bits, 9u); }},
      {"EmptyImage",
       {},
       false,
       "0",
       {},
       [](const Header& h) {
         EXPECT_EQ(h.size, 0u);
         EXPECT_EQ(h.l1_size, 0u);
       }},
      {"Version2",
       {"compat=0.10"},
       true,
       "1G",
       {},
       [](const Header& h) {
         EXPECT_EQ(h.version, 2u);
         EXPECT_EQ(h.backing_format, "qcow2");
         EXPECT_EQ(h.backing_file_offset, 72u + 16 + 8);
       }},
      {"Version2NoBacking", {"compat=0.10"}, false, "1G", {}, nullptr},
      {"ExternalDataFile",
       {"data_file=top.data"},
       true,
       "64M",
       {},
       [](const Header& h) {
         EXPECT_EQ(h.data_file, "top.data");
         EXPECT_TRUE(h.incompatible_features & kIncompatDataFile);
         EXPECT_FALSE(h.autoclear_features & kAutoclearDataFileRaw);
         absl::Status s = CheckFeatures(h, "top");
         EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
         EXPECT_THAT(std::string(s.message()), HasSubstr("top.data"));
       }},
      {"ExternalDataFileRaw",
       {"data_file=top.data", "data_file_raw=on"},
       false,
       "64M",
       {},
       [](const Header& h) {
         EXPECT_EQ(h.data_file, "top.data");
         EXPECT_TRUE(h.incompatible_features & kIncompatDataFile);
         EXPECT_TRUE(h.autoclear_features & kAutoclearDataFileRaw);
         absl::Status s = CheckFeatures(h, "top");
         EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
         EXPECT_THAT(std::string(s.message()), HasSubstr("top.data"));
       }},
      {"Bitmaps",
       {},
       true,
       "64M",
       {{"bitmap", "--add", "{img}", "b0"},
        {"bitmap", "--add", "-g", "1M", "{img}", "second"}},
       [](const Header& h) {
         ASSERT_EQ(h.other_extensions.size(), 1u);
         EXPECT_EQ(h.other_extensions[0].magic, kExtBitmaps);
         EXPECT_EQ(LoadBE32(h.other_extensions[0].data.data()), 2u);
         EXPECT_OK(CheckFeatures(h, "top"));
       }},
  };
}

class QemuHeaderTest : public ::testing::TestWithParam<QemuCase> {};

TEST_P(QemuHeaderTest, DecodesAndReEncodesQemuHeader) {
  SKIP_WITHOUT_QEMU();
  const QemuCase& c = GetParam();
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  const std::string top = dir.File("top.qcow2");
  ASSERT_NO_FATAL_FAILURE(
      QemuImg({"create", "-q", "-f", "qcow2", base, "64M"}));
  std::vector<std::string> args = {"create", "-q", "-f", "qcow2"};
  std::string opts;
  for (const std::string& o : c.options) {
    absl::StrAppend(&opts, opts.empty() ? "" : ",", o);
  }
  if (!opts.empty()) {
    args.push_back("-o");
    args.push_back(opts);
  }
  if (c.backing) {
    args.insert(args.end(), {"-b", "base.qcow2", "-F", "qcow2"});
  }
  args.insert(args.end(), {top, c.size});
  // Run from the directory so a relative data file lands there.
  std::string cmd = "cd '" + dir.path() + "' && qemu-img";
  for (const std::string& a : args) absl::StrAppend(&cmd, " '", a, "'");
  CommandResult r = ::qcow2::testing::RunShell(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (std::vector<std::string> a : c.after) {
    for (std::string& s : a) {
      if (s == "{img}") s = top;
    }
    ASSERT_NO_FATAL_FAILURE(QemuImg(a));
  }
  Header h;
  ASSERT_NO_FATAL_FAILURE(CheckAgainstQemu(top, &h));
  EXPECT_EQ(h.backing_file, c.backing ? "base.qcow2" : "");
  if (c.check) c.check(h);
}

INSTANTIATE_TEST_SUITE_P(Qemu, QemuHeaderTest, ::testing::ValuesIn(QemuCases()),
                         QemuCaseName);

TEST(QemuInteropTest, LuksEncryptedImage) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  const std::string top = dir.File("enc.qcow2");
  ASSERT_NO_FATAL_FAILURE(
      QemuImg({"create", "-q", "-f", "qcow2", base, "64M"}));
  ASSERT_NO_FATAL_FAILURE(QemuImg(
      {"create", "-q", "-f", "qcow2", "--object", "secret,id=sec0,data=123456",
       "-o",
       "encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=10,"
       "encrypt.hash-alg=sha512",
       "-b", "base.qcow2", "-F", "qcow2", top, "64M"}));
  Header h;
  // The crypto extension comes after the backing format in QEMU's layout.
  ASSERT_NO_FATAL_FAILURE(CheckAgainstQemu(top, &h));
  EXPECT_EQ(h.crypt_method, 2u);
  ASSERT_FALSE(h.other_extensions.empty());
  EXPECT_EQ(h.other_extensions[0].magic, kExtCrypto);
  EXPECT_EQ(h.other_extensions[0].data.size(), 16u);
  absl::Status s = CheckFeatures(h, top);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("encrypted images are not supported"));
}

TEST(QemuInteropTest, QemuAlsoRefusesExtendedL2BelowCluster16K) {
  // Same rule as DecodeHeader's: qemu-img will not even create
  // cluster_size=4096,extended_l2=on.
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  for (const char* cs : {"4096", "8192"}) {
    SCOPED_TRACE(cs);
    CommandResult r = ::qcow2::testing::Run(
        {"qemu-img", "create", "-q", "-f", "qcow2", "-o",
         absl::StrCat("cluster_size=", cs,
                      ",compression_type=zstd,extended_l2=on"),
         dir.File("x.qcow2"), "1G"});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_THAT(r.err, HasSubstr("16384"));
  }
}

// QEMU opens a header we wrote, and when it rewrites the header keeps our
// unknown extension and the header bytes past its own 112.
TEST(QemuInteropTest, QemuAcceptsAndPreservesOurHeader) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string top = dir.File("top.qcow2");
  ASSERT_NO_FATAL_FAILURE(
      QemuImg({"create", "-q", "-f", "qcow2", dir.File("base.qcow2"), "64M"}));
  ASSERT_NO_FATAL_FAILURE(
      QemuImg({"create", "-q", "-f", "raw", dir.File("other.raw"), "64M"}));
  ASSERT_NO_FATAL_FAILURE(QemuImg({"create", "-q", "-f", "qcow2", "-b",
                                   "base.qcow2", "-F", "qcow2", top, "64M"}));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> c0, Cluster0(top));
  ASSERT_OK_AND_ASSIGN(Header h, Decode(c0));

  h.header_length = 120;
  h.tail.assign(120 - 105, 0);
  for (size_t i = 7; i < h.tail.size(); ++i) h.tail[i] = 0xc0 + i;  // 112..119
  h.other_extensions.push_back({0x7e57ab1e, Bytes("keep me")});
  h.backing_file = "other.raw";
  h.backing_format = "raw";
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> enc, EncodeHeader(h));
  enc.resize(h.cluster_size(), 0);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> file, ReadFileBytes(top));
  std::copy(enc.begin(), enc.end(), file.begin());
  ASSERT_OK(WriteFileBytes(top, file));

  CommandResult info =
      ::qcow2::testing::Run({"qemu-img", "info", "--output=json", top});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_EQ(JsonValue(info.out, "backing-filename"), "other.raw");
  EXPECT_EQ(JsonValue(info.out, "backing-filename-format"), "raw");
  CommandResult check = ::qcow2::testing::QemuCheck(top);
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;

  // QEMU rewrites the header.
  ASSERT_NO_FATAL_FAILURE(
      QemuImg({"rebase", "-u", "-b", "base.qcow2", "-F", "qcow2", top}));
  Header after;
  ASSERT_NO_FATAL_FAILURE(CheckAgainstQemu(top, &after));
  EXPECT_EQ(after.backing_file, "base.qcow2");
  EXPECT_EQ(after.backing_format, "qcow2");
  EXPECT_EQ(after.header_length, 120u);
  EXPECT_EQ(after.tail, h.tail);
  ASSERT_EQ(after.other_extensions.size(), 1u);
  EXPECT_EQ(after.other_extensions[0].magic, 0x7e57ab1eu);
  EXPECT_EQ(after.other_extensions[0].data, Bytes("keep me"));
}

}  // namespace
}  // namespace qcow2::internal
