// SPDX-License-Identifier: Apache-2.0
// Compressed writes: one guest cluster stored as a compressed stream,
// packed into host clusters as QEMU packs them (qcow2_alloc_bytes), in the
// order of any allocating write (docs/crash-consistency.md): the
// refcounts go up in the cache, the stream is written, then the L2 entry
// names it (after the refcounts and a file flush), and an old host
// cluster is let go of last.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/events.h"
#include "lib/base/io_context.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/format/entries.h"
#include "lib/driver/flush_sequencer.h"
#include "lib/driver/header_writer.h"
#include "lib/driver/host_space.h"
#include "lib/driver/metadata_guard.h"
#include "lib/driver/pending_clusters.h"
#include "lib/driver/write_planner.h"

namespace qcow2::internal {

absl::StatusOr<uint64_t> WritePlanner::AllocateCompressedBytes(uint64_t len) {
  const Geometry& g = s_->geometry();
  const uint64_t cs = g.cluster_size;
  Refcounts& rc = *s_->refcounts;
  // With O_DIRECT an unaligned write is a read-modify-write of the blocks
  // around it: two streams in flight must never share one.
  const uint64_t align = std::max<uint32_t>(1, s_->file->alignment());
  uint64_t at = 0;
  if (s_->compressed_next != 0) {
    at = AlignUp(s_->compressed_next, align);
    if (at % cs == 0) {
      at = 0;  // the cluster is full
    } else {
      ASSIGN_OR_RETURN(uint64_t count, rc.Get(at >> g.cluster_bits));
      // Freed meanwhile (the free hook resets compressed_next, but be
      // sure), or counted as often as the width allows: a new cluster.
      if (count == 0 || count >= rc.max_refcount()) at = 0;
    }
  }
  const uint64_t room = at == 0 ? 0 : cs - at % cs;
  if (at == 0 || room < len) {
    ASSIGN_OR_RETURN(uint64_t fresh, rc.Allocate(1));  // refcount 1: ours
    CountMetadata(&IoStats::cluster_allocations, 1);
    if (at != 0 && fresh == AlignUp(at, cs)) {
      // The next cluster: the stream runs on into it from the current one,
      // which counts it too.
      absl::Status s = rc.Update(at, 1, 1);
      if (!s.ok()) {
        rc.Update(fresh, cs, -1).IgnoreError();
        return s;
      }
    } else {
      at = fresh;  // the rest of the current cluster stays unused
    }
  } else {
    RETURN_IF_ERROR(rc.Update(at, 1, 1));
  }
  const uint32_t shift = 62 - (g.cluster_bits - 8);
  if (at + len > (uint64_t{1} << shift)) {
    rc.Update(at, len, -1).IgnoreError();
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: host offset 0x%x is past what a compressed cluster descriptor "
        "can name",
        s_->file->name(), at));
  }
  s_->compressed_next = (at + len) % cs == 0 ? 0 : at + len;
  return at;
}

absl::Status WritePlanner::PlanWriteCompressed(uint64_t offset,
                                               absl::Span<const uint8_t> stream,
                                               uint64_t guest_len,
                                               IoPlan* plan,
                                               ProbeProgress* probe) {
  if (s_->has_data_file()) {
    // As QEMU: a compressed cluster has no place in a data file.
    return absl::UnimplementedError(absl::StrCat(
        s_->file->name(),
        ": compressed writes are not supported with an external data file"));
  }
  RETURN_IF_ERROR(header_writer_->PrepareWrite());
  const Geometry& g = s_->geometry();
  if (offset % g.cluster_size != 0 || stream.empty() ||
      stream.size() >= g.cluster_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: compressed write of %u bytes at guest offset 0x%x: needs a "
        "cluster-aligned offset and a stream shorter than a cluster",
        s_->file->name(), stream.size(), offset));
  }
  RETURN_IF_ERROR(ProbeChange(offset, guest_len, /*frees_owned=*/true, probe));
  auto plan_it = [&]() -> absl::Status {
    const uint64_t cluster = offset >> g.cluster_bits;
    if (!pending_->empty()) {
      // The caller holds the whole cluster: give a pending one its entry
      // first (or drop it, covered whole), as PlanWriteCluster does.
      RETURN_IF_ERROR(
          pending_->SettlePendingIn(offset, guest_len, /*drop_whole=*/true));
    }
    ASSIGN_OR_RETURN(L2Ref ref, L2ForWrite(cluster));
    const uint64_t entry = ref.entry();
    const uint64_t bitmap = ref.bitmap();
    // The old host cluster is let go of after the L2 update: refuse now,
    // before anything is allocated, if that would free metadata.
    RETURN_IF_ERROR(guard_->CheckNotMetadata(entry, offset));
    const bool release =
        (entry & kOflagCompressed) != 0 || (entry & kEntryOffsetMask) != 0;
    ASSIGN_OR_RETURN(uint64_t host, AllocateCompressedBytes(stream.size()));
    plan->aborts.push_back([this, host, n = stream.size()] {
      s_->refcounts->Update(host, n, -1).IgnoreError();
    });
    RETURN_IF_ERROR(guard_->CheckDataTarget(host, stream.size()));
    EmitEvent("compressed-write");
    IoOp op;
    op.file = s_->file.get();
    op.offset = host;
    op.guest_bytes = stream.size();
    op.Add(stream.data(), stream.size());
    plan->writes.push_back(std::move(op));
    const uint64_t desc =
        EncodeCompressed(host, stream.size(), g.cluster_bits);
    const uint64_t last = AlignDown(host + stream.size() - 1, g.cluster_size);
    plan->commits.push_back([this, ref, desc, last, release, entry, bitmap,
                             offset]() mutable {
      RETURN_IF_ERROR(flusher_->OrderL2AfterAllocation());
      ref.Set(desc, 0);  // never COPIED; no subcluster bits
      host_space_->NoteDataWritten(last);
      if (release) RETURN_IF_ERROR(ReleaseHost(entry, bitmap, offset));
      return absl::OkStatus();
    });
    return absl::OkStatus();
  };
  if (absl::Status s = plan_it(); !s.ok()) {
    return header_writer_->Fail(std::move(s));
  }
  return host_space_->GrowAhead(s_->refcounts->end_cluster() << g.cluster_bits,
                                plan);
}

}  // namespace qcow2::internal
