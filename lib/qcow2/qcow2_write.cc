// The qcow2 write path: cluster allocation, copy-on-write, L2 table
// allocation, and the ordering rules of docs/crash-consistency.md.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/format/entries.h"
#include "lib/qcow2/qcow2_layer.h"
#include "lib/base/endian.h"
#include "lib/base/events.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {


absl::Status Qcow2Layer::Fail(absl::Status s) {
  if (s.code() == absl::StatusCode::kDataLoss && writable_ &&
      (header_.incompatible_features & kIncompatCorrupt) == 0) {
    // Inconsistent metadata: stop writing, and say so in the image so that
    // nothing writes it again before a repair.
    header_.incompatible_features |= kIncompatCorrupt;
    WriteHeaderFields().IgnoreError();
    writable_ = false;
    marked_corrupt_ = true;
  }
  return s;
}

absl::Status Qcow2Layer::WriteHeaderFields() {
  ASSIGN_OR_RETURN(std::vector<uint8_t> enc, EncodeHeader(header_));
  EmitEvent("header-update");
  size_t n = header_.version >= 3 ? header_.header_length : kV2HeaderLength;
  CountMetadata(&IoStats::header_write_bytes, n);
  CountMetadata(&IoStats::host_flushes, 1);
  RETURN_IF_ERROR(meta_->WriteAt(0, absl::MakeConstSpan(enc.data(), n)));
  return meta_->Flush();
}

absl::Status Qcow2Layer::PrepareWrite() {
  if (closed_) {
    return absl::FailedPreconditionError(
        absl::StrCat(file_->name(), ": image is closed"));
  }
  if (!writable_) {
    return absl::FailedPreconditionError(
        absl::StrCat(file_->name(), " is not open for writing",
                     (header_.incompatible_features & kIncompatCorrupt)
                         ? " (marked corrupt)"
                         : ""));
  }
  if (prepared_) return absl::OkStatus();
  const Header original = header_;
  bool changed = false;
  // We maintain no autoclear feature (bitmaps, raw data file): clear the
  // bits so readers know those structures may be stale after our writes.
  if (header_.autoclear_features != 0) {
    header_.autoclear_features = 0;
    changed = true;
  }
  if (lazy_refcounts_ && (header_.incompatible_features & kIncompatDirty) == 0) {
    header_.incompatible_features |= kIncompatDirty;
    changed = true;
  }
  if (changed) {
    // While a request is planned, its executor writes the update with no
    // lock held, before the request's own I/O (in a log of its own, or in
    // the one being recorded); otherwise it is written now.
    absl::Status s;
    {
      WriteBackFile::RecordScope record(meta_.get());
      s = WriteHeaderFields();
      if (meta_->recording()) header_ticket_ = meta_->recording_ticket();
    }
    if (!s.ok()) {
      header_ = original;  // try again on the next write
      return s;
    }
  }
  prepared_ = true;
  return absl::OkStatus();
}

uint64_t Qcow2Layer::UnwrittenHeaderTicket() {
  if (header_ticket_ != 0 && meta_->Written(header_ticket_)) {
    header_ticket_ = 0;
  }
  return header_ticket_;
}

absl::Status Qcow2Layer::CheckDataTarget(uint64_t host, uint64_t len) const {
  auto overlaps = [&](uint64_t start, uint64_t n) {
    return n > 0 && host < start + n && start < host + len;
  };
  const uint64_t cs = header_.cluster_size();
  const char* what = nullptr;
  uint64_t at;
  MetadataSet::Kind kind;
  if (overlaps(0, cs)) {
    what = "the header";
  } else if (overlaps(map_->l1_offset(), uint64_t{map_->l1().size()} * 8)) {
    what = "the L1 table";
  } else if (overlaps(refcounts_->table_offset(),
                      uint64_t{refcounts_->table_clusters()} * cs)) {
    what = "the refcount table";
  } else if (metadata_->Find(host, len, ~0u, &at, &kind)) {
    // L2 tables and refcount blocks (and the tables, in case the lines
    // above ever miss them).
    what = MetadataSet::Name(kind);
  }
  if (what == nullptr) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "%s: corrupt image: refusing to write guest data at host offset 0x%x "
      "over %s",
      file_->name(), host, what));
}

absl::Status Qcow2Layer::CheckNotMetadata(uint64_t entry,
                                          uint64_t guest) const {
  if (entry & kOflagCompressed) return absl::OkStatus();
  const uint64_t host = entry & kEntryOffsetMask;
  uint64_t at;
  MetadataSet::Kind kind;
  if (host == 0 ||
      !metadata_->Find(host, header_.cluster_size(), ~0u, &at, &kind)) {
    return absl::OkStatus();
  }
  return map_->Corrupt(absl::StrFormat(
      "L2 entry 0x%016x for guest offset 0x%x names host cluster 0x%x, "
      "which holds %s",
      entry, guest, host, MetadataSet::Name(kind)));
}

absl::Status Qcow2Layer::OrderL2AfterAllocation() {
  MetadataCache& l2 = map_->l2_cache();
  if (!lazy_refcounts_) RETURN_IF_ERROR(l2.SetDependency(&refcounts_->cache()));
  l2.SetDependsOnFlush();
  return absl::OkStatus();
}

absl::Status Qcow2Layer::ReleaseHost(uint64_t entry, uint64_t bitmap,
                                     uint64_t guest) {
  // Never trust an entry with a refcount: a bad one would free a cluster
  // someone else owns.
  RETURN_IF_ERROR(ValidateEntry(entry, bitmap, guest));
  RETURN_IF_ERROR(CheckNotMetadata(entry, guest));
  RETURN_IF_ERROR(refcounts_->cache().SetDependency(&map_->l2_cache()));
  uint64_t host = entry & kEntryOffsetMask;
  uint64_t len = header_.cluster_size();
  if (entry & kOflagCompressed) {
    CompressedExtent c = DecodeCompressed(entry, header_.cluster_bits);
    host = c.host_offset;
    len = c.length;
  }
  if (host == 0) return absl::OkStatus();
  const Geometry& g = map_->geometry();
  if (unlinked_copies_.contains((guest >> g.cluster_bits) / g.l2_entries)) {
    deferred_releases_.push_back({host, len});
    return absl::OkStatus();
  }
  return refcounts_->Update(host, len, -1);
}

absl::Status Qcow2Layer::WriteL1Entry(uint64_t index) {
  uint8_t buf[8];
  StoreBE64(buf, map_->l1()[index]);
  EmitEvent("l1-update");
  CountMetadata(&IoStats::l1_write_bytes, 8);
  return meta_->WriteAt(map_->l1_offset() + index * 8,
                        absl::MakeConstSpan(buf, 8));
}

absl::Status Qcow2Layer::FillNewTable(uint64_t table, uint64_t old_table) {
  const Geometry& g = map_->geometry();
  MetadataCache& cache = map_->l2_cache();
  for (uint64_t s = 0; s < g.cluster_size / g.slice_bytes; ++s) {
    ASSIGN_OR_RETURN(MetadataCache::Handle slice,
                     cache.GetNew(table + s * g.slice_bytes));
    if (old_table != 0) {
      ASSIGN_OR_RETURN(MetadataCache::Handle old,
                       cache.Get(old_table + s * g.slice_bytes));
      slice->data = old->data;
      slice->MarkAllDirty();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<L2Ref> Qcow2Layer::L2ForWrite(uint64_t cluster) {
  const Geometry& g = map_->geometry();
  const uint64_t idx = cluster / g.l2_entries;
  if (idx >= map_->l1().size()) {
    return absl::OutOfRangeError(absl::StrCat(
        file_->name(), ": guest cluster ", cluster, " is beyond the L1 table"));
  }
  ASSIGN_OR_RETURN(uint64_t old_table, map_->L2TableFor(cluster));
  const uint64_t l1e = map_->l1()[idx];
  if (old_table != 0) {
    // Whatever the caller does with the entry, it must be sound: check it
    // before anything is allocated or copied.
    ASSIGN_OR_RETURN(L2Ref ref, map_->Lookup(cluster));
    RETURN_IF_ERROR(
        ValidateEntry(ref.entry(), ref.bitmap(), cluster << g.cluster_bits));
    if (l1e & kOflagCopied) return ref;
  }

  // A new table: fresh, or a private copy of a shared one.
  MetadataCache& cache = map_->l2_cache();
  ASSIGN_OR_RETURN(uint64_t table, refcounts_->Allocate(1));
  refcounts_->NoteMetadataEnd((table >> g.cluster_bits) + 1);
  RETURN_IF_ERROR(CheckDataTarget(table, g.cluster_size));
  map_->RaiseFileLimit(table + g.cluster_size);
  // Its slices, all dirty: in a cache of fewer entries, making room for
  // them writes the others out. While a request is planned, those writes
  // go into one log for its executor (the cache holds on to the entries
  // they write until then), rather than one by one under the lock.
  {
    WriteBackFile::RecordScope record(meta_.get());
    RETURN_IF_ERROR(FillNewTable(table, old_table));
  }
  EmitEvent("l2-alloc");
  CountMetadata(&IoStats::l2_table_allocations, 1);
  RETURN_IF_ERROR(cache.SetDependency(&refcounts_->cache()));
  // A fresh table, or a private copy of a shared one: its L1 entry waits
  // in memory for the next flush (WriteL1Entries), which writes it after
  // the table and its refcount are durable. Until then a power cut loses
  // the table with the writes into it, none of them flushed, and leaks its
  // cluster; the disk's L1 entry still names the shared table, whose
  // refcount drops only after the new entry is durable.
  map_->SetL1(idx, table | kOflagCopied);
  unwritten_l1_entries_.push_back(idx);
  if (old_table != 0) {
    unlinked_copies_.insert(idx);
    deferred_releases_.push_back({old_table, g.cluster_size});
  }
  return map_->Lookup(cluster);
}

absl::Status Qcow2Layer::WriteL1Entries() {
  if (unwritten_l1_entries_.empty()) return absl::OkStatus();
  // The tables, and the refcounts that count them, are durable before an
  // L1 entry names them.
  RETURN_IF_ERROR(map_->l2_cache().Flush());
  RETURN_IF_ERROR(refcounts_->Flush());
  CountMetadata(&IoStats::host_flushes, 1);
  RETURN_IF_ERROR(meta_->Flush());
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
  refcounts_->cache().SetDependsOnFlush();
  while (!deferred_releases_.empty()) {
    const auto [host, len] = deferred_releases_.back();
    RETURN_IF_ERROR(refcounts_->Update(host, len, -1));
    deferred_releases_.pop_back();
  }
  return refcounts_->Flush();
}

absl::Status Qcow2Layer::Grow(uint64_t new_size) {
  RETURN_IF_ERROR(PrepareWrite());
  const Geometry& g = map_->geometry();
  const uint64_t needed =
      RequiredL1Entries(new_size, g.cluster_bits, g.entry_size);
  if (needed * 8 > kMaxL1Bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        file_->name(), ": size ", new_size, " needs an L1 table over 32 MiB"));
  }
  if (needed <= map_->l1().size()) {
    header_.size = new_size;
    return WriteHeaderFields();
  }
  // A new, larger L1 table: written and durable (with its refcounts) before
  // one header write switches l1_size and l1_table_offset together; the old
  // table is freed last. L1 entries still waiting for a flush are written
  // first, so every table the new L1 names is durable.
  if (absl::Status s = WriteL1Entries(); !s.ok()) return Fail(std::move(s));
  EmitEvent("l1-grow");
  const uint64_t clusters = DivRoundUp(needed * 8, g.cluster_size);
  absl::StatusOr<uint64_t> allocated = refcounts_->Allocate(clusters);
  // kDataLoss (corrupt refcounts) marks the image corrupt.
  if (!allocated.ok()) return Fail(allocated.status());
  const uint64_t table = *allocated;
  refcounts_->NoteMetadataEnd((table >> g.cluster_bits) + clusters);
  std::vector<uint64_t> l1 = map_->l1();
  l1.resize(needed, 0);
  std::vector<uint8_t> raw(clusters * g.cluster_size, 0);
  for (uint64_t i = 0; i < needed; ++i) StoreBE64(&raw[i * 8], l1[i]);
  CountMetadata(&IoStats::l1_write_bytes, raw.size());
  absl::Status s = meta_->WriteAt(table, raw);
  if (s.ok()) s = refcounts_->cache().Flush();
  if (s.ok()) s = meta_->Flush();
  if (!s.ok()) return Fail(std::move(s));
  const Header old_header = header_;
  const uint64_t old_offset = header_.l1_table_offset;
  const uint64_t old_bytes = uint64_t{header_.l1_size} * 8;
  header_.l1_size = static_cast<uint32_t>(needed);
  header_.l1_table_offset = table;
  header_.size = new_size;
  s = WriteHeaderFields();
  if (!s.ok()) {
    header_ = old_header;  // the new table stays allocated: a leak at most
    return Fail(std::move(s));
  }
  map_->ReplaceL1(std::move(l1), table);
  if (old_bytes > 0) return refcounts_->Update(old_offset, old_bytes, -1);
  return absl::OkStatus();
}

absl::StatusOr<Qcow2Layer::FlushTicket> Qcow2Layer::BeginFlush() {
  if (marked_corrupt_) {
    return absl::DataLossError(absl::StrCat(
        file_->name(), " was marked corrupt after an inconsistency; writes "
                       "not flushed before that are lost"));
  }
  if (!writable_ || closed_) return FlushTicket{};
  // Recorded, not written: nothing here does I/O. (Only Fail's header
  // write could, on kDataLoss, after the recording ends.)
  meta_->BeginRecord();
  absl::Status s = map_->l2_cache().Flush();
  if (s.ok()) s = refcounts_->Flush();
  if (s.ok()) s = WriteL1Entries();
  if (s.ok()) EmitEvent("flush");
  FlushTicket ticket;
  ticket.write_back = meta_->EndRecord();
  if (!s.ok()) return Fail(std::move(s));
  ticket.generation = refcounts_->SealQuarantine();
  return ticket;
}

void Qcow2Layer::FinishFlush(
    uint64_t generation,
    std::vector<std::pair<uint64_t, uint64_t>>* to_discard) {
  if (writable_ && !closed_) {
    refcounts_->ReleaseQuarantine(generation, to_discard);
  }
}

void Qcow2Layer::DiscardReleased(
    const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  const uint32_t bits = map_->geometry().cluster_bits;
  for (const auto& [start, end] : ranges) {
    // Advisory: the clusters hold nothing anyone refers to.
    file_->Discard(start << bits, (end - start) << bits).IgnoreError();
    CountMetadata(&IoStats::host_discard_ops, 1);
    CountMetadata(&IoStats::host_discard_bytes, (end - start) << bits);
  }
}

void Qcow2Layer::EndDiscard(
    const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  if (writable_ && !closed_) refcounts_->EndDiscard(ranges);
}

absl::Status Qcow2Layer::Flush() {
  if (writable_ && !closed_ && !marked_corrupt_) {
    RETURN_IF_ERROR(SettleAllPending());
  }
  ASSIGN_OR_RETURN(FlushTicket ticket, BeginFlush());
  if (!writable_ || closed_) return absl::OkStatus();
  RETURN_IF_ERROR(meta_->WriteBack(ticket.write_back));
  CountMetadata(&IoStats::host_flushes, 1);
  if (absl::Status s = file_->Flush(); !s.ok()) return Fail(std::move(s));
  FinishFlush(ticket.generation);
  return absl::OkStatus();
}

absl::Status Qcow2Layer::GrowAhead(uint64_t end, IoPlan* plan) {
  const uint64_t have = std::max(grown_to_, file_size_);
  if (end <= have) return absl::OkStatus();
  const uint64_t step =
      std::clamp<uint64_t>(have / 4, uint64_t{1} << 20, uint64_t{256} << 20);
  const uint64_t cs = map_->geometry().cluster_size;
  const uint64_t target = (std::max(end, have + step) + cs - 1) / cs * cs;
  if (!reserve_unsupported_ && plan->grow_file == nullptr) {
    // Writes into [have, target) planned before the executor reserves it
    // extend the file themselves, which is sound, only slower.
    plan->grow_file = file_.get();
    plan->grow_from = have;
    plan->grow_to = target;
  } else {
    RETURN_IF_ERROR(file_->Extend(have, target));
  }
  grown_to_ = target;
  return absl::OkStatus();
}

absl::Status Qcow2Layer::GrowWithoutReserve(const absl::Status& reserve) {
  if (absl::IsUnimplemented(reserve)) reserve_unsupported_ = true;
  const uint64_t want = std::max(
      grown_to_, refcounts_->end_cluster() << map_->geometry().cluster_bits);
  ASSIGN_OR_RETURN(uint64_t size, file_->Size());
  // Every write in flight lies inside a cluster allocated so far, so below
  // `want`: the size change never cuts one off.
  if (size < want) RETURN_IF_ERROR(file_->Truncate(want));
  grown_to_ = want;
  return absl::OkStatus();
}

absl::Status Qcow2Layer::Close() {
  if (closed_) return absl::OkStatus();
  // On failure the layer stays open (and writable, unless marked corrupt):
  // the caller may retry, or keep using it.
  RETURN_IF_ERROR(Flush());
  if (grown_to_ != 0) {
    // Give back the room grown ahead and not used. The file keeps its size
    // at open, every cluster a committed write went to, and every cluster
    // ever given to metadata (which a failed step may still have put on
    // disk). Clusters allocated for writes that failed hold nothing.
    const uint64_t used = std::max(
        {file_size_, data_end_,
         refcounts_->metadata_end_cluster() << header_.cluster_bits});
    if (used < grown_to_) {
      RETURN_IF_ERROR(meta_->Truncate(used));
      RETURN_IF_ERROR(meta_->Flush());
    }
    grown_to_ = 0;
  }
  if (writable_ && (header_.incompatible_features & kIncompatDirty)) {
    header_.incompatible_features &= ~kIncompatDirty;
    if (absl::Status s = WriteHeaderFields(); !s.ok()) {
      header_.incompatible_features |= kIncompatDirty;
      return s;
    }
  }
  closed_ = true;
  return absl::OkStatus();
}

}  // namespace qcow2::internal
