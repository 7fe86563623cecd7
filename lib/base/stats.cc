// SPDX-License-Identifier: Apache-2.0
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "qcow2/stats.h"

namespace qcow2 {

namespace {
constexpr size_t kFields = sizeof(IoStats) / sizeof(uint64_t);
static_assert(std::is_standard_layout_v<IoStats>);
static_assert(sizeof(IoStats) % sizeof(uint64_t) == 0);

const uint64_t* Fields(const IoStats& s) {
  return reinterpret_cast<const uint64_t*>(&s);
}
uint64_t* Fields(IoStats& s) { return reinterpret_cast<uint64_t*>(&s); }
}  // namespace

IoStats& IoStats::operator+=(const IoStats& o) {
  for (size_t i = 0; i < kFields; ++i) Fields(*this)[i] += Fields(o)[i];
  return *this;
}

IoStats IoStats::Since(const IoStats& before) const {
  IoStats out = *this;
  for (size_t i = 0; i < kFields; ++i) Fields(out)[i] -= Fields(before)[i];
  return out;
}

}  // namespace qcow2
