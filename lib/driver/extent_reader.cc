// SPDX-License-Identifier: Apache-2.0
#include "lib/driver/extent_reader.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/format/compress.h"
#include "lib/format/entries.h"

namespace qcow2::internal {

absl::StatusOr<Extent> ExtentReader::Map(uint64_t offset, uint64_t max_len) {
  const Geometry& g = s_->geometry();
  max_len = std::min(max_len, s_->header.size - offset);
  uint64_t cluster = offset >> g.cluster_bits;
  if (!pending_->empty()) {
    // Clusters waiting for their L2 entry (deferred copy-on-write).
    if (const PendingIndex::Cluster* p = pending_->Find(cluster)) {
      return MapPending(*p, offset, max_len);
    }
    max_len = pending_->ClipAtPending(offset, max_len, g.cluster_bits);
  }
  ASSIGN_OR_RETURN(L2Ref ref, s_->map->Lookup(cluster));
  if (ref.slice == nullptr) {
    // No L2 table: unallocated up to the end of the table's coverage.
    uint64_t table_span = g.l2_entries << g.cluster_bits;
    uint64_t end = AlignDown(offset, table_span) + table_span;
    Extent e;
    e.kind = Extent::kUnallocated;
    e.length = std::min(max_len, end - offset);
    return e;
  }
  ASSIGN_OR_RETURN(Extent first, MapInCluster(ref, offset, max_len));
  // Extend across following clusters of the same slice while the run
  // continues with the same kind (and contiguous host offsets for data).
  uint64_t left = g.slice_entries - ref.index;
  uint64_t pos = offset + first.length;
  const bool plain_unallocated =
      first.kind == Extent::kUnallocated && !first.has_host_cluster;
  while (first.kind != Extent::kCompressed && first.length < max_len &&
         --left > 0 && IsAligned(pos, g.cluster_size)) {
    ref.index++;
    if (plain_unallocated && ref.entry() == 0 && ref.bitmap() == 0) {
      // An all-zero entry (and bitmap) is valid and unallocated: the
      // common case in a sparse overlay, taken without the full check.
      const uint64_t n = std::min(g.cluster_size, max_len - first.length);
      first.length += n;
      pos += n;
      continue;
    }
    ASSIGN_OR_RETURN(Extent next,
                     MapInCluster(ref, pos, max_len - first.length));
    if (next.kind != first.kind) break;
    if (first.kind == Extent::kData &&
        next.host_offset != first.host_offset + first.length) {
      break;
    }
    if ((first.kind == Extent::kZero || first.kind == Extent::kUnallocated) &&
        (next.has_host_cluster != first.has_host_cluster ||
         (first.has_host_cluster &&
          next.host_offset != first.host_offset + first.length))) {
      break;
    }
    first.length += next.length;
    pos += next.length;
  }
  return first;
}

absl::StatusOr<Extent> ExtentReader::MapPending(const PendingIndex::Cluster& p,
                                                uint64_t offset,
                                                uint64_t max_len) {
  constexpr uint64_t kUnit = PendingIndex::kFineLockBytes;
  const Geometry& g = s_->geometry();
  const uint64_t in_cluster = offset & (g.cluster_size - 1);
  const uint64_t units = g.cluster_size / kUnit;
  uint64_t u = in_cluster / kUnit;
  const bool covered = PendingIndex::TestBit(p.covered, u);
  while (u < units && PendingIndex::TestBit(p.covered, u) == covered) ++u;
  const uint64_t len = std::min(max_len, u * kUnit - in_cluster);
  if (!covered) {
    // What the L2 entry, still the old one, says of the rest.
    return MapInCluster(p.ref, offset, len);
  }
  Extent e;
  e.kind = Extent::kData;
  e.length = len;
  e.host_offset = p.host + in_cluster;
  return e;
}

absl::StatusOr<Extent> ExtentReader::MapInCluster(const L2Ref& ref,
                                                  uint64_t offset,
                                                  uint64_t max_len) {
  const Geometry& g = s_->geometry();
  const uint64_t entry = ref.entry();
  const uint64_t bitmap = ref.bitmap();
  const uint64_t in_cluster = offset & (g.cluster_size - 1);
  const uint64_t host = entry & kEntryOffsetMask;
  RETURN_IF_ERROR(guard_->ValidateEntry(entry, bitmap, offset));
  auto corrupt = [&](const std::string& why) {
    return s_->map->Corrupt(absl::StrFormat(
        "L2 entry 0x%016x%s for guest offset 0x%x %s", entry,
        g.extended_l2 ? absl::StrFormat(" (bitmap 0x%016x)", bitmap) : "",
        offset, why));
  };

  Extent e;
  if (entry & kOflagCompressed) {
    e.kind = Extent::kCompressed;
    e.entry = entry;
    e.length = std::min(max_len, g.cluster_size - in_cluster);
    return e;
  }

  int sc = static_cast<int>(in_cluster / g.subcluster_size);
  SubclusterType type = ClassifySubcluster(entry, bitmap, g.extended_l2, sc,
                                           s_->has_data_file());
  if (type == SubclusterType::kInvalid) {
    return corrupt("has an invalid subcluster bitmap");
  }
  // Extend over following subclusters of the same type.
  const uint64_t run_end =
      static_cast<uint64_t>(SubclusterRunEnd(bitmap, sc, g.subclusters)) *
      g.subcluster_size;
  e.length = std::min(max_len, run_end - in_cluster);
  switch (type) {
    case SubclusterType::kNormal:
      e.kind = Extent::kData;
      e.host_offset = host + in_cluster;
      break;
    case SubclusterType::kZeroAlloc:
      e.kind = Extent::kZero;
      e.has_host_cluster = true;
      e.host_offset = host + in_cluster;
      break;
    case SubclusterType::kZeroPlain:
      e.kind = Extent::kZero;
      break;
    case SubclusterType::kUnallocated:
      e.kind = Extent::kUnallocated;
      break;
    case SubclusterType::kUnallocatedAlloc:
      e.kind = Extent::kUnallocated;
      e.has_host_cluster = true;
      e.host_offset = host + in_cluster;
      break;
    default:
      return corrupt("is inconsistent");
  }
  return e;
}

absl::Status ExtentReader::ReadCompressed(uint64_t entry, uint8_t* out) {
  const Geometry& g = s_->geometry();
  CompressedExtent c = DecodeCompressed(entry, g.cluster_bits);
  std::vector<uint8_t> in(c.length);
  RETURN_IF_ERROR(s_->file->ReadAt(c.host_offset, absl::MakeSpan(in)));
  absl::Status s = DecompressCluster(
      static_cast<CompressionType>(s_->header.compression_type), in,
      absl::MakeSpan(out, g.cluster_size));
  if (!s.ok()) {
    return absl::DataLossError(
        absl::StrFormat("%s: compressed cluster at host offset 0x%x: %s",
                        s_->file->name(), c.host_offset, s.message()));
  }
  return absl::OkStatus();
}

absl::Status ExtentReader::CheckUnlocked() const {
  if (!s_->locked) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      s_->file->name(),
      ": the image is encrypted (LUKS) and was opened for its metadata only, "
      "without its key secret: its data cannot be read"));
}

absl::Status ExtentReader::ReadFromCompressed(uint64_t entry, uint64_t offset,
                                              absl::Span<uint8_t> buf) {
  RETURN_IF_ERROR(CheckUnlocked());
  const Geometry& g = s_->geometry();
  if (decompressed_.size() != g.cluster_size || decompressed_entry_ != entry) {
    decompressed_.resize(g.cluster_size);
    decompressed_entry_ = 0;
    RETURN_IF_ERROR(ReadCompressed(entry, decompressed_.data()));
    decompressed_entry_ = entry;
  }
  std::memcpy(buf.data(),
              decompressed_.data() + (offset & (g.cluster_size - 1)),
              buf.size());
  return absl::OkStatus();
}

absl::Status ExtentReader::PlanCompressedRead(uint64_t entry, uint64_t offset,
                                              uint8_t* dest, uint64_t len,
                                              IoPlan* plan,
                                              IoCategory category) {
  RETURN_IF_ERROR(CheckUnlocked());
  const Geometry& g = s_->geometry();
  const uint64_t in_cluster = offset & (g.cluster_size - 1);
  if (decompressed_entry_ == entry && decompressed_.size() == g.cluster_size) {
    std::memcpy(dest, decompressed_.data() + in_cluster, len);
    return absl::OkStatus();
  }
  // One decompression per cluster and plan: look for an earlier one. (A
  // plan's decompressions are keyed by this reader, one per layer.)
  for (const auto& d : plan->decompressed) {
    if (d.layer == this && d.entry == entry) {
      const uint8_t* src = d.cluster + in_cluster;
      plan->after_reads.push_back([dest, src, len] {
        std::memcpy(dest, src, len);
        return absl::OkStatus();
      });
      return absl::OkStatus();
    }
  }
  const CompressedExtent c = DecodeCompressed(entry, g.cluster_bits);
  uint8_t* in = plan->Buffer(c.length);
  uint8_t* cluster = plan->Buffer(g.cluster_size);
  plan->Read(s_->file.get(), c.host_offset, in, c.length, category,
             /*plain=*/true);
  plan->decompressed.push_back({this, entry, cluster});
  const auto type = static_cast<CompressionType>(s_->header.compression_type);
  const uint64_t cs = g.cluster_size;
  File* file = s_->file.get();
  plan->after_reads.push_back([=]() -> absl::Status {
    absl::Status s = DecompressCluster(type, absl::MakeConstSpan(in, c.length),
                                       absl::MakeSpan(cluster, cs));
    if (!s.ok()) {
      return absl::DataLossError(
          absl::StrFormat("%s: compressed cluster at host offset 0x%x: %s",
                          file->name(), c.host_offset, s.message()));
    }
    std::memcpy(dest, cluster + in_cluster, len);
    return absl::OkStatus();
  });
  // Remember the cluster for the next small read of it.
  plan->commits.push_back([this, entry, cluster, cs] {
    decompressed_.assign(cluster, cluster + cs);
    decompressed_entry_ = entry;
    return absl::OkStatus();
  });
  return absl::OkStatus();
}

}  // namespace qcow2::internal
