// SPDX-License-Identifier: Apache-2.0
// Big-endian load/store helpers for on-disk structures. qcow2 stores every
// integer big-endian; these never cast structs over buffers.
#ifndef QCOW2_LIB_BASE_ENDIAN_H_
#define QCOW2_LIB_BASE_ENDIAN_H_

#include <cstdint>
#include <cstring>

namespace qcow2::internal {

inline uint16_t LoadBE16(const uint8_t* p) {
  return static_cast<uint16_t>((p[0] << 8) | p[1]);
}
inline uint32_t LoadBE32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return __builtin_bswap32(v);
}
inline uint64_t LoadBE64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return __builtin_bswap64(v);
}
inline void StoreBE16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
inline void StoreBE32(uint8_t* p, uint32_t v) {
  v = __builtin_bswap32(v);
  std::memcpy(p, &v, 4);
}
inline void StoreBE64(uint8_t* p, uint64_t v) {
  v = __builtin_bswap64(v);
  std::memcpy(p, &v, 8);
}

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_BASE_ENDIAN_H_
