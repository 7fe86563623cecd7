// SPDX-License-Identifier: Apache-2.0
// The copy loop of qcowtool convert, as qemu-img convert runs it: the
// source's block status cut into chunks (2 MiB, or one target cluster
// when compressing), each read by one of N workers (-m) and written to the
// target in guest order (so that its clusters are allocated in order, as
// qemu-img's), the clusters that do not compress found beforehand by the
// workers; with -W each worker writes (compresses) its own chunks at
// once; zero runs of data found by sparse detection (-S) are left out (a target
// that reads as zeros) or written as zeros, ranges the target's backing
// file provides (-B) are left alone.
#ifndef QCOW2_TOOLS_CONVERT_COPY_H_
#define QCOW2_TOOLS_CONVERT_COPY_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "qcow2/image.h"

namespace qcow2::tool {

// Where convert writes: a qcow2 or raw image through the library, or a
// raw file or block device. Every method may be called from several
// threads at once, for different ranges.
class ConvertTarget {
 public:
  virtual ~ConvertTarget() = default;
  virtual absl::Status Write(uint64_t offset,
                             absl::Span<const uint8_t> data) = 0;
  // Makes the range read as zeros (freeing space where it can).
  virtual absl::Status WriteZeroes(uint64_t offset, uint64_t len) = 0;
  // One whole target cluster (or the disk's last part of one).
  virtual absl::Status WriteCompressed(uint64_t offset,
                                       absl::Span<const uint8_t> data) = 0;
  // Makes everything durable (and closes an image).
  virtual absl::Status Finish() = 0;
};

struct CopyOptions {
  // -S in bytes: zero runs at least this long (in aligned units of its
  // power-of-two floor) are not written as data; 0: everything is written,
  // zeros included (a fully allocated target).
  uint64_t min_sparse = 4096;
  // The target reads as zeros wherever nothing is written (a new image
  // with no backing file): zero ranges are skipped, not written.
  bool zero_init = true;
  // -B: the target has a backing file; ranges the source's top image does
  // not allocate are left to it (the source's top has a backing file), or
  // read as zeros (it has none).
  bool target_has_backing = false;
  // -c: every data cluster written compressed; `cluster_size` is the
  // target's cluster size.
  bool compressed = false;
  uint64_t cluster_size = 65536;
  CompressionType compression_type = CompressionType::kZlib;
  // -m and -W (out of order: each worker writes the chunks it read at
  // once).
  int workers = 8;
  bool out_of_order = false;
  // Called with each finished chunk's share of the disk, in percent,
  // under a lock (one call at a time).
  std::function<void(float)> progress;
};

// Copies the virtual disk of `source` into `target`. Stops at the first
// error (the others' writes in flight finish first), naming the offset.
absl::Status CopyImage(Image& source, ConvertTarget& target,
                       const CopyOptions& opts);

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_CONVERT_COPY_H_
