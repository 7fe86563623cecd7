// SPDX-License-Identifier: Apache-2.0
#include "tools/map_walk.h"

#include <utility>

namespace qcow2::tool {

bool Mergeable(const MapEntry& cur, const MapEntry& next) {
  if (cur.length == 0) return false;
  if (cur.zero != next.zero || cur.data != next.data ||
      cur.depth != next.depth || cur.present != next.present ||
      cur.offset.has_value() != next.offset.has_value()) {
    return false;
  }
  // Same depth means the same file, so the file names agree.
  return !cur.offset || *cur.offset + cur.length == *next.offset;
}

MapWalker::MapWalker(Image* image, std::vector<std::string> names)
    : image_(image),
      names_(std::move(names)),
      infos_(image->GetChainInfo()),
      layers_(infos_.size()) {}

const HostFile* MapWalker::HostFor(int depth) {
  Layer& l = layers_[depth];
  if (!l.checked) {
    l.checked = true;
    if (infos_[depth].format != ImageFormat::kQcow2) return nullptr;
    // Errors here only cost precision, as in QEMU: no digging.
    auto host = HostFile::Open(names_[depth]);
    if (!host.ok()) return nullptr;
    auto prealloc = DetectMetadataPreallocation(**host);
    if (!prealloc.ok() || !*prealloc) return nullptr;
    if (infos_[depth].has_data_file) {
      // The heuristic looks at the qcow2 file; the holes dug into are
      // the data file's, where the data is (QEMU's *file).
      host = HostFile::Open(infos_[depth].data_file);
      if (!host.ok()) return nullptr;
    }
    l.host = std::move(host).value();
  }
  return l.host.get();
}

absl::StatusOr<MapEntry> MapWalker::Get(uint64_t offset, uint64_t max_len) {
  absl::StatusOr<BlockStatus> bs = image_->GetBlockStatus(offset, max_len);
  if (!bs.ok()) return bs.status();
  MapEntry e;
  e.start = offset;
  e.length = bs->length;
  e.depth = bs->depth;
  e.present = bs->present;
  e.zero = bs->zero;
  e.data = bs->data;
  e.offset = bs->host_offset;

  if (!e.data || e.zero || !e.offset) return e;
  const HostFile* host = HostFor(e.depth);
  if (host == nullptr) return e;
  // bdrv_co_block_status(): the file's answer refines the format's.
  HostFile::Extent x = host->Probe(*e.offset, e.length);
  if (x.eof && (x.length == 0 || x.zero)) {
    e.zero = true;  // a format may read past the end of its file
  } else {
    e.length = x.length;
    e.zero = x.zero;
  }
  return e;
}

}  // namespace qcow2::tool
