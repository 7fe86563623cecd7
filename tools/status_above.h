// SPDX-License-Identifier: Apache-2.0
// The block status `qemu-img compare` sees: QEMU's bdrv_block_status_above()
// flags for a range of an image's virtual disk, with the range split where
// QEMU splits it. Two images compare equal under `compare -s` only when
// these flags agree range by range, so the splitting matters: QEMU reports
// the end of the disk as a flag (BDRV_BLOCK_EOF) of the last range, and a
// qcow2 layer never reports a range across one of its L2 tables.
//
//   StatusAbove walker(image.get(), names);
//   auto r = walker.Get(offset);  // flags and length of the range there
#ifndef QCOW2_TOOLS_STATUS_ABOVE_H_
#define QCOW2_TOOLS_STATUS_ABOVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "qcow2/image.h"
#include "tools/map_walk.h"

namespace qcow2::tool {

// QEMU's BDRV_BLOCK_* bits, as far as compare looks at them.
inline constexpr unsigned kStatusData = 0x01;
inline constexpr unsigned kStatusZero = 0x02;
inline constexpr unsigned kStatusOffsetValid = 0x04;
inline constexpr unsigned kStatusAllocated = 0x10;
inline constexpr unsigned kStatusEof = 0x20;

struct StatusRange {
  uint64_t length = 0;
  unsigned flags = 0;  // kStatus* bits
};

class StatusAbove {
 public:
  // `names`: the chain's file names as QEMU prints them (QemuChainNames).
  // `image` must outlive the walker.
  StatusAbove(Image* image, std::vector<std::string> names);

  // The range starting at `offset` (to the end of the disk at most).
  // REQUIRES: offset < image size.
  absl::StatusOr<StatusRange> Get(uint64_t offset);

 private:
  // The first offset after `offset` where a qcow2 layer among the top
  // `depth + 1` starts a new L2 table.
  uint64_t TableBoundary(uint64_t offset, int depth) const;
  unsigned Flags(const MapEntry& e) const;

  Image* image_;
  std::vector<LayerInfo> infos_;
  MapWalker walker_;
  // The last range found: a later offset inside it has the same status to
  // the same end (as QEMU would find it again), without a new walk.
  uint64_t last_start_ = 0;
  uint64_t last_end_ = 0;
  unsigned last_flags_ = 0;
};

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_STATUS_ABOVE_H_
