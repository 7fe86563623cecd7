// SPDX-License-Identifier: Apache-2.0
#include "lib/meta/refcounts.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/format/entries.h"
#include "lib/format/header.h"
#include "lib/base/endian.h"
#include "lib/base/events.h"
#include "lib/base/math.h"
#include "lib/io/io_plan.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

Refcounts::Refcounts(Params p)
    : file_(p.file),
      filename_(std::move(p.filename)),
      cluster_bits_(p.cluster_bits),
      cluster_size_(1ull << p.cluster_bits),
      refcount_order_(p.refcount_order),
      block_entries_(RefcountBlockEntries(p.cluster_bits, p.refcount_order)),
      max_refcount_(MaxRefcount(p.refcount_order)),
      table_offset_(p.table_offset),
      table_clusters_(p.table_clusters),
      table_(std::move(p.table)),
      cache_(p.file, static_cast<uint32_t>(1ull << p.cluster_bits),
             std::max<uint64_t>(4, p.cache_bytes >> p.cluster_bits),
             "refcount block") {
  cache_.set_flush_tail([this] { return WriteTableEntries(); });
}

absl::StatusOr<std::vector<uint64_t>> Refcounts::LoadTable(
    File* file, uint64_t offset, uint32_t clusters, uint32_t cluster_bits,
    const std::string& filename) {
  uint64_t bytes = uint64_t{clusters} << cluster_bits;
  std::vector<uint8_t> raw(bytes);
  absl::Status s = file->ReadAt(offset, absl::MakeSpan(raw));
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(filename,
                                               ": reading the refcount table: ",
                                               s.message()));
  }
  std::vector<uint64_t> table(bytes / 8);
  for (size_t i = 0; i < table.size(); ++i) table[i] = LoadBE64(&raw[i * 8]);
  return table;
}

absl::Status Refcounts::Corrupt(const std::string& what) const {
  return absl::DataLossError(absl::StrCat(filename_, ": corrupt image: ", what));
}

uint64_t Refcounts::TrackedBlock(uint64_t entry) const {
  if ((entry & ~kRefTableOffsetMask) || (entry & (cluster_size_ - 1)) ||
      entry >= kMaxHostOffset) {
    return 0;  // Get() refuses such an entry anyway
  }
  return entry;
}

void Refcounts::TrackMetadata(MetadataSet* metadata) {
  metadata_ = metadata;
  metadata_->Add(MetadataSet::kRefcountTable, table_offset_,
                 uint64_t{table_clusters_} << cluster_bits_);
  for (uint64_t e : table_) {
    if (uint64_t b = TrackedBlock(e); b != 0) {
      metadata_->Add(MetadataSet::kRefcountBlock, b, cluster_size_);
    }
  }
}

absl::Status Refcounts::CheckNotMetadata(uint64_t cluster,
                                         const char* why) const {
  uint64_t at;
  MetadataSet::Kind kind;
  if (metadata_ == nullptr ||
      !metadata_->Find(cluster << cluster_bits_, cluster_size_, ~0u, &at,
                       &kind)) {
    return absl::OkStatus();
  }
  return Corrupt(absl::StrFormat("cluster 0x%x holds %s, yet %s",
                                 cluster << cluster_bits_,
                                 MetadataSet::Name(kind), why));
}

void Refcounts::SetEntry(MetadataCache::Entry& block, uint64_t index,
                         uint64_t value) const {
  WriteRefcount(block.data.data(), refcount_order_, index, value);
  const uint64_t bit = index << refcount_order_;
  block.MarkDirty(static_cast<uint32_t>(bit / 8),
                  std::max<uint32_t>(1, (1u << refcount_order_) / 8));
}

absl::StatusOr<MetadataCache::Handle> Refcounts::BlockOf(uint64_t cluster,
                                                         bool may_defer) {
  const uint64_t idx = cluster / block_entries_;
  if (idx >= table_.size()) return MetadataCache::Handle();
  const uint64_t e = table_[idx];
  if (e & ~kRefTableOffsetMask) {
    return Corrupt(absl::StrFormat(
        "refcount table entry %d (0x%x) has reserved bits set", idx, e));
  }
  if (e == 0) return MetadataCache::Handle();
  if ((e & (cluster_size_ - 1)) != 0 || e >= kMaxHostOffset) {
    return Corrupt(absl::StrFormat(
        "refcount block offset 0x%x in table entry %d is invalid", e, idx));
  }
  return cache_.Get(e, may_defer);
}

absl::StatusOr<uint64_t> Refcounts::Get(uint64_t cluster, bool may_defer) {
  ASSIGN_OR_RETURN(MetadataCache::Handle block, BlockOf(cluster, may_defer));
  if (block == nullptr) return 0;
  return ReadRefcount(block->data.data(), refcount_order_, cluster % block_entries_);
}

bool Refcounts::Quarantined(uint64_t cluster, uint64_t n) const {
  for (const auto& [s, e] : quarantine_) {
    if (cluster < e && s < cluster + n) return true;
  }
  for (const Sealed& q : pending_release_) {
    if (cluster < q.end && q.start < cluster + n) return true;
  }
  return false;
}

absl::StatusOr<uint64_t> Refcounts::FindFree(uint64_t n) {
  uint64_t start = free_hint_;
  uint64_t c = start;
  while (c - start < n) {
    ASSIGN_OR_RETURN(uint64_t rc, Get(c, /*may_defer=*/true));
    if (rc != 0 || Quarantined(c, 1)) {
      start = c + 1;
      c = start;
    } else {
      // Refcount 0 on a cluster the image uses for metadata: the refcounts
      // are wrong, and handing it out would overwrite the metadata.
      RETURN_IF_ERROR(CheckNotMetadata(c, "its refcount is 0"));
      ++c;
    }
  }
  if ((start + n) << cluster_bits_ > kMaxHostOffset) {
    return absl::ResourceExhaustedError(absl::StrCat(
        filename_, ": no free host clusters below the 64 PiB offset limit"));
  }
  return start;
}

absl::Status Refcounts::WriteTableEntries() {
  if (unwritten_table_entries_.empty()) return absl::OkStatus();
  // The blocks these entries name were just written (or written back
  // earlier): durable first, then the entries.
  CountMetadata(&IoStats::host_flushes, 1);
  RETURN_IF_ERROR(file_->Flush());
  std::sort(unwritten_table_entries_.begin(), unwritten_table_entries_.end());
  // A new block may lie in the range of another new block (EnsureBlock
  // makes that one first, to count it). Its entry is written only once the
  // entry of the block counting it is durable: a power cut that kept the
  // one and lost the other would leave a block named and counted nowhere.
  while (!unwritten_table_entries_.empty()) {
    auto pending = [this](uint64_t idx) {
      return std::binary_search(unwritten_table_entries_.begin(),
                                unwritten_table_entries_.end(), idx);
    };
    std::vector<uint64_t> ready;
    for (uint64_t index : unwritten_table_entries_) {
      const uint64_t counter = (table_[index] >> cluster_bits_) / block_entries_;
      if (counter == index || !pending(counter)) ready.push_back(index);
    }
    if (ready.empty()) ready = unwritten_table_entries_;  // never: no cycles
    for (uint64_t index : ready) {
      uint8_t buf[8];
      StoreBE64(buf, table_[index]);
      CountMetadata(&IoStats::refcount_write_bytes, 8);
      EmitEvent("reftable-update");
      // Kept on failure: the next flush writes it again.
      RETURN_IF_ERROR(file_->WriteAt(table_offset_ + index * 8,
                                     absl::MakeConstSpan(buf, 8)));
      unwritten_table_entries_.erase(
          std::find(unwritten_table_entries_.begin(),
                    unwritten_table_entries_.end(), index));
    }
    if (!unwritten_table_entries_.empty()) {
      CountMetadata(&IoStats::host_flushes, 1);
      RETURN_IF_ERROR(file_->Flush());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Refcounts::EnsureBlock(uint64_t cluster) {
  const uint64_t idx = cluster / block_entries_;
  if (idx >= table_.size()) {
    // The grown table and its blocks take free clusters, possibly the very
    // ones the caller picked: report a move so it looks again.
    RETURN_IF_ERROR(GrowTable(idx));
    return true;
  }
  if (table_[idx] != 0) return false;
  while (true) {
    ASSIGN_OR_RETURN(uint64_t b, FindFree(1));
    const uint64_t idx_b = b / block_entries_;
    if (idx_b >= table_.size()) {
      RETURN_IF_ERROR(GrowTable(idx_b));
      continue;
    }
    if (idx_b != idx && table_[idx_b] == 0) {
      // The block's own refcount needs a block too: create that one first
      // (it will describe itself), then look again.
      ASSIGN_OR_RETURN(bool ignored, EnsureBlock(b));
      (void)ignored;
      continue;
    }
    EmitEvent("refblock-alloc");
    ASSIGN_OR_RETURN(MetadataCache::Handle block,
                     cache_.GetNew(b << cluster_bits_));
    if (idx_b == idx) {
      WriteRefcount(block->data.data(), refcount_order_, b % block_entries_, 1);
    } else {
      RETURN_IF_ERROR(Update(b << cluster_bits_, cluster_size_, 1));
    }
    NoteMetadataEnd(b + 1);
    // The table entry waits in memory: the block (and the count that covers
    // it) must be durable before the table points at it, and this cache's
    // flush tail writes the entry only then. Anything that points at a
    // cluster this block counts (an L2 entry, an L1 entry, a header) is
    // written after this cache is flushed, so after the entry too.
    table_[idx] = b << cluster_bits_;
    unwritten_table_entries_.push_back(idx);
    if (metadata_ != nullptr) {
      metadata_->Add(MetadataSet::kRefcountBlock, b << cluster_bits_,
                     cluster_size_);
    }
    return true;
  }
}

absl::Status Refcounts::GrowTable(uint64_t needed_index) {
  if (!header_writer_) {
    return absl::FailedPreconditionError(
        absl::StrCat(filename_, ": refcount table is full"));
  }
  const uint64_t old_entries = table_.size();
  uint64_t entries = std::max<uint64_t>(needed_index + 1, old_entries * 2);
  // The new table and the blocks describing it go past everything the old
  // table covers and past the end of the image: that space is all free.
  const uint64_t place = std::max(end_cluster_, old_entries * block_entries_);
  uint64_t table_clusters = 0, blocks = 0;
  while (true) {
    table_clusters = DivRoundUp(entries * 8, cluster_size_);
    uint64_t last = place + table_clusters + blocks - 1;
    uint64_t need_blocks = last / block_entries_ - place / block_entries_ + 1;
    uint64_t need_entries = last / block_entries_ + 1;
    if (need_blocks <= blocks && need_entries <= entries) break;
    blocks = std::max(blocks, need_blocks);
    entries = std::max(entries, need_entries);
  }
  if (table_clusters * cluster_size_ > kMaxRefcountTableBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        filename_, ": refcount table would exceed the 8 MiB limit"));
  }
  const uint64_t area_end = place + table_clusters + blocks;
  // Marked in use before anything is written there: if a later step fails,
  // the bytes may still reach the disk with a header that names them.
  NoteMetadataEnd(area_end);
  EmitEvent("refcount-table-grow");
  std::vector<uint64_t> table(entries, 0);
  std::copy(table_.begin(), table_.end(), table.begin());
  // New refcount blocks, each counting the new clusters in its range.
  std::vector<uint8_t> block(cluster_size_);
  const uint64_t first_idx = place / block_entries_;
  for (uint64_t j = 0; j < blocks; ++j) {
    const uint64_t idx = first_idx + j;
    std::fill(block.begin(), block.end(), 0);
    for (uint64_t c = std::max(place, idx * block_entries_);
         c < std::min(area_end, (idx + 1) * block_entries_); ++c) {
      WriteRefcount(block.data(), refcount_order_, c % block_entries_, 1);
    }
    const uint64_t at = (place + table_clusters + j) << cluster_bits_;
    // Through the cache (written by its flush below): a block written into
    // a log that is not on disk yet must not be read from the disk.
    ASSIGN_OR_RETURN(MetadataCache::Handle entry, cache_.GetNew(at));
    std::copy(block.begin(), block.end(), entry->data.begin());
    entry->MarkAllDirty();
    table[idx] = at;
  }
  std::vector<uint8_t> raw(table_clusters * cluster_size_, 0);
  for (uint64_t i = 0; i < entries; ++i) StoreBE64(&raw[i * 8], table[i]);
  CountMetadata(&IoStats::refcount_write_bytes, raw.size());
  RETURN_IF_ERROR(file_->WriteAt(place << cluster_bits_, raw));
  RETURN_IF_ERROR(cache_.Flush());
  CountMetadata(&IoStats::host_flushes, 1);
  RETURN_IF_ERROR(file_->Flush());
  RETURN_IF_ERROR(header_writer_(place << cluster_bits_,
                                 static_cast<uint32_t>(table_clusters)));
  const uint64_t old_offset = table_offset_;
  const uint64_t old_clusters = table_clusters_;
  // The new table holds every entry, durable since the header switch.
  unwritten_table_entries_.clear();
  table_ = std::move(table);
  table_offset_ = place << cluster_bits_;
  table_clusters_ = static_cast<uint32_t>(table_clusters);
  if (metadata_ != nullptr) {
    metadata_->Remove(MetadataSet::kRefcountTable, old_offset,
                      old_clusters << cluster_bits_);
    metadata_->Add(MetadataSet::kRefcountTable, table_offset_,
                   table_clusters << cluster_bits_);
    for (uint64_t j = 0; j < blocks; ++j) {
      metadata_->Add(MetadataSet::kRefcountBlock,
                     (place + table_clusters + j) << cluster_bits_,
                     cluster_size_);
    }
  }
  // The header no longer points at the old table: release it.
  return Update(old_offset, old_clusters << cluster_bits_, -1);
}

absl::Status Refcounts::Update(uint64_t offset, uint64_t len, int64_t delta) {
  if (len == 0) return absl::OkStatus();
  const uint64_t first = offset >> cluster_bits_;
  const uint64_t last = (offset + len - 1) >> cluster_bits_;
  for (uint64_t c = first; c <= last; ++c) {
    if (delta > 0) {
      ASSIGN_OR_RETURN(bool allocated, EnsureBlock(c));
      (void)allocated;
    }
    const uint64_t idx = c / block_entries_;
    if (idx >= table_.size() || table_[idx] == 0) {
      return Corrupt(absl::StrFormat(
          "refcount of cluster 0x%x would drop below zero (no refcount block)",
          c << cluster_bits_));
    }
    // Validates the table entry; one cache look-up for the read and the
    // write of the count.
    ASSIGN_OR_RETURN(MetadataCache::Handle block, BlockOf(c));
    const uint64_t cur = ReadRefcount(block->data.data(), refcount_order_, c % block_entries_);
    uint64_t next;
    if (delta < 0 && cur < static_cast<uint64_t>(-delta)) {
      return Corrupt(absl::StrFormat(
          "refcount of cluster 0x%x would drop below zero", c << cluster_bits_));
    }
    if (delta > 0 && max_refcount_ - cur < static_cast<uint64_t>(delta)) {
      return Corrupt(absl::StrFormat(
          "refcount of cluster 0x%x would exceed the %d-bit maximum",
          c << cluster_bits_, 1u << refcount_order_));
    }
    next = cur + delta;
    if (next == 0) {
      RETURN_IF_ERROR(CheckNotMetadata(c, "its refcount would drop to 0"));
    }
    SetEntry(*block, c % block_entries_, next);
    if (next == 0) {
      if (!quarantine_.empty() && quarantine_.back().second == c) {
        quarantine_.back().second = c + 1;
      } else {
        quarantine_.push_back({c, c + 1});
      }
      if (free_hook_) free_hook_(c << cluster_bits_);
    }
  }
  return absl::OkStatus();
}

absl::Status Refcounts::ProbeAllocate(uint64_t n) {
  uint64_t found = 0;
  uint64_t c = free_hint_;
  for (; found < n; ++c) {
    if ((c + 1) << cluster_bits_ > kMaxHostOffset) break;
    ASSIGN_OR_RETURN(uint64_t rc, Get(c, /*may_defer=*/true));
    if (rc == 0 && !Quarantined(c, 1)) ++found;
  }
  // Allocating that far (with the blocks that count it, just past it) may
  // outgrow the table. GrowTable then frees the old table's clusters,
  // which reads the blocks that count them: look at those too.
  if (c / block_entries_ + 2 >= table_.size()) {
    const uint64_t first = table_offset_ >> cluster_bits_;
    const uint64_t end = first + table_clusters_;
    for (uint64_t t = first; t < end; t = (t / block_entries_ + 1) *
                                          block_entries_) {
      ASSIGN_OR_RETURN(uint64_t rc, Get(t, /*may_defer=*/true));
      (void)rc;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Refcounts::AllocateOneInBlock() {
  uint64_t c = free_hint_;
  const uint64_t idx = c / block_entries_;
  if (idx >= table_.size() || table_[idx] == 0) return kNoCluster;
  // May be a deferred miss, as FindFree's first look-up would be.
  ASSIGN_OR_RETURN(MetadataCache::Handle block, BlockOf(c, /*may_defer=*/true));
  if (block == nullptr) return kNoCluster;
  const uint64_t end = (idx + 1) * block_entries_;
  for (; c < end; ++c) {
    const uint64_t i = c % block_entries_;
    if (ReadRefcount(block->data.data(), refcount_order_, i) != 0 || Quarantined(c, 1)) continue;
    RETURN_IF_ERROR(CheckNotMetadata(c, "its refcount is 0"));
    if ((c + 1) << cluster_bits_ > kMaxHostOffset) return kNoCluster;
    SetEntry(*block, i, 1);
    free_hint_ = c + 1;
    NoteEnd(c + 1);
    return c;
  }
  return kNoCluster;
}

absl::StatusOr<uint64_t> Refcounts::Allocate(uint64_t n) {
  if (n == 1) {
    ASSIGN_OR_RETURN(uint64_t c, AllocateOneInBlock());
    if (c != kNoCluster) return c << cluster_bits_;
  }
  while (true) {
    ASSIGN_OR_RETURN(uint64_t start, FindFree(n));
    bool moved = false;
    for (uint64_t c = start; c < start + n && !moved; ++c) {
      ASSIGN_OR_RETURN(moved, EnsureBlock(c));
    }
    if (moved) continue;  // a new block may sit inside the run: look again
    RETURN_IF_ERROR(Update(start << cluster_bits_, n << cluster_bits_, 1));
    // Every cluster below a single-cluster allocation was in use, so the
    // next search may start past it (releasing freed clusters lowers the
    // hint again). Without this, each allocation rescans from cluster 0.
    if (n == 1 || start == free_hint_) free_hint_ = start + n;
    NoteEnd(start + n);
    return start << cluster_bits_;
  }
}

absl::Status Refcounts::Flush() { return cache_.Flush(); }

uint64_t Refcounts::SealQuarantine() {
  ++generation_;
  for (const auto& [s, e] : quarantine_) {
    pending_release_.push_back({generation_, s, e});
  }
  quarantine_.clear();
  return generation_;
}

void Refcounts::ReleaseQuarantine(
    uint64_t generation,
    std::vector<std::pair<uint64_t, uint64_t>>* to_discard) {
  size_t kept = 0;
  for (Sealed& q : pending_release_) {
    if (q.generation > generation) {
      pending_release_[kept++] = q;
      continue;
    }
    if (to_discard != nullptr) {
      // Kept out of reach (Quarantined) until the caller has discarded it.
      to_discard->push_back({q.start, q.end});
      q.generation = kDiscarding;
      pending_release_[kept++] = q;
      continue;
    }
    free_hint_ = std::min(free_hint_, q.start);
    // Only now, with no durable pointer left to them, give the bytes back
    // to the file system (advisory).
    file_->Discard(q.start << cluster_bits_, (q.end - q.start) << cluster_bits_)
        .IgnoreError();
    CountMetadata(&IoStats::host_discard_ops, 1);
    CountMetadata(&IoStats::host_discard_bytes,
                  (q.end - q.start) << cluster_bits_);
  }
  pending_release_.resize(kept);
}

void Refcounts::EndDiscard(
    const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  for (const std::pair<uint64_t, uint64_t>& range : ranges) {
    std::erase_if(pending_release_, [&range](const Sealed& q) {
      return q.generation == kDiscarding && q.start == range.first &&
             q.end == range.second;
    });
    free_hint_ = std::min(free_hint_, range.first);
  }
}

}  // namespace qcow2::internal
