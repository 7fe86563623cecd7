// SPDX-License-Identifier: Apache-2.0
#include "lib/driver/flush_sequencer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lib/base/endian.h"
#include "lib/base/events.h"
#include "lib/base/io_context.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/format/entries.h"

namespace qcow2::internal {

absl::Status FlushSequencer::Flush() {
  ASSIGN_OR_RETURN(FlushTicket ticket, BeginFlush());
  if (!s_->writable || s_->closed) return absl::OkStatus();
  RETURN_IF_ERROR(s_->meta->WriteBack(ticket.write_back));
  CountMetadata(&IoStats::host_flushes, 1);
  absl::Status flushed =
      s_->has_data_file() ? s_->data_file->Flush() : absl::OkStatus();
  if (flushed.ok()) flushed = s_->file->Flush();
  if (absl::Status s = flushed; !s.ok()) {
    return header_writer_->Fail(std::move(s));
  }
  FinishFlush(ticket.generation);
  return absl::OkStatus();
}

absl::StatusOr<FlushSequencer::FlushTicket> FlushSequencer::BeginFlush() {
  if (s_->marked_corrupt) {
    return absl::DataLossError(
        absl::StrCat(s_->file->name(),
                     " was marked corrupt after an inconsistency; writes "
                     "not flushed before that are lost"));
  }
  if (!s_->writable || s_->closed) return FlushTicket{};
  // Recorded, not written: nothing here does I/O. (Only Fail's header
  // write could, on kDataLoss, after the recording ends.)
  s_->meta->BeginRecord();
  absl::Status s = s_->map->l2_cache().Flush();
  if (s.ok()) s = s_->refcounts->Flush();
  if (s.ok()) s = WriteL1Entries();
  if (s.ok()) EmitEvent("flush");
  FlushTicket ticket;
  ticket.write_back = s_->meta->EndRecord();
  if (!s.ok()) return header_writer_->Fail(std::move(s));
  ticket.generation = s_->refcounts->SealQuarantine();
  return ticket;
}

void FlushSequencer::FinishFlush(
    uint64_t generation,
    std::vector<std::pair<uint64_t, uint64_t>>* to_discard) {
  if (s_->writable && !s_->closed) {
    s_->refcounts->ReleaseQuarantine(generation, to_discard);
  }
}

void FlushSequencer::DiscardReleased(
    const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  const uint32_t bits = s_->geometry().cluster_bits;
  for (const auto& [start, end] : ranges) {
    // Advisory: the clusters hold nothing anyone refers to.
    s_->file->Discard(start << bits, (end - start) << bits).IgnoreError();
    CountMetadata(&IoStats::host_discard_ops, 1);
    CountMetadata(&IoStats::host_discard_bytes, (end - start) << bits);
  }
}

void FlushSequencer::EndDiscard(
    const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  if (s_->writable && !s_->closed) s_->refcounts->EndDiscard(ranges);
}

absl::Status FlushSequencer::OrderL2AfterAllocation() {
  MetadataCache& l2 = s_->map->l2_cache();
  if (!s_->lazy_refcounts) {
    RETURN_IF_ERROR(l2.SetDependency(&s_->refcounts->cache()));
  }
  l2.SetDependsOnFlush();
  return absl::OkStatus();
}

void FlushSequencer::NoteNewL2Table(uint64_t index, uint64_t old_table) {
  unwritten_l1_entries_.push_back(index);
  if (old_table != 0) {
    unlinked_copies_.insert(index);
    deferred_releases_.push_back({old_table, s_->geometry().cluster_size});
  }
}

absl::Status FlushSequencer::Release(uint64_t guest, uint64_t host,
                                     uint64_t len) {
  const Geometry& g = s_->geometry();
  if (unlinked_copies_.contains((guest >> g.cluster_bits) / g.l2_entries)) {
    deferred_releases_.push_back({host, len});
    return absl::OkStatus();
  }
  return s_->refcounts->Update(host, len, -1);
}

absl::Status FlushSequencer::WriteL1Entry(uint64_t index) {
  uint8_t buf[8];
  StoreBE64(buf, s_->map->l1()[index]);
  EmitEvent("l1-update");
  CountMetadata(&IoStats::l1_write_bytes, 8);
  return s_->meta->WriteAt(s_->map->l1_offset() + index * 8,
                           absl::MakeConstSpan(buf, 8));
}

absl::Status FlushSequencer::WriteL1Entries() {
  if (unwritten_l1_entries_.empty()) return absl::OkStatus();
  // The tables, and the refcounts that count them, are durable before an
  // L1 entry names them.
  RETURN_IF_ERROR(s_->map->l2_cache().Flush());
  RETURN_IF_ERROR(s_->refcounts->Flush());
  CountMetadata(&IoStats::host_flushes, 1);
  RETURN_IF_ERROR(s_->meta->Flush());
  std::sort(unwritten_l1_entries_.begin(), unwritten_l1_entries_.end());
  while (!unwritten_l1_entries_.empty()) {
    // Kept on failure: the next flush writes it again.
    RETURN_IF_ERROR(WriteL1Entry(unwritten_l1_entries_.front()));
    unwritten_l1_entries_.erase(unwritten_l1_entries_.begin());
  }
  unlinked_copies_.clear();
  if (deferred_releases_.empty()) return absl::OkStatus();
  // The shared tables the entries named before, and the clusters their
  // copies let go of: one reference fewer, in refcount blocks written only
  // after a file flush makes the entries durable (else a power cut could
  // leave a cluster named twice and counted once).
  s_->refcounts->cache().SetDependsOnFlush();
  while (!deferred_releases_.empty()) {
    const auto [host, len] = deferred_releases_.back();
    RETURN_IF_ERROR(s_->refcounts->Update(host, len, -1));
    deferred_releases_.pop_back();
  }
  return s_->refcounts->Flush();
}

absl::Status FlushSequencer::Grow(uint64_t new_size) {
  RETURN_IF_ERROR(header_writer_->PrepareWrite());
  Header& header = s_->header;
  const Geometry& g = s_->geometry();
  const uint64_t needed =
      RequiredL1Entries(new_size, g.cluster_bits, g.entry_size);
  if (needed * 8 > kMaxL1Bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(s_->file->name(), ": size ", new_size,
                     " needs an L1 table over 32 MiB"));
  }
  if (needed <= s_->map->l1().size()) {
    header.size = new_size;
    return header_writer_->WriteHeaderFields();
  }
  // A new, larger L1 table: written and durable (with its refcounts) before
  // one header write switches l1_size and l1_table_offset together; the old
  // table is freed last. L1 entries still waiting for a flush are written
  // first, so every table the new L1 names is durable.
  if (absl::Status s = WriteL1Entries(); !s.ok()) {
    return header_writer_->Fail(std::move(s));
  }
  EmitEvent("l1-grow");
  const uint64_t clusters = DivRoundUp(needed * 8, g.cluster_size);
  absl::StatusOr<uint64_t> allocated = s_->refcounts->Allocate(clusters);
  // kDataLoss (corrupt refcounts) marks the image corrupt.
  if (!allocated.ok()) return header_writer_->Fail(allocated.status());
  const uint64_t table = *allocated;
  s_->refcounts->NoteMetadataEnd((table >> g.cluster_bits) + clusters);
  std::vector<uint64_t> l1 = s_->map->l1();
  l1.resize(needed, 0);
  std::vector<uint8_t> raw(clusters * g.cluster_size, 0);
  for (uint64_t i = 0; i < needed; ++i) StoreBE64(&raw[i * 8], l1[i]);
  CountMetadata(&IoStats::l1_write_bytes, raw.size());
  absl::Status s = s_->meta->WriteAt(table, raw);
  if (s.ok()) s = s_->refcounts->cache().Flush();
  if (s.ok()) s = s_->meta->Flush();
  if (!s.ok()) return header_writer_->Fail(std::move(s));
  const Header old_header = header;
  const uint64_t old_offset = header.l1_table_offset;
  const uint64_t old_bytes = uint64_t{header.l1_size} * 8;
  header.l1_size = static_cast<uint32_t>(needed);
  header.l1_table_offset = table;
  header.size = new_size;
  s = header_writer_->WriteHeaderFields();
  if (!s.ok()) {
    header = old_header;  // the new table stays allocated: a leak at most
    return header_writer_->Fail(std::move(s));
  }
  s_->map->ReplaceL1(std::move(l1), table);
  if (old_bytes > 0) return s_->refcounts->Update(old_offset, old_bytes, -1);
  return absl::OkStatus();
}

}  // namespace qcow2::internal
