// SPDX-License-Identifier: Apache-2.0
// The refcount checker's scanning phases (see check.cc for the overview):
// reading the snapshot table, walking the header, L1/L2 tables, bitmaps
// and refcount blocks to compute the expected refcounts, comparing them
// with the stored ones, and the COPIED flag check.
#include "lib/qcow2/check_internal.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/format/entries.h"
#include "lib/format/header.h"
#include "lib/base/endian.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal::check_detail {

// --- Phase 1: the snapshot table -------------------------------------------

absl::Status Checker::ReadSnapshotTable(CheckResult* snap, RepairMode fix) {
  const bool repair = fix == RepairMode::kAll;
  uint32_t nb = h_.nb_snapshots;
  uint64_t reduced = 0, dropped = 0;
  if (nb > kMaxSnapshots && repair) {
    Msg(snap, absl::StrFormat("Discarding %d overhanging snapshots",
                              nb - kMaxSnapshots));
    reduced += nb - kMaxSnapshots;
    nb = kMaxSnapshots;
  }
  // QEMU validates the table pointer here rather than when opening.
  if (nb > kMaxSnapshots) {
    ++snap->check_errors;
    Msg(snap, "ERROR snapshot table too large");
    Msg(snap, absl::StrFormat("You can force-remove all %d overhanging "
                              "snapshots with qemu-img check -r all",
                              nb - kMaxSnapshots));
    return Efbig();
  }
  if (!IsAligned(h_.snapshots_offset, cs_) ||
      h_.snapshots_offset > static_cast<uint64_t>(INT64_MAX) -
                                uint64_t{nb} * kSnapshotHeaderSize) {
    ++snap->check_errors;
    Msg(snap, "ERROR snapshot table offset invalid");
    return Einval();
  }
  auto fail = [&](const std::string& why, absl::Status st) {
    ++snap->check_errors;
    Msg(snap, absl::StrCat("ERROR failed to read the snapshot table: ", why));
    snapshots_.clear();
    return st;
  };
  auto read = [&](uint64_t at, void* buf, size_t len) {
    return file_->ReadAt(at, absl::MakeSpan(static_cast<uint8_t*>(buf), len));
  };
  uint64_t offset = h_.snapshots_offset, table_length = 0;
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
      Msg(snap, absl::StrFormat("Discarding too much extra metadata in "
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
    sn.disk_size =
        sn.extra_data_size >= 16 ? LoadBE64(known + 8) : AlignUp(h_.size, 512);
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
        offset - h_.snapshots_offset > static_cast<uint64_t>(INT32_MAX)) {
      if (!repair) return fail("Snapshot table is too big", Efbig());
      Msg(snap, absl::StrFormat("Discarding %d overhanging snapshots "
                                "(snapshot table is too big)",
                                nb - i));
      reduced += nb - i;
      nb = i;
      offset = entry_start;
      break;
    }
    snapshots_.push_back(std::move(sn));
  }
  snapshots_size_ = offset - h_.snapshots_offset;
  snap->corruptions += reduced + dropped;
  if (reduced > 0) {
    // Dropping entries off the end only leaks clusters, which the refcount
    // check repairs.
    uint8_t buf[4];
    StoreBE32(buf, nb);
    absl::Status st =
        file_->WriteAt(kHeaderNbSnapshots, absl::MakeConstSpan(buf, 4));
    if (st.ok()) st = file_->Flush();
    if (!st.ok()) {
      ++snap->check_errors;
      Msg(snap, absl::StrCat("ERROR failed to update the snapshot count in "
                             "the image header: ",
                             st.message()));
      return st;
    }
    h_.nb_snapshots = nb;
    snap->corruptions_fixed += reduced;
    snap->corruptions -= reduced;
  }
  // Version 3 entries carry at least the 64-bit VM state size and the
  // disk size.
  if (h_.version >= 3) {
    for (size_t i = 0; i < snapshots_.size(); ++i) {
      if (snapshots_[i].extra_data_size < 16) {
        ++snap->corruptions;
        Msg(snap, absl::StrFormat("%s snapshot table entry %d is incomplete",
                                  repair ? "Repairing" : "ERROR", i));
      }
    }
  }
  return absl::OkStatus();
}

// --- Phase 2: expected refcounts --------------------------------------------

absl::Status Checker::Inc(CheckResult* res, uint64_t offset, uint64_t size,
                          uint32_t meta_kind) {
  if (size == 0) return absl::OkStatus();
  // The last cluster may be partly past the end of the file, no more.
  if (static_cast<int64_t>(offset + size) - static_cast<int64_t>(file_size_) >=
      static_cast<int64_t>(cs_)) {
    Msg(res, absl::StrFormat("ERROR: counting reference for region exceeding "
                             "the end of the file by one cluster or more: "
                             "offset 0x%x size 0x%x",
                             offset, size));
    ++res->corruptions;
    if (rejected_.size() < kMaxRejected) {
      rejected_.emplace_back(offset >> cb_, (offset + size - 1) >> cb_);
    } else {
      rejected_overflow_ = true;
    }
    return absl::OkStatus();
  }
  const uint64_t first = offset >> cb_;
  const uint64_t last = (offset + size - 1) >> cb_;
  if (last >= expected_.size()) {
    if (last >= kMaxCheckClusters + 1) return Efbig();
    expected_.Grow(last + 1);
  }
  for (uint64_t k = first; k <= last; ++k) {
    const uint64_t rc = expected_.Get(k);
    if (rc == max_refcount_) {
      Msg(res,
          absl::StrFormat("ERROR: overflow cluster offset=0x%x", k << cb_));
      Msg(res,
          "Use qemu-img amend to increase the refcount entry width or "
          "qemu-img convert to create a clean copy if the image cannot be "
          "opened for writing");
      ++res->corruptions;
      continue;
    }
    expected_.Set(k, rc + 1);
    if (meta_kind != 0) {
      MetaUse& use = meta_[k];
      use.kinds |= meta_kind;
      ++use.count;
    }
  }
  return absl::OkStatus();
}

absl::Status Checker::ZeroMisalignedEntry(CheckResult* res, uint64_t l2_offset,
                                          std::vector<uint8_t>* table,
                                          uint64_t i) {
  const uint32_t esize = h_.l2_entry_size();
  uint8_t* e = table->data() + i * esize;
  if (h_.extended_l2()) {
    // Allocated subclusters read as zero from now on.
    uint64_t bitmap = LoadBE64(e + 8);
    bitmap = (bitmap | (bitmap << 32)) & kBitmapAllZero;
    StoreBE64(e, 0);
    StoreBE64(e + 8, bitmap);
  } else {
    StoreBE64(e, kOflagZero);
  }
  absl::Status st =
      file_->WriteAt(l2_offset + i * esize, absl::MakeConstSpan(e, esize));
  if (st.ok()) st = file_->Flush();
  if (!st.ok()) {
    Msg(res, absl::StrCat("ERROR: Failed to overwrite L2 table entry: ",
                          st.message()));
    ++res->check_errors;
    return st;
  }
  --res->corruptions;
  ++res->corruptions_fixed;
  return absl::OkStatus();
}

absl::Status Checker::CheckL2(CheckResult* res, uint64_t l2_offset, bool active,
                              RepairMode fix) {
  std::vector<uint8_t> table(cs_);
  absl::Status st = file_->ReadAt(l2_offset, absl::MakeSpan(table));
  if (!st.ok()) {
    Msg(res, "ERROR: I/O error in check_refcounts_l2");
    ++res->check_errors;
    return st;
  }
  const bool extended = h_.extended_l2();
  const uint32_t esize = h_.l2_entry_size();
  uint64_t next_contiguous = 0;
  for (uint64_t i = 0; i < h_.l2_entries(); ++i) {
    uint64_t entry = LoadBE64(&table[i * esize]);
    const uint64_t bitmap = extended ? LoadBE64(&table[i * esize + 8]) : 0;
    const L2Type type = TypeOf(entry, extended);
    if (type != L2Type::kCompressed && (entry & kL2StandardReservedMask)) {
      Msg(res, absl::StrCat("ERROR found l2 entry with reserved bits set: ",
                            Hex(entry)));
      ++res->corruptions;
    }
    switch (type) {
      case L2Type::kCompressed: {
        if (entry & kOflagCopied) {
          const CompressedExtent ext = DecodeCompressed(entry, cb_);
          Msg(res, absl::StrFormat("ERROR: coffset=0x%x: copied flag must "
                                   "never be set for compressed clusters",
                                   ext.host_offset));
          entry &= ~kOflagCopied;
          ++res->corruptions;
        }
        if (bitmap) {
          Msg(res, absl::StrFormat("ERROR compressed cluster %d with non-zero "
                                   "subcluster allocation bitmap, "
                                   "entry=0x%x",
                                   i, entry));
          ++res->corruptions;
          break;
        }
        const CompressedExtent ext = DecodeCompressed(entry, cb_);
        RETURN_IF_ERROR(Inc(res, ext.host_offset, ext.length));
        if (active) {
          ++res->allocated_clusters;
          ++res->compressed_clusters;
          ++res->fragmented_clusters;  // compressed clusters always are
        }
        break;
      }
      case L2Type::kZeroAlloc:
      case L2Type::kNormal: {
        const uint64_t offset = entry & kEntryOffsetMask;
        if ((bitmap >> 32) & bitmap) {
          ++res->corruptions;
          Msg(res, absl::StrFormat("ERROR offset=%x: Allocated cluster has "
                                   "corrupted subcluster allocation bitmap",
                                   offset));
        }
        if (!IsAligned(offset, cs_)) {
          ++res->corruptions;
          const bool contains_data = extended ? (bitmap & kBitmapAllAlloc) != 0
                                              : !(entry & kOflagZero);
          if (!contains_data) {
            Msg(res,
                absl::StrFormat("%s offset=%x: Preallocated cluster is "
                                "not properly aligned; L2 entry "
                                "corrupted.",
                                fix == RepairMode::kAll ? "Repairing" : "ERROR",
                                offset));
            if (fix == RepairMode::kAll &&
                ZeroMisalignedEntry(res, l2_offset, &table, i).ok()) {
              continue;  // the entry no longer references a cluster
            }
          } else {
            Msg(res, absl::StrFormat("ERROR offset=%x: Data cluster is not "
                                     "properly aligned; L2 entry corrupted.",
                                     offset));
          }
        }
        if (active) {
          ++res->allocated_clusters;
          if (next_contiguous != 0 && offset != next_contiguous) {
            ++res->fragmented_clusters;
          }
          next_contiguous = offset + cs_;
        }
        RETURN_IF_ERROR(Inc(res, offset, cs_));
        break;
      }
      case L2Type::kZeroPlain:
        break;
      case L2Type::kUnallocated:
        if (bitmap & kBitmapAllAlloc) {
          ++res->corruptions;
          Msg(res,
              "ERROR: Unallocated cluster has non-zero subcluster "
              "allocation map");
        }
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status Checker::CheckL1(CheckResult* res, uint64_t l1_offset,
                              uint32_t l1_size, bool active, RepairMode fix) {
  if (l1_size == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Inc(res, l1_offset, uint64_t{l1_size} * 8,
                      active ? kMetaActiveL1 : kMetaSnapshotL1));
  std::vector<uint8_t> raw(uint64_t{l1_size} * 8);
  absl::Status st = file_->ReadAt(l1_offset, absl::MakeSpan(raw));
  if (!st.ok()) {
    Msg(res, "ERROR: I/O error in check_refcounts_l1");
    ++res->check_errors;
    return st;
  }
  for (uint32_t i = 0; i < l1_size; ++i) {
    const uint64_t e = LoadBE64(&raw[uint64_t{i} * 8]);
    if (e == 0) continue;
    if (e & kL1ReservedMask) {
      Msg(res, absl::StrCat("ERROR found L1 entry with reserved bits set: ",
                            Hex(e)));
      ++res->corruptions;
    }
    const uint64_t l2_offset = e & kL1OffsetMask;
    RETURN_IF_ERROR(Inc(res, l2_offset, cs_, kMetaL2));
    if (!IsAligned(l2_offset, cs_)) {
      Msg(res, absl::StrFormat("ERROR l2_offset=%x: Table is not cluster "
                               "aligned; L1 entry corrupted",
                               l2_offset));
      ++res->corruptions;
    }
    RETURN_IF_ERROR(CheckL2(res, l2_offset, active, fix));
  }
  return absl::OkStatus();
}

absl::Status Checker::CheckBitmaps(CheckResult* res) {
  if (!(h_.autoclear_features & kAutoclearBitmaps)) return absl::OkStatus();
  const RawExtension* ext = nullptr;
  for (const RawExtension& e : h_.other_extensions) {
    if (e.magic == kExtBitmaps) ext = &e;
  }
  if (ext == nullptr || ext->data.size() < 24) return absl::OkStatus();
  const uint32_t nb_bitmaps = LoadBE32(&ext->data[0]);
  const uint64_t dir_size = LoadBE64(&ext->data[8]);
  const uint64_t dir_offset = LoadBE64(&ext->data[16]);
  if (nb_bitmaps == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Inc(res, dir_offset, dir_size, kMetaBitmap));
  if (dir_size > kMaxSnapshotTableBytes) {
    ++res->corruptions;
    return Einval();
  }
  std::vector<uint8_t> dir(dir_size);
  RETURN_IF_ERROR(file_->ReadAt(dir_offset, absl::MakeSpan(dir)));
  uint64_t pos = 0;
  for (uint32_t b = 0; b < nb_bitmaps; ++b) {
    if (pos + kBitmapDirEntryFixed > dir.size()) {
      ++res->corruptions;  // QEMU cannot load the directory
      return Einval();
    }
    const uint64_t table_offset = LoadBE64(&dir[pos]);
    const uint32_t table_size = LoadBE32(&dir[pos + 8]);
    const uint16_t name_size = LoadBE16(&dir[pos + 18]);
    const uint32_t extra = LoadBE32(&dir[pos + 20]);
    pos += AlignUp(uint64_t{kBitmapDirEntryFixed} + extra + name_size, 8);
    if (pos > dir.size()) {
      ++res->corruptions;
      return Einval();
    }
    RETURN_IF_ERROR(
        Inc(res, table_offset, uint64_t{table_size} * 8, kMetaBitmap));
    // Past the end of the file the table reads as zero entries, which
    // reference nothing: read only the part inside the file, so that a
    // table size from an untrusted image cannot ask for gigabytes.
    const uint64_t table_bytes = uint64_t{table_size} * 8;
    const uint64_t in_file =
        table_offset >= file_size_
            ? 0
            : std::min(table_bytes, file_size_ - table_offset) / 8 * 8;
    std::vector<uint8_t> table(in_file);
    if (!file_->ReadAt(table_offset, absl::MakeSpan(table)).ok()) {
      ++res->corruptions;
      break;
    }
    for (uint64_t i = 0; i < in_file / 8; ++i) {
      const uint64_t e = LoadBE64(&table[uint64_t{i} * 8]);
      const uint64_t off = e & kEntryOffsetMask;
      if ((e & kBitmapEntryReservedMask) ||
          (off != 0 && ((e & kBitmapEntryAllOnes) || !IsAligned(off, cs_)))) {
        ++res->corruptions;
        continue;
      }
      if (off != 0) RETURN_IF_ERROR(Inc(res, off, cs_, kMetaBitmap));
    }
  }
  return absl::OkStatus();
}

void Checker::CheckRefblocks(CheckResult* res, RepairMode fix, bool* rebuild) {
  const std::vector<uint64_t>& table = stored_.table();
  for (uint64_t i = 0; i < table.size(); ++i) {
    const uint64_t offset = table[i] & kRefTableOffsetMask;
    const uint64_t cluster = offset >> cb_;
    if (table[i] & kRefTableReservedMask) {
      Msg(res, absl::StrFormat("ERROR refcount table entry %d has reserved "
                               "bits set",
                               i));
      ++res->corruptions;
      *rebuild = true;
      continue;
    }
    if (!IsAligned(offset, cs_)) {
      Msg(res, absl::StrFormat("ERROR refcount block %d is not cluster "
                               "aligned; refcount table entry corrupted",
                               i));
      ++res->corruptions;
      *rebuild = true;
      continue;
    }
    if (cluster >= expected_.size()) {
      Msg(res,
          absl::StrFormat("%s refcount block %d is outside image",
                          fix == RepairMode::kAll ? "Repairing" : "ERROR", i));
      ++res->corruptions;
      if (fix != RepairMode::kAll) continue;
      // QEMU grows the file to hold the block, which then reads as zeros:
      // the block's own cluster shows up as "refcount=0 reference=1" and
      // forces a rebuild. We count the same way but write nothing at a
      // possibly wild offset: the rebuild puts the new structure at the
      // real end of the file.
      *rebuild = true;
      if (offset > static_cast<uint64_t>(INT64_MAX) - cs_) {
        Msg(res, "ERROR could not resize image: Invalid argument");
        continue;
      }
      if (offset + cs_ > kTypicalMaxFileSize) {
        Msg(res, "ERROR could not resize image: File too large");
        continue;
      }
      --res->corruptions;
      ++res->corruptions_fixed;
      if (cluster < kMaxCheckClusters) {
        expected_.Grow(cluster + 1);
        expected_.Set(cluster, expected_.Get(cluster) + 1);
      } else {
        // Too far away to track: count the error Compare() would find.
        Msg(res, absl::StrFormat("ERROR cluster %d refcount=0 reference=1",
                                 cluster));
        ++res->corruptions;
      }
      continue;
    }
    if (offset == 0) continue;
    // Cannot fail: the cluster is inside the image.
    (void)Inc(res, offset, cs_, kMetaRefBlock);
    const uint64_t rc = expected_.Get(cluster);
    if (rc != 1) {
      Msg(res, absl::StrFormat("ERROR refcount block %d refcount=%d", i, rc));
      ++res->corruptions;
      *rebuild = true;
    }
  }
}

absl::Status Checker::Calculate(RepairMode fix, bool refcount_structures,
                                CheckResult* res, bool* rebuild) {
  expected_.Reset(DivRoundUp(file_size_, cs_));
  meta_.clear();
  rejected_.clear();
  rejected_overflow_ = false;
  RETURN_IF_ERROR(Inc(res, 0, cs_, kMetaHeader));
  RETURN_IF_ERROR(CheckL1(res, h_.l1_table_offset, h_.l1_size, true, fix));
  for (const Snapshot& sn : snapshots_) {
    if (!IsAligned(sn.l1_offset, cs_)) {
      Msg(res, absl::StrFormat("ERROR snapshot %s (%s) l1_offset=%#x: L1 "
                               "table is not cluster aligned; snapshot table "
                               "entry corrupted",
                               sn.id, sn.name, sn.l1_offset));
      ++res->corruptions;
      continue;
    }
    if (uint64_t{sn.l1_size} * 8 > kMaxL1Bytes) {
      Msg(res, absl::StrFormat("ERROR snapshot %s (%s) l1_size=%#x: L1 table "
                               "is too large; snapshot table entry corrupted",
                               sn.id, sn.name, sn.l1_size));
      ++res->corruptions;
      continue;
    }
    RETURN_IF_ERROR(CheckL1(res, sn.l1_offset, sn.l1_size, false, fix));
  }
  RETURN_IF_ERROR(
      Inc(res, h_.snapshots_offset, snapshots_size_, kMetaSnapshotTable));
  if (refcount_structures) {
    RETURN_IF_ERROR(Inc(res, h_.refcount_table_offset,
                        uint64_t{h_.refcount_table_clusters} << cb_,
                        kMetaRefTable));
  }
  RETURN_IF_ERROR(CheckBitmaps(res));
  if (refcount_structures) CheckRefblocks(res, fix, rebuild);
  return absl::OkStatus();
}

// A descriptive line for each metadata cluster that is also used as
// something else. The counters are not touched: QEMU counts these as
// refcount mismatches ("refcount=1 reference=2"), and so do we.
void Checker::ReportOverlaps(CheckResult* res) {
  std::vector<uint64_t> clusters;
  for (const auto& [k, use] : meta_) {
    const bool several_kinds = (use.kinds & (use.kinds - 1)) != 0;
    if (several_kinds || expected_.Get(k) > use.count) clusters.push_back(k);
  }
  std::sort(clusters.begin(), clusters.end());
  for (uint64_t k : clusters) {
    const MetaUse& use = meta_.at(k);
    std::string what = MetaKindNames(use.kinds);
    if (expected_.Get(k) > use.count) absl::StrAppend(&what, " and guest data");
    Msg(res, absl::StrFormat("ERROR cluster %d (offset 0x%x) is used as %s "
                             "(metadata overlap)",
                             k, k << cb_, what));
  }
}

// --- Phase 3: expected against stored ----------------------------------------

absl::Status Checker::Compare(CheckResult* res, RepairMode fix, bool* rebuild,
                              uint64_t* highest) {
  *highest = 0;
  const uint64_t n = expected_.size();
  const uint64_t per_block = stored_.block_entries();
  bool wrote = false;
  for (uint64_t idx = 0; idx * per_block < n; ++idx) {
    absl::StatusOr<uint8_t*> block = stored_.Block(idx);
    const uint64_t end = std::min(n, (idx + 1) * per_block);
    for (uint64_t i = idx * per_block; i < end; ++i) {
      if (!block.ok()) {
        Msg(res, absl::StrFormat("Can't get refcount for cluster %d: %s", i,
                                 block.status().message()));
        ++res->check_errors;
        continue;
      }
      const uint64_t stored =
          *block ? ReadRefcount(*block, stored_.order(), i % per_block) : 0;
      const uint64_t want = expected_.Get(i);
      if (stored > 0 || want > 0) *highest = i;
      if (stored == want) continue;
      uint64_t* num_fixed = nullptr;
      if (stored == 0) {
        *rebuild = true;
      } else if (stored > want && fix != RepairMode::kNone) {
        num_fixed = &res->leaks_fixed;
      } else if (stored < want && fix == RepairMode::kAll) {
        num_fixed = &res->corruptions_fixed;
      }
      Msg(res, absl::StrFormat("%s cluster %d refcount=%d reference=%d",
                               num_fixed       ? "Repairing"
                               : stored < want ? "ERROR"
                                               : "Leaked",
                               i, stored, want));
      if (num_fixed) {
        stored_.Set(i, want);  // *block is non-null: stored > 0
        wrote = true;
        ++*num_fixed;
        continue;
      }
      if (stored < want) {
        ++res->corruptions;
      } else {
        ++res->leaks;
      }
    }
  }
  if (wrote) {
    RETURN_IF_ERROR(stored_.WriteBack());
    RETURN_IF_ERROR(file_->Flush());
  }
  return absl::OkStatus();
}

// --- Phase 5: COPIED flags ---------------------------------------------------

absl::Status Checker::CheckCopied(CheckResult* res, RepairMode fix) {
  // With -r leaks, QEMU repairs COPIED flags only when the refcounts are
  // known to be right.
  const bool repair = fix == RepairMode::kAll ||
                      (fix == RepairMode::kLeaks && res->check_errors == 0 &&
                       res->corruptions == 0 && res->leaks == 0);
  if (h_.l1_size == 0) return absl::OkStatus();
  std::vector<uint8_t> l1(uint64_t{h_.l1_size} * 8);
  absl::Status st = file_->ReadAt(h_.l1_table_offset, absl::MakeSpan(l1));
  if (!st.ok()) {
    ++res->check_errors;
    return st;
  }
  // Writes into a table that is also some other metadata would destroy it:
  // QEMU's overlap check refuses those, and so do we.
  auto overlaps_other_metadata = [&](uint64_t offset, uint32_t own_kind) {
    auto it = meta_.find(offset >> cb_);
    return !IsAligned(offset, cs_) ||
           (it != meta_.end() && (it->second.kinds & ~own_kind) != 0);
  };
  const bool extended = h_.extended_l2();
  const uint32_t esize = h_.l2_entry_size();
  std::vector<uint8_t> l2(cs_);
  bool wrote = false;
  for (uint32_t i = 0; i < h_.l1_size; ++i) {
    const uint64_t l1e = LoadBE64(&l1[uint64_t{i} * 8]);
    const uint64_t l2_offset = l1e & kL1OffsetMask;
    if (l2_offset == 0) continue;
    absl::StatusOr<uint64_t> rc = stored_.Get(l2_offset >> cb_);
    if (!rc.ok()) continue;  // already reported by Compare()
    if ((*rc == 1) != ((l1e & kOflagCopied) != 0)) {
      ++res->corruptions;
      Msg(res, absl::StrFormat("%s OFLAG_COPIED L2 cluster: l1_index=%d "
                               "l1_entry=%x refcount=%d",
                               repair ? "Repairing" : "ERROR", i, l1e, *rc));
      if (repair) {
        const uint64_t fixed =
            *rc == 1 ? (l1e | kOflagCopied) : (l1e & ~kOflagCopied);
        uint8_t buf[8];
        StoreBE64(buf, fixed);
        if (overlaps_other_metadata(h_.l1_table_offset, kMetaActiveL1)) {
          st = Eio();
        } else {
          st = file_->WriteAt(h_.l1_table_offset + uint64_t{i} * 8,
                              absl::MakeConstSpan(buf, 8));
          if (st.ok()) st = file_->Flush();
        }
        if (!st.ok()) {
          ++res->check_errors;
          return st;
        }
        --res->corruptions;
        ++res->corruptions_fixed;
      }
    }
    st = file_->ReadAt(l2_offset, absl::MakeSpan(l2));
    if (!st.ok()) {
      Msg(res, absl::StrCat("ERROR: Could not read L2 table: ", st.message()));
      ++res->check_errors;
      return st;
    }
    uint64_t dirty = 0;
    for (uint64_t j = 0; j < h_.l2_entries(); ++j) {
      const uint64_t entry = LoadBE64(&l2[j * esize]);
      const L2Type type = TypeOf(entry, extended);
      if (type != L2Type::kNormal && type != L2Type::kZeroAlloc) continue;
      absl::StatusOr<uint64_t> drc =
          stored_.Get((entry & kEntryOffsetMask) >> cb_);
      if (!drc.ok()) continue;
      if ((*drc == 1) == ((entry & kOflagCopied) != 0)) continue;
      ++res->corruptions;
      Msg(res, absl::StrFormat("%s OFLAG_COPIED data cluster: l2_entry=%x "
                               "refcount=%d",
                               repair ? "Repairing" : "ERROR", entry, *drc));
      if (repair) {
        StoreBE64(&l2[j * esize],
                  *drc == 1 ? (entry | kOflagCopied) : (entry & ~kOflagCopied));
        ++dirty;
      }
    }
    if (dirty == 0) continue;
    if (overlaps_other_metadata(l2_offset, kMetaL2)) {
      Msg(res,
          "ERROR: Could not write L2 table; metadata overlap check "
          "failed: Input/output error");
      ++res->check_errors;
      return Eio();
    }
    st = file_->WriteAt(l2_offset, l2);
    if (!st.ok()) {
      Msg(res, absl::StrCat("ERROR: Could not write L2 table: ", st.message()));
      ++res->check_errors;
      return st;
    }
    wrote = true;
    res->corruptions -= dirty;
    res->corruptions_fixed += dirty;
  }
  if (wrote) RETURN_IF_ERROR(file_->Flush());
  return absl::OkStatus();
}

}  // namespace qcow2::internal::check_detail
