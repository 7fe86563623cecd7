// SPDX-License-Identifier: Apache-2.0
// The refcount checker's comparisons (phases 3 and 5 of check.cc's
// overview): expected against stored refcounts, and the COPIED flags.
#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/endian.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/check/check_internal.h"
#include "lib/format/entries.h"

namespace qcow2::internal::check_detail {

// --- Phase 3: expected against stored ------------------------------------

absl::Status Checker::Compare(CheckResult* res, RepairMode fix, bool* rebuild,
                              uint64_t* highest) {
  *highest = 0;
  const uint64_t n = s_.expected.size();
  const uint64_t per_block = s_.stored.block_entries();
  bool wrote = false;
  for (uint64_t idx = 0; idx * per_block < n; ++idx) {
    absl::StatusOr<uint8_t*> block = s_.stored.Block(idx);
    const uint64_t end = std::min(n, (idx + 1) * per_block);
    for (uint64_t i = idx * per_block; i < end; ++i) {
      if (!block.ok()) {
        s_.Msg(res, absl::StrFormat("Can't get refcount for cluster %d: %s", i,
                                    block.status().message()));
        ++res->check_errors;
        continue;
      }
      const uint64_t stored =
          *block ? ReadRefcount(*block, s_.stored.order(), i % per_block) : 0;
      const uint64_t want = s_.expected.Get(i);
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
      s_.Msg(res, absl::StrFormat("%s cluster %d refcount=%d reference=%d",
                                  num_fixed       ? "Repairing"
                                  : stored < want ? "ERROR"
                                                  : "Leaked",
                                  i, stored, want));
      if (num_fixed) {
        s_.stored.Set(i, want);  // *block is non-null: stored > 0
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
    RETURN_IF_ERROR(s_.stored.WriteBack());
    RETURN_IF_ERROR(s_.file->Flush());
  }
  return absl::OkStatus();
}

// --- Phase 5: COPIED flags ----------------------------------------------

absl::Status Checker::CheckCopied(CheckResult* res, RepairMode fix) {
  // With -r leaks, QEMU repairs COPIED flags only when the refcounts are
  // known to be right.
  const bool repair = fix == RepairMode::kAll ||
                      (fix == RepairMode::kLeaks && res->check_errors == 0 &&
                       res->corruptions == 0 && res->leaks == 0);
  if (s_.h.l1_size == 0) return absl::OkStatus();
  std::vector<uint8_t> l1(uint64_t{s_.h.l1_size} * 8);
  absl::Status st = s_.file->ReadAt(s_.h.l1_table_offset, absl::MakeSpan(l1));
  if (!st.ok()) {
    ++res->check_errors;
    return st;
  }
  // Writes into a table that is also some other metadata would destroy it:
  // QEMU's overlap check refuses those, and so do we.
  auto overlaps_other_metadata = [&](uint64_t offset, uint32_t own_kind) {
    auto it = s_.meta.find(offset >> s_.cb);
    return !IsAligned(offset, s_.cs) ||
           (it != s_.meta.end() && (it->second.kinds & ~own_kind) != 0);
  };
  const bool extended = s_.h.extended_l2();
  const uint32_t esize = s_.h.l2_entry_size();
  std::vector<uint8_t> l2(s_.cs);
  bool wrote = false;
  for (uint32_t i = 0; i < s_.h.l1_size; ++i) {
    const uint64_t l1e = LoadBE64(&l1[uint64_t{i} * 8]);
    const uint64_t l2_offset = l1e & kL1OffsetMask;
    if (l2_offset == 0) continue;
    absl::StatusOr<uint64_t> rc = s_.stored.Get(l2_offset >> s_.cb);
    if (!rc.ok()) continue;  // already reported by Compare()
    if ((*rc == 1) != ((l1e & kOflagCopied) != 0)) {
      ++res->corruptions;
      s_.Msg(res, absl::StrFormat("%s OFLAG_COPIED L2 cluster: l1_index=%d "
                                  "l1_entry=%x refcount=%d",
                                  repair ? "Repairing" : "ERROR", i, l1e, *rc));
      if (repair) {
        const uint64_t fixed =
            *rc == 1 ? (l1e | kOflagCopied) : (l1e & ~kOflagCopied);
        uint8_t buf[8];
        StoreBE64(buf, fixed);
        if (overlaps_other_metadata(s_.h.l1_table_offset, kMetaActiveL1)) {
          st = Eio();
        } else {
          st = s_.file->WriteAt(s_.h.l1_table_offset + uint64_t{i} * 8,
                                absl::MakeConstSpan(buf, 8));
          if (st.ok()) st = s_.file->Flush();
        }
        if (!st.ok()) {
          ++res->check_errors;
          return st;
        }
        --res->corruptions;
        ++res->corruptions_fixed;
      }
    }
    st = s_.file->ReadAt(l2_offset, absl::MakeSpan(l2));
    if (!st.ok()) {
      s_.Msg(res,
             absl::StrCat("ERROR: Could not read L2 table: ", st.message()));
      ++res->check_errors;
      return st;
    }
    uint64_t dirty = 0;
    for (uint64_t j = 0; j < s_.h.l2_entries(); ++j) {
      const uint64_t entry = LoadBE64(&l2[j * esize]);
      const L2Type type = TypeOf(entry, extended, s_.data_file);
      if (type != L2Type::kNormal && type != L2Type::kZeroAlloc) continue;
      // A data file's clusters count as referenced once (QEMU).
      absl::StatusOr<uint64_t> drc =
          s_.data_file ? absl::StatusOr<uint64_t>(1)
                       : s_.stored.Get((entry & kEntryOffsetMask) >> s_.cb);
      if (!drc.ok()) continue;
      if ((*drc == 1) == ((entry & kOflagCopied) != 0)) continue;
      ++res->corruptions;
      s_.Msg(res, absl::StrFormat("%s OFLAG_COPIED data cluster: l2_entry=%x "
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
      s_.Msg(res,
             "ERROR: Could not write L2 table; metadata overlap check "
             "failed: Input/output error");
      ++res->check_errors;
      return Eio();
    }
    st = s_.file->WriteAt(l2_offset, l2);
    if (!st.ok()) {
      s_.Msg(res,
             absl::StrCat("ERROR: Could not write L2 table: ", st.message()));
      ++res->check_errors;
      return st;
    }
    wrote = true;
    res->corruptions -= dirty;
    res->corruptions_fixed += dirty;
  }
  if (wrote) RETURN_IF_ERROR(s_.file->Flush());
  return absl::OkStatus();
}

}  // namespace qcow2::internal::check_detail
