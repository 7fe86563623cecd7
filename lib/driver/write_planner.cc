// SPDX-License-Identifier: Apache-2.0
// Planning writes into a qcow2 layer: what to allocate, what to copy from
// where (copy-on-write), what to write, and which L2 entries to change once
// the data is written. The plan is made under the image's metadata lock;
// its I/O runs without it (lib/engine).
#include "lib/driver/write_planner.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/events.h"
#include "lib/base/io_context.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/driver/cow_planner.h"
#include "lib/driver/flush_sequencer.h"
#include "lib/driver/header_writer.h"
#include "lib/driver/host_space.h"
#include "lib/driver/metadata_guard.h"
#include "lib/driver/pending_clusters.h"
#include "lib/format/entries.h"
#include "lib/meta/metadata_cache.h"

namespace qcow2::internal {

namespace {

// Bits `first`..`last` (inclusive) of a 32-bit subcluster mask.
uint32_t SubclusterMask(int first, int last) {
  uint64_t m = ((1ull << (last + 1)) - 1) & ~((1ull << first) - 1);
  return static_cast<uint32_t>(m);
}

void Count(uint64_t IoStats::*field, uint64_t n = 1) {
  CountMetadata(field, n);
}

}  // namespace

absl::Status WritePlanner::PlanSubclusters(const L2Ref& ref, uint64_t entry,
                                           uint64_t bitmap, uint64_t cluster,
                                           uint64_t in_cluster,
                                           absl::Span<const uint8_t> data,
                                           bool fresh, bool virgin,
                                           IoPlan* plan) {
  const Geometry& g = s_->geometry();
  const uint64_t host = entry & kEntryOffsetMask;
  const uint64_t guest = cluster << g.cluster_bits;
  const uint32_t alloc = static_cast<uint32_t>(bitmap);
  const uint32_t zero = static_cast<uint32_t>(bitmap >> 32);
  const int sc0 = static_cast<int>(in_cluster / g.subcluster_size);
  const int sc1 =
      static_cast<int>((in_cluster + data.size() - 1) / g.subcluster_size);

  // Pad to subcluster boundaries where the subcluster is not yet ours.
  uint64_t start = in_cluster, end = in_cluster + data.size();
  if (!((alloc >> sc0) & 1)) start = sc0 * g.subcluster_size;
  if (!((alloc >> sc1) & 1)) end = (sc1 + 1) * g.subcluster_size;
  RETURN_IF_ERROR(guard_->CheckDataTarget(host + start, end - start));
  bool skipped = false;
  if (virgin) {
    // Nothing was ever written to the new host cluster, so it reads as
    // zeros: padding that reads as zeros in the chain need not be written.
    ASSIGN_OR_RETURN(
        bool zero_head,
        cow_->KnownZero(entry, bitmap, guest + start, in_cluster - start));
    if (start < in_cluster && zero_head) {
      Count(&IoStats::cow_skipped_zero);
      start = in_cluster;
      skipped = true;
    }
    const uint64_t data_end = in_cluster + data.size();
    ASSIGN_OR_RETURN(
        bool zero_tail,
        cow_->KnownZero(entry, bitmap, guest + data_end, end - data_end));
    if (data_end < end && zero_tail) {
      Count(&IoStats::cow_skipped_zero);
      end = data_end;
      skipped = true;
    }
  }
  const uint32_t mask = SubclusterMask(sc0, sc1);
  IoOp op;
  op.file = s_->data();
  op.offset = host + start;
  op.first_fill = virgin;
  op.guest_bytes = data.size();
  if (start == in_cluster && end == in_cluster + data.size()) {
    EmitEvent(skipped ? "zero-skip-write" : "data-write");
    if ((alloc & mask) != mask) Count(&IoStats::cow_skipped_full);
    op.Add(data.data(), data.size());
  } else {
    EmitEvent("cow-write");
    const uint64_t head = in_cluster - start;
    const uint64_t tail_at = head + data.size();
    uint8_t* buf = plan->Buffer(end - start);
    if (head > 0) Count(&IoStats::cow_head_copies);
    if (tail_at < end - start) Count(&IoStats::cow_tail_copies);
    RETURN_IF_ERROR(
        cow_->PlanReadOld(entry, bitmap, guest + start, buf, head, plan));
    RETURN_IF_ERROR(
        cow_->PlanReadOld(entry, bitmap, guest + in_cluster + data.size(),
                          buf + tail_at, end - start - tail_at, plan));
    // Guest bytes go between head and tail without a copy.
    if (head > 0) op.Add(buf, head);
    op.Add(data.data(), data.size());
    if (tail_at < end - start) op.Add(buf + tail_at, end - start - tail_at);
  }
  plan->writes.push_back(std::move(op));
  if (fresh || (alloc & mask) != mask || (zero & mask) != 0 ||
      !(entry & kOflagCopied)) {
    plan->commits.push_back([this, ref = L2Ref(ref), host, mask]() mutable {
      RETURN_IF_ERROR(flusher_->OrderL2AfterAllocation());
      // From the bitmap as it stands now: writes into other subclusters
      // of a cluster we own may have committed since this one was planned
      // (they hold only their own bytes).
      const uint64_t now = ref.bitmap();
      const uint32_t now_alloc = static_cast<uint32_t>(now) | mask;
      const uint32_t now_zero = static_cast<uint32_t>(now >> 32) & ~mask;
      ref.Set(host | kOflagCopied,
              uint64_t{now_alloc} | (uint64_t{now_zero} << 32));
      host_space_->NoteDataWritten(host);
      return absl::OkStatus();
    });
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> WritePlanner::AllocateData(uint64_t cluster,
                                                    IoPlan* plan,
                                                    bool* virgin) {
  const Geometry& g = s_->geometry();
  Count(&IoStats::cluster_allocations);
  if (s_->has_data_file()) {
    // QEMU puts every data cluster at its guest offset in the data file
    // and counts no refcount for it. What the file held there before (a
    // raw file's old bytes) is unknown: padding is always written.
    *virgin = false;
    return cluster << g.cluster_bits;
  }
  // A cluster past everything the file ever held reads as zeros on disk.
  const uint64_t end_before = s_->refcounts->end_cluster();
  ASSIGN_OR_RETURN(uint64_t fresh, s_->refcounts->Allocate(1));
  *virgin = !s_->encrypted && (fresh >> g.cluster_bits) >= end_before;
  plan->aborts.push_back([this, fresh] {
    s_->refcounts->Update(fresh, s_->geometry().cluster_size, -1).IgnoreError();
  });
  RETURN_IF_ERROR(guard_->CheckDataTarget(fresh, g.cluster_size));
  return fresh;
}

absl::Status WritePlanner::PlanWriteCluster(uint64_t cluster,
                                            uint64_t in_cluster,
                                            absl::Span<const uint8_t> data,
                                            IoPlan* plan, bool fine) {
  const Geometry& g = s_->geometry();
  if (!pending_->empty()) {
    if (fine && pending_->Contains(cluster)) {
      return pending_->PlanPendingWrite(cluster, in_cluster, data, plan);
    }
    // Holding the whole cluster: no write is in flight to it. Give it its
    // full contents and its L2 entry first (or drop it if this write
    // covers it whole).
    RETURN_IF_ERROR(
        pending_->SettlePendingIn((cluster << g.cluster_bits) + in_cluster,
                                  data.size(), /*drop_whole=*/true));
  }
  ASSIGN_OR_RETURN(L2Ref ref, L2ForWrite(cluster));
  if (fine && ref.entry() == 0) {
    // FineWritable allowed this write to defer the cluster's L2 entry.
    return pending_->PlanPendingWrite(cluster, in_cluster, data, plan, &ref);
  }
  const uint64_t entry = ref.entry();
  const uint64_t bitmap = ref.bitmap();
  const uint64_t host = entry & kEntryOffsetMask;
  const bool compressed = (entry & kOflagCompressed) != 0;
  const uint64_t guest = cluster << g.cluster_bits;

  const bool owned =
      s_->has_data_file()
          ? (entry & kOflagCopied) && host == guest && !compressed
          : !compressed && host != 0 && (entry & kOflagCopied);
  if (owned) {
    // The cluster is ours alone: write in place. (It may end past the
    // file's end when its tail was never written: the file keeps it.)
    host_space_->NoteDataWritten(host);
    if (g.extended_l2) {
      return PlanSubclusters(ref, entry, bitmap, cluster, in_cluster, data,
                             false, false, plan);
    }
    RETURN_IF_ERROR(guard_->CheckDataTarget(host, g.cluster_size));
    EmitEvent("data-write");
    IoOp op;
    op.file = s_->data();
    op.guest_bytes = data.size();
    if ((entry & kOflagZero) == 0) {
      op.offset = host + in_cluster;
      op.Add(data.data(), data.size());
      plan->writes.push_back(std::move(op));
      return absl::OkStatus();
    }
    // Preallocated zero cluster: the rest must read as zeros on disk too.
    uint8_t* zeros = plan->Buffer(g.cluster_size);
    op.offset = host;
    if (in_cluster > 0) op.Add(zeros, in_cluster);
    op.Add(data.data(), data.size());
    const uint64_t tail = in_cluster + data.size();
    if (tail < g.cluster_size) op.Add(zeros + tail, g.cluster_size - tail);
    plan->writes.push_back(std::move(op));
    plan->commits.push_back([this, ref, host]() mutable {
      RETURN_IF_ERROR(flusher_->OrderL2AfterAllocation());
      ref.Set(host | kOflagCopied, 0);
      host_space_->NoteDataWritten(host);
      return absl::OkStatus();
    });
    return absl::OkStatus();
  }

  // A new host cluster. The old one (shared or compressed) is released
  // after the L2 update: refuse now, before anything is allocated, if that
  // would free metadata.
  RETURN_IF_ERROR(guard_->CheckNotMetadata(entry, guest));
  bool virgin = false;
  ASSIGN_OR_RETURN(uint64_t fresh, AllocateData(cluster, plan, &virgin));

  if (g.extended_l2 && !compressed && host == 0) {
    // Unallocated or zero subclusters: write only the subclusters touched.
    // Against the current bitmap with the new host offset, no subcluster
    // of the new cluster is allocated yet, so padding reads come from the
    // layers below (or zeros), never from the new cluster.
    return PlanSubclusters(ref, fresh | kOflagCopied, bitmap, cluster,
                           in_cluster, data, true, virgin, plan);
  }

  // Copy-on-write of the whole cluster: head, guest data and tail in one
  // vectored write. Into a never-written cluster, a head or tail that
  // reads as zeros is left out (the file reads as zeros there already).
  const uint64_t tail = in_cluster + data.size();
  bool copy_head = in_cluster > 0;
  bool copy_tail = tail < g.cluster_size;
  if (virgin && copy_head) {
    ASSIGN_OR_RETURN(bool zero,
                     cow_->KnownZero(entry, bitmap, guest, in_cluster));
    if (zero) {
      Count(&IoStats::cow_skipped_zero);
      copy_head = false;
    }
  }
  if (virgin && copy_tail) {
    ASSIGN_OR_RETURN(bool zero, cow_->KnownZero(entry, bitmap, guest + tail,
                                                g.cluster_size - tail));
    if (zero) {
      Count(&IoStats::cow_skipped_zero);
      copy_tail = false;
    }
  }
  uint8_t* head_buf = copy_head ? plan->Buffer(in_cluster) : nullptr;
  uint8_t* tail_buf = copy_tail ? plan->Buffer(g.cluster_size - tail) : nullptr;
  if (copy_head) Count(&IoStats::cow_head_copies);
  if (copy_tail) Count(&IoStats::cow_tail_copies);
  if (in_cluster == 0 && tail == g.cluster_size) {
    Count(&IoStats::cow_skipped_full);
  }
  if (copy_head) {
    RETURN_IF_ERROR(
        cow_->PlanReadOld(entry, bitmap, guest, head_buf, in_cluster, plan));
  }
  if (copy_tail) {
    RETURN_IF_ERROR(cow_->PlanReadOld(entry, bitmap, guest + tail, tail_buf,
                                      g.cluster_size - tail, plan));
  }
  const bool skipped =
      (in_cluster > 0 && !copy_head) || (tail < g.cluster_size && !copy_tail);
  EmitEvent(copy_head || copy_tail ? "cow-write"
            : skipped              ? "zero-skip-write"
                                   : "data-write");
  IoOp op;
  op.file = s_->data();
  op.offset = copy_head ? fresh : fresh + in_cluster;
  op.first_fill = virgin;
  op.guest_bytes = data.size();
  if (head_buf != nullptr) op.Add(head_buf, in_cluster);
  op.Add(data.data(), data.size());
  if (tail_buf != nullptr) op.Add(tail_buf, g.cluster_size - tail);
  plan->writes.push_back(std::move(op));
  const bool release =
      !s_->has_data_file() && (compressed || host != 0);
  const uint64_t new_bitmap = g.extended_l2 ? 0xffffffffull : 0;
  plan->commits.push_back(
      [this, ref, fresh, new_bitmap, release, entry, bitmap, guest]() mutable {
        RETURN_IF_ERROR(flusher_->OrderL2AfterAllocation());
        ref.Set(fresh | kOflagCopied, new_bitmap);
        host_space_->NoteDataWritten(fresh);
        if (release) RETURN_IF_ERROR(ReleaseHost(entry, bitmap, guest));
        return absl::OkStatus();
      });
  return absl::OkStatus();
}

absl::Status WritePlanner::ProbeCluster(uint64_t cluster, bool partial,
                                        bool frees_owned,
                                        uint64_t* allocations) {
  const Geometry& g = s_->geometry();
  uint64_t entry = 0;
  uint64_t bitmap = 0;
  ASSIGN_OR_RETURN(uint64_t table, s_->map->L2TableFor(cluster));
  if (table != 0) {
    ASSIGN_OR_RETURN(L2Ref ref, s_->map->Lookup(cluster));
    entry = ref.entry();
    bitmap = ref.bitmap();
  }
  const uint64_t host = entry & kEntryOffsetMask;
  if (s_->has_data_file()) {
    // No refcount is read for data clusters: only a new L2 table may be
    // allocated.
  } else if (entry & kOflagCompressed) {
    const CompressedExtent c = DecodeCompressed(entry, g.cluster_bits);
    const uint64_t last = (c.host_offset + c.length - 1) >> g.cluster_bits;
    for (uint64_t h = c.host_offset >> g.cluster_bits; h <= last; ++h) {
      RETURN_IF_ERROR(s_->refcounts->Get(h, /*may_defer=*/true).status());
    }
  } else if (host != 0 && (frees_owned || !(entry & kOflagCopied))) {
    RETURN_IF_ERROR(
        s_->refcounts->Get(host >> g.cluster_bits, /*may_defer=*/true)
            .status());
  }
  if (partial && host == 0 && !(entry & kOflagCompressed) &&
      cow_->has_backing_zero()) {
    RETURN_IF_ERROR(cow_->KnownZero(entry, bitmap, cluster << g.cluster_bits,
                                    g.cluster_size)
                        .status());
  }
  // Counted once the cluster is through (a round stopped here probes it
  // again): a new L2 table, or a new host cluster, may be needed.
  const bool owned =
      (entry & (kOflagCompressed | kOflagCopied)) == kOflagCopied;
  if (table == 0 || !(s_->map->l1()[cluster / g.l2_entries] & kOflagCopied) ||
      host == 0 || !owned) {
    ++*allocations;
  }
  return absl::OkStatus();
}

absl::Status WritePlanner::ProbeChange(uint64_t offset, uint64_t len,
                                       bool frees_owned,
                                       ProbeProgress* progress) {
  MissDeferral* d = MissDeferral::Active();
  if (d == nullptr || len == 0) return absl::OkStatus();
  const Geometry& g = s_->geometry();
  // Partial: padding to read from below. With extended L2 entries only a
  // subcluster the write covers in part is padded (PlanSubclusters), so a
  // write of whole subclusters asks nothing of the backing chain.
  const uint64_t mask = g.subcluster_size - 1;
  const uint64_t first = offset >> g.cluster_bits;
  const uint64_t last = (offset + len - 1) >> g.cluster_bits;
  ProbeProgress local;
  const uint64_t end = progress != nullptr
                           ? last + 1
                           : std::min(last + 1, first + kProbeClusters);
  if (progress == nullptr) progress = &local;
  for (uint64_t c = first + progress->clusters_done; c < end; ++c) {
    const bool partial = (c == first && (offset & mask) != 0) ||
                         (c == last && ((offset + len) & mask) != 0);
    absl::Status s =
        ProbeCluster(c, partial, frees_owned, &progress->allocations);
    if (!s.ok()) return d->deferred() ? s : absl::OkStatus();
    // Found, or read in (and pinned) by an earlier round: not again.
    progress->clusters_done = c + 1 - first;
  }
  if (progress->allocations == 0) return absl::OkStatus();
  // And where the allocations (clusters, and perhaps an L2 table) would
  // go: the refcount blocks over as many free clusters.
  absl::Status s = s_->refcounts->ProbeAllocate(progress->allocations + 1);
  return !s.ok() && d->deferred() ? s : absl::OkStatus();
}

absl::Status WritePlanner::PlanWrite(uint64_t offset,
                                     absl::Span<const uint8_t> data,
                                     IoPlan* plan, bool fine,
                                     ProbeProgress* probe) {
  RETURN_IF_ERROR(header_writer_->PrepareWrite());
  // What planning will look up, looked at first: a table missing there is
  // read by the executor with no lock held (MissDeferral). Once the plan
  // holds an allocation, a miss is read at once, under the lock.
  RETURN_IF_ERROR(
      ProbeChange(offset, data.size(), /*frees_owned=*/false, probe));
  const Geometry& g = s_->geometry();
  uint64_t pos = 0;
  while (pos < data.size()) {
    const uint64_t cur = offset + pos;
    const uint64_t in_cluster = cur & (g.cluster_size - 1);
    const uint64_t n =
        std::min<uint64_t>(data.size() - pos, g.cluster_size - in_cluster);
    absl::Status s = PlanWriteCluster(cur >> g.cluster_bits, in_cluster,
                                      data.subspan(pos, n), plan, fine);
    if (!s.ok()) return header_writer_->Fail(std::move(s));
    pos += n;
  }
  // Once the whole write is planned (a write that fails to plan changes
  // nothing in the file), new clusters are made to lie inside the file.
  RETURN_IF_ERROR(host_space_->GrowAhead(
      s_->refcounts->end_cluster() << g.cluster_bits, plan));
  plan->CoalesceWrites();
  return absl::OkStatus();
}

}  // namespace qcow2::internal
