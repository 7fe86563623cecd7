// SPDX-License-Identifier: Apache-2.0
// The internal snapshot table: one variable-length entry per snapshot,
// each starting on an 8-byte boundary (docs/interop/qcow2.txt, "Snapshot
// table"):
//
//   0  u64 L1 table offset        8  u32 L1 size (entries)
//  12  u16 id length             14  u16 name length
//  16  u32 date (seconds)        20  u32 date (nanoseconds)
//  24  u64 VM clock (ns)         32  u32 VM state size (0 if > 4 GiB)
//  36  u32 extra data size       40  extra data, then id, then name
//
// Extra data as QEMU writes it: u64 VM state size, u64 disk size, u64
// icount (24 bytes); bytes past those are kept as they are.
#ifndef QCOW2_LIB_FORMAT_SNAPSHOT_TABLE_H_
#define QCOW2_LIB_FORMAT_SNAPSHOT_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/format/header.h"
#include "qcow2/file.h"
#include "qcow2/types.h"

namespace qcow2::internal {

// Limits (QEMU's QCOW_MAX_SNAPSHOT_EXTRA_DATA and QCOW_MAX_SNAPSHOTS_SIZE;
// the count limit is kMaxSnapshots in header.h).
inline constexpr uint32_t kSnapshotHeaderSize = 40;
inline constexpr uint32_t kMaxSnapshotExtraData = 1024;
inline constexpr uint32_t kSnapshotKnownExtra = 24;  // VM state, disk, icount
inline constexpr uint64_t kMaxSnapshotTableBytes = 64ull << 20;
// The icount of a snapshot that did not record one.
inline constexpr uint64_t kNoIcount = ~0ull;

struct SnapshotEntry {
  uint64_t l1_offset = 0;
  uint32_t l1_size = 0;  // entries
  std::string id;
  std::string name;
  uint32_t date_sec = 0;
  uint32_t date_nsec = 0;
  uint64_t vm_clock_nsec = 0;
  uint64_t vm_state_size = 0;
  uint64_t disk_size = 0;  // the image's size when the entry had none
  uint64_t icount = kNoIcount;
  uint32_t extra_data_size = 0;        // as read (0 for new entries)
  std::vector<uint8_t> unknown_extra;  // extra data past the known 24 bytes
};

// Reads `buf.size()` bytes at `pos` bytes past the start of the table.
using SnapshotTableReader =
    absl::FunctionRef<absl::Status(uint64_t pos, absl::Span<uint8_t> buf)>;

struct DecodedSnapshotTable {
  std::vector<SnapshotEntry> entries;
  uint64_t size = 0;  // bytes the table spans
};

// Decodes `count` entries through `read`. `disk_size` is the default for
// entries with less than 16 bytes of extra data (QEMU: the image's size).
// Errors (kDataLoss, naming `filename` and the entry): a count over
// kMaxSnapshots, extra data over 1 KiB, a table over 64 MiB, or a read
// error passed on.
absl::StatusOr<DecodedSnapshotTable> DecodeSnapshotTable(
    SnapshotTableReader read, uint32_t count, uint64_t disk_size,
    const std::string& filename);

// Appends one entry as QEMU writes it (8-byte aligned start, 24 bytes of
// known extra data plus the unknown bytes kept). Fails (kInvalidArgument)
// on an id or name over 65535 bytes or too much extra data.
absl::Status AppendSnapshotEntry(const SnapshotEntry& e,
                                 std::vector<uint8_t>* table);

// The whole table; also fails past kMaxSnapshots entries or 64 MiB.
absl::StatusOr<std::vector<uint8_t>> EncodeSnapshotTable(
    const std::vector<SnapshotEntry>& entries);

// QEMU's choice of id for a new snapshot: one more than the largest id
// read as a decimal number (strtoul: leading digits; none reads as 0).
std::string NextSnapshotId(const std::vector<SnapshotEntry>& entries);

// Index of the entry QEMU's find_snapshot_by_id_or_name picks: the first
// whose id is `key`, else the first whose name is; -1 if none.
int FindSnapshotByIdOrName(const std::vector<SnapshotEntry>& entries,
                           const std::string& key);

// The snapshot table of an image with header `h`, read from `file` (whose
// size is `file_size`). kDataLoss, naming the file, for a malformed table.
absl::StatusOr<DecodedSnapshotTable> ReadSnapshotTable(File* file,
                                                       const Header& h,
                                                       uint64_t file_size);

// The public view of a table entry.
SnapshotInfo ToSnapshotInfo(const SnapshotEntry& e);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_FORMAT_SNAPSHOT_TABLE_H_
