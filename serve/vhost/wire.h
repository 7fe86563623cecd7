// SPDX-License-Identifier: Apache-2.0
// Little-endian loads and stores for the vhost-user and virtio layouts
// (both little-endian whatever the host; memcpy keeps them alignment-safe).
#ifndef QCOW2_SERVE_VHOST_WIRE_H_
#define QCOW2_SERVE_VHOST_WIRE_H_

#include <endian.h>

#include <cstdint>
#include <cstring>

namespace qcow2::vhost {

inline uint16_t LoadLe16(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return le16toh(v);
}
inline uint32_t LoadLe32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return le32toh(v);
}
inline uint64_t LoadLe64(const void* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return le64toh(v);
}
inline void StoreLe16(void* p, uint16_t v) {
  v = htole16(v);
  std::memcpy(p, &v, sizeof v);
}
inline void StoreLe32(void* p, uint32_t v) {
  v = htole32(v);
  std::memcpy(p, &v, sizeof v);
}
inline void StoreLe64(void* p, uint64_t v) {
  v = htole64(v);
  std::memcpy(p, &v, sizeof v);
}

}  // namespace qcow2::vhost

#endif  // QCOW2_SERVE_VHOST_WIRE_H_
