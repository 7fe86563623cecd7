// SPDX-License-Identifier: Apache-2.0
// The write planner's allocations beyond one write's clusters: L2 tables
// for writing (fresh, or private copies of shared ones), the release of
// host clusters an entry lets go of, and preallocation of new images.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/events.h"
#include "lib/base/io_context.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/format/entries.h"
#include "lib/meta/metadata_cache.h"
#include "lib/driver/flush_sequencer.h"
#include "lib/driver/header_writer.h"
#include "lib/driver/metadata_guard.h"
#include "lib/driver/pending_clusters.h"
#include "lib/driver/write_planner.h"

namespace qcow2::internal {

absl::StatusOr<L2Ref> WritePlanner::L2ForWrite(uint64_t cluster) {
  const Geometry& g = s_->geometry();
  const uint64_t idx = cluster / g.l2_entries;
  if (idx >= s_->map->l1().size()) {
    return absl::OutOfRangeError(absl::StrCat(s_->file->name(),
                                              ": guest cluster ", cluster,
                                              " is beyond the L1 table"));
  }
  ASSIGN_OR_RETURN(uint64_t old_table, s_->map->L2TableFor(cluster));
  const uint64_t l1e = s_->map->l1()[idx];
  if (old_table != 0) {
    // Whatever the caller does with the entry, it must be sound: check it
    // before anything is allocated or copied.
    ASSIGN_OR_RETURN(L2Ref ref, s_->map->Lookup(cluster));
    RETURN_IF_ERROR(guard_->ValidateEntry(ref.entry(), ref.bitmap(),
                                          cluster << g.cluster_bits));
    if (l1e & kOflagCopied) return ref;
  }

  // A new table: fresh, or a private copy of a shared one.
  MetadataCache& cache = s_->map->l2_cache();
  ASSIGN_OR_RETURN(uint64_t table, s_->refcounts->Allocate(1));
  s_->refcounts->NoteMetadataEnd((table >> g.cluster_bits) + 1);
  RETURN_IF_ERROR(guard_->CheckDataTarget(table, g.cluster_size));
  s_->map->RaiseFileLimit(table + g.cluster_size);
  // Its slices, all dirty: in a cache of fewer entries, making room for
  // them writes the others out. While a request is planned, those writes
  // go into one log for its executor (the cache holds on to the entries
  // they write until then), rather than one by one under the lock.
  {
    WriteBackFile::RecordScope record(s_->meta.get());
    RETURN_IF_ERROR(FillNewTable(table, old_table));
  }
  EmitEvent("l2-alloc");
  CountMetadata(&IoStats::l2_table_allocations, 1);
  RETURN_IF_ERROR(cache.SetDependency(&s_->refcounts->cache()));
  // A fresh table, or a private copy of a shared one: its L1 entry waits
  // in memory for the next flush (FlushSequencer), which writes it after
  // the table and its refcount are durable. Until then a power cut loses
  // the table with the writes into it, none of them flushed, and leaks its
  // cluster; the disk's L1 entry still names the shared table, whose
  // refcount drops only after the new entry is durable.
  s_->map->SetL1(idx, table | kOflagCopied);
  flusher_->NoteNewL2Table(idx, old_table);
  return s_->map->Lookup(cluster);
}

absl::Status WritePlanner::FillNewTable(uint64_t table, uint64_t old_table) {
  const Geometry& g = s_->geometry();
  MetadataCache& cache = s_->map->l2_cache();
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

absl::Status WritePlanner::ReleaseHost(uint64_t entry, uint64_t bitmap,
                                       uint64_t guest) {
  // Data clusters in an external data file have no refcount to drop.
  if (s_->has_data_file()) return absl::OkStatus();
  // Never trust an entry with a refcount: a bad one would free a cluster
  // someone else owns.
  RETURN_IF_ERROR(guard_->ValidateEntry(entry, bitmap, guest));
  RETURN_IF_ERROR(guard_->CheckNotMetadata(entry, guest));
  RETURN_IF_ERROR(s_->refcounts->cache().SetDependency(&s_->map->l2_cache()));
  uint64_t host = entry & kEntryOffsetMask;
  uint64_t len = s_->header.cluster_size();
  if (entry & kOflagCompressed) {
    CompressedExtent c = DecodeCompressed(entry, s_->header.cluster_bits);
    host = c.host_offset;
    len = c.length;
  }
  if (host == 0) return absl::OkStatus();
  return flusher_->Release(guest, host, len);
}

absl::Status WritePlanner::Preallocate(Preallocation mode) {
  RETURN_IF_ERROR(header_writer_->PrepareWrite());
  const Geometry& g = s_->geometry();
  const uint64_t clusters = DivRoundUp(s_->header.size, g.cluster_size);
  uint64_t data_end = 0;
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // host offset, bytes
  // Over a backing file, preallocated subclusters stay unallocated (they
  // read from the backing file until written), as qemu-img does.
  const uint64_t bitmap =
      !g.extended_l2 ? 0
                     : (s_->header.backing_file.empty() ? 0xffffffffull : 0);
  for (uint64_t c = 0; c < clusters;) {
    const uint64_t n = std::min(clusters - c, g.l2_entries - c % g.l2_entries);
    RETURN_IF_ERROR(L2ForWrite(c).status());
    uint64_t host = c << g.cluster_bits;  // in a data file: no refcount
    if (!s_->has_data_file()) {
      ASSIGN_OR_RETURN(host, s_->refcounts->Allocate(n));
    }
    RETURN_IF_ERROR(guard_->CheckDataTarget(host, n * g.cluster_size));
    RETURN_IF_ERROR(flusher_->OrderL2AfterAllocation());
    for (uint64_t i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN(L2Ref ref, s_->map->Lookup(c + i));
      ref.Set((host + i * g.cluster_size) | kOflagCopied, bitmap);
    }
    runs.push_back({host, n * g.cluster_size});
    data_end = std::max(data_end, host + n * g.cluster_size);
    c += n;
  }
  File* data = s_->data();
  ASSIGN_OR_RETURN(uint64_t file_size, data->Size());
  if (data_end > file_size) RETURN_IF_ERROR(data->Truncate(data_end));
  for (const auto& [host, len] : runs) {
    if (mode == Preallocation::kFalloc) {
      RETURN_IF_ERROR(data->Allocate(host, len));
    } else if (mode == Preallocation::kFull) {
      std::vector<uint8_t> zeros(std::min<uint64_t>(len, 1 << 20), 0);
      for (uint64_t off = 0; off < len; off += zeros.size()) {
        const uint64_t n = std::min<uint64_t>(zeros.size(), len - off);
        RETURN_IF_ERROR(data->WriteAt(
            host + off, absl::MakeConstSpan(zeros.data(), n)));
      }
    }
  }
  return pending_->SettleAndFlush();
}

}  // namespace qcow2::internal
