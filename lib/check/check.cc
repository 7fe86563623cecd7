// SPDX-License-Identifier: Apache-2.0
// The refcount checker. One check ("pass") follows QEMU 7.2's
// qcow2_co_check_locked() phase by phase, so that counters, verdicts and
// message lines agree with `qemu-img check`:
//
//   1. SnapshotTableCheck::Read(): the snapshot table (a broken one stops the
//   check);
//   2. ReferenceScan::Calculate(): recompute the expected refcount of every
//   host cluster,
//      checking L1/L2 entries and refcount table entries on the way;
//   3. Compare(): expected against stored refcounts (first without fixing,
//      to print and count; then, when repairing, again with fixes);
//   4. when the refcount structure is unusable and -r all: Rebuild() a new
//      one past the end of the file, switch the header, then recount;
//   5. CheckCopied(): the COPIED flag of active L1 and L2 entries;
//   6. SnapshotTableCheck::Fix(): with -r all, a snapshot table whose entries
//      needed repair is written anew at the end of the file;
//   7. after a successful repair, clear the dirty and corrupt bits.
//
// Write ordering during repairs: refcount fixes are written and flushed
// before any COPIED flag changes; a rebuilt structure (or new snapshot
// table) is written and flushed before the header points at it, and the
// header write is flushed before anything else happens; old structures
// are released last. A power cut at any point leaves an image that reads
// the same and that a later repair finishes.
#include "lib/check/check.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/base/endian.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/check/check_internal.h"
#include "lib/format/crypto_ext.h"
#include "lib/format/entries.h"
#include "lib/format/header.h"

namespace qcow2::internal {
namespace check_detail {

void CheckState::Msg(CheckResult* res, std::string line) {
  if (res->messages.size() < kMaxMessages) {
    res->messages.push_back(std::move(line));
  } else {
    ++suppressed;
  }
}

absl::Status Checker::LoadRefTable() {
  std::vector<uint8_t> raw(uint64_t{s_.h.refcount_table_clusters} << s_.cb);
  RETURN_IF_ERROR(
      s_.file->ReadAt(s_.h.refcount_table_offset, absl::MakeSpan(raw)));
  std::vector<uint64_t> table(raw.size() / 8);
  for (size_t i = 0; i < table.size(); ++i) table[i] = LoadBE64(&raw[i * 8]);
  s_.stored.set_table(std::move(table));
  return absl::OkStatus();
}

// --- The whole check ------------------------------------------------------

namespace {

void CopyCounters(const CheckResult& from, CheckResult* to) {
  to->corruptions = from.corruptions;
  to->leaks = from.leaks;
  to->check_errors = from.check_errors;
  to->corruptions_fixed = from.corruptions_fixed;
  to->leaks_fixed = from.leaks_fixed;
  to->image_end_offset = from.image_end_offset;
  to->total_clusters = from.total_clusters;
  to->allocated_clusters = from.allocated_clusters;
  to->fragmented_clusters = from.fragmented_clusters;
  to->compressed_clusters = from.compressed_clusters;
}

// QEMU's qcow2_add_check_result() without the fragmentation figures.
void AddCounters(const CheckResult& from, CheckResult* to) {
  to->corruptions += from.corruptions;
  to->leaks += from.leaks;
  to->check_errors += from.check_errors;
  to->corruptions_fixed += from.corruptions_fixed;
  to->leaks_fixed += from.leaks_fixed;
}

void MoveMessages(CheckResult* from, CheckResult* to) {
  to->messages.insert(to->messages.end(),
                      std::make_move_iterator(from->messages.begin()),
                      std::make_move_iterator(from->messages.end()));
  from->messages.clear();
}

}  // namespace

absl::Status Checker::CheckRefcounts(RepairMode fix, CheckResult* res) {
  bool rebuild = false;
  RETURN_IF_ERROR(scan_.Calculate(fix, true, res, &rebuild));
  scan_.ReportOverlaps(res);
  // When repairing without a rebuild, Compare() runs a second time with
  // fixes, from these counters.
  CheckResult pre;
  CopyCounters(*res, &pre);
  uint64_t highest = 0;
  RETURN_IF_ERROR(Compare(res, RepairMode::kNone, &rebuild, &highest));

  if (rebuild && fix == RepairMode::kAll) {
    CheckResult old;
    CopyCounters(*res, &old);
    s_.Msg(res, "Rebuilding refcount structure");
    RETURN_IF_ERROR(Rebuild(res));
    // Count again against the new structure; leaks it shows are fixed
    // silently (and not counted), like QEMU.
    res->corruptions = res->leaks = 0;
    res->allocated_clusters = res->fragmented_clusters = 0;
    res->compressed_clusters = 0;
    rebuild = false;
    RETURN_IF_ERROR(scan_.Calculate(RepairMode::kNone, true, res, &rebuild));
    CheckResult saved;
    CopyCounters(*res, &saved);
    CopyCounters(CheckResult(), res);
    RETURN_IF_ERROR(Compare(res, RepairMode::kLeaks, &rebuild, &highest));
    if (rebuild)
      s_.Msg(res, "ERROR rebuilt refcount structure is still broken");
    const uint64_t fresh_leaks = res->leaks;
    CopyCounters(saved, res);
    if (res->corruptions < old.corruptions) {
      res->corruptions_fixed += old.corruptions - res->corruptions;
    }
    if (res->leaks < old.leaks) res->leaks_fixed += old.leaks - res->leaks;
    res->leaks += fresh_leaks;
  } else if (fix != RepairMode::kNone) {
    if (rebuild) {
      s_.Msg(res, "ERROR need to rebuild refcount structures");
      ++res->check_errors;
      return Eio();
    }
    if (res->leaks || res->corruptions) {
      CopyCounters(pre, res);
      RETURN_IF_ERROR(Compare(res, fix, &rebuild, &highest));
    }
  }

  RETURN_IF_ERROR(CheckCopied(res, fix));
  res->image_end_offset = (highest + 1) << s_.cb;
  return absl::OkStatus();
}

absl::Status Checker::Run(RepairMode fix, CheckResult* res) {
  res->total_clusters = DivRoundUp(AlignUp(s_.h.size, 512), s_.cs);
  CheckResult snap;
  absl::Status st = snapshot_table_.Read(&snap, fix);
  MoveMessages(&snap, res);
  if (st.ok()) {
    st = CheckRefcounts(fix, res);
    if (st.ok()) {
      st = snapshot_table_.Fix(&snap, *res, fix);
      MoveMessages(&snap, res);
    }
  }
  AddCounters(snap, res);
  if (st.ok() && fix != RepairMode::kNone && res->check_errors == 0 &&
      res->corruptions == 0) {
    st = MarkCleanAndConsistent();
  }
  if (s_.suppressed > 0) {
    res->messages.push_back(
        absl::StrCat("(", s_.suppressed, " more lines not shown)"));
  }
  return st;
}

namespace {

absl::Status Bad(const std::string& name, const std::string& what) {
  return absl::DataLossError(absl::StrCat(name, ": ", what));
}

// The checks QEMU makes when opening an image for a check: failing one of
// them means the image cannot be checked at all.
absl::Status ValidateForCheck(const Header& h, const std::string& name) {
  const uint64_t cs = h.cluster_size();
  if (uint64_t{h.l1_size} * 8 > kMaxL1Bytes) {
    return Bad(name, "Active L1 table too large");
  }
  if (h.l1_size <
      RequiredL1Entries(h.size, h.cluster_bits, h.l2_entry_size())) {
    return Bad(name, "L1 table is too small");
  }
  if (!IsAligned(h.l1_table_offset, cs) ||
      h.l1_table_offset >= kMaxHostOffset) {
    return Bad(name, "Invalid L1 table offset");
  }
  if (h.refcount_table_clusters == 0) {
    return Bad(name, "Image does not contain a reference count table");
  }
  if ((uint64_t{h.refcount_table_clusters} << h.cluster_bits) >
      kMaxRefcountTableBytes) {
    return Bad(name, "Reference count table too large");
  }
  if (!IsAligned(h.refcount_table_offset, cs) ||
      h.refcount_table_offset >= kMaxHostOffset) {
    return Bad(name, "Invalid reference count table offset");
  }
  if (h.size > (1ull << 62)) return Bad(name, "Image is too big");
  return absl::OkStatus();
}

absl::StatusOr<CheckResult> CheckOnce(File* file, RepairMode mode) {
  const std::string& name = file->name();
  ASSIGN_OR_RETURN(const uint64_t size, file->Size());
  std::vector<uint8_t> c0(512);
  RETURN_IF_ERROR(file->ReadAt(0, absl::MakeSpan(c0)));
  if (size < 8 || LoadBE32(c0.data()) != kQcowMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": Image is not in qcow2 format"));
  }
  const uint32_t cluster_bits = LoadBE32(&c0[20]);
  if (cluster_bits >= kMinClusterBits && cluster_bits <= kMaxClusterBits) {
    c0.resize(1ull << cluster_bits);
    RETURN_IF_ERROR(file->ReadAt(0, absl::MakeSpan(c0)));
  }
  ASSIGN_OR_RETURN(Header h, DecodeHeader(c0, name));
  // LUKS: the check reads metadata only, and needs no key.
  // A data file: the check reads the image file's metadata only.
  RETURN_IF_ERROR(
      CheckFeatures(h, name, /*luks_ok=*/true, /*data_file_ok=*/true));
  RETURN_IF_ERROR(ValidateForCheck(h, name));
  RETURN_IF_ERROR(DecodeCryptoExtension(h, size, name).status());
  const uint64_t clusters = DivRoundUp(size, h.cluster_size());
  if (clusters > kMaxCheckClusters) {
    return absl::ResourceExhaustedError(absl::StrCat(
        name, ": the file holds ", clusters, " clusters; checking more than ",
        kMaxCheckClusters, " is not supported"));
  }
  Checker checker(file, std::move(h), size);
  absl::Status st = checker.LoadRefTable();
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat(name,
                                                ": reading the refcount "
                                                "table: ",
                                                st.message()));
  }
  CheckResult res;
  st = checker.Run(mode, &res);
  if (!st.ok()) res.failure = std::string(st.message());
  return res;
}

}  // namespace
}  // namespace check_detail

absl::StatusOr<CheckResult> CheckImage(File* file, RepairMode mode) {
  ASSIGN_OR_RETURN(CheckResult res, check_detail::CheckOnce(file, mode));
  if (mode == RepairMode::kNone || !res.failure.empty() ||
      (res.corruptions_fixed == 0 && res.leaks_fixed == 0)) {
    return res;
  }
  // Like qemu-img: check the repaired image again and report that, with the
  // repair pass's *_fixed counters.
  ASSIGN_OR_RETURN(CheckResult again,
                   check_detail::CheckOnce(file, RepairMode::kNone));
  again.corruptions_fixed = res.corruptions_fixed;
  again.leaks_fixed = res.leaks_fixed;
  again.rechecked = true;
  again.recheck_first_message = res.messages.size();
  res.messages.insert(res.messages.end(),
                      std::make_move_iterator(again.messages.begin()),
                      std::make_move_iterator(again.messages.end()));
  again.messages = std::move(res.messages);
  return again;
}

}  // namespace qcow2::internal
