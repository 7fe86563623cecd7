// SPDX-License-Identifier: Apache-2.0
#include "lib/format/bitmaps.h"

#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/endian.h"
#include "lib/base/math.h"

namespace qcow2::internal {

namespace {

absl::Status Bad(const std::string& filename, const std::string& what) {
  return absl::DataLossError(
      absl::StrCat(filename, ": malformed bitmaps extension: ", what));
}

std::string Hex(uint64_t v) { return absl::StrFormat("0x%x", v); }

// Byte offsets of a directory entry's fields.
enum : size_t {
  kOffTableOffset = 0,
  kOffTableSize = 8,
  kOffFlags = 12,
  kOffType = 16,
  kOffGranularity = 17,
  kOffNameSize = 18,
  kOffExtraSize = 20,
};

// Checks that [offset, offset + len) is cluster aligned, inside the file
// and clear of the header cluster. `what` names it for messages.
absl::Status CheckArea(const char* what, uint64_t offset, uint64_t len,
                       const Header& h, uint64_t file_size,
                       const std::string& filename, const std::string& where) {
  const uint64_t cs = h.cluster_size();
  if (offset == 0 || !IsAligned(offset, cs)) {
    return Bad(filename, absl::StrCat(where, what, " offset ", Hex(offset),
                                      " is not a cluster aligned offset past "
                                      "the header"));
  }
  uint64_t end;
  if (AddOverflows(offset, len, &end) || end > kMaxHostOffset ||
      end > file_size) {
    return Bad(filename, absl::StrCat(where, what, " at ", Hex(offset), " (",
                                      len, " bytes) lies past the end of the "
                                      "file (", file_size, " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t BitmapDataBytes(uint64_t virtual_size, uint32_t granularity_bits) {
  if (granularity_bits >= 64) return virtual_size > 0 ? 1 : 0;
  const uint64_t bits = DivRoundUp(virtual_size, uint64_t{1} << granularity_bits);
  return DivRoundUp(bits, 8);
}

uint64_t BitmapTableEntries(uint64_t virtual_size, uint32_t granularity_bits,
                            uint32_t cluster_bits) {
  return DivRoundUp(BitmapDataBytes(virtual_size, granularity_bits),
                    uint64_t{1} << cluster_bits);
}

uint64_t BitmapDirEntrySize(uint64_t name_size, uint64_t extra_data_size) {
  return AlignUp(kBitmapDirEntryHeader + name_size + extra_data_size, 8);
}

absl::StatusOr<BitmapsExtension> DecodeBitmapsExtension(
    absl::Span<const uint8_t> data, const Header& h, uint64_t file_size,
    const std::string& filename) {
  if (data.size() != kBitmapsExtensionSize) {
    return Bad(filename, absl::StrCat("extension length is ", data.size(),
                                      " bytes, not 24"));
  }
  BitmapsExtension ext;
  ext.nb_bitmaps = LoadBE32(&data[0]);
  const uint32_t reserved = LoadBE32(&data[4]);
  ext.directory_size = LoadBE64(&data[8]);
  ext.directory_offset = LoadBE64(&data[16]);
  if (reserved != 0) {
    return Bad(filename, absl::StrCat("reserved field (extension byte 4) is ",
                                      Hex(reserved), ", not 0"));
  }
  if (ext.nb_bitmaps == 0 || ext.nb_bitmaps > kMaxBitmaps) {
    return Bad(filename, absl::StrCat("nb_bitmaps ", ext.nb_bitmaps,
                                      " out of range 1..", kMaxBitmaps));
  }
  if (ext.directory_size == 0 ||
      ext.directory_size > kMaxBitmapDirectorySize) {
    return Bad(filename, absl::StrCat("bitmap_directory_size ",
                                      ext.directory_size, " out of range 1..",
                                      kMaxBitmapDirectorySize));
  }
  if (ext.directory_size <
      uint64_t{ext.nb_bitmaps} * BitmapDirEntrySize(1, 0)) {
    return Bad(filename, absl::StrCat("bitmap_directory_size ",
                                      ext.directory_size, " is too small for ",
                                      ext.nb_bitmaps, " bitmaps"));
  }
  if (absl::Status s = CheckArea("bitmap directory", ext.directory_offset,
                                 ext.directory_size, h, file_size, filename,
                                 "");
      !s.ok()) {
    return s;
  }
  return ext;
}

std::vector<uint8_t> EncodeBitmapsExtension(const BitmapsExtension& ext) {
  std::vector<uint8_t> out(kBitmapsExtensionSize, 0);
  StoreBE32(&out[0], ext.nb_bitmaps);
  StoreBE64(&out[8], ext.directory_size);
  StoreBE64(&out[16], ext.directory_offset);
  return out;
}

absl::StatusOr<std::vector<BitmapDirEntry>> DecodeBitmapDirectory(
    absl::Span<const uint8_t> dir, const BitmapsExtension& ext,
    const Header& h, uint64_t file_size, const std::string& filename) {
  std::vector<BitmapDirEntry> out;
  absl::flat_hash_set<std::string> names;
  uint64_t pos = 0;
  while (pos < dir.size()) {
    const uint64_t at = ext.directory_offset + pos;
    const std::string where =
        absl::StrCat("bitmap directory entry ", out.size(), " at ", Hex(at),
                     ": ");
    if (out.size() == ext.nb_bitmaps) {
      return Bad(filename, absl::StrCat(where, "more entries than nb_bitmaps ",
                                        ext.nb_bitmaps));
    }
    if (dir.size() - pos < kBitmapDirEntryHeader) {
      return Bad(filename, absl::StrCat(where, "runs past the end of the "
                                        "directory (", dir.size(), " bytes)"));
    }
    const uint8_t* p = &dir[pos];
    BitmapDirEntry e;
    e.file_offset = at;
    e.table_offset = LoadBE64(p + kOffTableOffset);
    e.table_size = LoadBE32(p + kOffTableSize);
    e.flags = LoadBE32(p + kOffFlags);
    e.type = p[kOffType];
    e.granularity_bits = p[kOffGranularity];
    const uint16_t name_size = LoadBE16(p + kOffNameSize);
    const uint32_t extra_size = LoadBE32(p + kOffExtraSize);
    const uint64_t size = BitmapDirEntrySize(name_size, extra_size);
    if (size > dir.size() - pos) {
      return Bad(filename,
                 absl::StrCat(where, "name_size ", name_size,
                              " and extra_data_size ", extra_size,
                              " run past the end of the directory (",
                              dir.size(), " bytes)"));
    }
    if (name_size == 0) return Bad(filename, absl::StrCat(where, "name_size is 0"));
    if (name_size > kMaxBitmapNameSize) {
      return Bad(filename, absl::StrCat(where, "name_size ", name_size,
                                        " exceeds ", kMaxBitmapNameSize));
    }
    const uint8_t* extra = p + kBitmapDirEntryHeader;
    e.extra_data.assign(extra, extra + extra_size);
    e.name.assign(reinterpret_cast<const char*>(extra + extra_size), name_size);
    for (uint64_t i = kBitmapDirEntryHeader + extra_size + name_size; i < size;
         ++i) {
      if (p[i] != 0) {
        return Bad(filename, absl::StrCat(where, "padding byte at ",
                                          Hex(at + i), " is not zero"));
      }
    }
    const std::string named = absl::StrCat(where, "bitmap '", e.name, "': ");
    if (!names.insert(e.name).second) {
      return Bad(filename, absl::StrCat(named, "name is not unique"));
    }
    if (e.granularity_bits > 63) {
      return Bad(filename, absl::StrCat(named, "granularity_bits ",
                                        int{e.granularity_bits},
                                        " out of range 0..63"));
    }
    if (e.table_size == 0 || e.table_size > kMaxBitmapTableSize) {
      return Bad(filename, absl::StrCat(named, "bitmap_table_size ",
                                        e.table_size, " out of range 1..",
                                        kMaxBitmapTableSize));
    }
    if (uint64_t{e.table_size} * h.cluster_size() > kMaxBitmapDataBytes) {
      return Bad(filename, absl::StrCat(named, "bitmap_table_size ",
                                        e.table_size, " describes more than ",
                                        kMaxBitmapDataBytes, " bytes of data"));
    }
    if (absl::Status s =
            CheckArea("bitmap table", e.table_offset,
                      uint64_t{e.table_size} * 8, h, file_size, filename, named);
        !s.ok()) {
      return s;
    }
    // A bitmap not in use must cover the whole disk (one in use may be
    // stale after a resize, as the spec allows).
    if (!(e.flags & kBitmapInUse) && e.granularity_bits <= 63) {
      const uint64_t need =
          BitmapTableEntries(h.size, e.granularity_bits, h.cluster_bits);
      if (e.table_size != need) {
        return Bad(filename,
                   absl::StrCat(named, "bitmap_table_size ", e.table_size,
                                " does not match the ", need,
                                " entries a virtual size of ", h.size,
                                " needs"));
      }
    }
    out.push_back(std::move(e));
    pos += size;
  }
  if (out.size() != ext.nb_bitmaps) {
    return Bad(filename,
               absl::StrCat("bitmap directory at ", Hex(ext.directory_offset),
                            " holds ", out.size(), " entries, nb_bitmaps is ",
                            ext.nb_bitmaps));
  }
  return out;
}

std::vector<uint8_t> EncodeBitmapDirectory(
    const std::vector<BitmapDirEntry>& entries) {
  uint64_t total = 0;
  for (const BitmapDirEntry& e : entries) {
    total += BitmapDirEntrySize(e.name.size(), e.extra_data.size());
  }
  std::vector<uint8_t> out(total, 0);
  uint64_t pos = 0;
  for (const BitmapDirEntry& e : entries) {
    uint8_t* p = &out[pos];
    StoreBE64(p + kOffTableOffset, e.table_offset);
    StoreBE32(p + kOffTableSize, e.table_size);
    StoreBE32(p + kOffFlags, e.flags);
    p[kOffType] = e.type;
    p[kOffGranularity] = e.granularity_bits;
    StoreBE16(p + kOffNameSize, static_cast<uint16_t>(e.name.size()));
    StoreBE32(p + kOffExtraSize, static_cast<uint32_t>(e.extra_data.size()));
    uint8_t* q = p + kBitmapDirEntryHeader;
    if (!e.extra_data.empty()) {
      std::memcpy(q, e.extra_data.data(), e.extra_data.size());
    }
    std::memcpy(q + e.extra_data.size(), e.name.data(), e.name.size());
    pos += BitmapDirEntrySize(e.name.size(), e.extra_data.size());
  }
  return out;
}

std::string BitmapUnsupported(const BitmapDirEntry& e) {
  if (e.type != kBitmapTypeDirty) {
    return absl::StrCat("bitmap '", e.name, "' has type ", int{e.type},
                        " (only 1, dirty tracking, is supported)");
  }
  if (e.flags & ~(kBitmapInUse | kBitmapAuto)) {
    return absl::StrCat("bitmap '", e.name, "' has unsupported flags ",
                        Hex(e.flags & ~(kBitmapInUse | kBitmapAuto)));
  }
  if (!e.extra_data.empty()) {
    return absl::StrCat("bitmap '", e.name, "' has ", e.extra_data.size(),
                        " bytes of extra data");
  }
  if (e.granularity_bits < kMinBitmapGranularityBits ||
      e.granularity_bits > kMaxBitmapGranularityBits) {
    return absl::StrCat("bitmap '", e.name, "' has granularity_bits ",
                        int{e.granularity_bits}, " (supported: 9..31)");
  }
  return "";
}

absl::Status CheckBitmapTableEntry(uint64_t entry, uint64_t index,
                                   uint64_t table_offset,
                                   const BitmapDirEntry& e, const Header& h,
                                   uint64_t file_size,
                                   const std::string& filename) {
  const uint64_t off = entry & kBitmapTableOffsetMask;
  const std::string where =
      absl::StrCat("bitmap '", e.name, "' table entry ", index, " at ",
                   Hex(table_offset + index * 8), " (", Hex(entry), "): ");
  if (entry & kBitmapTableReserved) {
    return Bad(filename, absl::StrCat(where, "reserved bits are set"));
  }
  if (off == 0) return absl::OkStatus();
  if (entry & kBitmapTableAllOnes) {
    return Bad(filename,
               absl::StrCat(where, "bit 0 is set together with an offset"));
  }
  return CheckArea("data cluster", off, h.cluster_size(), h, file_size,
                   filename, where);
}

absl::Status CheckNewBitmap(const std::string& name, uint64_t granularity,
                            uint64_t virtual_size, uint32_t cluster_bits) {
  // The block layer's checks first, then the qcow2 constraints, each in
  // QEMU's words.
  if (name.empty()) {
    return absl::InvalidArgumentError("Bitmap name cannot be empty");
  }
  if (name.size() > kMaxBitmapNameSize) {
    return absl::InvalidArgumentError("Bitmap name is too long");
  }
  if (granularity < (uint64_t{1} << kMinBitmapGranularityBits) ||
      granularity > (uint64_t{1} << kMaxBitmapGranularityBits) ||
      (granularity & (granularity - 1)) != 0) {
    return absl::InvalidArgumentError(
        "Granularity must be power of 2 and at least 512");
  }
  const int bits = __builtin_ctzll(granularity);
  const uint64_t bytes = BitmapDataBytes(virtual_size, bits);
  const uint64_t entries = BitmapTableEntries(virtual_size, bits, cluster_bits);
  if (bytes > kMaxBitmapDataBytes || entries > kMaxBitmapTableSize ||
      (entries << cluster_bits) > kMaxBitmapDataBytes) {
    return absl::InvalidArgumentError(
        "Too much space will be occupied by the bitmap. Use larger "
        "granularity");
  }
  return absl::OkStatus();
}

}  // namespace qcow2::internal
