// Preallocation of a new qcow2 image (metadata, falloc, full).
#include <algorithm>
#include <vector>

#include "lib/format/entries.h"
#include "lib/qcow2/qcow2_layer.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

absl::Status Qcow2Layer::Preallocate(Preallocation mode) {
  RETURN_IF_ERROR(PrepareWrite());
  const Geometry& g = map_->geometry();
  const uint64_t clusters = DivRoundUp(header_.size, g.cluster_size);
  uint64_t data_end = 0;
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // host offset, bytes
  // Over a backing file, preallocated subclusters stay unallocated (they
  // read from the backing file until written), as qemu-img does.
  const uint64_t bitmap =
      !g.extended_l2 ? 0 : (header_.backing_file.empty() ? 0xffffffffull : 0);
  for (uint64_t c = 0; c < clusters;) {
    const uint64_t n =
        std::min(clusters - c, g.l2_entries - c % g.l2_entries);
    RETURN_IF_ERROR(L2ForWrite(c).status());
    ASSIGN_OR_RETURN(uint64_t host, refcounts_->Allocate(n));
    RETURN_IF_ERROR(CheckDataTarget(host, n * g.cluster_size));
    RETURN_IF_ERROR(OrderL2AfterAllocation());
    for (uint64_t i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN(L2Ref ref, map_->Lookup(c + i));
      ref.Set((host + i * g.cluster_size) | kOflagCopied, bitmap);
    }
    runs.push_back({host, n * g.cluster_size});
    data_end = std::max(data_end, host + n * g.cluster_size);
    c += n;
  }
  ASSIGN_OR_RETURN(uint64_t file_size, file_->Size());
  if (data_end > file_size) RETURN_IF_ERROR(file_->Truncate(data_end));
  for (const auto& [host, len] : runs) {
    if (mode == Preallocation::kFalloc) {
      RETURN_IF_ERROR(file_->Allocate(host, len));
    } else if (mode == Preallocation::kFull) {
      std::vector<uint8_t> zeros(std::min<uint64_t>(len, 1 << 20), 0);
      for (uint64_t off = 0; off < len; off += zeros.size()) {
        const uint64_t n = std::min<uint64_t>(zeros.size(), len - off);
        RETURN_IF_ERROR(
            file_->WriteAt(host + off, absl::MakeConstSpan(zeros.data(), n)));
      }
    }
  }
  return Flush();
}

}  // namespace qcow2::internal
