// SPDX-License-Identifier: Apache-2.0
// A deterministic pseudo-random generator for tests and models.
#ifndef QCOW2_TESTING_RNG_H_
#define QCOW2_TESTING_RNG_H_

#include <cstdint>

namespace qcow2::testing {

// A deterministic generator (splitmix64): the same seed gives the same
// sequence on every platform and standard library.
class TestRng {
 public:
  explicit TestRng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, n); 0 when n == 0.
  uint64_t Uniform(uint64_t n);
  // Uniform in [lo, hi] (inclusive).
  uint64_t Range(uint64_t lo, uint64_t hi);
  bool OneIn(uint64_t n) { return Uniform(n) == 0; }

 private:
  uint64_t state_;
};

}  // namespace qcow2::testing

#endif  // QCOW2_TESTING_RNG_H_
