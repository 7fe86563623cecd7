// SPDX-License-Identifier: Apache-2.0
// Small helpers shared by the fuzz targets.
#ifndef QCOW2_FUZZ_FUZZ_UTIL_H_
#define QCOW2_FUZZ_FUZZ_UTIL_H_

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "testing/memory_file.h"

namespace qcow2::fuzz {

// Reports a broken invariant and aborts, which libFuzzer records as a crash
// (the input is saved as an artifact).
[[noreturn]] inline void Die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "\nFUZZ INVARIANT BROKEN: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
  abort();
}

inline uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Bytes determined by `seed`, all odd, so never zero (written data is never
// mistaken for zeros or for a stale cluster of another write).
inline void FillPattern(uint64_t seed, absl::Span<uint8_t> out) {
  uint64_t state = seed;
  uint8_t* p = out.data();
  size_t left = out.size();
  while (left > 0) {
    const uint64_t v = SplitMix64(&state) | 0x0101010101010101ull;
    const size_t n = left < 8 ? left : 8;
    std::memcpy(p, &v, n);
    p += n;
    left -= n;
  }
}

// Index of the first differing byte, or -1.
inline int64_t FirstDifference(absl::Span<const uint8_t> a,
                               absl::Span<const uint8_t> b) {
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  if (std::memcmp(a.data(), b.data(), n) == 0) {
    return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
  }
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return static_cast<int64_t>(n);
}

// A copy of the bytes of an in-memory file.
inline std::vector<uint8_t> Snapshot(internal::MemoryStore& store) {
  std::lock_guard<std::mutex> lock(store.mu);
  return store.bytes;
}

inline void SetBytes(internal::MemoryStore& store, const uint8_t* data,
                     size_t size) {
  std::lock_guard<std::mutex> lock(store.mu);
  store.bytes.assign(data, data + size);
}

}  // namespace qcow2::fuzz

#endif  // QCOW2_FUZZ_FUZZ_UTIL_H_
