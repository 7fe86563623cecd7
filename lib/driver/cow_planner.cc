// SPDX-License-Identifier: Apache-2.0
// Copy-on-write planning: the old contents of a range, and whether they
// are known zeros (cow_planner.h).
#include "lib/driver/cow_planner.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "lib/base/events.h"
#include "lib/base/status_macros.h"
#include "lib/format/entries.h"

namespace qcow2::internal {

namespace {

// Calls fn(type, pos, in_cluster, n) for each piece of guest range
// [offset, +len) inside one cluster that lies in a single subcluster:
// its type under `entry`/`bitmap`, where it starts in the range and in the
// cluster, and its length. Stops at the first error fn returns.
template <typename Fn>
absl::Status ForEachSubcluster(const Geometry& g, bool data_file,
                               uint64_t entry, uint64_t bitmap,
                               uint64_t offset, uint64_t len, Fn fn) {
  uint64_t n = 0;
  for (uint64_t pos = 0; pos < len; pos += n) {
    const uint64_t in_cluster = (offset + pos) & (g.cluster_size - 1);
    const int sc = static_cast<int>(in_cluster / g.subcluster_size);
    n = std::min<uint64_t>(len - pos,
                           (sc + 1) * g.subcluster_size - in_cluster);
    RETURN_IF_ERROR(
        fn(ClassifySubcluster(entry, bitmap, g.extended_l2, sc, data_file),
           pos, in_cluster, n));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CowPlanner::PlanReadOld(uint64_t entry, uint64_t bitmap,
                                     uint64_t offset, uint8_t* dest,
                                     uint64_t len, IoPlan* plan) {
  const Geometry& g = s_->geometry();
  if (len == 0) return absl::OkStatus();
  if (entry & kOflagCompressed) {
    // Head and tail of one copy-on-write share a single decompression.
    return reader_->PlanCompressedRead(entry, offset, dest, len, plan,
                                       IoCategory::kCow);
  }
  const uint64_t host = entry & kEntryOffsetMask;
  return ForEachSubcluster(
      g, s_->has_data_file(), entry, bitmap, offset, len,
      [&](SubclusterType type, uint64_t pos, uint64_t in_cluster,
          uint64_t n) -> absl::Status {
        switch (type) {
          case SubclusterType::kNormal:
            plan->Read(s_->data(), host + in_cluster, dest + pos, n,
                       IoCategory::kCow);
            return absl::OkStatus();
          case SubclusterType::kZeroPlain:
          case SubclusterType::kZeroAlloc:
            std::memset(dest + pos, 0, n);
            return absl::OkStatus();
          case SubclusterType::kUnallocated:
          case SubclusterType::kUnallocatedAlloc:
            if (!backing_) {
              std::memset(dest + pos, 0, n);
              return absl::OkStatus();
            }
            EmitEvent("cow-read");
            return backing_(offset + pos, dest + pos, n, plan);
          default:
            return s_->map->Corrupt(absl::StrFormat(
                "L2 entry 0x%016x for guest offset 0x%x is invalid", entry,
                offset + pos));
        }
      });
}

absl::StatusOr<bool> CowPlanner::KnownZero(uint64_t entry, uint64_t bitmap,
                                           uint64_t offset, uint64_t len) {
  if (entry & kOflagCompressed) return len == 0;
  bool zero = true;
  RETURN_IF_ERROR(ForEachSubcluster(
      s_->geometry(), s_->has_data_file(), entry, bitmap, offset, len,
      [&](SubclusterType type, uint64_t pos, uint64_t, uint64_t n) {
        if (!zero) return absl::OkStatus();
        switch (type) {
          case SubclusterType::kZeroPlain:
          case SubclusterType::kZeroAlloc:
            return absl::OkStatus();
          case SubclusterType::kUnallocated:
          case SubclusterType::kUnallocatedAlloc:
            if (backing_zero_) {
              absl::StatusOr<bool> below = backing_zero_(offset + pos, n);
              if (!below.ok()) return below.status();
              zero = *below;
            }
            return absl::OkStatus();
          default:
            zero = false;
            return absl::OkStatus();
        }
      }));
  return zero;
}

}  // namespace qcow2::internal
