// SPDX-License-Identifier: Apache-2.0
// Write-zeroes and discard for qcow2 layers: zero flags, zero subcluster
// bitmaps, and releasing host clusters.
#include "lib/driver/zeroer.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/format/entries.h"
#include "lib/meta/metadata_cache.h"
#include "lib/driver/cow_planner.h"
#include "lib/driver/extent_reader.h"
#include "lib/driver/header_writer.h"
#include "lib/driver/host_space.h"
#include "lib/driver/metadata_guard.h"
#include "lib/driver/pending_clusters.h"
#include "lib/driver/write_planner.h"

namespace qcow2::internal {

namespace {
const std::vector<uint8_t>& ZeroCluster2M() {
  static const auto* zeros = new std::vector<uint8_t>(2u << 20, 0);
  return *zeros;
}
}  // namespace

absl::StatusOr<bool> Zeroer::ReadsAsZeroHere(uint64_t offset, uint64_t len) {
  if (len == 0) return true;
  ASSIGN_OR_RETURN(Extent e, reader_->Map(offset, len));
  return e.length >= len &&
         (e.kind == Extent::kZero ||
          (e.kind == Extent::kUnallocated && !cow_->has_backing()));
}

absl::Status Zeroer::ZeroCluster(uint64_t cluster, bool free_clusters,
                                 IoPlan* plan) {
  const Geometry& g = s_->geometry();
  ASSIGN_OR_RETURN(L2Ref ref, s_->map->Lookup(cluster));
  if (ref.slice != nullptr &&
      !(s_->map->l1()[cluster / g.l2_entries] & kOflagCopied)) {
    // The table is shared (an internal snapshot uses it too): edit a
    // private copy, never the shared one.
    ASSIGN_OR_RETURN(ref, writer_->L2ForWrite(cluster));
  }
  const uint64_t entry = ref.slice ? ref.entry() : 0;
  const uint64_t bitmap = ref.slice ? ref.bitmap() : 0;
  const uint64_t guest = cluster << g.cluster_bits;
  // The entry decides what is freed or kept: check it first.
  RETURN_IF_ERROR(guard_->ValidateEntry(entry, bitmap, guest));
  RETURN_IF_ERROR(guard_->CheckNotMetadata(entry, guest));
  if (entry == 0 && bitmap == 0 && !cow_->has_backing())
    return absl::OkStatus();
  const uint64_t host = entry & kEntryOffsetMask;
  const bool owned =
      s_->has_data_file()
          ? (entry & kOflagCopied) && host == guest
          : host != 0 && (entry & kOflagCopied) && !(entry & kOflagCompressed);
  const bool keep = owned && !free_clusters;

  if (s_->header.version < 3) {
    // No zero flag in version 2: zero bytes are written (planned).
    if (cow_->has_backing()) {
      return writer_->PlanWriteCluster(
          cluster, 0,
          absl::MakeConstSpan(ZeroCluster2M().data(), g.cluster_size), plan);
    }
    if (keep) {
      RETURN_IF_ERROR(guard_->CheckDataTarget(host, g.cluster_size));
      host_space_->NoteDataWritten(host);
      IoOp op;
      op.file = s_->data();
      op.offset = host;
      op.bytes = g.cluster_size;
      op.zero_range = true;
      plan->writes.push_back(std::move(op));
      return absl::OkStatus();
    }
    if (entry == 0) return absl::OkStatus();
    ref.Set(0, 0);
    return writer_->ReleaseHost(entry, bitmap, guest);
  }

  if (ref.slice == nullptr) {
    ASSIGN_OR_RETURN(ref, writer_->L2ForWrite(cluster));
  }
  if (g.extended_l2) {
    ref.Set(keep ? (host | kOflagCopied) : 0, 0xffffffffull << 32);
  } else {
    ref.Set(keep ? (host | kOflagCopied | kOflagZero) : kOflagZero, 0);
  }
  if (!keep && (host != 0 || (entry & kOflagCompressed))) {
    RETURN_IF_ERROR(writer_->ReleaseHost(entry, bitmap, guest));
  }
  if (owned && !keep && s_->has_data_file() && !s_->data_file_raw() &&
      !s_->encrypted) {
    // Not when encrypted: until the cleared entry is on disk, a power cut
    // leaves the old one naming the hole, whose zeros decrypt to noise
    // (QEMU punches all the same).
    PlanPunch(guest, plan);
  }
  return absl::OkStatus();
}

void Zeroer::PlanPunch(uint64_t host, IoPlan* plan) const {
  // Planned, so it runs while this request holds the cluster: a later
  // write there (the same data-file offset, from any queue) waits for the
  // request to end, the punch included. A power cut before the entry is
  // written leaves it naming a hole: zeros, as the discard asked.
  const uint64_t cs = s_->geometry().cluster_size;
  if (!plan->writes.empty()) {
    IoOp& last = plan->writes.back();
    if (last.punch && last.file == s_->data() &&
        last.offset + last.bytes == host) {
      last.bytes += cs;
      return;
    }
  }
  IoOp op;
  op.file = s_->data();
  op.offset = host;
  op.bytes = cs;
  op.zero_range = true;
  op.punch = true;
  plan->writes.push_back(std::move(op));
}

absl::Status Zeroer::ZeroSubclusters(uint64_t cluster, uint64_t in_cluster,
                                     uint64_t len, IoPlan* plan) {
  const Geometry& g = s_->geometry();
  const uint64_t guest = cluster << g.cluster_bits;
  const uint64_t first_full = AlignUp(in_cluster, g.subcluster_size);
  const uint64_t end = in_cluster + len;
  const uint64_t last_full = AlignDown(end, g.subcluster_size);
  // Partial subclusters at either end get zero bytes written (planned),
  // unless they already read as zero.
  auto zero_bytes = [&](uint64_t from, uint64_t to) {
    const auto zeros = absl::MakeConstSpan(ZeroCluster2M().data(), to - from);
    return writer_->PlanWriteCluster(cluster, from, zeros, plan);
  };
  if (first_full >= last_full) {
    ASSIGN_OR_RETURN(bool zero, ReadsAsZeroHere(guest + in_cluster, len));
    return zero ? absl::OkStatus() : zero_bytes(in_cluster, end);
  }
  ASSIGN_OR_RETURN(bool head_zero, ReadsAsZeroHere(guest + in_cluster,
                                                   first_full - in_cluster));
  ASSIGN_OR_RETURN(bool tail_zero,
                   ReadsAsZeroHere(guest + last_full, end - last_full));
  ASSIGN_OR_RETURN(L2Ref ref, writer_->L2ForWrite(cluster));
  const uint64_t entry = ref.entry();
  const bool has_host = HasHostCluster(entry, s_->has_data_file());
  if ((entry & kOflagCompressed) || (has_host && !(entry & kOflagCopied))) {
    // Compressed (no subclusters) or shared (the other owner keeps it): a
    // private copy, as one write of the whole cluster, its old contents
    // read (and decompressed) into a buffer and the range zeroed there
    // before the buffer is written.
    uint8_t* buf = plan->Buffer(g.cluster_size);
    RETURN_IF_ERROR(cow_->PlanReadOld(entry, ref.bitmap(), guest, buf,
                                         g.cluster_size, plan));
    plan->after_reads.push_back([buf, in_cluster, len] {
      std::memset(buf + in_cluster, 0, len);
      return absl::OkStatus();
    });
    return writer_->PlanWriteCluster(
        cluster, 0, absl::MakeConstSpan(buf, g.cluster_size), plan);
  }
  // Both ends into a cluster with no host cluster yet would each allocate
  // one: one write of zero bytes over the whole range does it all.
  if (!has_host && !head_zero && !tail_zero) {
    return zero_bytes(in_cluster, end);
  }
  // Else the byte writes (in place, or one allocation) are planned, and
  // the whole subclusters between get their zero flags now.
  if (!head_zero) RETURN_IF_ERROR(zero_bytes(in_cluster, first_full));
  if (!tail_zero) RETURN_IF_ERROR(zero_bytes(last_full, end));
  ASSIGN_OR_RETURN(ref, writer_->L2ForWrite(cluster));
  const uint64_t bitmap = ref.bitmap();
  const int sc0 = static_cast<int>(first_full / g.subcluster_size);
  const int sc1 = static_cast<int>(last_full / g.subcluster_size) - 1;
  const uint32_t mask =
      static_cast<uint32_t>(((1ull << (sc1 + 1)) - 1) & ~((1ull << sc0) - 1));
  const uint32_t alloc = static_cast<uint32_t>(bitmap) & ~mask;
  const uint32_t zero = static_cast<uint32_t>(bitmap >> 32) | mask;
  ref.Set(ref.entry(), uint64_t{alloc} | (uint64_t{zero} << 32));
  return absl::OkStatus();
}

absl::Status Zeroer::Zero(uint64_t offset, uint64_t len, bool free_clusters,
                          IoPlan* plan, uint64_t* done, bool* more) {
  RETURN_IF_ERROR(header_writer_->PrepareWrite());
  // Clusters waiting for their L2 entry get it first (the caller holds
  // them whole, so no write to them is in flight).
  RETURN_IF_ERROR(pending_->SettlePendingIn(offset, len, /*drop_whole=*/true));
  // Changes are made as the range is walked: a table missing on the way
  // cannot be left for later then. So the walk goes a window of
  // kProbeClusters at a time, each looked up first, while a miss can
  // still be deferred (read with no lock held, the walk then going on
  // from `*done`). The whole clusters come first; the partial ones at
  // either end last, as they may put writes into the plan (which must be
  // empty for a miss to be deferred).
  const uint64_t cs = s_->geometry().cluster_size;
  const uint64_t end = offset + len;
  const uint64_t mid_begin = std::min(AlignUp(offset, cs), end);
  const uint64_t mid_end = std::max(mid_begin, AlignDown(end, cs));
  uint64_t none = 0;
  if (done == nullptr) done = &none;
  if (more != nullptr) *more = false;
  int windows = 0;
  while (mid_begin + *done < mid_end) {
    if (more != nullptr && (windows == kZeroRoundWindows || plan->HasWork())) {
      *more = true;  // the rest in the next round
      return absl::OkStatus();
    }
    const uint64_t at = mid_begin + *done;
    const uint64_t n =
        std::min(mid_end - at, WritePlanner::kProbeClusters * cs);
    RETURN_IF_ERROR(writer_->ProbeChange(at, n, free_clusters));
    MissDeferral::Paused changes;
    RETURN_IF_ERROR(ZeroRange(at, n, free_clusters, plan));
    *done += n;
    ++windows;
  }
  if (more != nullptr && plan->HasWork() &&
      (mid_begin > offset || end > mid_end)) {
    *more = true;  // the partial clusters' probe may miss: a round of its own
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(
      writer_->ProbeChange(offset, mid_begin - offset, free_clusters));
  RETURN_IF_ERROR(writer_->ProbeChange(mid_end, end - mid_end, free_clusters));
  MissDeferral::Paused changes;
  RETURN_IF_ERROR(ZeroRange(offset, mid_begin - offset, free_clusters, plan));
  return ZeroRange(mid_end, end - mid_end, free_clusters, plan);
}

absl::Status Zeroer::ZeroRange(uint64_t offset, uint64_t len,
                               bool free_clusters, IoPlan* plan) {
  const Geometry& g = s_->geometry();
  uint64_t whole_clusters = 0;
  uint64_t pos = 0;
  while (pos < len) {
    const uint64_t cur = offset + pos;
    const uint64_t cluster = cur >> g.cluster_bits;
    const uint64_t in_cluster = cur & (g.cluster_size - 1);
    uint64_t n = std::min<uint64_t>(len - pos, g.cluster_size - in_cluster);
    // The last cluster of an image whose size is not cluster aligned counts
    // as whole when the request reaches the end of the disk.
    // Without a backing file, the bytes past the end of the disk read as
    // zeros whatever we do, so a final partial cluster may be zeroed whole.
    // With one they must keep reading the backing file after a resize.
    const bool whole =
        n == g.cluster_size || (in_cluster == 0 && cur + n == s_->header.size &&
                                !cow_->has_backing());
    if (whole) ++whole_clusters;
    absl::Status s;
    if (whole) {
      s = ZeroCluster(cluster, free_clusters, plan);
    } else if (g.extended_l2) {
      s = ZeroSubclusters(cluster, in_cluster, n, plan);
    } else {
      ASSIGN_OR_RETURN(bool zero, ReadsAsZeroHere(cur, n));
      if (!zero) {
        // Planned: the caller's executor writes it with no lock held. No
        // other change of this request touches the cluster.
        s = writer_->PlanWriteCluster(
            cluster, in_cluster, absl::MakeConstSpan(ZeroCluster2M().data(), n),
            plan);
      }
    }
    if (!s.ok()) return header_writer_->Fail(std::move(s));
    pos += n;
  }
  if (s_->data_file_raw() && len > 0 && !s_->encrypted) {
    // The data file stays a raw image of the disk: zeroed there too, as
    // QEMU does before it changes the entries. (Zero bytes planned above
    // for part of a cluster land in the same range: zeros either way.)
    IoOp op;
    op.file = s_->data();
    op.offset = offset;
    op.bytes = len;
    op.zero_range = true;
    plan->writes.push_back(std::move(op));
  } else if (s_->data_file_raw() && whole_clusters > 0) {
    // Encrypted: QEMU zeroes only the clusters it zero-flags, and stores
    // plain zero bytes there (the entries say zero; nothing decrypts
    // them). Part of a cluster keeps the encrypted zeros planned above.
    const uint64_t first = AlignUp(offset, g.cluster_size);
    IoOp op;
    op.file = s_->data();
    op.offset = first;
    op.bytes = std::min(offset + len - first,
                        uint64_t{whole_clusters} << g.cluster_bits);
    op.zero_range = true;
    op.plain = true;
    plan->writes.push_back(std::move(op));
  }
  return absl::OkStatus();
}

}  // namespace qcow2::internal
