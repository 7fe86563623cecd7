// SPDX-License-Identifier: Apache-2.0
#include "lib/format/snapshot_table.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/endian.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/format/header.h"

namespace qcow2::internal {

namespace {

absl::Status TableError(const std::string& filename, const std::string& what) {
  return absl::DataLossError(
      absl::StrCat(filename, ": snapshot table: ", what));
}

// Like QEMU, a stored string ends at its first NUL.
std::string CString(const uint8_t* p, size_t len) {
  if (len == 0) return std::string();  // p may be null: memchr must not see it
  const void* nul = std::memchr(p, 0, len);
  if (nul != nullptr) len = static_cast<const uint8_t*>(nul) - p;
  return std::string(reinterpret_cast<const char*>(p), len);
}

}  // namespace

absl::StatusOr<DecodedSnapshotTable> DecodeSnapshotTable(
    SnapshotTableReader read, uint32_t count, uint64_t disk_size,
    const std::string& filename) {
  if (count > kMaxSnapshots) {
    return TableError(filename, absl::StrCat(count, " snapshots (at most ",
                                             kMaxSnapshots, ")"));
  }
  DecodedSnapshotTable out;
  uint64_t pos = 0;
  for (uint32_t i = 0; i < count; ++i) {
    pos = AlignUp(pos, 8);
    uint8_t fixed[kSnapshotHeaderSize];
    RETURN_IF_ERROR(read(pos, absl::MakeSpan(fixed)));
    pos += sizeof fixed;
    SnapshotEntry e;
    e.l1_offset = LoadBE64(fixed);
    e.l1_size = LoadBE32(fixed + 8);
    const uint16_t id_len = LoadBE16(fixed + 12);
    const uint16_t name_len = LoadBE16(fixed + 14);
    e.date_sec = LoadBE32(fixed + 16);
    e.date_nsec = LoadBE32(fixed + 20);
    e.vm_clock_nsec = LoadBE64(fixed + 24);
    e.vm_state_size = LoadBE32(fixed + 32);
    e.extra_data_size = LoadBE32(fixed + 36);
    if (e.extra_data_size > kMaxSnapshotExtraData) {
      return TableError(filename,
                        absl::StrCat("entry ", i, " has ", e.extra_data_size,
                                     " bytes of extra data (at most ",
                                     kMaxSnapshotExtraData, ")"));
    }
    // Extra data, id and name in one read.
    std::vector<uint8_t> rest(size_t{e.extra_data_size} + id_len + name_len);
    RETURN_IF_ERROR(read(pos, absl::MakeSpan(rest)));
    pos += rest.size();
    if (pos > kMaxSnapshotTableBytes) {
      return TableError(filename,
                        absl::StrCat("entry ", i, " ends past 64 MiB"));
    }
    const uint8_t* extra = rest.data();
    if (e.extra_data_size >= 8) e.vm_state_size = LoadBE64(extra);
    e.disk_size = e.extra_data_size >= 16 ? LoadBE64(extra + 8) : disk_size;
    if (e.extra_data_size >= 24) e.icount = LoadBE64(extra + 16);
    if (e.extra_data_size > kSnapshotKnownExtra) {
      e.unknown_extra.assign(extra + kSnapshotKnownExtra,
                             extra + e.extra_data_size);
    }
    e.id = CString(extra + e.extra_data_size, id_len);
    e.name = CString(extra + e.extra_data_size + id_len, name_len);
    out.entries.push_back(std::move(e));
  }
  out.size = pos;
  return out;
}

absl::Status AppendSnapshotEntry(const SnapshotEntry& e,
                                 std::vector<uint8_t>* table) {
  if (e.id.size() > 0xffff || e.name.size() > 0xffff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapshot '", e.name.substr(0, 64), "': id or name over 65535 bytes"));
  }
  const uint64_t extra = kSnapshotKnownExtra + e.unknown_extra.size();
  if (extra > kMaxSnapshotExtraData) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapshot '", e.name, "': ", extra, " bytes of extra data (at most ",
        kMaxSnapshotExtraData, ")"));
  }
  table->resize(AlignUp(table->size(), 8), 0);
  uint8_t fixed[kSnapshotHeaderSize];
  StoreBE64(fixed, e.l1_offset);
  StoreBE32(fixed + 8, e.l1_size);
  StoreBE16(fixed + 12, static_cast<uint16_t>(e.id.size()));
  StoreBE16(fixed + 14, static_cast<uint16_t>(e.name.size()));
  StoreBE32(fixed + 16, e.date_sec);
  StoreBE32(fixed + 20, e.date_nsec);
  StoreBE64(fixed + 24, e.vm_clock_nsec);
  // Older readers take a VM state over 4 GiB as none at all, not as a
  // truncated one.
  StoreBE32(fixed + 32, e.vm_state_size <= 0xffffffffull
                            ? static_cast<uint32_t>(e.vm_state_size)
                            : 0);
  StoreBE32(fixed + 36, static_cast<uint32_t>(extra));
  table->insert(table->end(), fixed, fixed + sizeof fixed);
  uint8_t known[kSnapshotKnownExtra];
  StoreBE64(known, e.vm_state_size);
  StoreBE64(known + 8, e.disk_size);
  StoreBE64(known + 16, e.icount);
  table->insert(table->end(), known, known + sizeof known);
  table->insert(table->end(), e.unknown_extra.begin(), e.unknown_extra.end());
  table->insert(table->end(), e.id.begin(), e.id.end());
  table->insert(table->end(), e.name.begin(), e.name.end());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> EncodeSnapshotTable(
    const std::vector<SnapshotEntry>& entries) {
  if (entries.size() > kMaxSnapshots) {
    return absl::OutOfRangeError(absl::StrCat(
        entries.size(), " snapshots (at most ", kMaxSnapshots, ")"));
  }
  std::vector<uint8_t> table;
  for (const SnapshotEntry& e : entries) {
    RETURN_IF_ERROR(AppendSnapshotEntry(e, &table));
  }
  if (table.size() > kMaxSnapshotTableBytes) {
    return absl::OutOfRangeError(absl::StrCat(
        "snapshot table of ", table.size(), " bytes (at most 64 MiB)"));
  }
  return table;
}

std::string NextSnapshotId(const std::vector<SnapshotEntry>& entries) {
  unsigned long max_id = 0;
  for (const SnapshotEntry& e : entries) {
    max_id = std::max(max_id, std::strtoul(e.id.c_str(), nullptr, 10));
  }
  return std::to_string(max_id + 1);
}

int FindSnapshotByIdOrName(const std::vector<SnapshotEntry>& entries,
                           const std::string& key) {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].id == key) return static_cast<int>(i);
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].name == key) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<DecodedSnapshotTable> ReadSnapshotTable(File* file,
                                                       const Header& h,
                                                       uint64_t file_size) {
  if (h.nb_snapshots == 0) return DecodedSnapshotTable{};
  auto read = [&](uint64_t pos, absl::Span<uint8_t> buf) -> absl::Status {
    uint64_t end = 0;
    if (AddOverflows(h.snapshots_offset, pos + buf.size(), &end) ||
        end > file_size) {
      return absl::DataLossError(absl::StrFormat(
          "%s: snapshot table: entry at offset 0x%x runs past the end of "
          "the file",
          file->name(), h.snapshots_offset + pos));
    }
    return file->ReadAt(h.snapshots_offset + pos, buf);
  };
  return DecodeSnapshotTable(read, h.nb_snapshots, h.size, file->name());
}

SnapshotInfo ToSnapshotInfo(const SnapshotEntry& e) {
  SnapshotInfo info;
  info.id = e.id;
  info.name = e.name;
  info.vm_state_size = e.vm_state_size;
  info.date_sec = e.date_sec;
  info.date_nsec = e.date_nsec;
  info.vm_clock_nsec = e.vm_clock_nsec;
  if (e.icount != kNoIcount) info.icount = e.icount;
  info.disk_size = e.disk_size;
  return info;
}

}  // namespace qcow2::internal
