// SPDX-License-Identifier: Apache-2.0
// The refcount checker's repairs (see check.cc for the overview):
// allocation past the end of the file, rewriting the snapshot table,
// rebuilding the refcount structure, and clearing the dirty/corrupt bits.
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

// Allocates `n` clusters past the end of the file and everything counted,
// with refcount 1 written in place (creating refcount blocks that describe
// themselves where needed). REQUIRES: the refcounts are consistent.
absl::StatusOr<uint64_t> Checker::AllocateAtEnd(uint64_t n) {
  const uint64_t per_block = stored_.block_entries();
  uint64_t start = std::max(DivRoundUp(file_size_, cs_), expected_.size());
  bool moved = true;
  while (moved) {
    moved = false;
    for (uint64_t idx = start / per_block; idx <= (start + n - 1) / per_block;
         ++idx) {
      if (idx >= stored_.table().size()) {
        return absl::ResourceExhaustedError("the refcount table is full");
      }
      ASSIGN_OR_RETURN(uint8_t * block, stored_.Block(idx));
      if (block != nullptr) continue;
      // A new block at the first cluster of the run in its range, counting
      // itself; durable before the table points at it.
      const uint64_t b = std::max(start, idx * per_block);
      std::vector<uint8_t> data(cs_, 0);
      WriteRefcount(data.data(), stored_.order(), b % per_block, 1);
      RETURN_IF_ERROR(file_->WriteAt(b << cb_, data));
      RETURN_IF_ERROR(file_->Flush());
      uint8_t entry[8];
      StoreBE64(entry, b << cb_);
      RETURN_IF_ERROR(file_->WriteAt(h_.refcount_table_offset + idx * 8,
                                     absl::MakeConstSpan(entry, 8)));
      RETURN_IF_ERROR(file_->Flush());
      stored_.set_table_entry(idx, b << cb_);
      expected_.Grow(b + 1);
      expected_.Set(b, 1);
      ASSIGN_OR_RETURN(file_size_, file_->Size());
      start = b + 1;
      moved = true;
      break;
    }
  }
  for (uint64_t k = start; k < start + n; ++k) {
    ASSIGN_OR_RETURN(uint8_t * block, stored_.Block(k / per_block));
    (void)block;  // exists now
    stored_.Set(k, 1);
  }
  expected_.Grow(start + n);
  for (uint64_t k = start; k < start + n; ++k) expected_.Set(k, 1);
  RETURN_IF_ERROR(stored_.WriteBack());
  RETURN_IF_ERROR(file_->Flush());
  return start << cb_;
}

// Writes the snapshot table anew (full extra data, truncated entries as
// read) at the end of the file, points the header at it, then frees the
// old table. QEMU's qcow2_write_snapshots().
absl::Status Checker::WriteSnapshotTable() {
  std::vector<uint8_t> table;
  for (const Snapshot& sn : snapshots_) {
    table.resize(AlignUp(table.size(), 8), 0);
    uint8_t fixed[kSnapshotHeaderSize];
    std::memcpy(fixed, sn.fixed, sizeof fixed);
    StoreBE32(fixed + 32, sn.vm_state_size <= 0xffffffffull
                              ? static_cast<uint32_t>(sn.vm_state_size)
                              : 0);
    const uint32_t extra =
        std::max<uint32_t>(kSnapshotKnownExtra, sn.extra_data_size);
    StoreBE32(fixed + 36, extra);
    StoreBE16(fixed + 12, static_cast<uint16_t>(sn.id.size()));
    StoreBE16(fixed + 14, static_cast<uint16_t>(sn.name.size()));
    table.insert(table.end(), fixed, fixed + sizeof fixed);
    uint8_t known[kSnapshotKnownExtra];
    StoreBE64(known, sn.vm_state_size);
    StoreBE64(known + 8, sn.disk_size);
    StoreBE64(known + 16, sn.icount);
    table.insert(table.end(), known, known + sizeof known);
    table.insert(table.end(), sn.unknown_extra.begin(), sn.unknown_extra.end());
    table.insert(table.end(), sn.id.begin(), sn.id.end());
    table.insert(table.end(), sn.name.begin(), sn.name.end());
  }
  if (table.size() > kMaxSnapshotTableBytes) return Efbig();
  uint64_t offset = 0;
  if (!table.empty()) {
    ASSIGN_OR_RETURN(offset, AllocateAtEnd(DivRoundUp(table.size(), cs_)));
    RETURN_IF_ERROR(file_->WriteAt(offset, table));
    RETURN_IF_ERROR(file_->Flush());
  }
  uint8_t ptr[12];
  StoreBE32(ptr, static_cast<uint32_t>(snapshots_.size()));
  StoreBE64(ptr + 4, offset);
  RETURN_IF_ERROR(
      file_->WriteAt(kHeaderNbSnapshots, absl::MakeConstSpan(ptr, 12)));
  RETURN_IF_ERROR(file_->Flush());
  // Free the old table (errors only leak clusters, as in QEMU).
  const uint64_t old_offset = h_.snapshots_offset, old_size = snapshots_size_;
  h_.nb_snapshots = static_cast<uint32_t>(snapshots_.size());
  h_.snapshots_offset = offset;
  snapshots_size_ = table.size();
  if (old_size > 0 && old_offset + old_size <= file_size_) {
    for (uint64_t k = old_offset >> cb_;
         k <= (old_offset + old_size - 1) >> cb_; ++k) {
      absl::StatusOr<uint64_t> rc = stored_.Get(k);
      if (rc.ok() && *rc > 0) stored_.Set(k, *rc - 1);
    }
    if (stored_.WriteBack().ok()) (void)file_->Flush();
  }
  return absl::OkStatus();
}

absl::Status Checker::FixSnapshotTable(CheckResult* snap,
                                       const CheckResult& refs,
                                       RepairMode fix) {
  if (snap->corruptions == 0 || fix != RepairMode::kAll) {
    return absl::OkStatus();
  }
  if (refs.corruptions != 0 || refs.check_errors != 0) {
    // Allocating needs refcounts that can be trusted.
    Msg(snap,
        "ERROR not rewriting the snapshot table: the refcounts are "
        "still inconsistent");
    return absl::OkStatus();
  }
  absl::Status st = WriteSnapshotTable();
  if (!st.ok()) {
    ++snap->check_errors;
    Msg(snap,
        absl::StrCat("ERROR failed to update snapshot table: ", st.message()));
    return st;
  }
  snap->corruptions_fixed += snap->corruptions;
  snap->corruptions = 0;
  return absl::OkStatus();
}

// --- Phase 4: a new refcount structure --------------------------------------

// Writes refcount blocks and a refcount table describing exactly the
// clusters in use (without the old refcount structure) past the end of the
// file, then points the header at them.
absl::Status Checker::Rebuild(CheckResult* res) {
  auto fail = [&](const std::string& what, absl::Status st) {
    Msg(res, absl::StrCat("ERROR ", what, ": ", st.message()));
    ++res->check_errors;
    return st;
  };
  // Expected counts without the old refcount table and blocks; the messages
  // and counters of this recount are not wanted.
  CheckResult scratch;
  bool ignored = false;
  RETURN_IF_ERROR(Calculate(RepairMode::kNone, false, &scratch, &ignored));

  if (rejected_overflow_) {
    return fail("allocating reftable",
                absl::ResourceExhaustedError(
                    "too many references past the end of the file"));
  }
  // The new structure goes past the end of the file and past everything
  // the image points at, even where a (broken) pointer lies beyond the end
  // of the file: such a pointer must never meet a refcount block. Ranges
  // below the new structure become part of the file and are counted.
  std::sort(rejected_.begin(), rejected_.end());
  const uint64_t per_block = stored_.block_entries();
  const uint64_t file_clusters = DivRoundUp(file_size_, cs_);
  std::vector<bool> used_blocks(DivRoundUp(expected_.size(), per_block), false);
  for (uint64_t k = 0; k < expected_.size(); ++k) {
    if (expected_.Get(k) != 0) used_blocks[k / per_block] = true;
  }
  uint64_t place = std::max(expected_.size(), file_clusters);
  // Table at `place`, then the blocks; grow both until they cover
  // everything including themselves.
  uint64_t table_clusters = 1, nblocks = 0;
  std::vector<uint64_t> block_idx;
  while (true) {
    if (place + table_clusters + nblocks > kMaxCheckClusters + 1) {
      return fail("allocating reftable", Efbig());
    }
    const uint64_t area_end = place + table_clusters + nblocks;
    std::vector<bool> used = used_blocks;
    used.resize(
        std::max<uint64_t>(used.size(), DivRoundUp(area_end, per_block)),
        false);
    bool collides = false;
    for (const auto& [first, last] : rejected_) {
      if (first < area_end && last >= place) {
        place = last + 1;  // skip past it and start over
        collides = true;
        break;
      }
      if (last < place) {
        for (uint64_t k = first; k <= last; ++k) used[k / per_block] = true;
      }
    }
    if (collides) continue;
    for (uint64_t k = place; k < area_end; ++k) used[k / per_block] = true;
    block_idx.clear();
    for (uint64_t i = 0; i < used.size(); ++i) {
      if (used[i]) block_idx.push_back(i);
    }
    const uint64_t entries = block_idx.empty() ? 1 : block_idx.back() + 1;
    const uint64_t need_table = DivRoundUp(entries * 8, cs_);
    if (need_table <= table_clusters && block_idx.size() <= nblocks) break;
    table_clusters = std::max(table_clusters, need_table);
    nblocks = std::max<uint64_t>(nblocks, block_idx.size());
  }
  if ((table_clusters << cb_) > kMaxRefcountTableBytes) {
    return fail("allocating reftable",
                absl::ResourceExhaustedError(
                    "the refcount table would exceed the 8 MiB limit"));
  }
  const uint64_t area_end = place + table_clusters + block_idx.size();
  expected_.Grow(area_end);
  for (const auto& [first, last] : rejected_) {
    if (last >= place) break;
    for (uint64_t k = first; k <= last; ++k) {
      const uint64_t rc = expected_.Get(k);
      if (rc < max_refcount_) expected_.Set(k, rc + 1);
    }
  }
  for (uint64_t k = place; k < area_end; ++k) expected_.Set(k, 1);

  // Blocks first, each a slice of the expected counts.
  std::vector<uint64_t> table((table_clusters << cb_) / 8, 0);
  std::vector<uint8_t> block(cs_);
  for (size_t j = 0; j < block_idx.size(); ++j) {
    const uint64_t idx = block_idx[j];
    std::fill(block.begin(), block.end(), 0);
    const uint64_t first = idx * per_block;
    const uint64_t last = std::min(expected_.size(), first + per_block);
    for (uint64_t k = first; k < last; ++k) {
      const uint64_t v = expected_.Get(k);
      if (v) WriteRefcount(block.data(), stored_.order(), k - first, v);
    }
    const uint64_t at = (place + table_clusters + j) << cb_;
    absl::Status st = file_->WriteAt(at, block);
    if (!st.ok()) return fail("writing refblock", st);
    table[idx] = at;
  }
  std::vector<uint8_t> raw(table_clusters << cb_, 0);
  for (size_t i = 0; i < table.size(); ++i) StoreBE64(&raw[i * 8], table[i]);
  absl::Status st = file_->WriteAt(place << cb_, raw);
  if (st.ok()) st = file_->Flush();
  if (!st.ok()) return fail("writing reftable", st);

  // Switch the header to the new structure in one write.
  uint8_t ptr[12];
  StoreBE64(ptr, place << cb_);
  StoreBE32(ptr + 8, static_cast<uint32_t>(table_clusters));
  st = file_->WriteAt(kHeaderRefTableOffset, absl::MakeConstSpan(ptr, 12));
  if (st.ok()) st = file_->Flush();
  if (!st.ok()) return fail("setting reftable", st);

  h_.refcount_table_offset = place << cb_;
  h_.refcount_table_clusters = static_cast<uint32_t>(table_clusters);
  stored_.set_table(std::move(table));
  ASSIGN_OR_RETURN(file_size_, file_->Size());
  return absl::OkStatus();
}

// --- Phase 6
// -------------------------------------------------------------------

absl::Status Checker::MarkCleanAndConsistent() {
  if (h_.version < 3) return absl::OkStatus();
  uint8_t buf[8];
  RETURN_IF_ERROR(file_->ReadAt(kHeaderIncompat, absl::MakeSpan(buf, 8)));
  const uint64_t bits = LoadBE64(buf);
  const uint64_t clean = bits & ~(kIncompatDirty | kIncompatCorrupt);
  if (clean == bits) return absl::OkStatus();
  StoreBE64(buf, clean);
  RETURN_IF_ERROR(file_->WriteAt(kHeaderIncompat, absl::MakeConstSpan(buf, 8)));
  return file_->Flush();
}

}  // namespace qcow2::internal::check_detail
