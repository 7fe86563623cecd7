// SPDX-License-Identifier: Apache-2.0
// `qcowtool bench --device /dev/X`: the block device that the measured
// images are written to, so that the library's own cost shows without a
// file system's first-write cost. A device is checked before anything is
// written to it: it must be a block device nobody holds (not mounted, not
// part of a device mapper or md array), and without --force it must not
// hold a file system, a partition table, LVM or LUKS metadata, swap or a
// qcow2 image.
#ifndef QCOW2_TOOLS_BENCH_DEVICE_H_
#define QCOW2_TOOLS_BENCH_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace qcow2::tool::bench {

// What the first blocks of a device say it holds ("" when nothing known).
// `head` is at least its first 128 KiB (shorter reads are fine: what they
// do not reach is not looked at).
std::string DescribeDeviceContents(const uint8_t* head, size_t len);

// Checks `path` as above; returns its size in bytes. kInvalidArgument
// (a usage error) names the device and what it holds.
absl::StatusOr<uint64_t> CheckBenchDevice(const std::string& path, bool force);

// Zeroes the first MiB (the qcow2 header the benchmark left), so that the
// next run does not take the device for someone's image.
absl::Status WipeBenchDevice(const std::string& path);

}  // namespace qcow2::tool::bench

#endif  // QCOW2_TOOLS_BENCH_DEVICE_H_
