// SPDX-License-Identifier: Apache-2.0
#include "tests/util/loop_device.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/strip.h"
#include "tests/util/test_util.h"

namespace qcow2::testing {

LoopDevice::LoopDevice(const std::string& backing, uint64_t bytes,
                       uint8_t fill) {
  FILE* f = std::fopen(backing.c_str(), "w");
  if (f == nullptr) {
    why_ = "cannot create " + backing;
    return;
  }
  constexpr uint64_t kChunk = 1 << 20;
  std::vector<uint8_t> junk(kChunk, fill);
  for (uint64_t i = 0; i < bytes; i += kChunk) {
    std::fwrite(junk.data(), 1, std::min(kChunk, bytes - i), f);
  }
  std::fclose(f);
  CommandResult r = Run({"losetup", "-f", "--show", backing});
  if (r.exit_code != 0) {
    why_ = r.err;
    return;
  }
  path_ = std::string(absl::StripTrailingAsciiWhitespace(r.out));
}

LoopDevice::~LoopDevice() {
  if (!path_.empty()) Run({"losetup", "-d", path_});
}

}  // namespace qcow2::testing
