// SPDX-License-Identifier: Apache-2.0
// Persistent dirty bitmaps (QEMU's docs/interop/qcow2.txt, "Bitmaps
// extension" and "Bitmaps"): the header extension, the bitmap directory and
// bitmap table entries, with every check the spec asks for. Summary in
// docs/format.md.
//
// Two kinds of failure: a malformed structure (kDataLoss, naming the field
// and its byte offset in the file), and a well-formed bitmap of a kind we
// cannot maintain (BitmapUnsupported: unknown type or flags, extra data,
// granularity outside QEMU's 9..31), which the driver refuses to write.
#ifndef QCOW2_LIB_FORMAT_BITMAPS_H_
#define QCOW2_LIB_FORMAT_BITMAPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/format/header.h"

namespace qcow2::internal {

inline constexpr uint32_t kBitmapsExtensionSize = 24;
// Directory entry flags.
inline constexpr uint32_t kBitmapInUse = 1u << 0;
inline constexpr uint32_t kBitmapAuto = 1u << 1;
inline constexpr uint32_t kBitmapExtraDataCompatible = 1u << 2;
inline constexpr uint8_t kBitmapTypeDirty = 1;
// Limits QEMU enforces (block/qcow2.h, block/qcow2-bitmap.c); we keep them.
inline constexpr uint32_t kMinBitmapGranularityBits = 9;
inline constexpr uint32_t kMaxBitmapGranularityBits = 31;
inline constexpr uint32_t kMaxBitmapNameSize = 1023;
inline constexpr uint32_t kMaxBitmaps = 65535;
inline constexpr uint64_t kMaxBitmapDirectorySize = 1024ull * kMaxBitmaps;
inline constexpr uint32_t kMaxBitmapTableSize = 0x8000000;  // entries
inline constexpr uint64_t kMaxBitmapDataBytes = 0x20000000;
inline constexpr uint32_t kBitmapDirEntryHeader = 24;
// Bitmap table entries.
inline constexpr uint64_t kBitmapTableReserved = 0xff000000000001feull;
inline constexpr uint64_t kBitmapTableOffsetMask = 0x00fffffffffffe00ull;
inline constexpr uint64_t kBitmapTableAllOnes = 1;

// The extension's fields.
struct BitmapsExtension {
  uint32_t nb_bitmaps = 0;
  uint64_t directory_size = 0;
  uint64_t directory_offset = 0;
};

// One bitmap directory entry.
struct BitmapDirEntry {
  uint64_t table_offset = 0;
  uint32_t table_size = 0;  // entries
  uint32_t flags = 0;
  uint8_t type = kBitmapTypeDirty;
  uint8_t granularity_bits = 16;
  std::string name;
  std::vector<uint8_t> extra_data;
  // Where the entry was found (decoding only): its byte offset in the file.
  uint64_t file_offset = 0;

  uint64_t granularity() const { return uint64_t{1} << granularity_bits; }
};

// The bitmap's data size in bytes for a disk of `virtual_size` bytes (one
// bit per granule, rounded up to whole bytes).
uint64_t BitmapDataBytes(uint64_t virtual_size, uint32_t granularity_bits);
// The number of bitmap table entries (clusters of data) it needs.
uint64_t BitmapTableEntries(uint64_t virtual_size, uint32_t granularity_bits,
                            uint32_t cluster_bits);
// Size of one directory entry with its padding.
uint64_t BitmapDirEntrySize(uint64_t name_size, uint64_t extra_data_size);

// Decodes the extension's data and checks it against the header and the
// file: length 24, reserved bytes zero, 1..65535 bitmaps, a directory of
// 1..64 MiB, cluster aligned, inside the file and clear of the header.
absl::StatusOr<BitmapsExtension> DecodeBitmapsExtension(
    absl::Span<const uint8_t> data, const Header& h, uint64_t file_size,
    const std::string& filename);
std::vector<uint8_t> EncodeBitmapsExtension(const BitmapsExtension& ext);

// Decodes and validates the directory read from ext.directory_offset:
// exactly nb_bitmaps entries filling it, each with a non-empty name of at
// most 1023 bytes (unique), zero padding, granularity_bits <= 63, a bitmap
// table that is cluster aligned, non-empty, at most kMaxBitmapTableSize
// entries and inside the file, and (unless the bitmap is in use) exactly as
// large as the virtual size needs.
absl::StatusOr<std::vector<BitmapDirEntry>> DecodeBitmapDirectory(
    absl::Span<const uint8_t> dir, const BitmapsExtension& ext,
    const Header& h, uint64_t file_size, const std::string& filename);
// The directory bytes for `entries` (their file_offset is ignored).
std::vector<uint8_t> EncodeBitmapDirectory(
    const std::vector<BitmapDirEntry>& entries);

// Why a well-formed bitmap cannot be maintained by us ("" if it can):
// a type other than dirty tracking, flags other than in_use and auto,
// extra data, or a granularity outside 9..31 bits.
std::string BitmapUnsupported(const BitmapDirEntry& e);

// Checks one bitmap table entry (index `index` of the table at
// `table_offset`): reserved bits zero, the all-ones bit only without an
// offset, the offset cluster aligned and its cluster inside the file.
absl::Status CheckBitmapTableEntry(uint64_t entry, uint64_t index,
                                   uint64_t table_offset,
                                   const BitmapDirEntry& e, const Header& h,
                                   uint64_t file_size,
                                   const std::string& filename);

// The constraints on a bitmap to be added, in QEMU's words: a name of
// 1..1023 bytes, a granularity a power of two of 512 B to 2 GiB, and data
// of at most 512 MiB for a disk of `virtual_size`. kInvalidArgument.
absl::Status CheckNewBitmap(const std::string& name, uint64_t granularity,
                            uint64_t virtual_size, uint32_t cluster_bits);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_FORMAT_BITMAPS_H_
