// SPDX-License-Identifier: Apache-2.0
// A loop device over a file of junk, for tests of block devices. Needs
// root (losetup); where the machine does not allow it, path() is empty and
// why() says why, and the test skips.
#ifndef QCOW2_TESTS_UTIL_LOOP_DEVICE_H_
#define QCOW2_TESTS_UTIL_LOOP_DEVICE_H_

#include <cstdint>
#include <string>

namespace qcow2::testing {

class LoopDevice {
 public:
  // Writes `bytes` bytes of `fill` to `backing`, then attaches it.
  LoopDevice(const std::string& backing, uint64_t bytes, uint8_t fill = 0xa5);
  // Detaches the device.
  ~LoopDevice();
  LoopDevice(const LoopDevice&) = delete;
  LoopDevice& operator=(const LoopDevice&) = delete;

  const std::string& path() const { return path_; }
  const std::string& why() const { return why_; }

 private:
  std::string path_;
  std::string why_;
};

}  // namespace qcow2::testing

#endif  // QCOW2_TESTS_UTIL_LOOP_DEVICE_H_
