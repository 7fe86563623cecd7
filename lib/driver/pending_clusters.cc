// SPDX-License-Identifier: Apache-2.0
// Writes under a byte-range lock, and deferred copy-on-write: a small write
// into a cluster the top does not own yet writes only its own bytes into a
// new host cluster, and the cluster's L2 entry waits until writes have
// covered it or a flush fills the rest from the chain below
// (pending_clusters.h).
#include "lib/driver/pending_clusters.h"

#include <algorithm>
#include <bit>
#include <memory>

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
#include "lib/format/entries.h"

namespace qcow2::internal {

namespace {

bool TestBit(const PendingIndex::UnitBits& bits, uint64_t i) {
  return PendingIndex::TestBit(bits, i);
}

// The bitmap bits of the subclusters that begin in a covered unit. (A
// write under a byte-range lock covers whole subclusters, so with
// subclusters larger than a unit all of a subcluster's units are covered
// or none.) Visits the covered units only: a fresh cluster has few.
uint32_t CoveredSubclusters(const PendingClusters::UnitBits& covered,
                            const Geometry& g) {
  constexpr uint64_t kUnit = PendingClusters::kFineLockBytes;
  const uint64_t scs = g.subcluster_size;
  const uint64_t subclusters = static_cast<uint64_t>(g.subclusters);
  uint32_t mask = 0;
  for (size_t w = 0; w < covered.size(); ++w) {
    for (uint64_t bits = covered[w]; bits != 0; bits &= bits - 1) {
      const uint64_t lo = (w * 64 + std::countr_zero(bits)) * kUnit;
      const uint64_t end =
          std::min<uint64_t>((lo + kUnit + scs - 1) / scs, subclusters);
      for (uint64_t sc = (lo + scs - 1) / scs; sc < end; ++sc) {
        mask |= uint32_t{1} << sc;
      }
    }
  }
  return mask;
}

}  // namespace

void PendingClusters::NoteWriteBegun(uint64_t offset, uint64_t len) {
  recent_ends_[recent_next_] = offset + len;
  recent_next_ = (recent_next_ + 1) % recent_ends_.size();
}

PendingClusters::FineKind PendingClusters::ClassifyFine(uint64_t cluster,
                                                        uint64_t in_cluster,
                                                        uint64_t len,
                                                        bool stream) {
  const Geometry& g = s_->geometry();
  // Pending clusters track 4 KiB units; with extended L2 a unit (or the
  // write) must also cover whole subclusters, whose bits it sets.
  const uint64_t unit =
      g.extended_l2 ? std::max<uint64_t>(kFineLockBytes, g.subcluster_size)
                    : kFineLockBytes;
  const bool aligned = IsAligned(in_cluster, unit) && IsAligned(len, unit);
  if (const PendingCluster* p = index_->Find(cluster); p != nullptr) {
    // Being filled by a flush, with no lock held: a write into it waits
    // for the whole cluster, which the fill holds.
    if (p->filling) return FineKind::kNone;
    return aligned ? FineKind::kPending : FineKind::kNone;
  }
  L2Ref ref;
  if (!s_->map->Peek(cluster, &ref)) return FineKind::kNone;
  const uint64_t entry = ref.slice != nullptr ? ref.entry() : 0;
  const uint64_t bitmap = ref.slice != nullptr ? ref.bitmap() : 0;
  const uint64_t guest = cluster << g.cluster_bits;
  if (!guard_->ValidateEntry(entry, bitmap, guest).ok()) return FineKind::kNone;
  const uint64_t host = entry & kEntryOffsetMask;
  const bool owned = s_->has_data_file()
                         ? (entry & kOflagCopied) && host == guest
                         : (entry & kOflagCopied) && host != 0 &&
                               !(entry & kOflagCompressed);
  if (owned) {
    if (!g.extended_l2) {
      // A preallocated zero cluster gets zeros written around the data.
      return (entry & kOflagZero) ? FineKind::kNone : FineKind::kInPlace;
    }
    // Every subcluster touched is ours, or covered whole (then the commit
    // sets its bits in the bitmap as it stands then: writes into other
    // subclusters may set theirs meanwhile).
    const int sc0 = static_cast<int>(in_cluster / g.subcluster_size);
    const int sc1 =
        static_cast<int>((in_cluster + len - 1) / g.subcluster_size);
    for (int sc = sc0; sc <= sc1; ++sc) {
      const SubclusterType t =
          ClassifySubcluster(entry, bitmap, true, sc, s_->has_data_file());
      if (t == SubclusterType::kNormal) continue;
      const bool whole = sc * g.subcluster_size >= in_cluster &&
                         (sc + 1) * g.subcluster_size <= in_cluster + len;
      if (!whole || t == SubclusterType::kInvalid ||
          t == SubclusterType::kCompressed) {
        return FineKind::kNone;
      }
    }
    return FineKind::kInPlace;
  }
  // No deferred entries with an external data file: a data cluster's
  // place is fixed (its guest offset), so a copy-on-write there is
  // planned whole, holding the cluster.
  if (s_->has_data_file()) return FineKind::kNone;
  // Deferred L2 entry: a cluster with no host cluster here (unallocated,
  // or with extended L2 made of unallocated and zero subclusters). With
  // standard entries there must be a backing chain to copy from (else the
  // write copies nothing anyway); with extended ones nothing is ever
  // copied, and the entry waits only for the writes in flight.
  if (entry != 0 || (!g.extended_l2 && !cow_->has_backing()) || !aligned ||
      g.cluster_bits <= kFineLockBits || len >= g.cluster_size ||
      index_->size() >= kMaxPending) {
    return FineKind::kNone;
  }
  // Only a stream defers: a write that continues a recent write or lands
  // in a recently written cluster, so that the writes after it into the
  // cluster run beside it. With standard L2 what a stream leaves uncovered
  // is copied at the flush. With extended L2 nothing is ever copied, but a
  // deferred entry has its own cost: the pending cluster is set up, looked
  // up and committed under the lock. A lone write into a new cluster (the
  // usual random write) allocates it holding the whole cluster, which is
  // cheaper, and a write into that cluster meanwhile waits for it. (With
  // `stream` false the caller rechecks a write allowed already.)
  if (!stream) return FineKind::kDefer;
  const uint64_t offset = guest + in_cluster;
  for (uint64_t end : recent_ends_) {
    if (end == 0) continue;
    if (end == offset || ((end - 1) >> g.cluster_bits) == cluster) {
      return FineKind::kDefer;
    }
  }
  return FineKind::kNone;
}

bool PendingClusters::FineWritable(uint64_t offset, uint64_t len, bool stream) {
  if (!s_->writable || s_->closed || s_->marked_corrupt || len == 0)
    return false;
  const Geometry& g = s_->geometry();
  uint64_t pos = 0;
  while (pos < len) {
    const uint64_t cur = offset + pos;
    const uint64_t in_cluster = cur & (g.cluster_size - 1);
    const uint64_t n = std::min(len - pos, g.cluster_size - in_cluster);
    const FineKind kind =
        ClassifyFine(cur >> g.cluster_bits, in_cluster, n, stream);
    if (kind == FineKind::kNone) return false;
    // A deferred or pending write stays inside one cluster.
    if (kind != FineKind::kInPlace && n != len) return false;
    pos += n;
  }
  return true;
}

absl::Status PendingClusters::PlanPendingWrite(uint64_t cluster,
                                               uint64_t in_cluster,
                                               absl::Span<const uint8_t> data,
                                               IoPlan* plan, L2Ref* given) {
  const Geometry& g = s_->geometry();
  PendingCluster* found = index_->Find(cluster);
  if (found == nullptr) {
    // WritePlanner looked the entry up (L2ForWrite) and passes it in.
    if (given == nullptr) {
      return absl::InternalError(absl::StrFormat(
          "%s: deferred copy-on-write into guest cluster %d without its "
          "L2 entry",
          s_->file->name(), cluster));
    }
    L2Ref ref = std::move(*given);
    if (ref.entry() != 0) {
      return absl::InternalError(absl::StrFormat(
          "%s: deferred copy-on-write into guest cluster %d, which is "
          "allocated",
          s_->file->name(), cluster));
    }
    const uint64_t end_before = s_->refcounts->end_cluster();
    ASSIGN_OR_RETURN(uint64_t fresh, s_->refcounts->Allocate(1));
    if (absl::Status s = guard_->CheckDataTarget(fresh, g.cluster_size);
        !s.ok()) {
      s_->refcounts->Update(fresh, g.cluster_size, -1).IgnoreError();
      return s;
    }
    CountMetadata(&IoStats::cluster_allocations, 1);
    CountMetadata(&IoStats::cow_deferred, 1);
    found = &index_->Add(cluster);
    found->ref = std::move(ref);
    found->host = fresh;
    found->virgin = !s_->encrypted && (fresh >> g.cluster_bits) >= end_before;
  }
  PendingCluster& p = *found;
  const uint64_t unit = in_cluster / kFineLockBytes;
  PendingWrite& w = p.in_flight.emplace_back();
  w.in_cluster = in_cluster;
  w.data = data.data();
  w.len = data.size();
  // Units this write covers first: uncovered again if it fails.
  for (uint64_t u = unit; u < (in_cluster + data.size()) / kFineLockBytes;
       ++u) {
    if (TestBit(p.covered, u)) continue;
    p.covered[u / 64] |= uint64_t{1} << (u % 64);
    w.newly[u / 64] |= uint64_t{1} << (u % 64);
    ++p.covered_units;
  }
  EmitEvent("deferred-write");
  IoOp op;
  op.file = s_->data();
  op.offset = p.host + in_cluster;
  op.guest_bytes = data.size();
  op.Add(data.data(), data.size());
  plan->writes.push_back(std::move(op));
  // Two words of capture, so that neither closure allocates.
  const uint64_t key = WriteKey(cluster, unit);
  plan->commits.push_back(
      [this, key] { return FinishPendingWrite(key, true); });
  plan->aborts.push_back(
      [this, key] { FinishPendingWrite(key, false).IgnoreError(); });
  return absl::OkStatus();
}

absl::Status PendingClusters::FinishPendingWrite(uint64_t key, bool ok) {
  const uint64_t cluster = key >> kUnitKeyBits;
  const uint64_t unit = key & ((1u << kUnitKeyBits) - 1);
  PendingCluster* found = index_->Find(cluster);
  // Gone: committed by a flush meanwhile (which wrote this write's bytes
  // too), or dropped when the image was marked corrupt. It cannot have
  // become pending again since: that takes an L2 entry of 0 again, so a
  // discard or write-zeroes of the whole cluster, which waits for this
  // write's bytes.
  if (found == nullptr) return absl::OkStatus();
  PendingCluster& p = *found;
  auto w = std::find_if(p.in_flight.begin(), p.in_flight.end(),
                        [unit](const PendingWrite& w) {
                          return w.in_cluster / kFineLockBytes == unit;
                        });
  if (w == p.in_flight.end()) return absl::OkStatus();  // never, as above
  if (!ok) {
    for (size_t i = 0; i < w->newly.size(); ++i) {
      p.covered[i] &= ~w->newly[i];
      p.covered_units -= std::popcount(w->newly[i]);
    }
  }
  p.in_flight.erase(w);
  // A fill in flight wrote this write's bytes too, and commits the
  // cluster (or leaves it pending if it fails).
  if (!p.in_flight.empty() || p.filling) return absl::OkStatus();
  const Geometry& g = s_->geometry();
  if (p.covered_units == 0) {
    const uint64_t host = p.host;
    index_->Remove(cluster);
    return s_->refcounts->Update(host, g.cluster_size, -1);
  }
  // With extended L2 the units written so far become allocated
  // subclusters, the rest keep what they were: nothing to copy.
  if (g.extended_l2 || p.covered_units == g.cluster_size / kFineLockBytes) {
    return CommitPending(cluster);
  }
  return absl::OkStatus();
}

absl::Status PendingClusters::CommitPending(uint64_t cluster) {
  PendingCluster& p = *index_->Find(cluster);
  const Geometry& g = s_->geometry();
  RETURN_IF_ERROR(flusher_->OrderL2AfterAllocation());
  uint64_t bitmap = 0;
  if (g.extended_l2) {
    // Covered subclusters become allocated (and not zero); the others
    // keep their state in the bitmap as it stands.
    const uint32_t mask = CoveredSubclusters(p.covered, g);
    const uint64_t now = p.ref.bitmap();
    bitmap = uint64_t{static_cast<uint32_t>(now) | mask} |
             (uint64_t{static_cast<uint32_t>(now >> 32) & ~mask} << 32);
  }
  p.ref.Set(p.host | kOflagCopied, bitmap);
  host_space_->NoteDataWritten(p.host);
  index_->Remove(cluster);
  return absl::OkStatus();
}

absl::Status PendingClusters::PlanFill(uint64_t cluster, IoPlan* plan) {
  PendingCluster* found = index_->Find(cluster);
  if (found == nullptr) return absl::OkStatus();
  PendingCluster& p = *found;
  if (p.filling) {
    return absl::InternalError(
        absl::StrFormat("%s: guest cluster %d is already being filled",
                        s_->file->name(), cluster));
  }
  const Geometry& g = s_->geometry();
  const uint64_t units = g.cluster_size / kFineLockBytes;
  const uint64_t guest = cluster << g.cluster_bits;
  const size_t writes_before = plan->writes.size();
  // Writes still in flight into the cluster (a flush does not wait for
  // them): their bytes are written again, from copies taken now, while
  // their buffers are certainly valid (they cannot finish while the
  // caller holds the lock). The same bytes written twice at once read
  // back as those bytes.
  for (const PendingWrite& w : p.in_flight) {
    uint8_t* copy = plan->Buffer(w.len);
    std::copy(w.data, w.data + w.len, copy);
    IoOp op;
    op.file = s_->data();
    op.offset = p.host + w.in_cluster;
    op.guest_bytes = 0;
    op.Add(copy, w.len);
    plan->writes.push_back(std::move(op));
  }
  bool filled = false;
  // With extended L2, uncovered subclusters simply stay as they are.
  for (uint64_t u = 0; u < units && !g.extended_l2;) {
    if (TestBit(p.covered, u)) {
      ++u;
      continue;
    }
    uint64_t v = u;
    while (v < units && !TestBit(p.covered, v)) ++v;
    const uint64_t start = u * kFineLockBytes;
    const uint64_t len = (v - u) * kFineLockBytes;
    u = v;
    if (p.virgin) {
      // The new cluster reads as zeros already.
      ASSIGN_OR_RETURN(bool zero, cow_->KnownZero(0, 0, guest + start, len));
      if (zero) {
        CountMetadata(&IoStats::cow_skipped_zero, 1);
        continue;
      }
    }
    uint8_t* buf = plan->Buffer(len);
    RETURN_IF_ERROR(cow_->PlanReadOld(0, 0, guest + start, buf, len, plan));
    IoOp op;
    op.file = s_->data();
    op.offset = p.host + start;
    op.guest_bytes = 0;  // all of it is copy-on-write
    op.Add(buf, len);
    plan->writes.push_back(std::move(op));
    filled = true;
  }
  if (filled) CountMetadata(&IoStats::cow_deferred_filled, 1);
  if (plan->writes.size() != writes_before) EmitEvent("deferred-fill");
  p.filling = true;
  plan->commits.push_back([this, cluster] {
    PendingCluster* found = index_->Find(cluster);
    // Gone: dropped when the image was marked corrupt.
    if (found == nullptr) return absl::OkStatus();
    PendingCluster& p = *found;
    p.filling = false;
    // Every unit holds its data now (with standard L2): the cluster can
    // go into the table.
    if (!s_->geometry().extended_l2) {
      std::fill(p.covered.begin(), p.covered.end(), ~uint64_t{0});
      p.covered_units =
          static_cast<uint32_t>(s_->geometry().cluster_size / kFineLockBytes);
    }
    return CommitPending(cluster);
  });
  plan->aborts.push_back([this, cluster] {
    // The cluster stays pending, as it was; the next flush fills it.
    if (PendingCluster* p = index_->Find(cluster); p != nullptr) {
      p->filling = false;
    }
  });
  return absl::OkStatus();
}

absl::Status PendingClusters::Materialize(uint64_t cluster) {
  IoPlan plan;
  absl::Status s = PlanFill(cluster, &plan);
  if (s.ok() && !plan.writes.empty()) s = RunPlanIo(plan, CurrentStats());
  if (!s.ok()) {
    for (auto& abort : plan.aborts) abort();
    return s;
  }
  for (auto& commit : plan.commits) RETURN_IF_ERROR(commit());
  return absl::OkStatus();
}

absl::Status PendingClusters::SettleAllPending() {
  if (!s_->writable || s_->closed || s_->marked_corrupt) {
    return absl::OkStatus();
  }
  return SettlePendingIn(0, ~uint64_t{0}, /*drop_whole=*/false);
}

absl::Status PendingClusters::SettleAndFlush() {
  RETURN_IF_ERROR(SettleAllPending());
  return flusher_->Flush();
}

absl::Status PendingClusters::PlanFillsFor(uint64_t offset, uint64_t len,
                                           IoPlan* plan) {
  return SettlePendingIn(offset, len, /*drop_whole=*/true, plan);
}

absl::Status PendingClusters::SettlePendingIn(uint64_t offset, uint64_t len,
                                              bool drop_whole, IoPlan* fills) {
  if (index_->empty() || len == 0) return absl::OkStatus();
  const uint32_t bits = s_->geometry().cluster_bits;
  const uint64_t cs = s_->geometry().cluster_size;
  const uint64_t first = offset >> bits;
  const uint64_t last = (offset + len - 1) >> bits;
  for (uint64_t cluster : index_->Between(first, last)) {
    const PendingCluster& p = *index_->Find(cluster);
    const uint64_t start = cluster << bits;
    if (drop_whole && p.in_flight.empty() && start >= offset &&
        start + cs <= offset + len) {
      // About to be overwritten whole: nothing refers to the host
      // cluster yet, so it is simply given back.
      const uint64_t host = p.host;
      index_->Remove(cluster);
      RETURN_IF_ERROR(s_->refcounts->Update(host, cs, -1));
      continue;
    }
    if (fills == nullptr) {
      if (absl::Status s = Materialize(cluster); !s.ok())
        return header_writer_->Fail(s);
      continue;
    }
    const size_t commits = fills->commits.size();
    const size_t aborts = fills->aborts.size();
    RETURN_IF_ERROR(PlanFill(cluster, fills));
    if (fills->writes.empty() && fills->reads.empty()) {
      // Nothing to copy (the rest of a fresh cluster reads as zeros):
      // committed now, as Materialize would.
      for (size_t i = commits; i < fills->commits.size(); ++i) {
        if (absl::Status s = fills->commits[i](); !s.ok())
          return header_writer_->Fail(s);
      }
      fills->commits.resize(commits);
      fills->aborts.resize(aborts);
    }
  }
  return absl::OkStatus();
}

}  // namespace qcow2::internal
