// SPDX-License-Identifier: Apache-2.0
// The ranges `qemu-img map` reports for an image: libqcow2's BlockStatus,
// plus what QEMU additionally learns from the host file of a qcow2 image
// that looks metadata-preallocated (tools/host_probe.h): data clusters
// over holes in the file, or past its end, also read as zero.
//
//   MapWalker walker(image.get(), names);
//   auto e = walker.Get(offset, max_len);  // one range, not yet merged
//   if (Mergeable(prev, *e)) ...
#ifndef QCOW2_TOOLS_MAP_WALK_H_
#define QCOW2_TOOLS_MAP_WALK_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "qcow2/image.h"
#include "tools/host_probe.h"

namespace qcow2::tool {

// One line of `qemu-img map` (QEMU's MapEntry).
struct MapEntry {
  uint64_t start = 0;
  uint64_t length = 0;
  int depth = 0;
  bool present = false;
  bool zero = false;
  bool data = false;
  std::optional<uint64_t> offset;  // host offset in the layer at `depth`
};

// QEMU's entry_mergeable(): `next` continues `cur` with the same status
// (and contiguous host offsets when both have one).
bool Mergeable(const MapEntry& cur, const MapEntry& next);

class MapWalker {
 public:
  // `names`: the chain's file names as QEMU prints them, top first (see
  // QemuChainNames). `image` must outlive the walker.
  MapWalker(Image* image, std::vector<std::string> names);

  // The status of the range at `offset`, at most `max_len` bytes.
  // REQUIRES: offset < image size.
  absl::StatusOr<MapEntry> Get(uint64_t offset, uint64_t max_len);

 private:
  struct Layer {
    bool checked = false;            // `host` decided
    std::unique_ptr<HostFile> host;  // null: QEMU would not look below
  };
  // The host file QEMU digs into for layer `depth`, or nullptr (raw
  // layers: libqcow2 already reports their holes).
  const HostFile* HostFor(int depth);

  Image* image_;
  std::vector<std::string> names_;
  std::vector<LayerInfo> infos_;
  std::vector<Layer> layers_;
};

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_MAP_WALK_H_
