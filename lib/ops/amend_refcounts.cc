// SPDX-License-Identifier: Apache-2.0
// A new refcount width (QEMU's qcow2_change_refcount_order, done in an
// order of our own): every refcount is read at the old width; a new
// refcount table and blocks, holding the same counts at the new width
// (the old table and blocks counted 0, the new ones 1), are written past
// the end of the file and past every cluster the old structure counts, and
// flushed; then one write of the header fields (refcount_order, the table
// offset and size: all in the first 112 bytes) switches to them, and is
// flushed. A power cut before that write leaves the old structure in
// charge and the new one unreferenced past the old end of the image; after
// it, the new one is complete and the old clusters are free space.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/base/endian.h"
#include "lib/base/events.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/ops/amend.h"
#include "lib/check/check.h"
#include "lib/check/check_internal.h"
#include "lib/format/entries.h"
#include "lib/meta/refcounts.h"

namespace qcow2::internal {

absl::StatusOr<std::vector<uint64_t>> ReadAllRefcounts(AmendTarget* t) {
  const Header& h = t->h;
  const uint64_t cs = h.cluster_size();
  ASSIGN_OR_RETURN(std::vector<uint64_t> table,
                   Refcounts::LoadTable(t->file, h.refcount_table_offset,
                                        h.refcount_table_clusters,
                                        h.cluster_bits, t->file->name()));
  const uint64_t per_block = RefcountBlockEntries(h.cluster_bits, h.refcount_order);
  if (DivRoundUp(t->file_size, cs) > kMaxCheckClusters) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: too many clusters to amend (more than %u)", t->file->name(),
        kMaxCheckClusters));
  }
  std::vector<uint64_t> refs;
  std::vector<uint8_t> block(cs);
  for (uint64_t i = 0; i < table.size(); ++i) {
    const uint64_t off = table[i] & kRefTableOffsetMask;
    if (off == 0) continue;
    if (!IsAligned(off, cs) || off + cs > AlignUp(t->file_size, cs)) {
      return absl::DataLossError(absl::StrFormat(
          "%s: refcount block %u at 0x%x is misaligned or past the end of "
          "the file",
          t->file->name(), i, off));
    }
    RETURN_IF_ERROR(t->file->ReadAt(off, absl::MakeSpan(block)));
    for (uint64_t k = 0; k < per_block; ++k) {
      const uint64_t v = ReadRefcount(block.data(), h.refcount_order, k);
      if (v == 0) continue;
      const uint64_t cluster = i * per_block + k;
      if (cluster >= refs.size()) refs.resize(cluster + 1, 0);
      refs[cluster] = v;
    }
  }
  return refs;
}

namespace {

// Where the new structure goes and what it holds.
struct NewStructure {
  uint64_t place = 0;           // first cluster: the table, then blocks
  uint64_t table_clusters = 1;
  std::vector<uint64_t> blocks;  // indices (in the new table) of blocks
};

// Sizes the new structure: it must count itself, so grow the table and the
// set of blocks until they cover everything, themselves included.
// `counts(k)` is cluster k's new refcount outside the new structure.
template <typename Counts>
NewStructure Size(uint64_t place, uint64_t per_block, uint64_t cs,
                  uint64_t n_counted, Counts counts) {
  NewStructure ns;
  ns.place = place;
  uint64_t nblocks = 0;
  while (true) {
    const uint64_t end = place + ns.table_clusters + nblocks;
    std::vector<bool> used(DivRoundUp(std::max(end, n_counted), per_block),
                           false);
    for (uint64_t k = 0; k < n_counted; ++k) {
      if (counts(k) != 0) used[k / per_block] = true;
    }
    for (uint64_t k = place; k < end; ++k) used[k / per_block] = true;
    ns.blocks.clear();
    for (uint64_t i = 0; i < used.size(); ++i) {
      if (used[i]) ns.blocks.push_back(i);
    }
    const uint64_t entries = ns.blocks.empty() ? 1 : ns.blocks.back() + 1;
    const uint64_t need_table = DivRoundUp(entries * 8, cs);
    if (need_table <= ns.table_clusters && ns.blocks.size() <= nblocks) {
      // Clusters sized for blocks that turned out unneeded stay free.
      return ns;
    }
    ns.table_clusters = std::max(ns.table_clusters, need_table);
    nblocks = std::max<uint64_t>(nblocks, ns.blocks.size());
  }
}

}  // namespace

absl::Status ChangeRefcountOrder(AmendTarget* t, uint32_t order) {
  const Header& h = t->h;
  const uint64_t cs = h.cluster_size();
  const uint32_t cb = h.cluster_bits;
  ASSIGN_OR_RETURN(std::vector<uint64_t> refs, ReadAllRefcounts(t));
  // The old structure is free space once the header no longer names it.
  ASSIGN_OR_RETURN(std::vector<uint64_t> old_table,
                   Refcounts::LoadTable(t->file, h.refcount_table_offset,
                                        h.refcount_table_clusters, cb,
                                        t->file->name()));
  auto drop = [&](uint64_t cluster) {
    if (cluster < refs.size()) refs[cluster] = 0;
  };
  for (uint64_t i = 0; i < h.refcount_table_clusters; ++i) {
    drop((h.refcount_table_offset >> cb) + i);
  }
  for (uint64_t e : old_table) {
    if ((e & kRefTableOffsetMask) != 0) drop((e & kRefTableOffsetMask) >> cb);
  }
  const uint64_t per_block = RefcountBlockEntries(cb, order);
  const uint64_t place =
      std::max<uint64_t>(DivRoundUp(t->file_size, cs), refs.size());
  const NewStructure ns =
      Size(place, per_block, cs, refs.size(),
           [&](uint64_t k) { return refs[k]; });
  if ((ns.table_clusters << cb) > kMaxRefcountTableBytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: the refcount table at %u bits would exceed the 8 MiB limit",
        t->file->name(), 1u << order));
  }
  const uint64_t struct_end = ns.place + ns.table_clusters + ns.blocks.size();
  auto count = [&](uint64_t k) -> uint64_t {
    if (k >= ns.place && k < struct_end) return 1;
    return k < refs.size() ? refs[k] : 0;
  };

  // Blocks, then the table; all durable before the header names them.
  std::vector<uint64_t> table((ns.table_clusters << cb) / 8, 0);
  std::vector<uint8_t> block(cs);
  for (size_t j = 0; j < ns.blocks.size(); ++j) {
    const uint64_t idx = ns.blocks[j];
    std::fill(block.begin(), block.end(), 0);
    for (uint64_t k = 0; k < per_block; ++k) {
      const uint64_t v = count(idx * per_block + k);
      if (v != 0) WriteRefcount(block.data(), order, k, v);
    }
    const uint64_t at = (ns.place + ns.table_clusters + j) << cb;
    EmitEvent("refblock-update");
    RETURN_IF_ERROR(t->file->WriteAt(at, block));
    table[idx] = at;
  }
  std::vector<uint8_t> raw(ns.table_clusters << cb, 0);
  for (size_t i = 0; i < table.size(); ++i) StoreBE64(&raw[i * 8], table[i]);
  EmitEvent("reftable-update");
  RETURN_IF_ERROR(t->file->WriteAt(ns.place << cb, raw));
  RETURN_IF_ERROR(t->file->Flush());

  // The switch: one write of the header fields.
  const Header saved = t->h;
  t->h.refcount_order = order;
  t->h.refcount_table_offset = ns.place << cb;
  t->h.refcount_table_clusters = static_cast<uint32_t>(ns.table_clusters);
  if (absl::Status s = t->WriteHeaderFields(); !s.ok()) {
    t->h = saved;
    return s;
  }
  ASSIGN_OR_RETURN(t->file_size, t->file->Size());
  // The old structure's bytes are not needed any more (advisory).
  t->file->Discard(saved.refcount_table_offset,
                   uint64_t{saved.refcount_table_clusters} << cb)
      .IgnoreError();
  for (uint64_t e : old_table) {
    if ((e & kRefTableOffsetMask) != 0) {
      t->file->Discard(e & kRefTableOffsetMask, cs).IgnoreError();
    }
  }
  return absl::OkStatus();
}

}  // namespace qcow2::internal
