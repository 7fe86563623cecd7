// SPDX-License-Identifier: Apache-2.0
// The sizes `qemu-img measure` reports for a new image: what the file
// needs at least for the data given, and fully allocated. The formulas are
// QEMU's (qcow2_measure, qcow2_calc_prealloc_size, raw_measure), so that
// the numbers agree with qemu-img's to the byte.
#ifndef QCOW2_TOOLS_MEASURE_H_
#define QCOW2_TOOLS_MEASURE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "qcow2/options.h"

namespace qcow2::tool {

// The new image, as its creation options describe it.
struct MeasureTarget {
  ImageFormat format = ImageFormat::kQcow2;
  uint64_t cluster_size = 65536;
  bool extended_l2 = false;
  int version = 3;
  uint32_t refcount_bits = 16;
  Preallocation preallocation = Preallocation::kOff;
  bool has_backing_file = false;
  uint64_t size = 0;  // virtual size, when there is no source image
};

// The source image's part: its size and which of its bytes hold data.
struct MeasureSource {
  uint64_t size = 0;
  // Bytes of data clusters the copy needs, rounded out to whole clusters
  // of the new image (QEMU's walk over the source's block status).
  uint64_t data_bytes = 0;
  // Persistent bitmaps (name length, granularity), when the source can
  // carry them (qcow2 v3); nullopt when it cannot.
  struct Bitmap {
    size_t name_length = 0;
    uint64_t granularity = 0;
  };
  std::optional<std::vector<Bitmap>> bitmaps;
};

struct MeasureResult {
  uint64_t required = 0;
  uint64_t fully_allocated = 0;
  std::optional<uint64_t> bitmaps;  // shown only when both sides carry them
};

// kInvalidArgument when the size needs an L1 table over QEMU's 32 MiB.
absl::StatusOr<MeasureResult> Measure(const MeasureTarget& target,
                                      const MeasureSource* source);

// Bytes of refcount table and blocks that count `clusters` clusters and
// themselves (QEMU's qcow2_refcount_metadata_size without the generous
// increase).
uint64_t RefcountMetadataBytes(uint64_t clusters, uint64_t cluster_size,
                               uint32_t refcount_bits);

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_MEASURE_H_
