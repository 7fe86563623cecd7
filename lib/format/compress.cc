// SPDX-License-Identifier: Apache-2.0
#include "lib/format/compress.h"

#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace qcow2::internal {
namespace {

// QEMU writes raw deflate (negative windowBits) with a 4 KiB window and reads
// with the same window. We write exactly that, and read with the largest
// window so streams from more generous writers decode too (a raw stream
// carries no window size, so a bigger window never rejects a valid stream).
constexpr int kDeflateWindowBits = -12;
constexpr int kInflateWindowBits = -15;
constexpr int kDeflateMemLevel = 9;

// Bounds the zstd decoder's window buffer (8 MiB). QEMU compresses one
// cluster (at most 2 MiB) with its size known up front, so its frames are
// single-segment with a window no larger than the cluster; this only rejects
// hostile frames that would make the decoder allocate up to 128 MiB.
constexpr int kZstdWindowLogMax = 23;

constexpr size_t kMaxZlibLength = std::numeric_limits<uInt>::max();

absl::Status ShortOutput(size_t produced, size_t expected,
                         absl::string_view why) {
  return absl::DataLossError(absl::StrCat("compressed cluster decompresses to ",
                                          produced, " bytes, expected ",
                                          expected, why));
}

// zlib's API takes non-const input pointers unless built with ZLIB_CONST.
Bytef* ZlibInput(absl::Span<const uint8_t> in) {
  return const_cast<Bytef*>(reinterpret_cast<const Bytef*>(in.data()));
}

// One z_stream per thread and direction, initialized on first use and reset
// before every call; inflateInit2/deflateInit2 allocate, the resets do not.
class Inflater {
 public:
  Inflater() = default;
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
  ~Inflater() {
    if (ready_) inflateEnd(&stream_);
  }

  // Returns a freshly reset stream, or nullptr when zlib is out of memory.
  z_stream* Acquire() {
    if (!ready_) {
      stream_ = z_stream{};
      if (inflateInit2(&stream_, kInflateWindowBits) != Z_OK) return nullptr;
      ready_ = true;
    } else if (inflateReset(&stream_) != Z_OK) {
      return nullptr;
    }
    return &stream_;
  }

 private:
  z_stream stream_{};
  bool ready_ = false;
};

class Deflater {
 public:
  Deflater() = default;
  Deflater(const Deflater&) = delete;
  Deflater& operator=(const Deflater&) = delete;
  ~Deflater() {
    if (ready_) deflateEnd(&stream_);
  }

  z_stream* Acquire() {
    if (!ready_) {
      stream_ = z_stream{};
      if (deflateInit2(&stream_, Z_DEFAULT_COMPRESSION, Z_DEFLATED,
                       kDeflateWindowBits, kDeflateMemLevel,
                       Z_DEFAULT_STRATEGY) != Z_OK) {
        return nullptr;
      }
      ready_ = true;
    } else if (deflateReset(&stream_) != Z_OK) {
      return nullptr;
    }
    return &stream_;
  }

 private:
  z_stream stream_{};
  bool ready_ = false;
};

class ZstdDecoder {
 public:
  ZstdDecoder() = default;
  ZstdDecoder(const ZstdDecoder&) = delete;
  ZstdDecoder& operator=(const ZstdDecoder&) = delete;
  ~ZstdDecoder() { ZSTD_freeDCtx(ctx_); }

  // Returns a context at the start of a fresh frame, or nullptr when out of
  // memory.
  ZSTD_DCtx* Acquire() {
    if (ctx_ == nullptr) {
      ZSTD_DCtx* ctx = ZSTD_createDCtx();
      if (ctx == nullptr) return nullptr;
      if (ZSTD_isError(ZSTD_DCtx_setParameter(ctx, ZSTD_d_windowLogMax,
                                              kZstdWindowLogMax))) {
        ZSTD_freeDCtx(ctx);
        return nullptr;
      }
      ctx_ = ctx;
    } else if (ZSTD_isError(ZSTD_DCtx_reset(ctx_, ZSTD_reset_session_only))) {
      return nullptr;
    }
    return ctx_;
  }

  // After a failed frame the context keeps state that a reset does not
  // clear (a later damaged frame could then be accepted): start over.
  void Discard() {
    ZSTD_freeDCtx(ctx_);
    ctx_ = nullptr;
  }

 private:
  ZSTD_DCtx* ctx_ = nullptr;
};

class ZstdEncoder {
 public:
  ZstdEncoder() = default;
  ZstdEncoder(const ZstdEncoder&) = delete;
  ZstdEncoder& operator=(const ZstdEncoder&) = delete;
  ~ZstdEncoder() { ZSTD_freeCCtx(ctx_); }

  // Returns a context with default parameters (level 3, content size in the
  // frame header, no checksum), or nullptr when out of memory.
  ZSTD_CCtx* Acquire() {
    if (ctx_ == nullptr) {
      ctx_ = ZSTD_createCCtx();
    } else if (ZSTD_isError(ZSTD_CCtx_reset(ctx_, ZSTD_reset_session_only))) {
      return nullptr;
    }
    return ctx_;
  }

 private:
  ZSTD_CCtx* ctx_ = nullptr;
};

absl::Status InflateCluster(absl::Span<const uint8_t> in,
                            absl::Span<uint8_t> out) {
  if (out.size() > kMaxZlibLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster of ", out.size(), " bytes is too large"));
  }
  thread_local Inflater inflater;
  z_stream* strm = inflater.Acquire();
  if (strm == nullptr) {
    return absl::ResourceExhaustedError("cannot allocate a zlib stream");
  }
  // A stream never needs more input than this for one cluster; anything
  // past it is trailing data.
  strm->next_in = ZlibInput(in);
  strm->avail_in = static_cast<uInt>(std::min(in.size(), kMaxZlibLength));
  strm->next_out = reinterpret_cast<Bytef*>(out.data());
  strm->avail_out = static_cast<uInt>(out.size());

  // One call does all the work: inflate() only returns when the stream ends,
  // the output is full, the input runs out or the data is corrupt.
  const int ret = inflate(strm, Z_FINISH);
  const size_t produced = out.size() - strm->avail_out;
  switch (ret) {
    case Z_STREAM_END:
      if (strm->avail_out == 0) return absl::OkStatus();
      return ShortOutput(produced, out.size(), "");
    case Z_OK:
    case Z_BUF_ERROR:
      // A full cluster with the stream still going is success: the
      // descriptor's length is only sector-granular, and a longer stream is
      // cut at one cluster.
      if (strm->avail_out == 0) return absl::OkStatus();
      return ShortOutput(produced, out.size(), " (compressed data truncated)");
    case Z_DATA_ERROR:
    case Z_NEED_DICT:
      return absl::DataLossError(
          absl::StrCat("corrupt zlib-compressed cluster: ",
                       strm->msg != nullptr ? strm->msg : "invalid data",
                       " after ", produced, " bytes of output"));
    case Z_MEM_ERROR:
      return absl::ResourceExhaustedError("zlib is out of memory");
    default:
      return absl::InternalError(
          absl::StrCat("zlib inflate failed with code ", ret));
  }
}

absl::Status ZstdDecompressCluster(absl::Span<const uint8_t> in,
                                   absl::Span<uint8_t> out) {
  thread_local ZstdDecoder decoder;
  ZSTD_DCtx* dctx = decoder.Acquire();
  if (dctx == nullptr) {
    return absl::ResourceExhaustedError("cannot allocate a zstd context");
  }
  ZSTD_inBuffer input{in.data(), in.size(), 0};
  ZSTD_outBuffer output{out.data(), out.size(), 0};
  // Whether the last call that made progress finished a frame.
  bool frame_done = false;
  while (output.pos < output.size) {
    const size_t in_before = input.pos;
    const size_t out_before = output.pos;
    const size_t ret = ZSTD_decompressStream(dctx, &output, &input);
    if (ZSTD_isError(ret)) {
      decoder.Discard();
      // Bytes after a complete frame that are not another frame are just
      // the sector padding: the frame was too short.
      if (frame_done) return ShortOutput(output.pos, out.size(), "");
      if (ZSTD_getErrorCode(ret) == ZSTD_error_memory_allocation) {
        return absl::ResourceExhaustedError("zstd is out of memory");
      }
      return absl::DataLossError(absl::StrCat(
          "corrupt zstd-compressed cluster: ", ZSTD_getErrorName(ret),
          " after ", output.pos, " bytes of output"));
    }
    if (input.pos == in_before && output.pos == out_before) {
      // Input exhausted (each call consumes or flushes all it can).
      decoder.Discard();
      return ShortOutput(output.pos, out.size(),
                         frame_done ? "" : " (compressed data truncated)");
    }
    // Like QEMU, a cluster split over several concatenated frames is
    // accepted, so a finished frame with room left is not yet an error.
    frame_done = ret == 0;
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> DeflateCluster(absl::Span<const uint8_t> in,
                                      absl::Span<uint8_t> out) {
  if (in.size() > kMaxZlibLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster of ", in.size(), " bytes is too large"));
  }
  thread_local Deflater deflater;
  z_stream* strm = deflater.Acquire();
  if (strm == nullptr) {
    return absl::ResourceExhaustedError("cannot allocate a zlib stream");
  }
  const uInt out_size = static_cast<uInt>(std::min(out.size(), kMaxZlibLength));
  strm->next_in = ZlibInput(in);
  strm->avail_in = static_cast<uInt>(in.size());
  strm->next_out = reinterpret_cast<Bytef*>(out.data());
  strm->avail_out = out_size;
  const int ret = deflate(strm, Z_FINISH);
  switch (ret) {
    case Z_STREAM_END:
      return static_cast<size_t>(out_size - strm->avail_out);
    case Z_OK:         // ran out of output space
    case Z_BUF_ERROR:  // no output space at all
      return 0;
    case Z_MEM_ERROR:
      return absl::ResourceExhaustedError("zlib is out of memory");
    default:
      return absl::InternalError(
          absl::StrCat("zlib deflate failed with code ", ret));
  }
}

absl::StatusOr<size_t> ZstdCompressCluster(absl::Span<const uint8_t> in,
                                           absl::Span<uint8_t> out) {
  thread_local ZstdEncoder encoder;
  ZSTD_CCtx* cctx = encoder.Acquire();
  if (cctx == nullptr) {
    return absl::ResourceExhaustedError("cannot allocate a zstd context");
  }
  // One frame, with the cluster size recorded in its header.
  const size_t ret =
      ZSTD_compress2(cctx, out.data(), out.size(), in.data(), in.size());
  if (!ZSTD_isError(ret)) return ret;
  switch (ZSTD_getErrorCode(ret)) {
    case ZSTD_error_dstSize_tooSmall:
      return 0;
    case ZSTD_error_memory_allocation:
      return absl::ResourceExhaustedError("zstd is out of memory");
    default:
      return absl::InternalError(
          absl::StrCat("zstd compression failed: ", ZSTD_getErrorName(ret)));
  }
}

absl::Status UnknownType(CompressionType type) {
  return absl::InvalidArgumentError(
      absl::StrCat("unknown compression type ", static_cast<int>(type)));
}

}  // namespace

absl::Status DecompressCluster(CompressionType type,
                               absl::Span<const uint8_t> in,
                               absl::Span<uint8_t> out) {
  if (out.empty()) {
    return absl::InvalidArgumentError("empty decompression buffer");
  }
  switch (type) {
    case CompressionType::kZlib:
      return InflateCluster(in, out);
    case CompressionType::kZstd:
      return ZstdDecompressCluster(in, out);
  }
  return UnknownType(type);
}

absl::StatusOr<size_t> CompressCluster(CompressionType type,
                                       absl::Span<const uint8_t> in,
                                       absl::Span<uint8_t> out) {
  if (out.empty()) return 0;
  switch (type) {
    case CompressionType::kZlib:
      return DeflateCluster(in, out);
    case CompressionType::kZstd:
      return ZstdCompressCluster(in, out);
  }
  return UnknownType(type);
}

}  // namespace qcow2::internal
