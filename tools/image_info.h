// SPDX-License-Identifier: Apache-2.0
// What `qcowtool info` says about one file of a chain, in qemu-img info's
// two layouts. Pure functions of their arguments.
#ifndef QCOW2_TOOLS_IMAGE_INFO_H_
#define QCOW2_TOOLS_IMAGE_INFO_H_

#include <cstdint>
#include <optional>
#include <string>

#include "qcow2/image.h"
#include "tools/json_writer.h"

namespace qcow2::tool {

struct ImageFacts {
  LayerInfo info;
  std::string name;  // as QEMU shows it (QemuChainNames)
  // st_blocks * 512 of the file; nullopt when stat() failed.
  std::optional<uint64_t> actual_size;
};

// The object `qemu-img info --output=json` prints for the image (QEMU's
// ImageInfo), except that "snapshots" is the number of internal snapshots
// (present only when there are some) instead of their list.
Json ImageInfoJson(const ImageFacts& facts);

// The block `qemu-img info` prints ("image: ...", "file format: ...", ...),
// each line ending in '\n'. Internal snapshots appear as one
// "Snapshot count: N" line where qemu-img prints its snapshot table.
std::string ImageInfoHuman(const ImageFacts& facts);

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_IMAGE_INFO_H_
