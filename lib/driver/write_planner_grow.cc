// SPDX-License-Identifier: Apache-2.0
// The write planner's part of a resize: preallocation of the range a grow
// added (qemu-img resize --preallocation), data clusters for every guest
// cluster of it that no entry maps yet, zeroed on disk before an entry
// names them; and a shrink's release of the clusters past the new end.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/format/entries.h"
#include "lib/driver/flush_sequencer.h"
#include "lib/driver/header_writer.h"
#include "lib/driver/metadata_guard.h"
#include "lib/driver/pending_clusters.h"
#include "lib/driver/write_planner.h"

namespace qcow2::internal {
namespace {

// Guest clusters [guest, +count) get host clusters [host, +count).
struct GrownRun {
  uint64_t guest = 0;
  uint64_t count = 0;
  uint64_t host = 0;
};

}  // namespace

absl::Status WritePlanner::ZeroHostRun(uint64_t host, uint64_t len,
                                       uint64_t old_file_size,
                                       Preallocation mode) {
  // Below the old end of the file a cluster may hold freed data: written
  // over with zeros whatever the mode. Past it the file reads as zeros.
  const uint64_t written_end =
      mode == Preallocation::kFull ? host + len
                                   : std::min(host + len,
                                              std::max(old_file_size, host));
  std::vector<uint8_t> zeros(std::min<uint64_t>(len, 1 << 20), 0);
  for (uint64_t off = host; off < written_end; off += zeros.size()) {
    const uint64_t n = std::min<uint64_t>(zeros.size(), written_end - off);
    RETURN_IF_ERROR(
        s_->data()->WriteAt(off, absl::MakeConstSpan(zeros.data(), n)));
  }
  if (mode == Preallocation::kFalloc && written_end < host + len) {
    RETURN_IF_ERROR(
        s_->data()->Allocate(written_end, host + len - written_end));
  }
  return absl::OkStatus();
}

absl::Status WritePlanner::PreallocateGrown(uint64_t from, uint64_t to,
                                            Preallocation mode) {
  RETURN_IF_ERROR(header_writer_->PrepareWrite());
  const Geometry& g = s_->geometry();
  File* const data = s_->data();  // where the data clusters go
  ASSIGN_OR_RETURN(const uint64_t old_file_size, data->Size());
  const uint64_t end = DivRoundUp(to, g.cluster_size);
  std::vector<GrownRun> runs;
  uint64_t data_end = 0;
  // Pass 1: the L2 tables, and host clusters for each unmapped run, zeroed.
  for (uint64_t c = from / g.cluster_size; c < end;) {
    const uint64_t table_end =
        std::min(end, c - c % g.l2_entries + g.l2_entries);
    ASSIGN_OR_RETURN(L2Ref ref, L2ForWrite(c));
    if (ref.entry() != 0 || ref.bitmap() != 0) {
      ++c;  // mapped already (the partial cluster of the old end)
      continue;
    }
    uint64_t n = 1;
    while (c + n < table_end) {
      ASSIGN_OR_RETURN(L2Ref next, s_->map->Lookup(c + n));
      if (next.entry() != 0 || next.bitmap() != 0) break;
      ++n;
    }
    uint64_t host = c << g.cluster_bits;  // in a data file: no refcount
    if (!s_->has_data_file()) {
      ASSIGN_OR_RETURN(host, s_->refcounts->Allocate(n));
    }
    RETURN_IF_ERROR(guard_->CheckDataTarget(host, n * g.cluster_size));
    RETURN_IF_ERROR(
        ZeroHostRun(host, n * g.cluster_size, old_file_size, mode));
    runs.push_back({c, n, host});
    data_end = std::max(data_end, host + n * g.cluster_size);
    c += n;
  }
  if (mode == Preallocation::kMetadata && !runs.empty()) {
    // As QEMU lays it out, so that block status reads alike: the part of
    // a partial first cluster below the old end is written (its
    // copy-on-write), and the file ends at the disk's last byte.
    const GrownRun& first = runs.front();
    const uint64_t head = from - first.guest * g.cluster_size;
    if (head > 0 && head < g.cluster_size) {
      RETURN_IF_ERROR(ZeroHostRun(first.host, head, 0, Preallocation::kFull));
    }
    const GrownRun& last = runs.back();
    if (last.guest + last.count == end &&
        last.host + last.count * g.cluster_size == data_end) {
      data_end = last.host + (to - last.guest * g.cluster_size);
    }
  }
  ASSIGN_OR_RETURN(const uint64_t file_size, data->Size());
  if (data_end > file_size) RETURN_IF_ERROR(data->Truncate(data_end));
  // The zeros are durable before any entry names their clusters.
  RETURN_IF_ERROR(data->Flush());
  // Pass 2: the entries, after the refcounts that count the clusters.
  RETURN_IF_ERROR(flusher_->OrderL2AfterAllocation());
  // With extended L2 entries the subclusters stay unallocated (they read
  // as zeros), as QEMU leaves them.
  for (const GrownRun& r : runs) {
    for (uint64_t i = 0; i < r.count; ++i) {
      ASSIGN_OR_RETURN(L2Ref ref, s_->map->Lookup(r.guest + i));
      ref.Set((r.host + i * g.cluster_size) | kOflagCopied, 0);
    }
  }
  return pending_->SettleAndFlush();
}

}  // namespace qcow2::internal

namespace qcow2::internal {

absl::Status WritePlanner::Shrink(uint64_t new_size) {
  RETURN_IF_ERROR(header_writer_->PrepareWrite());
  if (s_->header.nb_snapshots > 0) {
    return absl::UnimplementedError(
        absl::StrCat(s_->file->name(),
                     ": shrinking an image with internal snapshots is not "
                     "supported yet"));
  }
  // Clusters waiting for their L2 entry (deferred copy-on-write) get it
  // first, so that none is set after the entries are cleared.
  RETURN_IF_ERROR(pending_->SettleAndFlush());
  const Geometry& g = s_->geometry();
  const uint64_t first = DivRoundUp(new_size, g.cluster_size);
  const uint64_t old_end = DivRoundUp(s_->header.size, g.cluster_size);
  // Every entry past the new end is cleared and its host clusters let go
  // of (as a discard does); the L2 tables stay, emptied.
  for (uint64_t c = first; c < old_end;) {
    const uint64_t idx = c / g.l2_entries;
    const uint64_t table_end = std::min(old_end, (idx + 1) * g.l2_entries);
    if (idx >= s_->map->l1().size() || s_->map->l1()[idx] == 0) {
      c = table_end;
      continue;
    }
    for (; c < table_end; ++c) {
      ASSIGN_OR_RETURN(L2Ref ref, s_->map->Lookup(c));
      const uint64_t entry = ref.entry(), bitmap = ref.bitmap();
      if (entry == 0 && bitmap == 0) continue;
      const uint64_t guest = c << g.cluster_bits;
      RETURN_IF_ERROR(guard_->ValidateEntry(entry, bitmap, guest));
      RETURN_IF_ERROR(guard_->CheckNotMetadata(entry, guest));
      if (!(s_->map->l1()[idx] & kOflagCopied)) {
        ASSIGN_OR_RETURN(ref, L2ForWrite(c));  // never shared: no snapshots
      }
      ref.Set(0, 0);
      RETURN_IF_ERROR(ReleaseHost(entry, bitmap, guest));
    }
  }
  // The cleared entries are durable before the counts they let go of
  // (the flush orders them), and both before the header's new size.
  RETURN_IF_ERROR(pending_->SettleAndFlush());
  s_->header.size = new_size;
  return header_writer_->WriteHeaderFields();
}

}  // namespace qcow2::internal
