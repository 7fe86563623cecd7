// SPDX-License-Identifier: Apache-2.0
// The refcount checker's scan (phase 2 of check.cc's overview): walking
// the header, L1/L2 tables, bitmaps and refcount blocks to compute the
// expected refcount of every host cluster.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/base/endian.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/check/check_internal.h"
#include "lib/format/entries.h"
#include "lib/format/crypto_ext.h"
#include "lib/format/header.h"

namespace qcow2::internal::check_detail {

// --- Phase 2: expected refcounts --------------------------------------------

absl::Status ReferenceScan::Inc(CheckResult* res, uint64_t offset,
                                uint64_t size, uint32_t meta_kind) {
  if (size == 0) return absl::OkStatus();
  // The last cluster may be partly past the end of the file, no more.
  if (static_cast<int64_t>(offset + size) -
          static_cast<int64_t>(s_.file_size) >=
      static_cast<int64_t>(s_.cs)) {
    s_.Msg(res,
           absl::StrFormat("ERROR: counting reference for region exceeding "
                           "the end of the file by one cluster or more: "
                           "offset 0x%x size 0x%x",
                           offset, size));
    ++res->corruptions;
    if (s_.rejected.size() < kMaxRejected) {
      s_.rejected.emplace_back(offset >> s_.cb, (offset + size - 1) >> s_.cb);
    } else {
      s_.rejected_overflow = true;
    }
    return absl::OkStatus();
  }
  const uint64_t first = offset >> s_.cb;
  const uint64_t last = (offset + size - 1) >> s_.cb;
  if (last >= s_.expected.size()) {
    if (last >= kMaxCheckClusters + 1) return Efbig();
    s_.expected.Grow(last + 1);
  }
  for (uint64_t k = first; k <= last; ++k) {
    const uint64_t rc = s_.expected.Get(k);
    if (rc == s_.max_refcount) {
      s_.Msg(res, absl::StrFormat("ERROR: overflow cluster offset=0x%x",
                                  k << s_.cb));
      s_.Msg(res,
             "Use qemu-img amend to increase the refcount entry width or "
             "qemu-img convert to create a clean copy if the image cannot be "
             "opened for writing");
      ++res->corruptions;
      continue;
    }
    s_.expected.Set(k, rc + 1);
    if (meta_kind != 0) {
      MetaUse& use = s_.meta[k];
      use.kinds |= meta_kind;
      ++use.count;
    }
  }
  return absl::OkStatus();
}

absl::Status ReferenceScan::ZeroMisalignedEntry(CheckResult* res,
                                                uint64_t l2_offset,
                                                std::vector<uint8_t>* table,
                                                uint64_t i) {
  const uint32_t esize = s_.h.l2_entry_size();
  uint8_t* e = table->data() + i * esize;
  if (s_.h.extended_l2()) {
    // Allocated subclusters read as zero from now on.
    uint64_t bitmap = LoadBE64(e + 8);
    bitmap = (bitmap | (bitmap << 32)) & kBitmapAllZero;
    StoreBE64(e, 0);
    StoreBE64(e + 8, bitmap);
  } else {
    StoreBE64(e, kOflagZero);
  }
  absl::Status st =
      s_.file->WriteAt(l2_offset + i * esize, absl::MakeConstSpan(e, esize));
  if (st.ok()) st = s_.file->Flush();
  if (!st.ok()) {
    s_.Msg(res, absl::StrCat("ERROR: Failed to overwrite L2 table entry: ",
                             st.message()));
    ++res->check_errors;
    return st;
  }
  --res->corruptions;
  ++res->corruptions_fixed;
  return absl::OkStatus();
}

absl::Status ReferenceScan::CheckL2(CheckResult* res, uint64_t l2_offset,
                                    bool active, RepairMode fix) {
  std::vector<uint8_t> table(s_.cs);
  absl::Status st = s_.file->ReadAt(l2_offset, absl::MakeSpan(table));
  if (!st.ok()) {
    s_.Msg(res, "ERROR: I/O error in check_refcounts_l2");
    ++res->check_errors;
    return st;
  }
  const bool extended = s_.h.extended_l2();
  const uint32_t esize = s_.h.l2_entry_size();
  uint64_t next_contiguous = 0;
  for (uint64_t i = 0; i < s_.h.l2_entries(); ++i) {
    uint64_t entry = LoadBE64(&table[i * esize]);
    const uint64_t bitmap = extended ? LoadBE64(&table[i * esize + 8]) : 0;
    const L2Type type = TypeOf(entry, extended, s_.data_file);
    if (type != L2Type::kCompressed && (entry & kL2StandardReservedMask)) {
      s_.Msg(res, absl::StrCat("ERROR found l2 entry with reserved bits set: ",
                               Hex(entry)));
      ++res->corruptions;
    }
    switch (type) {
      case L2Type::kCompressed: {
        if (entry & kOflagCopied) {
          const CompressedExtent ext = DecodeCompressed(entry, s_.cb);
          s_.Msg(res, absl::StrFormat("ERROR: coffset=0x%x: copied flag must "
                                      "never be set for compressed clusters",
                                      ext.host_offset));
          entry &= ~kOflagCopied;
          ++res->corruptions;
        }
        if (bitmap) {
          s_.Msg(res,
                 absl::StrFormat("ERROR compressed cluster %d with non-zero "
                                 "subcluster allocation bitmap, "
                                 "entry=0x%x",
                                 i, entry));
          ++res->corruptions;
          break;
        }
        const CompressedExtent ext = DecodeCompressed(entry, s_.cb);
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
          s_.Msg(res, absl::StrFormat("ERROR offset=%x: Allocated cluster has "
                                      "corrupted subcluster allocation bitmap",
                                      offset));
        }
        if (!IsAligned(offset, s_.cs)) {
          ++res->corruptions;
          const bool contains_data = extended ? (bitmap & kBitmapAllAlloc) != 0
                                              : !(entry & kOflagZero);
          if (!contains_data) {
            s_.Msg(res, absl::StrFormat(
                            "%s offset=%x: Preallocated cluster is "
                            "not properly aligned; L2 entry "
                            "corrupted.",
                            fix == RepairMode::kAll ? "Repairing" : "ERROR",
                            offset));
            if (fix == RepairMode::kAll &&
                ZeroMisalignedEntry(res, l2_offset, &table, i).ok()) {
              continue;  // the entry no longer references a cluster
            }
          } else {
            s_.Msg(res, absl::StrFormat("ERROR offset=%x: Data cluster is not "
                                        "properly aligned; L2 entry corrupted.",
                                        offset));
          }
        }
        if (active) {
          ++res->allocated_clusters;
          if (next_contiguous != 0 && offset != next_contiguous) {
            ++res->fragmented_clusters;
          }
          next_contiguous = offset + s_.cs;
        }
        if (!s_.data_file) RETURN_IF_ERROR(Inc(res, offset, s_.cs));
        break;
      }
      case L2Type::kZeroPlain:
        break;
      case L2Type::kUnallocated:
        if (bitmap & kBitmapAllAlloc) {
          ++res->corruptions;
          s_.Msg(res,
                 "ERROR: Unallocated cluster has non-zero subcluster "
                 "allocation map");
        }
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status ReferenceScan::CheckL1(CheckResult* res, uint64_t l1_offset,
                                    uint32_t l1_size, bool active,
                                    RepairMode fix) {
  if (l1_size == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Inc(res, l1_offset, uint64_t{l1_size} * 8,
                      active ? kMetaActiveL1 : kMetaSnapshotL1));
  std::vector<uint8_t> raw(uint64_t{l1_size} * 8);
  absl::Status st = s_.file->ReadAt(l1_offset, absl::MakeSpan(raw));
  if (!st.ok()) {
    s_.Msg(res, "ERROR: I/O error in check_refcounts_l1");
    ++res->check_errors;
    return st;
  }
  for (uint32_t i = 0; i < l1_size; ++i) {
    const uint64_t e = LoadBE64(&raw[uint64_t{i} * 8]);
    if (e == 0) continue;
    if (e & kL1ReservedMask) {
      s_.Msg(res, absl::StrCat("ERROR found L1 entry with reserved bits set: ",
                               Hex(e)));
      ++res->corruptions;
    }
    const uint64_t l2_offset = e & kL1OffsetMask;
    RETURN_IF_ERROR(Inc(res, l2_offset, s_.cs, kMetaL2));
    if (!IsAligned(l2_offset, s_.cs)) {
      s_.Msg(res, absl::StrFormat("ERROR l2_offset=%x: Table is not cluster "
                                  "aligned; L1 entry corrupted",
                                  l2_offset));
      ++res->corruptions;
    }
    RETURN_IF_ERROR(CheckL2(res, l2_offset, active, fix));
  }
  return absl::OkStatus();
}

absl::Status ReferenceScan::CheckBitmaps(CheckResult* res) {
  if (!(s_.h.autoclear_features & kAutoclearBitmaps)) return absl::OkStatus();
  const RawExtension* ext = nullptr;
  for (const RawExtension& e : s_.h.other_extensions) {
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
  RETURN_IF_ERROR(s_.file->ReadAt(dir_offset, absl::MakeSpan(dir)));
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
        table_offset >= s_.file_size
            ? 0
            : std::min(table_bytes, s_.file_size - table_offset) / 8 * 8;
    std::vector<uint8_t> table(in_file);
    if (!s_.file->ReadAt(table_offset, absl::MakeSpan(table)).ok()) {
      ++res->corruptions;
      break;
    }
    for (uint64_t i = 0; i < in_file / 8; ++i) {
      const uint64_t e = LoadBE64(&table[uint64_t{i} * 8]);
      const uint64_t off = e & kEntryOffsetMask;
      if ((e & kBitmapEntryReservedMask) ||
          (off != 0 && ((e & kBitmapEntryAllOnes) || !IsAligned(off, s_.cs)))) {
        ++res->corruptions;
        continue;
      }
      if (off != 0) RETURN_IF_ERROR(Inc(res, off, s_.cs, kMetaBitmap));
    }
  }
  return absl::OkStatus();
}

void ReferenceScan::CheckRefblocks(CheckResult* res, RepairMode fix,
                                   bool* rebuild) {
  const std::vector<uint64_t>& table = s_.stored.table();
  for (uint64_t i = 0; i < table.size(); ++i) {
    const uint64_t offset = table[i] & kRefTableOffsetMask;
    const uint64_t cluster = offset >> s_.cb;
    if (table[i] & kRefTableReservedMask) {
      s_.Msg(res, absl::StrFormat("ERROR refcount table entry %d has reserved "
                                  "bits set",
                                  i));
      ++res->corruptions;
      *rebuild = true;
      continue;
    }
    if (!IsAligned(offset, s_.cs)) {
      s_.Msg(res, absl::StrFormat("ERROR refcount block %d is not cluster "
                                  "aligned; refcount table entry corrupted",
                                  i));
      ++res->corruptions;
      *rebuild = true;
      continue;
    }
    if (cluster >= s_.expected.size()) {
      s_.Msg(res, absl::StrFormat(
                      "%s refcount block %d is outside image",
                      fix == RepairMode::kAll ? "Repairing" : "ERROR", i));
      ++res->corruptions;
      if (fix != RepairMode::kAll) continue;
      // QEMU grows the file to hold the block, which then reads as zeros:
      // the block's own cluster shows up as "refcount=0 reference=1" and
      // forces a rebuild. We count the same way but write nothing at a
      // possibly wild offset: the rebuild puts the new structure at the
      // real end of the file.
      *rebuild = true;
      if (offset > static_cast<uint64_t>(INT64_MAX) - s_.cs) {
        s_.Msg(res, "ERROR could not resize image: Invalid argument");
        continue;
      }
      if (offset + s_.cs > kTypicalMaxFileSize) {
        s_.Msg(res, "ERROR could not resize image: File too large");
        continue;
      }
      --res->corruptions;
      ++res->corruptions_fixed;
      if (cluster < kMaxCheckClusters) {
        s_.expected.Grow(cluster + 1);
        s_.expected.Set(cluster, s_.expected.Get(cluster) + 1);
      } else {
        // Too far away to track: count the error Compare() would find.
        s_.Msg(res, absl::StrFormat("ERROR cluster %d refcount=0 reference=1",
                                    cluster));
        ++res->corruptions;
      }
      continue;
    }
    if (offset == 0) continue;
    // Cannot fail: the cluster is inside the image.
    (void)Inc(res, offset, s_.cs, kMetaRefBlock);
    const uint64_t rc = s_.expected.Get(cluster);
    if (rc != 1) {
      s_.Msg(res,
             absl::StrFormat("ERROR refcount block %d refcount=%d", i, rc));
      ++res->corruptions;
      *rebuild = true;
    }
  }
}

absl::Status ReferenceScan::Calculate(RepairMode fix, bool refcount_structures,
                                      CheckResult* res, bool* rebuild) {
  s_.expected.Reset(DivRoundUp(s_.file_size, s_.cs));
  s_.meta.clear();
  s_.rejected.clear();
  s_.rejected_overflow = false;
  RETURN_IF_ERROR(Inc(res, 0, s_.cs, kMetaHeader));
  // The LUKS area of an encrypted image (validated at open), as QEMU
  // counts it: referenced, never a leak, never freed by a repair.
  ASSIGN_OR_RETURN(std::optional<CryptoExtension> crypto,
                   DecodeCryptoExtension(s_.h, s_.file_size, s_.file->name()));
  if (crypto.has_value()) {
    RETURN_IF_ERROR(Inc(res, crypto->offset, crypto->length, kMetaHeader));
  }
  RETURN_IF_ERROR(CheckL1(res, s_.h.l1_table_offset, s_.h.l1_size, true, fix));
  for (const Snapshot& sn : table_.snapshots()) {
    if (!IsAligned(sn.l1_offset, s_.cs)) {
      s_.Msg(res,
             absl::StrFormat("ERROR snapshot %s (%s) l1_offset=%#x: L1 "
                             "table is not cluster aligned; snapshot table "
                             "entry corrupted",
                             sn.id, sn.name, sn.l1_offset));
      ++res->corruptions;
      continue;
    }
    if (uint64_t{sn.l1_size} * 8 > kMaxL1Bytes) {
      s_.Msg(res,
             absl::StrFormat("ERROR snapshot %s (%s) l1_size=%#x: L1 table "
                             "is too large; snapshot table entry corrupted",
                             sn.id, sn.name, sn.l1_size));
      ++res->corruptions;
      continue;
    }
    RETURN_IF_ERROR(CheckL1(res, sn.l1_offset, sn.l1_size, false, fix));
  }
  RETURN_IF_ERROR(
      Inc(res, s_.h.snapshots_offset, table_.size_bytes(), kMetaSnapshotTable));
  if (refcount_structures) {
    RETURN_IF_ERROR(Inc(res, s_.h.refcount_table_offset,
                        uint64_t{s_.h.refcount_table_clusters} << s_.cb,
                        kMetaRefTable));
  }
  RETURN_IF_ERROR(CheckBitmaps(res));
  if (refcount_structures) CheckRefblocks(res, fix, rebuild);
  return absl::OkStatus();
}

// A descriptive line for each metadata cluster that is also used as
// something else. The counters are not touched: QEMU counts these as
// refcount mismatches ("refcount=1 reference=2"), and so do we.
void ReferenceScan::ReportOverlaps(CheckResult* res) {
  std::vector<uint64_t> clusters;
  for (const auto& [k, use] : s_.meta) {
    const bool several_kinds = (use.kinds & (use.kinds - 1)) != 0;
    if (several_kinds || s_.expected.Get(k) > use.count) clusters.push_back(k);
  }
  std::sort(clusters.begin(), clusters.end());
  for (uint64_t k : clusters) {
    const MetaUse& use = s_.meta.at(k);
    std::string what = MetaKindNames(use.kinds);
    if (s_.expected.Get(k) > use.count)
      absl::StrAppend(&what, " and guest data");
    s_.Msg(res, absl::StrFormat("ERROR cluster %d (offset 0x%x) is used as %s "
                                "(metadata overlap)",
                                k, k << s_.cb, what));
  }
}

}  // namespace qcow2::internal::check_detail
