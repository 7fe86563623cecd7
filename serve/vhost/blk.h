// SPDX-License-Identifier: Apache-2.0
// virtio-blk (virtio 1.x, 5.2) on top of a popped chain: the request
// header, the data segments, the status byte, the discard and
// write-zeroes segments, and the device's config space and features.
// Pure functions over iovecs: no I/O here.
#ifndef QCOW2_SERVE_VHOST_BLK_H_
#define QCOW2_SERVE_VHOST_BLK_H_

#include <sys/uio.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "serve/vhost/split_ring.h"

namespace qcow2::vhost {

// What the device offers and how its config space reads.
struct BlkGeometry {
  uint64_t capacity_bytes = 0;
  uint16_t num_queues = 1;
  bool read_only = false;
  bool discard = true;  // offer DISCARD and WRITE_ZEROES (writable only)
};

inline constexpr uint32_t kSectorSize = 512;
inline constexpr uint32_t kBlkSize = 512;
inline constexpr uint32_t kSegMax = 128 - 2;
inline constexpr uint32_t kSizeMax = 1u << 20;
inline constexpr uint32_t kMaxDiscardSectors = 32768;
inline constexpr uint32_t kMaxWriteZeroesSectors = 32768;
inline constexpr size_t kIdBytes = 20;  // VIRTIO_BLK_ID_BYTES

// The virtio feature bits the device offers (without the transport and
// vhost-user bits, which the device adds).
uint64_t BlkFeatures(const BlkGeometry& g);
// The config space (struct virtio_blk_config, little-endian) as of now;
// `writeback` is the WCE byte.
std::vector<uint8_t> BlkConfig(const BlkGeometry& g, bool writeback);

// One request taken apart. The iovecs point into guest memory.
struct BlkRequest {
  uint32_t type = 0;
  uint64_t sector = 0;
  std::vector<iovec> data;   // OUT: readable bytes after the header;
                             // IN and GET_ID: writable bytes before status
  uint64_t data_bytes = 0;
  uint8_t* status = nullptr; // the last writable byte
};

// kInvalidArgument when the chain has no room for the 16-byte header or
// the status byte (a request the device cannot even fail).
absl::StatusOr<BlkRequest> ParseBlkRequest(const Chain& chain);

// A discard or write-zeroes segment (struct virtio_blk_discard_write_zeroes).
struct BlkRange {
  uint64_t sector = 0;
  uint32_t num_sectors = 0;
  uint32_t flags = 0;
};
// The segments of a DISCARD or WRITE_ZEROES request's data; false when the
// data is not a whole number of 16-byte segments.
bool ParseRanges(const BlkRequest& req, std::vector<BlkRange>* out);

// Copies `len` bytes from `src` into iovecs (GET_ID); returns bytes copied.
size_t CopyToIov(const std::vector<iovec>& iov, const void* src, size_t len);

}  // namespace qcow2::vhost

#endif  // QCOW2_SERVE_VHOST_BLK_H_
