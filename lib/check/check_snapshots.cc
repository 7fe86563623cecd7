// SPDX-License-Identifier: Apache-2.0
// The refcount checker's snapshot table (phases 1 and 6 of check.cc's
// overview): reading and validating it, and writing it anew when -r all
// repaired an entry.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/endian.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/check/check_internal.h"
#include "lib/format/header.h"

namespace qcow2::internal::check_detail {

absl::Status SnapshotTableCheck::Read(CheckResult* snap, RepairMode fix) {
  const bool repair = fix == RepairMode::kAll;
  uint32_t nb = s_.h.nb_snapshots;
  uint64_t reduced = 0, dropped = 0;
  if (nb > kMaxSnapshots && repair) {
    s_.Msg(snap, absl::StrFormat("Discarding %d overhanging snapshots",
                                 nb - kMaxSnapshots));
    reduced += nb - kMaxSnapshots;
    nb = kMaxSnapshots;
  }
  // QEMU validates the table pointer here rather than when opening.
  if (nb > kMaxSnapshots) {
    ++snap->check_errors;
    s_.Msg(snap, "ERROR snapshot table too large");
    s_.Msg(snap, absl::StrFormat("You can force-remove all %d overhanging "
                                 "snapshots with qemu-img check -r all",
                                 nb - kMaxSnapshots));
    return Efbig();
  }
  if (!IsAligned(s_.h.snapshots_offset, s_.cs) ||
      s_.h.snapshots_offset > static_cast<uint64_t>(INT64_MAX) -
                                  uint64_t{nb} * kSnapshotHeaderSize) {
    ++snap->check_errors;
    s_.Msg(snap, "ERROR snapshot table offset invalid");
    return Einval();
  }
  auto fail = [&](const std::string& why, absl::Status st) {
    ++snap->check_errors;
    s_.Msg(snap,
           absl::StrCat("ERROR failed to read the snapshot table: ", why));
    snapshots_.clear();
    return st;
  };
  auto read = [&](uint64_t at, void* buf, size_t len) {
    return s_.file->ReadAt(at, absl::MakeSpan(static_cast<uint8_t*>(buf), len));
  };
  uint64_t offset = s_.h.snapshots_offset, table_length = 0;
  for (uint32_t i = 0; i < nb; ++i) {
    const uint64_t entry_start = offset;
    table_length = AlignUp(table_length, 8);
    offset = AlignUp(offset, 8);
    Snapshot sn;
    absl::Status st = read(offset, sn.fixed, kSnapshotHeaderSize);
    if (!st.ok()) return fail(std::string(st.message()), st);
    offset += kSnapshotHeaderSize;
    sn.l1_offset = LoadBE64(sn.fixed);
    sn.l1_size = LoadBE32(sn.fixed + 8);
    const uint16_t id_len = LoadBE16(sn.fixed + 12);
    const uint16_t name_len = LoadBE16(sn.fixed + 14);
    sn.vm_state_size = LoadBE32(sn.fixed + 32);
    sn.extra_data_size = LoadBE32(sn.fixed + 36);
    bool truncate = false;
    if (sn.extra_data_size > kMaxSnapshotExtraData) {
      if (!repair) {
        return fail(absl::StrCat("Too much extra metadata in snapshot table "
                                 "entry ",
                                 i),
                    Efbig());
      }
      s_.Msg(snap,
             absl::StrFormat("Discarding too much extra metadata in "
                             "snapshot table entry %d (%d > %d)",
                             i, sn.extra_data_size, kMaxSnapshotExtraData));
      ++dropped;
      truncate = true;
    }
    uint8_t known[kSnapshotKnownExtra] = {};
    const uint32_t known_len =
        std::min<uint32_t>(kSnapshotKnownExtra, sn.extra_data_size);
    st = read(offset, known, known_len);
    if (!st.ok()) return fail(std::string(st.message()), st);
    offset += known_len;
    if (sn.extra_data_size >= 8) sn.vm_state_size = LoadBE64(known);
    sn.disk_size = sn.extra_data_size >= 16 ? LoadBE64(known + 8)
                                            : AlignUp(s_.h.size, 512);
    sn.icount = sn.extra_data_size >= 24 ? LoadBE64(known + 16) : ~0ull;
    if (sn.extra_data_size > kSnapshotKnownExtra) {
      const uint64_t extra_end =
          offset + sn.extra_data_size - kSnapshotKnownExtra;
      if (truncate) sn.extra_data_size = kMaxSnapshotExtraData;
      sn.unknown_extra.resize(sn.extra_data_size - kSnapshotKnownExtra);
      st = read(offset, sn.unknown_extra.data(), sn.unknown_extra.size());
      if (!st.ok()) return fail(std::string(st.message()), st);
      offset = extra_end;
    }
    std::string strings(size_t{id_len} + name_len, '\0');
    st = read(offset, strings.data(), strings.size());
    if (!st.ok()) return fail(std::string(st.message()), st);
    offset += strings.size();
    // Like QEMU, the strings end at their first NUL.
    sn.id = std::string(strings.substr(0, id_len).c_str());
    sn.name = std::string(strings.substr(id_len).c_str());
    table_length += kSnapshotHeaderSize + sn.extra_data_size + strings.size();
    if (table_length > kMaxSnapshotTableBytes ||
        offset - s_.h.snapshots_offset > static_cast<uint64_t>(INT32_MAX)) {
      if (!repair) return fail("Snapshot table is too big", Efbig());
      s_.Msg(snap, absl::StrFormat("Discarding %d overhanging snapshots "
                                   "(snapshot table is too big)",
                                   nb - i));
      reduced += nb - i;
      nb = i;
      offset = entry_start;
      break;
    }
    snapshots_.push_back(std::move(sn));
  }
  snapshots_size_ = offset - s_.h.snapshots_offset;
  snap->corruptions += reduced + dropped;
  if (reduced > 0) {
    // Dropping entries off the end only leaks clusters, which the refcount
    // check repairs.
    uint8_t buf[4];
    StoreBE32(buf, nb);
    absl::Status st =
        s_.file->WriteAt(kHeaderNbSnapshots, absl::MakeConstSpan(buf, 4));
    if (st.ok()) st = s_.file->Flush();
    if (!st.ok()) {
      ++snap->check_errors;
      s_.Msg(snap, absl::StrCat("ERROR failed to update the snapshot count in "
                                "the image header: ",
                                st.message()));
      return st;
    }
    s_.h.nb_snapshots = nb;
    snap->corruptions_fixed += reduced;
    snap->corruptions -= reduced;
  }
  // Version 3 entries carry at least the 64-bit VM state size and the
  // disk size.
  if (s_.h.version >= 3) {
    for (size_t i = 0; i < snapshots_.size(); ++i) {
      if (snapshots_[i].extra_data_size < 16) {
        ++snap->corruptions;
        s_.Msg(snap, absl::StrFormat("%s snapshot table entry %d is incomplete",
                                     repair ? "Repairing" : "ERROR", i));
      }
    }
  }
  return absl::OkStatus();
}

// Writes the snapshot table anew (full extra data, truncated entries as
// read) at the end of the file, points the header at it, then frees the
// old table. QEMU's qcow2_write_snapshots().
absl::Status SnapshotTableCheck::Write() {
  std::vector<uint8_t> table;
  for (const Snapshot& sn : snapshots_) {
    SnapshotEntry e;
    e.l1_offset = sn.l1_offset;
    e.l1_size = sn.l1_size;
    e.id = sn.id;
    e.name = sn.name;
    e.date_sec = LoadBE32(sn.fixed + 16);
    e.date_nsec = LoadBE32(sn.fixed + 20);
    e.vm_clock_nsec = LoadBE64(sn.fixed + 24);
    e.vm_state_size = sn.vm_state_size;
    e.disk_size = sn.disk_size;
    e.icount = sn.icount;
    e.unknown_extra = sn.unknown_extra;
    RETURN_IF_ERROR(AppendSnapshotEntry(e, &table));
  }
  if (table.size() > kMaxSnapshotTableBytes) return Efbig();
  uint64_t offset = 0;
  if (!table.empty()) {
    ASSIGN_OR_RETURN(offset, s_.AllocateAtEnd(DivRoundUp(table.size(), s_.cs)));
    RETURN_IF_ERROR(s_.file->WriteAt(offset, table));
    RETURN_IF_ERROR(s_.file->Flush());
  }
  uint8_t ptr[12];
  StoreBE32(ptr, static_cast<uint32_t>(snapshots_.size()));
  StoreBE64(ptr + 4, offset);
  RETURN_IF_ERROR(
      s_.file->WriteAt(kHeaderNbSnapshots, absl::MakeConstSpan(ptr, 12)));
  RETURN_IF_ERROR(s_.file->Flush());
  // Free the old table (errors only leak clusters, as in QEMU).
  const uint64_t old_offset = s_.h.snapshots_offset, old_size = snapshots_size_;
  s_.h.nb_snapshots = static_cast<uint32_t>(snapshots_.size());
  s_.h.snapshots_offset = offset;
  snapshots_size_ = table.size();
  if (old_size > 0 && old_offset + old_size <= s_.file_size) {
    for (uint64_t k = old_offset >> s_.cb;
         k <= (old_offset + old_size - 1) >> s_.cb; ++k) {
      absl::StatusOr<uint64_t> rc = s_.stored.Get(k);
      if (rc.ok() && *rc > 0) s_.stored.Set(k, *rc - 1);
    }
    if (s_.stored.WriteBack().ok()) (void)s_.file->Flush();
  }
  return absl::OkStatus();
}

absl::Status SnapshotTableCheck::Fix(CheckResult* snap, const CheckResult& refs,
                                     RepairMode fix) {
  if (snap->corruptions == 0 || fix != RepairMode::kAll) {
    return absl::OkStatus();
  }
  if (refs.corruptions != 0 || refs.check_errors != 0) {
    // Allocating needs refcounts that can be trusted.
    s_.Msg(snap,
           "ERROR not rewriting the snapshot table: the refcounts are "
           "still inconsistent");
    return absl::OkStatus();
  }
  absl::Status st = Write();
  if (!st.ok()) {
    ++snap->check_errors;
    s_.Msg(snap, absl::StrCat("ERROR failed to update snapshot table: ",
                              st.message()));
    return st;
  }
  snap->corruptions_fixed += snap->corruptions;
  snap->corruptions = 0;
  return absl::OkStatus();
}

}  // namespace qcow2::internal::check_detail
