// SPDX-License-Identifier: Apache-2.0
// What `qcowtool info` says about one file of a chain, in qemu-img info's
// two layouts. Pure functions of their arguments.
#ifndef QCOW2_TOOLS_IMAGE_INFO_H_
#define QCOW2_TOOLS_IMAGE_INFO_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qcow2/image.h"
#include "tools/json_writer.h"

namespace qcow2::tool {

// QEMU's name of the format ("qcow2", "raw").
const char* FormatName(ImageFormat f);

struct ImageFacts {
  LayerInfo info;
  std::string name;  // as QEMU shows it (QemuChainNames)
  // st_blocks * 512 of the file; nullopt when stat() failed.
  std::optional<uint64_t> actual_size;
};

// The object `qemu-img info --output=json` prints for the image (QEMU's
// ImageInfo), "snapshots" (present only when there are some) included.
Json ImageInfoJson(const ImageFacts& facts);

// The block `qemu-img info` prints ("image: ...", "file format: ...", ...),
// each line ending in '\n', the snapshot list included.
std::string ImageInfoHuman(const ImageFacts& facts);

// The internal snapshots as `qemu-img snapshot -l` prints them: "Snapshot
// list:", the column header, one line per snapshot (dates in local time).
// Empty for no snapshots.
std::string SnapshotListText(const std::vector<SnapshotInfo>& snapshots);

// One entry of the "snapshots" array of `qemu-img info --output=json`
// (QEMU's SnapshotInfo; "icount" only when recorded).
Json SnapshotJson(const SnapshotInfo& sn);

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_IMAGE_INFO_H_
