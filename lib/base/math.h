// SPDX-License-Identifier: Apache-2.0
// Alignment and overflow-checked arithmetic used across the library.
#ifndef QCOW2_LIB_BASE_MATH_H_
#define QCOW2_LIB_BASE_MATH_H_

#include <cstdint>

namespace qcow2::internal {

// REQUIRES: `align` is a power of two.
constexpr uint64_t AlignDown(uint64_t v, uint64_t align) {
  return v & ~(align - 1);
}
// REQUIRES: `align` is a power of two and v + align - 1 does not overflow.
constexpr uint64_t AlignUp(uint64_t v, uint64_t align) {
  return (v + align - 1) & ~(align - 1);
}
constexpr bool IsAligned(uint64_t v, uint64_t align) {
  return (v & (align - 1)) == 0;
}
constexpr uint64_t DivRoundUp(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}
// Sets *out = a + b; returns false on overflow.
inline bool AddOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_BASE_MATH_H_
