// SPDX-License-Identifier: Apache-2.0
// The refcount checker's repairs (see check.cc for the overview):
// allocation past the end of the file, rebuilding the refcount structure,
// and clearing the dirty/corrupt bits.
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
#include "lib/format/header.h"

namespace qcow2::internal::check_detail {

// Allocates `n` clusters past the end of the file and everything counted,
// with refcount 1 written in place (creating refcount blocks that describe
// themselves where needed). REQUIRES: the refcounts are consistent.
absl::StatusOr<uint64_t> CheckState::AllocateAtEnd(uint64_t n) {
  const uint64_t per_block = stored.block_entries();
  uint64_t start = std::max(DivRoundUp(file_size, cs), expected.size());
  bool moved = true;
  while (moved) {
    moved = false;
    for (uint64_t idx = start / per_block; idx <= (start + n - 1) / per_block;
         ++idx) {
      if (idx >= stored.table().size()) {
        return absl::ResourceExhaustedError("the refcount table is full");
      }
      ASSIGN_OR_RETURN(uint8_t * block, stored.Block(idx));
      if (block != nullptr) continue;
      // A new block at the first cluster of the run in its range, counting
      // itself; durable before the table points at it.
      const uint64_t b = std::max(start, idx * per_block);
      std::vector<uint8_t> data(cs, 0);
      WriteRefcount(data.data(), stored.order(), b % per_block, 1);
      RETURN_IF_ERROR(file->WriteAt(b << cb, data));
      RETURN_IF_ERROR(file->Flush());
      uint8_t entry[8];
      StoreBE64(entry, b << cb);
      RETURN_IF_ERROR(file->WriteAt(h.refcount_table_offset + idx * 8,
                                    absl::MakeConstSpan(entry, 8)));
      RETURN_IF_ERROR(file->Flush());
      stored.set_table_entry(idx, b << cb);
      expected.Grow(b + 1);
      expected.Set(b, 1);
      ASSIGN_OR_RETURN(file_size, file->Size());
      start = b + 1;
      moved = true;
      break;
    }
  }
  for (uint64_t k = start; k < start + n; ++k) {
    ASSIGN_OR_RETURN(uint8_t * block, stored.Block(k / per_block));
    (void)block;  // exists now
    stored.Set(k, 1);
  }
  expected.Grow(start + n);
  for (uint64_t k = start; k < start + n; ++k) expected.Set(k, 1);
  RETURN_IF_ERROR(stored.WriteBack());
  RETURN_IF_ERROR(file->Flush());
  return start << cb;
}

// --- Phase 4: a new refcount structure --------------------------------------

// Writes refcount blocks and a refcount table describing exactly the
// clusters in use (without the old refcount structure) past the end of the
// file, then points the header at them.
absl::Status Checker::Rebuild(CheckResult* res) {
  auto fail = [&](const std::string& what, absl::Status st) {
    s_.Msg(res, absl::StrCat("ERROR ", what, ": ", st.message()));
    ++res->check_errors;
    return st;
  };
  // Expected counts without the old refcount table and blocks; the messages
  // and counters of this recount are not wanted.
  CheckResult scratch;
  bool ignored = false;
  RETURN_IF_ERROR(
      scan_.Calculate(RepairMode::kNone, false, &scratch, &ignored));

  if (s_.rejected_overflow) {
    return fail("allocating reftable",
                absl::ResourceExhaustedError(
                    "too many references past the end of the file"));
  }
  // The new structure goes past the end of the file and past everything
  // the image points at, even where a (broken) pointer lies beyond the end
  // of the file: such a pointer must never meet a refcount block. Ranges
  // below the new structure become part of the file and are counted.
  std::sort(s_.rejected.begin(), s_.rejected.end());
  const uint64_t per_block = s_.stored.block_entries();
  const uint64_t file_clusters = DivRoundUp(s_.file_size, s_.cs);
  std::vector<bool> used_blocks(DivRoundUp(s_.expected.size(), per_block),
                                false);
  for (uint64_t k = 0; k < s_.expected.size(); ++k) {
    if (s_.expected.Get(k) != 0) used_blocks[k / per_block] = true;
  }
  uint64_t place = std::max(s_.expected.size(), file_clusters);
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
    for (const auto& [first, last] : s_.rejected) {
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
    const uint64_t need_table = DivRoundUp(entries * 8, s_.cs);
    if (need_table <= table_clusters && block_idx.size() <= nblocks) break;
    table_clusters = std::max(table_clusters, need_table);
    nblocks = std::max<uint64_t>(nblocks, block_idx.size());
  }
  if ((table_clusters << s_.cb) > kMaxRefcountTableBytes) {
    return fail("allocating reftable",
                absl::ResourceExhaustedError(
                    "the refcount table would exceed the 8 MiB limit"));
  }
  const uint64_t area_end = place + table_clusters + block_idx.size();
  s_.expected.Grow(area_end);
  for (const auto& [first, last] : s_.rejected) {
    if (last >= place) break;
    for (uint64_t k = first; k <= last; ++k) {
      const uint64_t rc = s_.expected.Get(k);
      if (rc < s_.max_refcount) s_.expected.Set(k, rc + 1);
    }
  }
  for (uint64_t k = place; k < area_end; ++k) s_.expected.Set(k, 1);

  // Blocks first, each a slice of the expected counts.
  std::vector<uint64_t> table((table_clusters << s_.cb) / 8, 0);
  std::vector<uint8_t> block(s_.cs);
  for (size_t j = 0; j < block_idx.size(); ++j) {
    const uint64_t idx = block_idx[j];
    std::fill(block.begin(), block.end(), 0);
    const uint64_t first = idx * per_block;
    const uint64_t last = std::min(s_.expected.size(), first + per_block);
    for (uint64_t k = first; k < last; ++k) {
      const uint64_t v = s_.expected.Get(k);
      if (v) WriteRefcount(block.data(), s_.stored.order(), k - first, v);
    }
    const uint64_t at = (place + table_clusters + j) << s_.cb;
    absl::Status st = s_.file->WriteAt(at, block);
    if (!st.ok()) return fail("writing refblock", st);
    table[idx] = at;
  }
  std::vector<uint8_t> raw(table_clusters << s_.cb, 0);
  for (size_t i = 0; i < table.size(); ++i) StoreBE64(&raw[i * 8], table[i]);
  absl::Status st = s_.file->WriteAt(place << s_.cb, raw);
  if (st.ok()) st = s_.file->Flush();
  if (!st.ok()) return fail("writing reftable", st);

  // Switch the header to the new structure in one write.
  uint8_t ptr[12];
  StoreBE64(ptr, place << s_.cb);
  StoreBE32(ptr + 8, static_cast<uint32_t>(table_clusters));
  st = s_.file->WriteAt(kHeaderRefTableOffset, absl::MakeConstSpan(ptr, 12));
  if (st.ok()) st = s_.file->Flush();
  if (!st.ok()) return fail("setting reftable", st);

  s_.h.refcount_table_offset = place << s_.cb;
  s_.h.refcount_table_clusters = static_cast<uint32_t>(table_clusters);
  s_.stored.set_table(std::move(table));
  ASSIGN_OR_RETURN(s_.file_size, s_.file->Size());
  return absl::OkStatus();
}

// --- Phase 7: clean and consistent ---------------------------------------

absl::Status Checker::MarkCleanAndConsistent() {
  if (s_.h.version < 3) return absl::OkStatus();
  uint8_t buf[8];
  RETURN_IF_ERROR(s_.file->ReadAt(kHeaderIncompat, absl::MakeSpan(buf, 8)));
  const uint64_t bits = LoadBE64(buf);
  const uint64_t clean = bits & ~(kIncompatDirty | kIncompatCorrupt);
  if (clean == bits) return absl::OkStatus();
  StoreBE64(buf, clean);
  RETURN_IF_ERROR(
      s_.file->WriteAt(kHeaderIncompat, absl::MakeConstSpan(buf, 8)));
  return s_.file->Flush();
}

}  // namespace qcow2::internal::check_detail
