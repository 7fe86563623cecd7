// SPDX-License-Identifier: Apache-2.0
#include "serve/vhost/blk.h"

#include <linux/virtio_blk.h>
#include <linux/virtio_config.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "absl/status/status.h"
#include "serve/vhost/wire.h"

namespace qcow2::vhost {
namespace {

// Copies up to `len` bytes from the front of `iov`, skipping `skip` bytes.
size_t Gather(const std::vector<iovec>& iov, size_t skip, void* dst,
              size_t len) {
  auto* out = static_cast<uint8_t*>(dst);
  size_t done = 0;
  for (const iovec& v : iov) {
    if (done == len) break;
    if (skip >= v.iov_len) {
      skip -= v.iov_len;
      continue;
    }
    const size_t n = std::min(v.iov_len - skip, len - done);
    std::memcpy(out + done, static_cast<uint8_t*>(v.iov_base) + skip, n);
    done += n;
    skip = 0;
  }
  return done;
}

// The iovecs of `iov` from byte `from` for `len` bytes.
std::vector<iovec> Slice(const std::vector<iovec>& iov, uint64_t from,
                         uint64_t len) {
  std::vector<iovec> out;
  for (const iovec& v : iov) {
    if (len == 0) break;
    if (from >= v.iov_len) {
      from -= v.iov_len;
      continue;
    }
    const uint64_t n = std::min<uint64_t>(v.iov_len - from, len);
    out.push_back({static_cast<uint8_t*>(v.iov_base) + from, n});
    len -= n;
    from = 0;
  }
  return out;
}

}  // namespace

uint64_t BlkFeatures(const BlkGeometry& g) {
  uint64_t f = (1ull << VIRTIO_BLK_F_SIZE_MAX) | (1ull << VIRTIO_BLK_F_SEG_MAX) |
               (1ull << VIRTIO_BLK_F_BLK_SIZE) | (1ull << VIRTIO_BLK_F_TOPOLOGY) |
               (1ull << VIRTIO_BLK_F_FLUSH) | (1ull << VIRTIO_BLK_F_CONFIG_WCE) |
               (1ull << VIRTIO_BLK_F_MQ);
  if (g.read_only) {
    f |= 1ull << VIRTIO_BLK_F_RO;
  } else if (g.discard) {
    f |= (1ull << VIRTIO_BLK_F_DISCARD) | (1ull << VIRTIO_BLK_F_WRITE_ZEROES);
  }
  return f;
}

std::vector<uint8_t> BlkConfig(const BlkGeometry& g, bool writeback) {
  std::vector<uint8_t> c(sizeof(virtio_blk_config), 0);
  auto at = [&](size_t off) { return c.data() + off; };
  StoreLe64(at(offsetof(virtio_blk_config, capacity)),
            g.capacity_bytes / kSectorSize);
  StoreLe32(at(offsetof(virtio_blk_config, size_max)), kSizeMax);
  StoreLe32(at(offsetof(virtio_blk_config, seg_max)), kSegMax);
  StoreLe32(at(offsetof(virtio_blk_config, blk_size)), kBlkSize);
  StoreLe16(at(offsetof(virtio_blk_config, min_io_size)), 1);
  StoreLe32(at(offsetof(virtio_blk_config, opt_io_size)), 1);
  *at(offsetof(virtio_blk_config, wce)) = writeback ? 1 : 0;
  StoreLe16(at(offsetof(virtio_blk_config, num_queues)), g.num_queues);
  StoreLe32(at(offsetof(virtio_blk_config, max_discard_sectors)),
            kMaxDiscardSectors);
  StoreLe32(at(offsetof(virtio_blk_config, max_discard_seg)), 1);
  StoreLe32(at(offsetof(virtio_blk_config, discard_sector_alignment)),
            kBlkSize / kSectorSize);
  StoreLe32(at(offsetof(virtio_blk_config, max_write_zeroes_sectors)),
            kMaxWriteZeroesSectors);
  StoreLe32(at(offsetof(virtio_blk_config, max_write_zeroes_seg)), 1);
  *at(offsetof(virtio_blk_config, write_zeroes_may_unmap)) = 1;
  return c;
}

absl::StatusOr<BlkRequest> ParseBlkRequest(const Chain& chain) {
  uint8_t hdr[16];
  if (Gather(chain.readable, 0, hdr, sizeof hdr) != sizeof hdr) {
    return absl::InvalidArgumentError(
        "virtio-blk: request without a 16-byte header");
  }
  if (chain.writable_bytes == 0) {
    return absl::InvalidArgumentError("virtio-blk: request without a status byte");
  }
  BlkRequest r;
  r.type = LoadLe32(hdr);
  r.sector = LoadLe64(hdr + 8);
  const iovec& last = chain.writable.back();  // the status byte ends it
  r.status = static_cast<uint8_t*>(last.iov_base) + last.iov_len - 1;
  if (r.type == VIRTIO_BLK_T_IN || r.type == VIRTIO_BLK_T_GET_ID) {
    r.data_bytes = chain.writable_bytes - 1;
    r.data = Slice(chain.writable, 0, r.data_bytes);
  } else {
    r.data_bytes = chain.readable_bytes - sizeof hdr;
    r.data = Slice(chain.readable, sizeof hdr, r.data_bytes);
  }
  return r;
}

bool ParseRanges(const BlkRequest& req, std::vector<BlkRange>* out) {
  out->clear();
  if (req.data_bytes == 0 || req.data_bytes % 16 != 0) return false;
  for (uint64_t off = 0; off < req.data_bytes; off += 16) {
    uint8_t seg[16];
    Gather(req.data, off, seg, sizeof seg);
    out->push_back({LoadLe64(seg), LoadLe32(seg + 8), LoadLe32(seg + 12)});
    if (out->size() > 256) return false;  // never more than max_*_seg asks
  }
  return true;
}

size_t CopyToIov(const std::vector<iovec>& iov, const void* src, size_t len) {
  const auto* in = static_cast<const uint8_t*>(src);
  size_t done = 0;
  for (const iovec& v : iov) {
    if (done == len) break;
    const size_t n = std::min(v.iov_len, len - done);
    std::memcpy(v.iov_base, in + done, n);
    done += n;
  }
  return done;
}

}  // namespace qcow2::vhost
