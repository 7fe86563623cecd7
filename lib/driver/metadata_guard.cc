// SPDX-License-Identifier: Apache-2.0
#include "lib/driver/metadata_guard.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"
#include "lib/base/math.h"
#include "lib/format/entries.h"

namespace qcow2::internal {

namespace {

// What is wrong with an extended entry's subcluster bitmap, or null.
const char* BitmapProblem(bool extended, bool has_host, uint64_t bitmap) {
  if (!extended) return nullptr;
  const uint32_t alloc = static_cast<uint32_t>(bitmap);
  const uint32_t zero = static_cast<uint32_t>(bitmap >> 32);
  if ((alloc & zero) != 0) {
    return "has an invalid subcluster bitmap (subclusters both allocated "
           "and zero)";
  }
  if (!has_host && alloc != 0) {
    return "has an invalid subcluster bitmap (allocated subclusters but no "
           "host cluster)";
  }
  return nullptr;
}

}  // namespace

absl::Status MetadataGuard::ValidateEntry(uint64_t entry, uint64_t bitmap,
                                          uint64_t guest_offset) const {
  const Geometry& g = s_->geometry();
  const uint64_t host = entry & kEntryOffsetMask;
  auto corrupt = [&](const std::string& why) {
    return s_->map->Corrupt(absl::StrFormat(
        "L2 entry 0x%016x%s for guest offset 0x%x %s", entry,
        g.extended_l2 ? absl::StrFormat(" (bitmap 0x%016x)", bitmap) : "",
        guest_offset, why));
  };
  if (s_->has_data_file()) return ValidateDataFileEntry(entry, bitmap, guest_offset);
  if (entry & kOflagCompressed) {
    CompressedExtent c = DecodeCompressed(entry, g.cluster_bits);
    uint64_t end;
    if (AddOverflows(c.host_offset, c.length, &end) || end > kMaxHostOffset ||
        c.host_offset < g.cluster_size) {
      return corrupt("points outside the image");
    }
    if (g.extended_l2 && bitmap != 0) {
      // The bitmap of a compressed cluster is reserved (all zero).
      return corrupt("is compressed but has a non-zero subcluster bitmap");
    }
    return absl::OkStatus();
  }
  if (!g.extended_l2 && (entry & kL2StandardReservedMask)) {
    return corrupt("has reserved bits set");
  }
  if (g.extended_l2 && (entry & (kL2StandardReservedMask | kOflagZero))) {
    return corrupt("has reserved bits set");
  }
  if (host != 0 && (host & (g.cluster_size - 1)) != 0) {
    return corrupt("points at an unaligned host offset");
  }
  if (host == 0 && (entry & kOflagCopied)) {
    return corrupt("has the COPIED flag but no host offset");
  }
  if (host != 0 && host < g.cluster_size) {
    return corrupt("points into the header cluster");
  }
  if (host != 0 && host >= HostLimit()) {
    return corrupt("points past the end of the file");
  }
  if (const char* why = BitmapProblem(g.extended_l2, host != 0, bitmap)) {
    return corrupt(why);
  }
  return absl::OkStatus();
}

absl::Status MetadataGuard::ValidateDataFileEntry(
    uint64_t entry, uint64_t bitmap, uint64_t guest_offset) const {
  const Geometry& g = s_->geometry();
  const uint64_t host = entry & kEntryOffsetMask;
  const uint64_t guest_cluster = AlignDown(guest_offset, g.cluster_size);
  auto corrupt = [&](const std::string& why) {
    return s_->map->Corrupt(absl::StrFormat(
        "L2 entry 0x%016x%s for guest offset 0x%x %s", entry,
        g.extended_l2 ? absl::StrFormat(" (bitmap 0x%016x)", bitmap) : "",
        guest_offset, why));
  };
  if (entry & kOflagCompressed) {
    return corrupt("is compressed in an image with an external data file");
  }
  if (!g.extended_l2 && (entry & kL2StandardReservedMask)) {
    return corrupt("has reserved bits set");
  }
  if (g.extended_l2 && (entry & (kL2StandardReservedMask | kOflagZero))) {
    return corrupt("has reserved bits set");
  }
  // Data clusters live at their guest offset in the data file (QEMU
  // allocates them there and checks it): anything else is corruption.
  const bool zero_plain = !g.extended_l2 && (entry & kOflagZero) && host == 0;
  if (HasHostCluster(entry, true) && !zero_plain && host != guest_cluster) {
    return corrupt(absl::StrFormat(
        "names data file offset 0x%x, not its guest cluster's", host));
  }
  if (const char* why = BitmapProblem(g.extended_l2,
                                      HasHostCluster(entry, true), bitmap)) {
    return corrupt(why);
  }
  return absl::OkStatus();
}

absl::Status MetadataGuard::CheckNotMetadata(uint64_t entry,
                                             uint64_t guest) const {
  // Data clusters in a data file are never metadata.
  if (s_->has_data_file()) return absl::OkStatus();
  if (entry & kOflagCompressed) return absl::OkStatus();
  const uint64_t host = entry & kEntryOffsetMask;
  uint64_t at;
  MetadataSet::Kind kind;
  if (host == 0 ||
      !s_->metadata->Find(host, s_->header.cluster_size(), ~0u, &at, &kind)) {
    return absl::OkStatus();
  }
  return s_->map->Corrupt(absl::StrFormat(
      "L2 entry 0x%016x for guest offset 0x%x names host cluster 0x%x, "
      "which holds %s",
      entry, guest, host, MetadataSet::Name(kind)));
}

absl::Status MetadataGuard::CheckDataTarget(uint64_t host, uint64_t len) const {
  if (s_->has_data_file()) return absl::OkStatus();  // no metadata there
  auto overlaps = [&](uint64_t start, uint64_t n) {
    return n > 0 && host < start + n && start < host + len;
  };
  const uint64_t cs = s_->header.cluster_size();
  const char* what = nullptr;
  uint64_t at;
  MetadataSet::Kind kind;
  if (overlaps(0, cs)) {
    what = "the header";
  } else if (overlaps(s_->map->l1_offset(),
                      uint64_t{s_->map->l1().size()} * 8)) {
    what = "the L1 table";
  } else if (overlaps(s_->refcounts->table_offset(),
                      uint64_t{s_->refcounts->table_clusters()} * cs)) {
    what = "the refcount table";
  } else if (s_->metadata->Find(host, len, ~0u, &at, &kind)) {
    // L2 tables and refcount blocks (and the tables, in case the lines
    // above ever miss them).
    what = MetadataSet::Name(kind);
  }
  if (what == nullptr) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "%s: corrupt image: refusing to write guest data at host offset 0x%x "
      "over %s",
      s_->file->name(), host, what));
}

uint64_t MetadataGuard::HostLimit() const {
  uint64_t limit = s_->map->file_limit();
  if (s_->refcounts != nullptr) {
    // Clusters allocated since the open lie past the file size seen then.
    limit = std::max(limit, s_->refcounts->end_cluster()
                                << s_->header.cluster_bits);
  }
  return limit;
}

}  // namespace qcow2::internal
