// SPDX-License-Identifier: Apache-2.0
#include "testing/rng.h"

#include <cstdint>

namespace qcow2::testing {

uint64_t TestRng::Next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t TestRng::Uniform(uint64_t n) {
  if (n == 0) return 0;
  // Rejection sampling keeps it exactly uniform.
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = Next();
  } while (x >= limit);
  return x % n;
}

uint64_t TestRng::Range(uint64_t lo, uint64_t hi) {
  if (hi <= lo) return lo;
  if (hi - lo == UINT64_MAX) return Next();
  return lo + Uniform(hi - lo + 1);
}

}  // namespace qcow2::testing
