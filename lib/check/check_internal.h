// SPDX-License-Identifier: Apache-2.0
// Internal declarations shared by the refcount checker's translation units
// (check.cc, check_scan.cc, check_repair.cc): constants, refcount entry
// codecs, the expected/stored refcount containers and the Checker class.
// Not part of the library API; see check.h.
#ifndef QCOW2_LIB_CHECK_CHECK_INTERNAL_H_
#define QCOW2_LIB_CHECK_CHECK_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/base/endian.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/check/check.h"
#include "lib/format/entries.h"
#include "lib/format/header.h"
#include "lib/format/snapshot_table.h"

namespace qcow2::internal::check_detail {

// Field offsets in the header that repairs rewrite.
constexpr uint64_t kHeaderRefTableOffset = 48;  // u64 offset, u32 clusters
constexpr uint64_t kHeaderNbSnapshots = 60;     // u32 count, u64 offset
constexpr uint64_t kHeaderIncompat = 72;

constexpr uint64_t kL1OffsetMask = kEntryOffsetMask;
constexpr uint64_t kRefTableReservedMask = ~kRefTableOffsetMask;  // bits 0..8
constexpr uint64_t kBitmapAllAlloc = 0xffffffffull;
constexpr uint64_t kBitmapAllZero = 0xffffffff00000000ull;

// Persistent bitmaps (QEMU's docs/interop/qcow2.txt, "Bitmaps extension").
constexpr uint64_t kBitmapEntryReservedMask = 0xff000000000001feull;
constexpr uint64_t kBitmapEntryAllOnes = 1;
constexpr uint32_t kBitmapDirEntryFixed = 24;

// Where QEMU's attempt to grow the file to hold a refcount block beyond its
// end fails (ext4's limit), for counting the way it does.
constexpr uint64_t kTypicalMaxFileSize = 16ull << 40;

// Rebuild() keeps clear of at most this many references past the end of
// the file (and refuses to run when there are more).
constexpr size_t kMaxRejected = 1 << 20;

// More message lines than this are counted, not kept.
constexpr size_t kMaxMessages = 100000;

// Cached refcount blocks above this many bytes are written back and dropped.
constexpr uint64_t kMaxCachedBlockBytes = 32ull << 20;

inline std::string Hex(uint64_t v) { return absl::StrFormat("%x", v); }

// QEMU's view of an L2 entry (qcow2_get_cluster_type); with extended L2
// the ZERO bit is not interpreted and a host offset makes the cluster
// "normal" whatever its bitmap says.
enum class L2Type {
  kUnallocated,
  kZeroPlain,
  kZeroAlloc,
  kNormal,
  kCompressed
};

// `data_file`: the image has an external data file, where offset 0 with
// COPIED is guest cluster 0's data (HasHostCluster).
inline L2Type TypeOf(uint64_t entry, bool extended, bool data_file = false) {
  if (entry & kOflagCompressed) return L2Type::kCompressed;
  const bool has_offset = (entry & kEntryOffsetMask) != 0;
  if ((entry & kOflagZero) && !extended) {
    return has_offset ? L2Type::kZeroAlloc : L2Type::kZeroPlain;
  }
  return HasHostCluster(entry, data_file) ? L2Type::kNormal
                                          : L2Type::kUnallocated;
}

// The expected refcount of every host cluster: 16 bits each, counts of
// 0xffff and more kept in a side map.
class ExpectedRefcounts {
 public:
  uint64_t size() const { return counts_.size(); }
  void Reset(uint64_t n) {
    counts_.assign(n, 0);
    big_.clear();
  }
  void Grow(uint64_t n) {
    if (n > counts_.size()) counts_.resize(n, 0);
  }
  uint64_t Get(uint64_t k) const {
    if (k >= counts_.size()) return 0;
    return counts_[k] == kSpill ? big_.at(k) : counts_[k];
  }
  // REQUIRES: k < size().
  void Set(uint64_t k, uint64_t v) {
    if (v >= kSpill) {
      counts_[k] = kSpill;
      big_[k] = v;
    } else {
      if (counts_[k] == kSpill) big_.erase(k);
      counts_[k] = static_cast<uint16_t>(v);
    }
  }

 private:
  static constexpr uint16_t kSpill = 0xffff;
  std::vector<uint16_t> counts_;
  absl::flat_hash_map<uint64_t, uint64_t> big_;
};

// The refcounts stored in the image, read (and, when repairing, written)
// one refcount block at a time through a small write-back cache.
class StoredRefcounts {
 public:
  StoredRefcounts(File* file, uint32_t cluster_bits, uint32_t refcount_order)
      : file_(file),
        cluster_bits_(cluster_bits),
        order_(refcount_order),
        block_entries_(RefcountBlockEntries(cluster_bits, refcount_order)) {}

  void set_table(std::vector<uint64_t> table) {
    table_ = std::move(table);
    cache_.clear();
  }
  const std::vector<uint64_t>& table() const { return table_; }
  void set_table_entry(uint64_t idx, uint64_t value) { table_[idx] = value; }
  uint64_t block_entries() const { return block_entries_; }
  uint32_t order() const { return order_; }

  // The buffer of the refcount block covering clusters
  // [idx * block_entries, (idx + 1) * block_entries), or nullptr when there
  // is none (the counts are 0). Like QEMU, reserved bits in the table entry
  // are ignored here; a misaligned block is an I/O error. The pointer stays
  // valid until the next call.
  absl::StatusOr<uint8_t*> Block(uint64_t idx) {
    if (idx >= table_.size()) return nullptr;
    const uint64_t offset = table_[idx] & kRefTableOffsetMask;
    if (offset == 0) return nullptr;
    if (!IsAligned(offset, 1ull << cluster_bits_)) {
      return absl::DataLossError("Input/output error");
    }
    auto it = cache_.find(offset);
    if (it != cache_.end()) return it->second->data.data();
    if ((cache_.size() + 1) << cluster_bits_ > kMaxCachedBlockBytes) {
      RETURN_IF_ERROR(WriteBack());
      cache_.clear();
    }
    auto block = std::make_unique<CachedBlock>();
    block->data.resize(1ull << cluster_bits_);
    RETURN_IF_ERROR(file_->ReadAt(offset, absl::MakeSpan(block->data)));
    uint8_t* data = block->data.data();
    cache_[offset] = std::move(block);
    return data;
  }

  absl::StatusOr<uint64_t> Get(uint64_t cluster) {
    ASSIGN_OR_RETURN(uint8_t * block, Block(cluster / block_entries_));
    return block ? ReadRefcount(block, order_, cluster % block_entries_) : 0;
  }

  // Sets a count in a block that exists. REQUIRES: Block() of its index
  // returned non-null since the last cache drop.
  void Set(uint64_t cluster, uint64_t value) {
    const uint64_t offset =
        table_[cluster / block_entries_] & kRefTableOffsetMask;
    CachedBlock& b = *cache_.at(offset);
    WriteRefcount(b.data.data(), order_, cluster % block_entries_, value);
    b.dirty = true;
  }

  // Writes the modified blocks (not flushed).
  absl::Status WriteBack() {
    for (auto& [offset, block] : cache_) {
      if (!block->dirty) continue;
      RETURN_IF_ERROR(file_->WriteAt(offset, block->data));
      block->dirty = false;
    }
    return absl::OkStatus();
  }

 private:
  struct CachedBlock {
    std::vector<uint8_t> data;
    bool dirty = false;
  };

  File* const file_;
  const uint32_t cluster_bits_;
  const uint32_t order_;
  const uint64_t block_entries_;
  std::vector<uint64_t> table_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<CachedBlock>> cache_;
};

// One snapshot table entry, kept whole so that the table can be rewritten.
struct Snapshot {
  uint8_t fixed[40];  // the fixed part as read (dates, VM clock, ...)
  uint64_t l1_offset = 0;
  uint32_t l1_size = 0;
  uint32_t extra_data_size = 0;  // after truncation to 1 KiB, if any
  uint64_t vm_state_size = 0, disk_size = 0, icount = ~0ull;
  std::vector<uint8_t> unknown_extra;  // extra data past the known 24 bytes
  std::string id, name;
};

// What a metadata cluster was referenced as (for the overlap report).
enum MetaKind : uint32_t {
  kMetaHeader = 1 << 0,
  kMetaActiveL1 = 1 << 1,
  kMetaSnapshotL1 = 1 << 2,
  kMetaL2 = 1 << 3,
  kMetaRefTable = 1 << 4,
  kMetaRefBlock = 1 << 5,
  kMetaSnapshotTable = 1 << 6,
  kMetaBitmap = 1 << 7,
};

inline std::string MetaKindNames(uint32_t kinds) {
  static constexpr std::pair<uint32_t, const char*> kNames[] = {
      {kMetaHeader, "image header"},
      {kMetaActiveL1, "active L1 table"},
      {kMetaSnapshotL1, "snapshot L1 table"},
      {kMetaL2, "L2 table"},
      {kMetaRefTable, "refcount table"},
      {kMetaRefBlock, "refcount block"},
      {kMetaSnapshotTable, "snapshot table"},
      {kMetaBitmap, "bitmap metadata"},
  };
  std::vector<std::string> names;
  for (const auto& [bit, name] : kNames) {
    if (kinds & bit) names.push_back(name);
  }
  return absl::StrJoin(names, " and ");
}

struct MetaUse {
  uint32_t kinds = 0;
  uint64_t count = 0;
};

// Internal errors that stop a check carry QEMU's strerror() text.
inline absl::Status Eio() { return absl::DataLossError("Input/output error"); }
inline absl::Status Einval() {
  return absl::InvalidArgumentError("Invalid argument");
}
inline absl::Status Efbig() { return absl::OutOfRangeError("File too large"); }

// What the phases of one check share: the file, its header (whose
// refcount table fields change when the structure is rebuilt), the stored
// and the expected refcounts, and the messages.
struct CheckState {
  CheckState(File* f, Header header, uint64_t size)
      : file(f),
        h(std::move(header)),
        cb(h.cluster_bits),
        cs(h.cluster_size()),
        max_refcount(MaxRefcount(h.refcount_order)),
        file_size(size),
        data_file((h.incompatible_features & kIncompatDataFile) != 0),
        stored(f, h.cluster_bits, h.refcount_order) {}

  // Adds a message line, or counts it once kMaxMessages are kept.
  void Msg(CheckResult* res, std::string line);
  // Allocates `n` clusters past the end of the file and everything
  // counted, with refcount 1 written in place (creating refcount blocks
  // that describe themselves where needed). REQUIRES: the refcounts are
  // consistent.
  absl::StatusOr<uint64_t> AllocateAtEnd(uint64_t n);

  File* const file;
  Header h;
  const uint32_t cb;
  const uint64_t cs;
  const uint64_t max_refcount;
  uint64_t file_size;
  // Data clusters live in an external data file: no refcount of this
  // file counts them (QEMU's has_data_file()).
  const bool data_file;
  StoredRefcounts stored;
  ExpectedRefcounts expected;
  // Metadata clusters found by the last Calculate().
  absl::flat_hash_map<uint64_t, MetaUse> meta;
  // References of the last Calculate() that lie past the end of the file
  // (first and last cluster), which Rebuild() must stay clear of.
  std::vector<std::pair<uint64_t, uint64_t>> rejected;
  bool rejected_overflow = false;
  size_t suppressed = 0;
};

// Phases 1 and 6: the snapshot table, read and checked first (a broken
// one stops the check), written anew at the end when -r all repaired one
// of its entries.
class SnapshotTableCheck {
 public:
  explicit SnapshotTableCheck(CheckState* s) : s_(*s) {}
  // QEMU keeps the snapshot table's counters apart from the refcount
  // check's (they decide different repairs); `snap` receives them.
  absl::Status Read(CheckResult* snap, RepairMode fix);
  absl::Status Fix(CheckResult* snap, const CheckResult& refs, RepairMode fix);

  const std::vector<Snapshot>& snapshots() const { return snapshots_; }
  // Bytes of the table as stored (what its clusters hold).
  uint64_t size_bytes() const { return snapshots_size_; }

 private:
  absl::Status Write();

  CheckState& s_;
  std::vector<Snapshot> snapshots_;
  uint64_t snapshots_size_ = 0;
};

// Phase 2: recomputes the expected refcount of every host cluster from
// the header, the L1/L2 tables (active and snapshots'), the bitmaps and
// the refcount structure, checking their entries on the way.
class ReferenceScan {
 public:
  ReferenceScan(CheckState* s, const SnapshotTableCheck* table)
      : s_(*s), table_(*table) {}
  absl::Status Calculate(RepairMode fix, bool refcount_structures,
                         CheckResult* res, bool* rebuild);
  // Clusters referenced as two kinds of metadata at once.
  void ReportOverlaps(CheckResult* res);

 private:
  absl::Status Inc(CheckResult* res, uint64_t offset, uint64_t size,
                   uint32_t meta_kind = 0);
  absl::Status CheckL1(CheckResult* res, uint64_t l1_offset, uint32_t l1_size,
                       bool active, RepairMode fix);
  absl::Status CheckL2(CheckResult* res, uint64_t l2_offset, bool active,
                       RepairMode fix);
  absl::Status ZeroMisalignedEntry(CheckResult* res, uint64_t l2_offset,
                                   std::vector<uint8_t>* table, uint64_t i);
  absl::Status CheckBitmaps(CheckResult* res);
  void CheckRefblocks(CheckResult* res, RepairMode fix, bool* rebuild);

  CheckState& s_;
  const SnapshotTableCheck& table_;
};

// One check (with or without repairs) of one image: runs the phases.
class Checker {
 public:
  Checker(File* file, Header h, uint64_t file_size)
      : s_(file, std::move(h), file_size),
        snapshot_table_(&s_),
        scan_(&s_, &snapshot_table_) {}

  // Reads the refcount table.
  absl::Status LoadRefTable();
  // Runs the check; `res` holds what was found even when it stops early.
  absl::Status Run(RepairMode fix, CheckResult* res);

 private:
  // Phases 3 to 7.
  absl::Status Compare(CheckResult* res, RepairMode fix, bool* rebuild,
                       uint64_t* highest);
  absl::Status CheckRefcounts(RepairMode fix, CheckResult* res);
  absl::Status Rebuild(CheckResult* res);
  absl::Status CheckCopied(CheckResult* res, RepairMode fix);
  absl::Status MarkCleanAndConsistent();

  CheckState s_;
  SnapshotTableCheck snapshot_table_;
  ReferenceScan scan_;
};

}  // namespace qcow2::internal::check_detail

#endif  // QCOW2_LIB_CHECK_CHECK_INTERNAL_H_
