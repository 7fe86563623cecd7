// SPDX-License-Identifier: Apache-2.0
// Before a downgrade to version 2, which has no zero flag: every zero
// cluster of the active disk and of each snapshot becomes
//  - an unallocated cluster when the image has no backing file (it reads
//    as zeros then too), or
//  - a data cluster of zeros: a preallocated zero cluster is zeroed in
//    place when its L2 table is its only user, else (and for a plain zero
//    cluster over a backing file) a new cluster is allocated, zeroed and
//    counted once per user of the L2 table (QEMU's
//    qcow2_expand_zero_clusters).
// Per L2 table: new clusters counted (refcounts durable), zeros written
// (durable), then the table written (durable), then the references a
// replaced cluster held dropped. A power cut leaks clusters at most; the
// guest reads zeros throughout.
#include <cstring>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "lib/base/endian.h"
#include "lib/base/events.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/ops/amend.h"
#include "lib/check/check_internal.h"
#include "lib/format/entries.h"
#include "lib/format/snapshot_table.h"
#include "lib/meta/refcounts.h"

namespace qcow2::internal {

using check_detail::L2Type;
using check_detail::TypeOf;

namespace {

// Calls fn(table offset, its entries) for every L2 table of `l1`.
template <typename Fn>
absl::Status ForEachL2(AmendTarget* t, const std::vector<uint64_t>& l1,
                       Fn fn) {
  const uint64_t cs = t->h.cluster_size();
  std::vector<uint8_t> raw(cs);
  for (uint64_t e : l1) {
    const uint64_t table = e & kEntryOffsetMask;
    if (table == 0) continue;
    if (!IsAligned(table, cs) || table + cs > AlignUp(t->file_size, cs)) {
      return absl::DataLossError(absl::StrFormat(
          "%s: L2 table at 0x%x is misaligned or past the end of the file",
          t->file->name(), table));
    }
    RETURN_IF_ERROR(t->file->ReadAt(table, absl::MakeSpan(raw)));
    std::vector<uint64_t> entries(cs / 8);
    for (size_t i = 0; i < entries.size(); ++i) {
      entries[i] = LoadBE64(&raw[i * 8]);
    }
    RETURN_IF_ERROR(fn(table, &entries));
  }
  return absl::OkStatus();
}

class ZeroExpander {
 public:
  ZeroExpander(AmendTarget* t, Refcounts* refs)
      : t_(t),
        refs_(refs),
        cs_(t->h.cluster_size()),
        backing_(!t->h.backing_file.empty()) {}

  absl::Status Tree(const std::vector<uint64_t>& l1) {
    return ForEachL2(t_, l1,
                     [this](uint64_t table, std::vector<uint64_t>* entries) {
                       if (!seen_.insert(table).second) {
                         return absl::OkStatus();
                       }
                       return Table(table, entries);
                     });
  }

 private:
  // A new cluster counted once per user of the L2 table.
  absl::StatusOr<uint64_t> NewCluster(uint64_t users) {
    ASSIGN_OR_RETURN(uint64_t off, refs_->Allocate(1));
    if (users > 1) {
      RETURN_IF_ERROR(refs_->Update(off, cs_, static_cast<int64_t>(users) - 1));
    }
    return off;
  }

  // A cluster the guest reads as zeros. On an encrypted image that is the
  // ciphertext of zeros at its host offset: plain zeros would decrypt to
  // noise (QEMU 7.2 writes plain zeros here, and its downgraded image
  // then reads garbage where the guest had zeros).
  absl::Status WriteZeroCluster(uint64_t off) {
    if (t_->cipher == nullptr) return t_->file->WriteZeroes(off, cs_);
    std::vector<uint8_t> buf(cs_, 0);
    RETURN_IF_ERROR(t_->cipher->Encrypt(off, absl::MakeSpan(buf)));
    return t_->file->WriteAt(off, buf);
  }

  absl::Status Table(uint64_t table, std::vector<uint64_t>* entries) {
    ASSIGN_OR_RETURN(const uint64_t users,
                     refs_->Get(table >> t_->h.cluster_bits));
    const uint64_t copied = users == 1 ? kOflagCopied : 0;
    std::vector<uint64_t> to_zero;                      // host offsets
    std::vector<std::pair<uint64_t, uint64_t>> to_drop;  // offset, refs
    bool changed = false;
    for (uint64_t& e : *entries) {
      const L2Type type = TypeOf(e, false);
      if (type != L2Type::kZeroPlain && type != L2Type::kZeroAlloc) continue;
      changed = true;
      if (!backing_ && type == L2Type::kZeroPlain) {
        e = 0;
        continue;
      }
      uint64_t off = e & kEntryOffsetMask;
      if (type == L2Type::kZeroAlloc) {
        ASSIGN_OR_RETURN(uint64_t rc, refs_->Get(off >> t_->h.cluster_bits));
        if (rc != users) {
          // Other tables use the cluster too: it keeps their bytes.
          to_drop.emplace_back(off, users);
          ASSIGN_OR_RETURN(off, NewCluster(users));
        }
      } else {
        ASSIGN_OR_RETURN(off, NewCluster(users));
      }
      to_zero.push_back(off);
      e = off | copied;
    }
    if (!changed) return absl::OkStatus();
    RETURN_IF_ERROR(refs_->Flush());
    RETURN_IF_ERROR(t_->file->Flush());
    for (uint64_t off : to_zero) {
      EmitEvent("zero-expand-write");
      RETURN_IF_ERROR(WriteZeroCluster(off));
    }
    if (!to_zero.empty()) RETURN_IF_ERROR(t_->file->Flush());
    std::vector<uint8_t> raw(cs_);
    for (size_t i = 0; i < entries->size(); ++i) {
      StoreBE64(&raw[i * 8], (*entries)[i]);
    }
    EmitEvent("l2-update");
    RETURN_IF_ERROR(t_->file->WriteAt(table, raw));
    RETURN_IF_ERROR(t_->file->Flush());
    if (to_drop.empty()) return absl::OkStatus();
    for (const auto& [off, n] : to_drop) {
      RETURN_IF_ERROR(refs_->Update(off, cs_, -static_cast<int64_t>(n)));
    }
    RETURN_IF_ERROR(refs_->Flush());
    return t_->file->Flush();
  }

  AmendTarget* const t_;
  Refcounts* const refs_;
  const uint64_t cs_;
  const bool backing_;
  absl::flat_hash_set<uint64_t> seen_;  // L2 tables done
};

}  // namespace

absl::StatusOr<bool> HasCompressedClusters(AmendTarget* t) {
  ASSIGN_OR_RETURN(std::vector<uint64_t> l1,
                   t->ReadL1(t->h.l1_table_offset, t->h.l1_size));
  bool found = false;
  RETURN_IF_ERROR(
      ForEachL2(t, l1, [&](uint64_t, std::vector<uint64_t>* entries) {
        for (uint64_t e : *entries) found |= (e & kOflagCompressed) != 0;
        return absl::OkStatus();
      }));
  return found;
}

absl::Status ExpandZeroClusters(AmendTarget* t) {
  const Header& h = t->h;
  ASSIGN_OR_RETURN(std::unique_ptr<Refcounts> refs, OpenRefcounts(t));
  ZeroExpander expand(t, refs.get());
  ASSIGN_OR_RETURN(std::vector<uint64_t> l1,
                   t->ReadL1(h.l1_table_offset, h.l1_size));
  RETURN_IF_ERROR(expand.Tree(l1));
  ASSIGN_OR_RETURN(DecodedSnapshotTable snapshots,
                   ReadSnapshotTable(t->file, h, t->file_size));
  for (const SnapshotEntry& sn : snapshots.entries) {
    ASSIGN_OR_RETURN(std::vector<uint64_t> sn_l1,
                     t->ReadL1(sn.l1_offset, sn.l1_size));
    RETURN_IF_ERROR(expand.Tree(sn_l1));
  }
  RETURN_IF_ERROR(refs->Flush());
  RETURN_IF_ERROR(t->file->Flush());
  ASSIGN_OR_RETURN(t->file_size, t->file->Size());
  return absl::OkStatus();
}

}  // namespace qcow2::internal
