// SPDX-License-Identifier: Apache-2.0
// In-memory images for the micro-benchmarks: qcow2 chains built through the
// public API on a MemoryFileSystem, and the header and L1 table of a file
// read back for benchmarks that drive internal classes directly.
#ifndef QCOW2_BENCH_MICRO_UTIL_H_
#define QCOW2_BENCH_MICRO_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/format/header.h"
#include "testing/memory_file.h"

namespace qcow2::bench {

struct MemChain {
  internal::MemoryFileSystem fs;
  std::vector<std::string> paths;  // bottom first; back() is the top
};

// Creates `depth` + 1 qcow2 images of `size` bytes, each backed by the one
// before. Layer i writes 4 KiB into every `stride`-th cluster starting at
// cluster i, so a map of the top alternates between layers.
absl::Status BuildChain(MemChain* chain, int depth, uint64_t size,
                        uint32_t cluster_size, uint64_t stride);

struct HeaderAndL1 {
  internal::Header header;
  std::vector<uint64_t> l1;  // host order
};

// Decodes the header and reads the L1 table of `path` in `fs`.
absl::StatusOr<HeaderAndL1> ReadHeaderAndL1(internal::MemoryFileSystem& fs,
                                            const std::string& path);

}  // namespace qcow2::bench

#endif  // QCOW2_BENCH_MICRO_UTIL_H_
