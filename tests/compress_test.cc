// SPDX-License-Identifier: Apache-2.0
#include "lib/format/compress.h"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "lib/base/endian.h"
#include "qcow2/options.h"
#include "tests/util/test_util.h"

namespace qcow2::internal {
namespace {

using Bytes = std::vector<uint8_t>;

constexpr CompressionType kTypes[] = {CompressionType::kZlib,
                                      CompressionType::kZstd};

std::string TypeName(CompressionType type) {
  return type == CompressionType::kZlib ? "zlib" : "zstd";
}

enum class DataKind { kRandom, kZero, kText };

std::string KindName(DataKind kind) {
  switch (kind) {
    case DataKind::kRandom:
      return "random";
    case DataKind::kZero:
      return "zero";
    case DataKind::kText:
      return "text";
  }
  return "unknown";
}

Bytes RandomBytes(size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes out(size);
  for (size_t i = 0; i < size; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, size - i));
  }
  return out;
}

// Log-like lines: compressible, but not trivially so.
Bytes TextBytes(size_t size, uint64_t seed) {
  static constexpr const char* kWords[] = {
      "cluster", "refcount", "table",  "guest", "offset", "the",  "qcow2",
      "image",   "backing",  "sector", "write", "read",   "zstd", "deflate",
      "error",   "snapshot", "L2",     "L1",    "entry",  "of",   "and"};
  std::mt19937_64 rng(seed);
  std::string text;
  text.reserve(size + 64);
  uint64_t line = 0;
  while (text.size() < size) {
    absl::StrAppend(&text, "[", line++, "] ");
    const int words = 3 + static_cast<int>(rng() % 10);
    for (int w = 0; w < words; ++w) {
      absl::StrAppend(&text, kWords[rng() % std::size(kWords)], " ");
    }
    absl::StrAppend(&text, rng() % 100000, "\n");
  }
  return Bytes(text.begin(), text.begin() + size);
}

Bytes MakeData(DataKind kind, size_t size, uint64_t seed) {
  switch (kind) {
    case DataKind::kRandom:
      return RandomBytes(size, seed);
    case DataKind::kZero:
      return Bytes(size, 0);
    case DataKind::kText:
      return TextBytes(size, seed);
  }
  return {};
}

// Compresses `data` with room to spare (so even incompressible data yields a
// stream) and returns the stream.
Bytes CompressRoomy(CompressionType type, const Bytes& data) {
  Bytes out(data.size() + data.size() / 4 + 4096);
  absl::StatusOr<size_t> n = CompressCluster(type, data, absl::MakeSpan(out));
  EXPECT_TRUE(n.ok()) << n.status();
  EXPECT_GT(n.value_or(0), 0u);
  out.resize(n.value_or(0));
  return out;
}

// Pads a compressed stream to the end of its last 512-byte sector, the way
// it appears when read back through a compressed-cluster descriptor.
Bytes PadToSector(Bytes stream, uint8_t fill) {
  stream.resize((stream.size() + 511) / 512 * 512, fill);
  return stream;
}

// ---------------------------------------------------------------------------
// Round trips over every cluster size and data kind.

struct RoundTripParam {
  CompressionType type;
  int cluster_bits;
  DataKind kind;
};

std::string RoundTripName(const RoundTripParam& p) {
  return absl::StrCat(TypeName(p.type), "_", size_t{1} << p.cluster_bits, "_",
                      KindName(p.kind));
}

void PrintTo(const RoundTripParam& p, std::ostream* os) {
  *os << RoundTripName(p);
}

// Every type, cluster size (512 B to 2 MiB) and data kind.
std::vector<RoundTripParam> RoundTripParams() {
  std::vector<RoundTripParam> v;
  for (CompressionType type : kTypes) {
    for (int bits = 9; bits < 22; ++bits) {
      for (DataKind kind :
           {DataKind::kRandom, DataKind::kZero, DataKind::kText}) {
        v.push_back({type, bits, kind});
      }
    }
  }
  return v;
}

class CompressRoundTripTest : public ::testing::TestWithParam<RoundTripParam> {
};

TEST_P(CompressRoundTripTest, RoundTrip) {
  const auto [type, cluster_bits, kind] = GetParam();
  const size_t cluster_size = size_t{1} << cluster_bits;
  const Bytes data = MakeData(kind, cluster_size, 1000 + cluster_bits);

  // What the image writer does: only accept compression that saves space.
  Bytes out(cluster_size - 1);
  ASSERT_OK_AND_ASSIGN(const size_t n,
                       CompressCluster(type, data, absl::MakeSpan(out)));
  ASSERT_LE(n, out.size());
  if (kind == DataKind::kRandom) {
    EXPECT_EQ(n, 0u) << "random data should not compress";
  } else {
    ASSERT_GT(n, 0u);
    if (kind == DataKind::kZero) {
      EXPECT_LT(n, cluster_size / 8 + 64);
    }
    out.resize(n);
    const Bytes stream = PadToSector(out, 0);
    Bytes back(cluster_size, 0xaa);
    ASSERT_OK(DecompressCluster(type, stream, absl::MakeSpan(back)));
    EXPECT_TRUE(back == data);
  }

  // With enough room every kind compresses (stored/raw blocks for random
  // data) and still round-trips.
  const Bytes roomy = CompressRoomy(type, data);
  ASSERT_FALSE(roomy.empty());
  Bytes back(cluster_size, 0x55);
  ASSERT_OK(
      DecompressCluster(type, PadToSector(roomy, 0xff), absl::MakeSpan(back)));
  EXPECT_TRUE(back == data);
}

INSTANTIATE_TEST_SUITE_P(
    AllSizes, CompressRoundTripTest, ::testing::ValuesIn(RoundTripParams()),
    [](const ::testing::TestParamInfo<RoundTripParam>& info) {
      return RoundTripName(info.param);
    });

// ---------------------------------------------------------------------------
// Edge cases, for both types.

TEST(CompressTest, IncompressibleDataReturnsZero) {
  const Bytes data = RandomBytes(65536, 7);
  for (CompressionType type : kTypes) {
    SCOPED_TRACE(TypeName(type));
    for (size_t room : {size_t{1}, size_t{100}, size_t{65535}}) {
      Bytes out(room);
      ASSERT_OK_AND_ASSIGN(const size_t n,
                           CompressCluster(type, data, absl::MakeSpan(out)));
      EXPECT_EQ(n, 0u) << "room " << room;
    }
    ASSERT_OK_AND_ASSIGN(const size_t n,
                         CompressCluster(type, data, absl::Span<uint8_t>()));
    EXPECT_EQ(n, 0u);
  }
}

TEST(CompressTest, TextCompressesWell) {
  const Bytes data = TextBytes(65536, 8);
  for (CompressionType type : kTypes) {
    SCOPED_TRACE(TypeName(type));
    Bytes out(data.size() - 1);
    ASSERT_OK_AND_ASSIGN(const size_t n,
                         CompressCluster(type, data, absl::MakeSpan(out)));
    EXPECT_GT(n, 0u);
    EXPECT_LT(n, data.size() / 2);
  }
}

TEST(CompressTest, TrailingGarbageIsIgnored) {
  const Bytes data = TextBytes(65536, 9);
  for (CompressionType type : kTypes) {
    SCOPED_TRACE(TypeName(type));
    const Bytes stream = CompressRoomy(type, data);
    const Bytes garbage = RandomBytes(70000, 10);
    for (size_t extra :
         {size_t{0}, size_t{1}, size_t{511}, size_t{4096}, size_t{70000}}) {
      for (int fill : {0x00, 0xff, -1}) {
        Bytes in = stream;
        for (size_t i = 0; i < extra; ++i) {
          in.push_back(fill < 0 ? garbage[i] : static_cast<uint8_t>(fill));
        }
        SCOPED_TRACE(absl::StrCat("extra ", extra, " fill ", fill));
        Bytes back(data.size());
        ASSERT_OK(DecompressCluster(type, in, absl::MakeSpan(back)));
        EXPECT_TRUE(back == data);
      }
    }
  }
}

TEST(CompressTest, TruncatedInputIsDataLoss) {
  const Bytes data = TextBytes(65536, 11);
  for (CompressionType type : kTypes) {
    SCOPED_TRACE(TypeName(type));
    const Bytes stream = CompressRoomy(type, data);
    ASSERT_GT(stream.size(), 64u);
    // Every cut drops at least one symbol that produces output. (Dropping
    // only the last byte or two of a deflate stream can be harmless: once
    // the cluster is full the end-of-block code is never read, and QEMU
    // accepts that too.)
    for (size_t keep : {size_t{0}, size_t{1}, size_t{10}, stream.size() / 2,
                        stream.size() - 16}) {
      Bytes back(data.size());
      const absl::Status s = DecompressCluster(
          type, absl::MakeConstSpan(stream).first(keep), absl::MakeSpan(back));
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss)
          << "keep " << keep << ": " << s;
    }
  }
  // zstd decodes whole blocks, so even one missing byte is noticed.
  const Bytes stream = CompressRoomy(CompressionType::kZstd, data);
  Bytes back(data.size());
  const absl::Status s =
      DecompressCluster(CompressionType::kZstd,
                        absl::MakeConstSpan(stream).first(stream.size() - 1),
                        absl::MakeSpan(back));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("expected 65536"), std::string::npos) << s;
}

TEST(CompressTest, ShortStreamIsDataLoss) {
  const Bytes half = TextBytes(32768, 12);
  for (CompressionType type : kTypes) {
    SCOPED_TRACE(TypeName(type));
    const Bytes stream = CompressRoomy(type, half);
    for (uint8_t fill : {uint8_t{0x00}, uint8_t{0xff}}) {
      Bytes back(65536, 0xcc);
      const absl::Status s = DecompressCluster(type, PadToSector(stream, fill),
                                               absl::MakeSpan(back));
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      EXPECT_NE(
          s.message().find("compressed cluster decompresses to 32768 bytes, "
                           "expected 65536"),
          std::string::npos)
          << s;
    }
    // Exactly the stream, nothing after it.
    Bytes back(65536);
    const absl::Status s =
        DecompressCluster(type, stream, absl::MakeSpan(back));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("decompresses to 32768 bytes, expected 65536"),
              std::string::npos)
        << s;
  }
}

TEST(CompressTest, OverlongStreamFillsOnlyOneCluster) {
  for (CompressionType type : kTypes) {
    for (size_t cluster : {size_t{512}, size_t{65536}, size_t{2} << 20}) {
      SCOPED_TRACE(absl::StrCat(TypeName(type), " ", cluster));
      for (DataKind kind :
           {DataKind::kZero, DataKind::kText, DataKind::kRandom}) {
        // A "bomb": four clusters' worth of data in one stream.
        const Bytes big = MakeData(kind, 4 * cluster, 13);
        const Bytes stream = CompressRoomy(type, big);
        // The cluster sits inside a guarded buffer; under ASan the exact
        // allocation below also catches any overrun.
        Bytes guarded(cluster + 4096, 0x5a);
        ASSERT_OK(DecompressCluster(type, stream,
                                    absl::MakeSpan(guarded).first(cluster)));
        EXPECT_TRUE(
            std::equal(big.begin(), big.begin() + cluster, guarded.begin()));
        EXPECT_TRUE(std::all_of(guarded.begin() + cluster, guarded.end(),
                                [](uint8_t b) { return b == 0x5a; }));
        Bytes exact(cluster);
        ASSERT_OK(DecompressCluster(type, stream, absl::MakeSpan(exact)));
        EXPECT_TRUE(std::equal(exact.begin(), exact.end(), big.begin()));
      }
    }
  }
}

// QEMU keeps decoding zstd frames until the cluster is full, so a cluster
// split over two frames reads fine there; it does here too.
TEST(CompressTest, ZstdConcatenatedFramesFillCluster) {
  const Bytes data = TextBytes(65536, 21);
  const Bytes first(data.begin(), data.begin() + 40000);
  const Bytes second(data.begin() + 40000, data.end());
  Bytes in = CompressRoomy(CompressionType::kZstd, first);
  const Bytes tail = CompressRoomy(CompressionType::kZstd, second);
  in.insert(in.end(), tail.begin(), tail.end());
  Bytes back(data.size());
  ASSERT_OK(DecompressCluster(CompressionType::kZstd, PadToSector(in, 0),
                              absl::MakeSpan(back)));
  EXPECT_TRUE(back == data);
}

TEST(CompressTest, GarbageInputIsDataLoss) {
  std::vector<Bytes> inputs = {Bytes(4096, 0x00), Bytes(4096, 0xff),
                               Bytes(1, 0x00), Bytes()};
  for (uint64_t seed = 0; seed < 32; ++seed) {
    inputs.push_back(RandomBytes(4096, 100 + seed));
  }
  for (CompressionType type : kTypes) {
    SCOPED_TRACE(TypeName(type));
    for (size_t i = 0; i < inputs.size(); ++i) {
      Bytes back(65536);
      const absl::Status s =
          DecompressCluster(type, inputs[i], absl::MakeSpan(back));
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss)
          << "input " << i << ": " << s;
    }
  }
}

// Flipped bits may go unnoticed (zstd frames carry no checksum here) but
// must never crash or overflow; the result is either OK or DataLoss.
TEST(CompressTest, CorruptedStreamNeverCrashes) {
  const Bytes data = TextBytes(65536, 14);
  std::mt19937_64 rng(15);
  for (CompressionType type : kTypes) {
    SCOPED_TRACE(TypeName(type));
    const Bytes stream = PadToSector(CompressRoomy(type, data), 0);
    int data_loss = 0;
    for (int iter = 0; iter < 500; ++iter) {
      Bytes bad = stream;
      const int flips = 1 + static_cast<int>(rng() % 8);
      for (int f = 0; f < flips; ++f) {
        bad[rng() % bad.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      }
      Bytes back(data.size());
      const absl::Status s = DecompressCluster(type, bad, absl::MakeSpan(back));
      ASSERT_TRUE(s.ok() || s.code() == absl::StatusCode::kDataLoss) << s;
      if (!s.ok()) ++data_loss;
    }
    EXPECT_GT(data_loss, 0);
  }
}

TEST(CompressTest, InvalidArguments) {
  const Bytes data = TextBytes(4096, 16);
  const Bytes stream = CompressRoomy(CompressionType::kZlib, data);
  EXPECT_EQ(
      DecompressCluster(CompressionType::kZlib, stream, absl::Span<uint8_t>())
          .code(),
      absl::StatusCode::kInvalidArgument);
  Bytes out(4096);
  const auto bogus = static_cast<CompressionType>(7);
  EXPECT_EQ(DecompressCluster(bogus, stream, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CompressCluster(bogus, data, absl::MakeSpan(out)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Our output as QEMU reads it.

TEST(CompressTest, ZlibOutputIsRawDeflateWithQemuWindow) {
  for (DataKind kind : {DataKind::kZero, DataKind::kText}) {
    for (size_t cluster : {size_t{512}, size_t{65536}, size_t{2} << 20}) {
      SCOPED_TRACE(absl::StrCat(KindName(kind), " ", cluster));
      const Bytes data = MakeData(kind, cluster, 17);
      Bytes out(cluster - 1);
      ASSERT_OK_AND_ASSIGN(
          const size_t n,
          CompressCluster(CompressionType::kZlib, data, absl::MakeSpan(out)));
      ASSERT_GT(n, 0u);
      // QEMU inflates with windowBits -12: raw deflate, 4 KiB window.
      z_stream strm{};
      ASSERT_EQ(inflateInit2(&strm, -12), Z_OK);
      Bytes back(cluster + 1);
      strm.next_in = out.data();
      strm.avail_in = static_cast<uInt>(n);
      strm.next_out = back.data();
      strm.avail_out = static_cast<uInt>(back.size());
      const int ret = inflate(&strm, Z_FINISH);
      const size_t produced = back.size() - strm.avail_out;
      const size_t consumed = n - strm.avail_in;
      inflateEnd(&strm);
      EXPECT_EQ(ret, Z_STREAM_END);
      EXPECT_EQ(consumed, n);
      ASSERT_EQ(produced, cluster);
      EXPECT_TRUE(std::equal(data.begin(), data.end(), back.begin()));
    }
  }
}

TEST(CompressTest, ZstdOutputIsOneFrame) {
  for (DataKind kind : {DataKind::kZero, DataKind::kText}) {
    for (size_t cluster : {size_t{512}, size_t{65536}, size_t{2} << 20}) {
      SCOPED_TRACE(absl::StrCat(KindName(kind), " ", cluster));
      const Bytes data = MakeData(kind, cluster, 18);
      Bytes out(cluster - 1);
      ASSERT_OK_AND_ASSIGN(
          const size_t n,
          CompressCluster(CompressionType::kZstd, data, absl::MakeSpan(out)));
      ASSERT_GT(n, 0u);
      EXPECT_EQ(ZSTD_findFrameCompressedSize(out.data(), n), n);
      Bytes back(cluster + 1);
      const size_t got =
          ZSTD_decompress(back.data(), back.size(), out.data(), n);
      ASSERT_FALSE(ZSTD_isError(got)) << ZSTD_getErrorName(got);
      ASSERT_EQ(got, cluster);
      EXPECT_TRUE(std::equal(data.begin(), data.end(), back.begin()));
    }
  }
}

TEST(CompressTest, ConcurrentUse) {
  constexpr int kThreads = 8;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures] {
      for (int iter = 0; iter < 40; ++iter) {
        const CompressionType type = kTypes[(t + iter) % 2];
        const size_t cluster = size_t{512} << ((t + iter) % 8);
        const Bytes data = TextBytes(cluster, t * 1000 + iter);
        Bytes out(cluster - 1);
        absl::StatusOr<size_t> n =
            CompressCluster(type, data, absl::MakeSpan(out));
        if (!n.ok() || *n == 0) {
          ++failures;
          continue;
        }
        out.resize(*n);
        Bytes back(cluster);
        if (!DecompressCluster(type, PadToSector(out, 0xee),
                               absl::MakeSpan(back))
                 .ok() ||
            back != data) {
          ++failures;
        }
        // Leave this thread's contexts mid-error now and then.
        Bytes junk = RandomBytes(512, iter);
        (void)DecompressCluster(type, junk, absl::MakeSpan(back));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

// ---------------------------------------------------------------------------
// Interop: clusters compressed by qemu-img.

// 1 MiB: text, zeros, random (stored uncompressed by QEMU), then a
// structured pattern.
Bytes InteropPattern() {
  constexpr size_t kSize = 1 << 20;
  Bytes data = TextBytes(256 << 10, 19);
  data.resize(384 << 10, 0);
  const Bytes random = RandomBytes(128 << 10, 20);
  data.insert(data.end(), random.begin(), random.end());
  while (data.size() < kSize) {
    const size_t i = data.size();
    data.push_back(static_cast<uint8_t>((i % 512 < 16) ? (i >> 9) + (i % 16)
                                                       : (i * 7) ^ (i >> 11)));
  }
  return data;
}

struct InteropStats {
  int compressed = 0;
  int uncompressed = 0;
  int unallocated = 0;
  int past_eof = 0;  // descriptor spans reaching past the end of the file
};

// Walks a qemu-img-written image by hand and checks every guest cluster of
// `expected` against it, decompressing compressed ones with our codec.
void CheckImage(const Bytes& image, const Bytes& expected, CompressionType type,
                InteropStats* stats) {
  ASSERT_GE(image.size(), 112u);
  ASSERT_EQ(LoadBE32(&image[0]), 0x514649fbu);
  ASSERT_EQ(LoadBE32(&image[4]), 3u);
  const uint32_t cluster_bits = LoadBE32(&image[20]);
  ASSERT_GE(cluster_bits, 9u);
  ASSERT_LE(cluster_bits, 21u);
  const uint64_t cluster_size = uint64_t{1} << cluster_bits;
  const uint32_t l1_size = LoadBE32(&image[36]);
  const uint64_t l1_offset = LoadBE64(&image[40]);
  const uint64_t incompatible = LoadBE64(&image[72]);
  const uint32_t header_length = LoadBE32(&image[100]);
  if (type == CompressionType::kZstd) {
    EXPECT_TRUE(incompatible & (1u << 3)) << "compression type bit";
    ASSERT_GT(header_length, 104u);
    EXPECT_EQ(image[104], 1) << "compression_type field";
  } else {
    EXPECT_FALSE(incompatible & (1u << 3));
  }

  const uint64_t l2_entries = cluster_size / 8;
  const uint32_t csize_bits = cluster_bits - 8;
  const uint32_t csize_shift = 62 - csize_bits;
  const uint64_t coffset_mask = (uint64_t{1} << csize_shift) - 1;
  const uint64_t csize_mask = (uint64_t{1} << csize_bits) - 1;

  for (uint64_t guest = 0; guest < expected.size(); guest += cluster_size) {
    SCOPED_TRACE(absl::StrCat("guest offset ", guest));
    const uint64_t index = guest / cluster_size;
    const uint64_t l1_index = index / l2_entries;
    ASSERT_LT(l1_index, l1_size);
    ASSERT_LE(l1_offset + 8 * (l1_index + 1), image.size());
    const uint64_t l1_entry = LoadBE64(&image[l1_offset + 8 * l1_index]);
    const uint64_t l2_offset = l1_entry & 0x00fffffffffffe00ull;

    // Expected cluster content: the pattern, zero-padded past its end.
    Bytes want(cluster_size, 0);
    const uint64_t avail =
        std::min<uint64_t>(cluster_size, expected.size() - guest);
    std::copy_n(expected.begin() + guest, avail, want.begin());

    uint64_t l2_entry = 0;
    if (l2_offset != 0) {
      const uint64_t at = l2_offset + 8 * (index % l2_entries);
      ASSERT_LE(at + 8, image.size());
      l2_entry = LoadBE64(&image[at]);
    }
    if (l2_entry & (uint64_t{1} << 62)) {
      ++stats->compressed;
      const uint64_t coffset = l2_entry & coffset_mask;
      const uint64_t nb_sectors = ((l2_entry >> csize_shift) & csize_mask) + 1;
      const uint64_t csize = nb_sectors * 512 - (coffset & 511);
      ASSERT_LT(coffset, image.size());
      // Reads past the end of the file return zeros, as in QEMU.
      Bytes in(csize, 0);
      const uint64_t have = std::min<uint64_t>(csize, image.size() - coffset);
      if (have < csize) ++stats->past_eof;
      std::copy_n(image.begin() + coffset, have, in.begin());
      Bytes got(cluster_size, 0xa5);
      ASSERT_OK(DecompressCluster(type, in, absl::MakeSpan(got)));
      ASSERT_TRUE(got == want);
    } else {
      const uint64_t host = l2_entry & 0x00fffffffffffe00ull;
      if (host == 0 || (l2_entry & 1)) {
        ++stats->unallocated;
        ASSERT_TRUE(std::all_of(want.begin(), want.end(),
                                [](uint8_t b) { return b == 0; }));
      } else {
        ++stats->uncompressed;
        ASSERT_LE(host + cluster_size, image.size());
        ASSERT_TRUE(std::equal(want.begin(), want.end(), image.begin() + host));
      }
    }
  }
}

struct InteropParam {
  CompressionType type;
  uint32_t cluster_size;
};

std::string InteropName(const InteropParam& p) {
  return absl::StrCat(TypeName(p.type), "_", p.cluster_size);
}

void PrintTo(const InteropParam& p, std::ostream* os) {
  *os << InteropName(p);
}

std::vector<InteropParam> InteropParams() {
  std::vector<InteropParam> v;
  for (CompressionType type : kTypes) {
    for (uint32_t cluster_size : {512u, 4096u, 65536u, 2u << 20}) {
      v.push_back({type, cluster_size});
    }
  }
  return v;
}

class QemuInteropTest : public ::testing::TestWithParam<InteropParam> {};

TEST_P(QemuInteropTest, DecompressesQemuCompressedClusters) {
  SKIP_WITHOUT_QEMU();
  const auto [type, cluster_size] = GetParam();
  qcow2::testing::TempDir dir;
  const Bytes pattern = InteropPattern();
  const std::string raw = dir.File("pattern.raw");
  const std::string image = dir.File("pattern.qcow2");
  ASSERT_OK(qcow2::testing::WriteFileBytes(raw, pattern));
  const qcow2::testing::CommandResult r = qcow2::testing::Run(
      {"qemu-img", "convert", "-c", "-f", "raw", "-O", "qcow2", "-o",
       absl::StrCat("compression_type=", TypeName(type),
                    ",cluster_size=", cluster_size),
       raw, image});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_OK_AND_ASSIGN(const Bytes bytes, qcow2::testing::ReadFileBytes(image));
  InteropStats stats;
  CheckImage(bytes, pattern, type, &stats);
  EXPECT_GT(stats.compressed, 0);
  if (cluster_size <= 65536) {
    EXPECT_GT(stats.uncompressed, 0) << "random region stored as is";
    EXPECT_GT(stats.unallocated, 0) << "zero region left unallocated";
  }
  RecordProperty("compressed", stats.compressed);
  RecordProperty("past_eof", stats.past_eof);
}

// Clusters written one at a time by `qemu-io -c "write -c"`. The last one
// written ends the file, and its descriptor's sector span usually reaches
// past the end of the file (QEMU does not pad the file; reads past EOF
// return zeros).
TEST_P(QemuInteropTest, DecompressesQemuIoCompressedWrites) {
  SKIP_WITHOUT_QEMU();
  const auto [type, cluster_size] = GetParam();
  qcow2::testing::TempDir dir;
  const Bytes pattern = InteropPattern();
  const std::string image = dir.File("io.qcow2");
  qcow2::testing::CommandResult r =
      qcow2::testing::Run({"qemu-img", "create", "-q", "-f", "qcow2", "-o",
                           absl::StrCat("compression_type=", TypeName(type),
                                        ",cluster_size=", cluster_size),
                           image, absl::StrCat(pattern.size())});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Fill a few clusters with single-byte patterns, compressed; the rest of
  // the image stays unallocated (zeros).
  Bytes expected(pattern.size(), 0);
  const uint64_t step = std::max<uint64_t>(cluster_size, 256 << 10);
  int i = 0;
  for (uint64_t off = 0; off < expected.size(); off += step, ++i) {
    const uint64_t len =
        std::min<uint64_t>(cluster_size, expected.size() - off);
    const int fill = 0x41 + i;
    std::fill_n(expected.begin() + off, len, static_cast<uint8_t>(fill));
    r = qcow2::testing::Run(
        {"qemu-io", "-c",
         absl::StrCat("write -c -P ", fill, " ", off, " ", len), image});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_EQ(r.out.find("failed"), std::string::npos) << r.out;
  }
  ASSERT_OK_AND_ASSIGN(const Bytes bytes, qcow2::testing::ReadFileBytes(image));
  InteropStats stats;
  CheckImage(bytes, expected, type, &stats);
  EXPECT_EQ(stats.compressed, i);
  RecordProperty("past_eof", stats.past_eof);
}

INSTANTIATE_TEST_SUITE_P(
    QemuImg, QemuInteropTest, ::testing::ValuesIn(InteropParams()),
    [](const ::testing::TestParamInfo<InteropParam>& info) {
      return InteropName(info.param);
    });

}  // namespace
}  // namespace qcow2::internal
