// SPDX-License-Identifier: Apache-2.0
// fuzz_decompress: one compressed cluster, as DecompressCluster sees it.
//
// Input: byte 0 chooses the codec (bit 0: 0 zlib/raw deflate, 1 zstd) and
// the cluster size (cluster_bits = 9 + (bits 1..4) % 13, so 512 B .. 2 MiB);
// the rest is the descriptor's sector span as read from the image.
//
// Checked:
//  - nothing is written outside the one-cluster output buffer (ASan, plus
//    canary bytes on both sides);
//  - failures are kDataLoss (or kResourceExhausted);
//  - the result agrees with a reference decoder written against the
//    contract, with a fresh context per call as QEMU has (zlib: raw
//    inflate, any window, success iff a full cluster comes out; zstd:
//    QEMU's loop over concatenated frames): when the library succeeds the
//    reference produces the same bytes, and when the reference succeeds
//    (zstd: with windows no larger than 2 MiB, the largest cluster) the
//    library succeeds too. The library keeps its codec contexts per thread,
//    so its answer must not depend on what the thread decoded before
//    (fuzz/regressions/fuzz_decompress/zstd-after-error-* is such a pair);
//  - CompressCluster round trips: the decoded cluster, and the input
//    itself taken as a cluster, compress (when they fit) to a stream that
//    decodes back to the same bytes, also with arbitrary trailing bytes in
//    the rest of the last sector.
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "fuzz/fuzz_util.h"
#include "lib/format/compress.h"

namespace qcow2::fuzz {
namespace {

using internal::CompressCluster;
using internal::DecompressCluster;

constexpr size_t kCanary = 64;
constexpr uint8_t kCanaryByte = 0xc5;
// zstd's default decoder window limit (ZSTD_WINDOWLOG_LIMIT_DEFAULT, only
// visible with ZSTD_STATIC_LINKING_ONLY): 128 MiB.
constexpr int kZstdWindowLogDefault = 27;
// The largest window a QEMU-compatible writer uses: one 2 MiB cluster.
constexpr int kZstdWindowLogCluster = 21;

const char* Name(CompressionType t) {
  return t == CompressionType::kZlib ? "zlib" : "zstd";
}

// Reference raw-deflate decoder: success iff `out` fills up.
bool RefInflate(absl::Span<const uint8_t> in, absl::Span<uint8_t> out) {
  z_stream s{};
  if (inflateInit2(&s, -15) != Z_OK) Die("inflateInit2 failed");
  s.next_in = const_cast<Bytef*>(in.data());
  s.avail_in = static_cast<uInt>(in.size());
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  int ret;
  do {
    ret = inflate(&s, Z_NO_FLUSH);
  } while (ret == Z_OK && s.avail_out > 0 && s.avail_in > 0);
  const bool full = s.avail_out == 0;
  inflateEnd(&s);
  return full && (ret == Z_OK || ret == Z_STREAM_END || ret == Z_BUF_ERROR);
}

// Reference zstd decoder (QEMU's qcow2_zstd_decompress): decode until the
// cluster is full; an error, or a step without progress, fails.
bool RefZstd(absl::Span<const uint8_t> in, absl::Span<uint8_t> out,
             int window_log_max) {
  ZSTD_DCtx* d = ZSTD_createDCtx();
  if (d == nullptr) Die("ZSTD_createDCtx failed");
  ZSTD_DCtx_setParameter(d, ZSTD_d_windowLogMax, window_log_max);
  ZSTD_inBuffer input{in.data(), in.size(), 0};
  ZSTD_outBuffer output{out.data(), out.size(), 0};
  bool ok = true;
  while (output.pos < output.size) {
    const size_t in_before = input.pos, out_before = output.pos;
    const size_t r = ZSTD_decompressStream(d, &output, &input);
    if (ZSTD_isError(r) ||
        (input.pos == in_before && output.pos == out_before)) {
      ok = false;
      break;
    }
  }
  ZSTD_freeDCtx(d);
  return ok;
}

bool Reference(CompressionType t, absl::Span<const uint8_t> in,
               absl::Span<uint8_t> out, int zstd_window_log_max) {
  return t == CompressionType::kZlib ? RefInflate(in, out)
                                     : RefZstd(in, out, zstd_window_log_max);
}

// DecompressCluster on a new thread, so with fresh thread-local codec
// contexts.
absl::Status DecodeOnFreshThread(CompressionType t,
                                 absl::Span<const uint8_t> in, size_t cs) {
  absl::Status s;
  std::thread th([&] {
    std::vector<uint8_t> out(cs);
    s = DecompressCluster(t, in, absl::MakeSpan(out));
  });
  th.join();
  return s;
}

// Buffers reused across inputs (fresh multi-MiB allocations per input
// would cost more in page faults than the decoding itself).
std::vector<uint8_t>& Buffer(int which, size_t size) {
  static std::vector<uint8_t> buffers[5];
  std::vector<uint8_t>& b = buffers[which];
  if (b.size() < size) b.resize(size);
  return b;
}
enum { kDecodeBuf, kRefBuf, kCompBuf, kBackBuf, kPlainBuf };

// Decompresses into a buffer with canaries on both sides; on return
// `*cluster` is the cluster's bytes (valid until the next Decode).
absl::Status Decode(CompressionType t, absl::Span<const uint8_t> in, size_t cs,
                    absl::Span<const uint8_t>* cluster) {
  std::vector<uint8_t>& buf = Buffer(kDecodeBuf, cs + 2 * kCanary);
  std::memset(buf.data(), kCanaryByte, cs + 2 * kCanary);
  absl::Status s =
      DecompressCluster(t, in, absl::MakeSpan(buf.data() + kCanary, cs));
  for (size_t i = 0; i < kCanary; ++i) {
    if (buf[i] != kCanaryByte || buf[kCanary + cs + i] != kCanaryByte) {
      Die("%s DecompressCluster wrote outside its %zu-byte cluster", Name(t),
          cs);
    }
  }
  if (!s.ok() && s.code() != absl::StatusCode::kDataLoss &&
      s.code() != absl::StatusCode::kResourceExhausted) {
    Die("%s DecompressCluster failed with an unexpected code: %s", Name(t),
        s.ToString().c_str());
  }
  *cluster = absl::MakeConstSpan(buf.data() + kCanary, cs);
  return s;
}

// Compresses `cluster`; when it fits, decodes the stream padded to whole
// sectors with `padding` bytes and requires the same cluster back.
void RoundTrip(CompressionType t, absl::Span<const uint8_t> cluster,
               absl::Span<const uint8_t> padding) {
  const size_t cs = cluster.size();
  std::vector<uint8_t>& comp = Buffer(kCompBuf, cs + 512);
  auto n = CompressCluster(t, cluster, absl::MakeSpan(comp.data(), cs));
  if (!n.ok()) {
    Die("%s CompressCluster of a %zu-byte cluster failed: %s", Name(t), cs,
        n.status().ToString().c_str());
  }
  if (*n == 0) return;  // did not fit: stored uncompressed
  if (*n > cs) Die("%s CompressCluster returned %zu > %zu", Name(t), *n, cs);
  // The rest of the last sector holds whatever follows in the image.
  const size_t padded = (*n + 511) / 512 * 512;
  for (size_t i = *n; i < padded; ++i) {
    comp[i] = padding.empty() ? 0 : padding[(i - *n) % padding.size()];
  }
  absl::Span<const uint8_t> back;
  absl::Status s =
      Decode(t, absl::MakeConstSpan(comp.data(), padded), cs, &back);
  if (!s.ok()) {
    Die("%s: a %zu-byte stream from CompressCluster does not decode: %s",
        Name(t), *n, s.ToString().c_str());
  }
  const int64_t d = FirstDifference(cluster, back);
  if (d >= 0) {
    Die("%s round trip of a %zu-byte cluster differs at byte %lld", Name(t), cs,
        (long long)d);
  }
}

}  // namespace
}  // namespace qcow2::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qcow2;
  using namespace qcow2::fuzz;
  if (size < 1) return 0;
  const uint8_t sel = data[0];
  const CompressionType t =
      (sel & 1) ? CompressionType::kZstd : CompressionType::kZlib;
  const uint32_t cluster_bits = 9 + ((sel >> 1) & 0xf) % 13;
  const size_t cs = size_t{1} << cluster_bits;
  const absl::Span<const uint8_t> in(data + 1, size - 1);

  absl::Span<const uint8_t> decoded;
  absl::Status s = Decode(t, in, cs, &decoded);

  absl::Span<uint8_t> ref = absl::MakeSpan(Buffer(kRefBuf, cs).data(), cs);
  if (s.ok()) {
    // Anything the library accepts, a permissive reference accepts too,
    // with the same bytes.
    if (!Reference(t, in, ref, kZstdWindowLogDefault)) {
      const bool fresh_rejects = !DecodeOnFreshThread(t, in, cs).ok();
      Die(fresh_rejects
              ? "%s: DecompressCluster accepted a %zu-byte input the reference "
                "decoder rejects (cluster %zu), and rejects it on a fresh "
                "thread: the result depends on what the thread decoded before"
              : "%s: DecompressCluster accepted a %zu-byte input the reference "
                "decoder rejects (cluster %zu)",
          Name(t), in.size(), cs);
    }
    const int64_t d = FirstDifference(ref, decoded);
    if (d >= 0) {
      Die("%s: DecompressCluster and the reference differ at byte %lld of "
          "a %zu-byte cluster",
          Name(t), (long long)d, cs);
    }
    // RoundTrip decodes into the same buffer: keep a copy.
    std::vector<uint8_t>& cluster = Buffer(kBackBuf, cs);
    std::copy(decoded.begin(), decoded.end(), cluster.begin());
    RoundTrip(t, absl::MakeConstSpan(cluster.data(), cs), in);
  } else if (Reference(t, in, ref, kZstdWindowLogCluster)) {
    // Streams a QEMU-compatible writer could have made must decode.
    Die("%s: DecompressCluster rejected a %zu-byte input the reference "
        "decodes (cluster %zu): %s",
        Name(t), in.size(), cs, s.ToString().c_str());
  }

  // The input as cluster contents.
  std::vector<uint8_t>& plain = Buffer(kPlainBuf, cs);
  const size_t n = std::min(in.size(), cs);
  std::copy(in.begin(), in.begin() + n, plain.begin());
  std::memset(plain.data() + n, 0, cs - n);
  RoundTrip(t, absl::MakeConstSpan(plain.data(), cs), in);
  return 0;
}
