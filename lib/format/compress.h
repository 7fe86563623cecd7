// SPDX-License-Identifier: Apache-2.0
// The qcow2 compressed-cluster codec: one guest cluster in, a compressed
// stream out, and back. Compatible with QEMU's qcow2 driver:
//   - kZlib: a raw deflate stream (no zlib header or trailer), written with
//     a 4 KiB window (windowBits 12) like QEMU; any window is accepted when
//     reading.
//   - kZstd: one zstd frame.
// A compressed descriptor only records its length in 512-byte sectors, so
// the bytes handed to DecompressCluster usually run past the end of the
// stream; the surplus is ignored.
//
// Both functions are thread-safe: the compression contexts are per thread
// and no other state is shared.
#ifndef QCOW2_LIB_FORMAT_COMPRESS_H_
#define QCOW2_LIB_FORMAT_COMPRESS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "qcow2/options.h"

namespace qcow2::internal {

// Decompresses the compressed cluster `in` (the descriptor's whole sector
// span as read from the image; trailing bytes past the end of the stream are
// ignored) into `out`, which is exactly one cluster. Fills all of `out` or
// fails; never writes past it: a stream that would decompress to more than
// out.size() bytes is cut off there.
//
// Errors: DataLossError when the stream is corrupt, truncated or decompresses
// to fewer than out.size() bytes; InvalidArgumentError for an unknown type
// or an empty `out`; ResourceExhaustedError when a context cannot be
// allocated.
absl::Status DecompressCluster(CompressionType type,
                               absl::Span<const uint8_t> in,
                               absl::Span<uint8_t> out);

// Compresses the cluster `in` into `out` and returns the compressed length
// (at most out.size()). Returns 0 when the compressed stream does not fit in
// `out`; the caller then stores the cluster uncompressed. Callers normally
// pass out.size() == in.size() - 1 or smaller so that compression only
// happens when it saves space.
//
// Errors: InvalidArgumentError for an unknown type or oversized input;
// ResourceExhaustedError when a context cannot be allocated; InternalError
// when the compressor itself fails.
absl::StatusOr<size_t> CompressCluster(CompressionType type,
                                       absl::Span<const uint8_t> in,
                                       absl::Span<uint8_t> out);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_FORMAT_COMPRESS_H_
