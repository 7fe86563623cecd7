// The refcount checker. One check ("pass") follows QEMU 7.2's
// qcow2_co_check_locked() phase by phase, so that counters, verdicts and
// message lines agree with `qemu-img check`:
//
//   1. read the snapshot table (a broken one stops the check);
//   2. Calculate(): recompute the expected refcount of every host cluster,
//      checking L1/L2 entries and refcount table entries on the way;
//   3. Compare(): expected against stored refcounts (first without fixing,
//      to print and count; then, when repairing, again with fixes);
//   4. when the refcount structure is unusable and -r all: Rebuild() a new
//      one past the end of the file, switch the header, then recount;
//   5. CheckCopied(): the COPIED flag of active L1 and L2 entries;
//   6. FixSnapshotTable(): with -r all, a snapshot table whose entries
//      needed repair is written anew at the end of the file;
//   7. after a successful repair, clear the dirty and corrupt bits.
//
// Write ordering during repairs: refcount fixes are written and flushed
// before any COPIED flag changes; a rebuilt structure (or new snapshot
// table) is written and flushed before the header points at it, and the
// header write is flushed before anything else happens; old structures
// are released last. A power cut at any point leaves an image that reads
// the same and that a later repair finishes.
#include "lib/refcount/check.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/format/entries.h"
#include "lib/format/header.h"
#include "lib/util/endian.h"
#include "lib/util/math.h"
#include "lib/util/status_macros.h"

namespace qcow2::internal {
namespace {

// Field offsets in the header that repairs rewrite.
constexpr uint64_t kHeaderRefTableOffset = 48;  // u64 offset, u32 clusters
constexpr uint64_t kHeaderNbSnapshots = 60;     // u32 count, u64 offset
constexpr uint64_t kHeaderIncompat = 72;

constexpr uint64_t kL1OffsetMask = kEntryOffsetMask;
constexpr uint64_t kRefTableReservedMask = ~kRefTableOffsetMask;  // bits 0..8
constexpr uint64_t kBitmapAllAlloc = 0xffffffffull;
constexpr uint64_t kBitmapAllZero = 0xffffffff00000000ull;

// Snapshot table limits (QEMU's QCOW_MAX_SNAPSHOT_EXTRA_DATA and
// QCOW_MAX_SNAPSHOTS_SIZE).
constexpr uint32_t kSnapshotHeaderSize = 40;
constexpr uint32_t kMaxSnapshotExtraData = 1024;
constexpr uint32_t kSnapshotKnownExtra =
    24;  // VM state size, disk size, icount
constexpr uint64_t kMaxSnapshotTableBytes = 64ull << 20;

// Persistent bitmaps (docs/interop/qcow2.txt, "Bitmaps extension").
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

std::string Hex(uint64_t v) { return absl::StrFormat("%x", v); }

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

L2Type TypeOf(uint64_t entry, bool extended) {
  if (entry & kOflagCompressed) return L2Type::kCompressed;
  const bool has_offset = (entry & kEntryOffsetMask) != 0;
  if ((entry & kOflagZero) && !extended) {
    return has_offset ? L2Type::kZeroAlloc : L2Type::kZeroPlain;
  }
  return has_offset ? L2Type::kNormal : L2Type::kUnallocated;
}

// Refcount entry codec for every width (sub-byte widths count from the
// least significant bit).
uint64_t ReadRefcount(const uint8_t* block, uint32_t order, uint64_t i) {
  switch (order) {
    case 0:
    case 1:
    case 2: {
      const uint32_t bits = 1u << order;
      const uint64_t bit = i * bits;
      return (block[bit / 8] >> (bit % 8)) & ((1u << bits) - 1);
    }
    case 3:
      return block[i];
    case 4:
      return LoadBE16(block + i * 2);
    case 5:
      return LoadBE32(block + i * 4);
    default:
      return LoadBE64(block + i * 8);
  }
}

void WriteRefcount(uint8_t* block, uint32_t order, uint64_t i, uint64_t v) {
  switch (order) {
    case 0:
    case 1:
    case 2: {
      const uint32_t bits = 1u << order;
      const uint64_t bit = i * bits;
      const uint8_t mask =
          static_cast<uint8_t>(((1u << bits) - 1) << (bit % 8));
      block[bit / 8] = static_cast<uint8_t>((block[bit / 8] & ~mask) |
                                            ((v << (bit % 8)) & mask));
      break;
    }
    case 3:
      block[i] = static_cast<uint8_t>(v);
      break;
    case 4:
      StoreBE16(block + i * 2, static_cast<uint16_t>(v));
      break;
    case 5:
      StoreBE32(block + i * 4, static_cast<uint32_t>(v));
      break;
    default:
      StoreBE64(block + i * 8, v);
      break;
  }
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
        block_entries_((1ull << cluster_bits) * 8 >> refcount_order) {}

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

std::string MetaKindNames(uint32_t kinds) {
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
absl::Status Eio() { return absl::DataLossError("Input/output error"); }
absl::Status Einval() { return absl::InvalidArgumentError("Invalid argument"); }
absl::Status Efbig() { return absl::OutOfRangeError("File too large"); }

// One check (with or without repairs) of one image.
class Checker {
 public:
  Checker(File* file, Header h, uint64_t file_size)
      : file_(file),
        h_(std::move(h)),
        cb_(h_.cluster_bits),
        cs_(h_.cluster_size()),
        max_refcount_(
            h_.refcount_order == 6 ? ~0ull : (1ull << h_.refcount_bits()) - 1),
        file_size_(file_size),
        stored_(file, h_.cluster_bits, h_.refcount_order) {}

  // Reads the refcount table.
  absl::Status LoadRefTable();
  // Runs the check; `res` holds what was found even when it stops early.
  absl::Status Run(RepairMode fix, CheckResult* res);

 private:
  void Msg(CheckResult* res, std::string line);
  // QEMU keeps the snapshot table's counters apart from the refcount
  // check's (they decide different repairs); `snap` receives them.
  absl::Status ReadSnapshotTable(CheckResult* snap, RepairMode fix);
  absl::Status FixSnapshotTable(CheckResult* snap, const CheckResult& refs,
                                RepairMode fix);
  absl::Status WriteSnapshotTable();
  absl::StatusOr<uint64_t> AllocateAtEnd(uint64_t n);

  // Phase 2.
  absl::Status Calculate(RepairMode fix, bool refcount_structures,
                         CheckResult* res, bool* rebuild);
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
  void ReportOverlaps(CheckResult* res);

  // Phases 3 to 6.
  absl::Status Compare(CheckResult* res, RepairMode fix, bool* rebuild,
                       uint64_t* highest);
  absl::Status CheckRefcounts(RepairMode fix, CheckResult* res);
  absl::Status Rebuild(CheckResult* res);
  absl::Status CheckCopied(CheckResult* res, RepairMode fix);
  absl::Status MarkCleanAndConsistent();

  File* const file_;
  Header h_;  // the refcount table fields change when rebuilding
  const uint32_t cb_;
  const uint64_t cs_;
  const uint64_t max_refcount_;
  uint64_t file_size_;
  StoredRefcounts stored_;
  std::vector<Snapshot> snapshots_;
  uint64_t snapshots_size_ = 0;
  ExpectedRefcounts expected_;
  // Metadata clusters found by the last Calculate().
  absl::flat_hash_map<uint64_t, MetaUse> meta_;
  // References of the last Calculate() that lie past the end of the file
  // (first and last cluster), which Rebuild() must stay clear of.
  std::vector<std::pair<uint64_t, uint64_t>> rejected_;
  bool rejected_overflow_ = false;
  size_t suppressed_ = 0;
};

void Checker::Msg(CheckResult* res, std::string line) {
  if (res->messages.size() < kMaxMessages) {
    res->messages.push_back(std::move(line));
  } else {
    ++suppressed_;
  }
}

absl::Status Checker::LoadRefTable() {
  std::vector<uint8_t> raw(uint64_t{h_.refcount_table_clusters} << cb_);
  RETURN_IF_ERROR(file_->ReadAt(h_.refcount_table_offset, absl::MakeSpan(raw)));
  std::vector<uint64_t> table(raw.size() / 8);
  for (size_t i = 0; i < table.size(); ++i) table[i] = LoadBE64(&raw[i * 8]);
  stored_.set_table(std::move(table));
  return absl::OkStatus();
}

// --- Phase 1: the snapshot table -------------------------------------------

absl::Status Checker::ReadSnapshotTable(CheckResult* snap, RepairMode fix) {
  const bool repair = fix == RepairMode::kAll;
  uint32_t nb = h_.nb_snapshots;
  uint64_t reduced = 0, dropped = 0;
  if (nb > kMaxSnapshots && repair) {
    Msg(snap, absl::StrFormat("Discarding %d overhanging snapshots",
                              nb - kMaxSnapshots));
    reduced += nb - kMaxSnapshots;
    nb = kMaxSnapshots;
  }
  // QEMU validates the table pointer here rather than when opening.
  if (nb > kMaxSnapshots) {
    ++snap->check_errors;
    Msg(snap, "ERROR snapshot table too large");
    Msg(snap, absl::StrFormat("You can force-remove all %d overhanging "
                              "snapshots with qemu-img check -r all",
                              nb - kMaxSnapshots));
    return Efbig();
  }
  if (!IsAligned(h_.snapshots_offset, cs_) ||
      h_.snapshots_offset > static_cast<uint64_t>(INT64_MAX) -
                                uint64_t{nb} * kSnapshotHeaderSize) {
    ++snap->check_errors;
    Msg(snap, "ERROR snapshot table offset invalid");
    return Einval();
  }
  auto fail = [&](const std::string& why, absl::Status st) {
    ++snap->check_errors;
    Msg(snap, absl::StrCat("ERROR failed to read the snapshot table: ", why));
    snapshots_.clear();
    return st;
  };
  auto read = [&](uint64_t at, void* buf, size_t len) {
    return file_->ReadAt(at, absl::MakeSpan(static_cast<uint8_t*>(buf), len));
  };
  uint64_t offset = h_.snapshots_offset, table_length = 0;
  for (uint32_t i = 0; i < nb; ++i) {
    const uint64_t entry_start = offset;
    table_length = AlignUp(table_length, 8);
    offset = AlignUp(offset, 8);
    Snapshot sn;
    absl::Status st = read(offset, sn.fixed, kSnapshotHeaderSize);
    if (!st.ok()) return fail(std::string(st.message()), st);
    offset += kSnapshotHeaderSize;
    sn.l1_offset = LoadBE64(sn.fixed);
    sn.l1_size = LoadBE32(sn.fixed + 8);
    const uint16_t id_len = LoadBE16(sn.fixed + 12);
    const uint16_t name_len = LoadBE16(sn.fixed + 14);
    sn.vm_state_size = LoadBE32(sn.fixed + 32);
    sn.extra_data_size = LoadBE32(sn.fixed + 36);
    bool truncate = false;
    if (sn.extra_data_size > kMaxSnapshotExtraData) {
      if (!repair) {
        return fail(absl::StrCat("Too much extra metadata in snapshot table "
                                 "entry ",
                                 i),
                    Efbig());
      }
      Msg(snap, absl::StrFormat("Discarding too much extra metadata in "
                                "snapshot table entry %d (%d > %d)",
                                i, sn.extra_data_size, kMaxSnapshotExtraData));
      ++dropped;
      truncate = true;
    }
    uint8_t known[kSnapshotKnownExtra] = {};
    const uint32_t known_len =
        std::min<uint32_t>(kSnapshotKnownExtra, sn.extra_data_size);
    st = read(offset, known, known_len);
    if (!st.ok()) return fail(std::string(st.message()), st);
    offset += known_len;
    if (sn.extra_data_size >= 8) sn.vm_state_size = LoadBE64(known);
    sn.disk_size =
        sn.extra_data_size >= 16 ? LoadBE64(known + 8) : AlignUp(h_.size, 512);
    sn.icount = sn.extra_data_size >= 24 ? LoadBE64(known + 16) : ~0ull;
    if (sn.extra_data_size > kSnapshotKnownExtra) {
      const uint64_t extra_end =
          offset + sn.extra_data_size - kSnapshotKnownExtra;
      if (truncate) sn.extra_data_size = kMaxSnapshotExtraData;
      sn.unknown_extra.resize(sn.extra_data_size - kSnapshotKnownExtra);
      st = read(offset, sn.unknown_extra.data(), sn.unknown_extra.size());
      if (!st.ok()) return fail(std::string(st.message()), st);
      offset = extra_end;
    }
    std::string strings(size_t{id_len} + name_len, '\0');
    st = read(offset, strings.data(), strings.size());
    if (!st.ok()) return fail(std::string(st.message()), st);
    offset += strings.size();
    // Like QEMU, the strings end at their first NUL.
    sn.id = std::string(strings.substr(0, id_len).c_str());
    sn.name = std::string(strings.substr(id_len).c_str());
    table_length += kSnapshotHeaderSize + sn.extra_data_size + strings.size();
    if (table_length > kMaxSnapshotTableBytes ||
        offset - h_.snapshots_offset > static_cast<uint64_t>(INT32_MAX)) {
      if (!repair) return fail("Snapshot table is too big", Efbig());
      Msg(snap, absl::StrFormat("Discarding %d overhanging snapshots "
                                "(snapshot table is too big)",
                                nb - i));
      reduced += nb - i;
      nb = i;
      offset = entry_start;
      break;
    }
    snapshots_.push_back(std::move(sn));
  }
  snapshots_size_ = offset - h_.snapshots_offset;
  snap->corruptions += reduced + dropped;
  if (reduced > 0) {
    // Dropping entries off the end only leaks clusters, which the refcount
    // check repairs.
    uint8_t buf[4];
    StoreBE32(buf, nb);
    absl::Status st =
        file_->WriteAt(kHeaderNbSnapshots, absl::MakeConstSpan(buf, 4));
    if (st.ok()) st = file_->Flush();
    if (!st.ok()) {
      ++snap->check_errors;
      Msg(snap, absl::StrCat("ERROR failed to update the snapshot count in "
                             "the image header: ",
                             st.message()));
      return st;
    }
    h_.nb_snapshots = nb;
    snap->corruptions_fixed += reduced;
    snap->corruptions -= reduced;
  }
  // Version 3 entries carry at least the 64-bit VM state size and the
  // disk size.
  if (h_.version >= 3) {
    for (size_t i = 0; i < snapshots_.size(); ++i) {
      if (snapshots_[i].extra_data_size < 16) {
        ++snap->corruptions;
        Msg(snap, absl::StrFormat("%s snapshot table entry %d is incomplete",
                                  repair ? "Repairing" : "ERROR", i));
      }
    }
  }
  return absl::OkStatus();
}

// Allocates `n` clusters past the end of the file and everything counted,
// with refcount 1 written in place (creating refcount blocks that describe
// themselves where needed). REQUIRES: the refcounts are consistent.
absl::StatusOr<uint64_t> Checker::AllocateAtEnd(uint64_t n) {
  const uint64_t per_block = stored_.block_entries();
  uint64_t start = std::max(DivRoundUp(file_size_, cs_), expected_.size());
  bool moved = true;
  while (moved) {
    moved = false;
    for (uint64_t idx = start / per_block; idx <= (start + n - 1) / per_block;
         ++idx) {
      if (idx >= stored_.table().size()) {
        return absl::ResourceExhaustedError("the refcount table is full");
      }
      ASSIGN_OR_RETURN(uint8_t * block, stored_.Block(idx));
      if (block != nullptr) continue;
      // A new block at the first cluster of the run in its range, counting
      // itself; durable before the table points at it.
      const uint64_t b = std::max(start, idx * per_block);
      std::vector<uint8_t> data(cs_, 0);
      WriteRefcount(data.data(), stored_.order(), b % per_block, 1);
      RETURN_IF_ERROR(file_->WriteAt(b << cb_, data));
      RETURN_IF_ERROR(file_->Flush());
      uint8_t entry[8];
      StoreBE64(entry, b << cb_);
      RETURN_IF_ERROR(file_->WriteAt(h_.refcount_table_offset + idx * 8,
                                     absl::MakeConstSpan(entry, 8)));
      RETURN_IF_ERROR(file_->Flush());
      stored_.set_table_entry(idx, b << cb_);
      expected_.Grow(b + 1);
      expected_.Set(b, 1);
      ASSIGN_OR_RETURN(file_size_, file_->Size());
      start = b + 1;
      moved = true;
      break;
    }
  }
  for (uint64_t k = start; k < start + n; ++k) {
    ASSIGN_OR_RETURN(uint8_t * block, stored_.Block(k / per_block));
    (void)block;  // exists now
    stored_.Set(k, 1);
  }
  expected_.Grow(start + n);
  for (uint64_t k = start; k < start + n; ++k) expected_.Set(k, 1);
  RETURN_IF_ERROR(stored_.WriteBack());
  RETURN_IF_ERROR(file_->Flush());
  return start << cb_;
}

// Writes the snapshot table anew (full extra data, truncated entries as
// read) at the end of the file, points the header at it, then frees the
// old table. QEMU's qcow2_write_snapshots().
absl::Status Checker::WriteSnapshotTable() {
  std::vector<uint8_t> table;
  for (const Snapshot& sn : snapshots_) {
    table.resize(AlignUp(table.size(), 8), 0);
    uint8_t fixed[kSnapshotHeaderSize];
    std::memcpy(fixed, sn.fixed, sizeof fixed);
    StoreBE32(fixed + 32, sn.vm_state_size <= 0xffffffffull
                              ? static_cast<uint32_t>(sn.vm_state_size)
                              : 0);
    const uint32_t extra =
        std::max<uint32_t>(kSnapshotKnownExtra, sn.extra_data_size);
    StoreBE32(fixed + 36, extra);
    StoreBE16(fixed + 12, static_cast<uint16_t>(sn.id.size()));
    StoreBE16(fixed + 14, static_cast<uint16_t>(sn.name.size()));
    table.insert(table.end(), fixed, fixed + sizeof fixed);
    uint8_t known[kSnapshotKnownExtra];
    StoreBE64(known, sn.vm_state_size);
    StoreBE64(known + 8, sn.disk_size);
    StoreBE64(known + 16, sn.icount);
    table.insert(table.end(), known, known + sizeof known);
    table.insert(table.end(), sn.unknown_extra.begin(), sn.unknown_extra.end());
    table.insert(table.end(), sn.id.begin(), sn.id.end());
    table.insert(table.end(), sn.name.begin(), sn.name.end());
  }
  if (table.size() > kMaxSnapshotTableBytes) return Efbig();
  uint64_t offset = 0;
  if (!table.empty()) {
    ASSIGN_OR_RETURN(offset, AllocateAtEnd(DivRoundUp(table.size(), cs_)));
    RETURN_IF_ERROR(file_->WriteAt(offset, table));
    RETURN_IF_ERROR(file_->Flush());
  }
  uint8_t ptr[12];
  StoreBE32(ptr, static_cast<uint32_t>(snapshots_.size()));
  StoreBE64(ptr + 4, offset);
  RETURN_IF_ERROR(
      file_->WriteAt(kHeaderNbSnapshots, absl::MakeConstSpan(ptr, 12)));
  RETURN_IF_ERROR(file_->Flush());
  // Free the old table (errors only leak clusters, as in QEMU).
  const uint64_t old_offset = h_.snapshots_offset, old_size = snapshots_size_;
  h_.nb_snapshots = static_cast<uint32_t>(snapshots_.size());
  h_.snapshots_offset = offset;
  snapshots_size_ = table.size();
  if (old_size > 0 && old_offset + old_size <= file_size_) {
    for (uint64_t k = old_offset >> cb_;
         k <= (old_offset + old_size - 1) >> cb_; ++k) {
      absl::StatusOr<uint64_t> rc = stored_.Get(k);
      if (rc.ok() && *rc > 0) stored_.Set(k, *rc - 1);
    }
    if (stored_.WriteBack().ok()) (void)file_->Flush();
  }
  return absl::OkStatus();
}

absl::Status Checker::FixSnapshotTable(CheckResult* snap,
                                       const CheckResult& refs,
                                       RepairMode fix) {
  if (snap->corruptions == 0 || fix != RepairMode::kAll) {
    return absl::OkStatus();
  }
  if (refs.corruptions != 0 || refs.check_errors != 0) {
    // Allocating needs refcounts that can be trusted.
    Msg(snap,
        "ERROR not rewriting the snapshot table: the refcounts are "
        "still inconsistent");
    return absl::OkStatus();
  }
  absl::Status st = WriteSnapshotTable();
  if (!st.ok()) {
    ++snap->check_errors;
    Msg(snap,
        absl::StrCat("ERROR failed to update snapshot table: ", st.message()));
    return st;
  }
  snap->corruptions_fixed += snap->corruptions;
  snap->corruptions = 0;
  return absl::OkStatus();
}

// --- Phase 2: expected refcounts --------------------------------------------

absl::Status Checker::Inc(CheckResult* res, uint64_t offset, uint64_t size,
                          uint32_t meta_kind) {
  if (size == 0) return absl::OkStatus();
  // The last cluster may be partly past the end of the file, no more.
  if (static_cast<int64_t>(offset + size) - static_cast<int64_t>(file_size_) >=
      static_cast<int64_t>(cs_)) {
    Msg(res, absl::StrFormat("ERROR: counting reference for region exceeding "
                             "the end of the file by one cluster or more: "
                             "offset 0x%x size 0x%x",
                             offset, size));
    ++res->corruptions;
    if (rejected_.size() < kMaxRejected) {
      rejected_.emplace_back(offset >> cb_, (offset + size - 1) >> cb_);
    } else {
      rejected_overflow_ = true;
    }
    return absl::OkStatus();
  }
  const uint64_t first = offset >> cb_;
  const uint64_t last = (offset + size - 1) >> cb_;
  if (last >= expected_.size()) {
    if (last >= kMaxCheckClusters + 1) return Efbig();
    expected_.Grow(last + 1);
  }
  for (uint64_t k = first; k <= last; ++k) {
    const uint64_t rc = expected_.Get(k);
    if (rc == max_refcount_) {
      Msg(res,
          absl::StrFormat("ERROR: overflow cluster offset=0x%x", k << cb_));
      Msg(res,
          "Use qemu-img amend to increase the refcount entry width or "
          "qemu-img convert to create a clean copy if the image cannot be "
          "opened for writing");
      ++res->corruptions;
      continue;
    }
    expected_.Set(k, rc + 1);
    if (meta_kind != 0) {
      MetaUse& use = meta_[k];
      use.kinds |= meta_kind;
      ++use.count;
    }
  }
  return absl::OkStatus();
}

absl::Status Checker::ZeroMisalignedEntry(CheckResult* res, uint64_t l2_offset,
                                          std::vector<uint8_t>* table,
                                          uint64_t i) {
  const uint32_t esize = h_.l2_entry_size();
  uint8_t* e = table->data() + i * esize;
  if (h_.extended_l2()) {
    // Allocated subclusters read as zero from now on.
    uint64_t bitmap = LoadBE64(e + 8);
    bitmap = (bitmap | (bitmap << 32)) & kBitmapAllZero;
    StoreBE64(e, 0);
    StoreBE64(e + 8, bitmap);
  } else {
    StoreBE64(e, kOflagZero);
  }
  absl::Status st =
      file_->WriteAt(l2_offset + i * esize, absl::MakeConstSpan(e, esize));
  if (st.ok()) st = file_->Flush();
  if (!st.ok()) {
    Msg(res, absl::StrCat("ERROR: Failed to overwrite L2 table entry: ",
                          st.message()));
    ++res->check_errors;
    return st;
  }
  --res->corruptions;
  ++res->corruptions_fixed;
  return absl::OkStatus();
}

absl::Status Checker::CheckL2(CheckResult* res, uint64_t l2_offset, bool active,
                              RepairMode fix) {
  std::vector<uint8_t> table(cs_);
  absl::Status st = file_->ReadAt(l2_offset, absl::MakeSpan(table));
  if (!st.ok()) {
    Msg(res, "ERROR: I/O error in check_refcounts_l2");
    ++res->check_errors;
    return st;
  }
  const bool extended = h_.extended_l2();
  const uint32_t esize = h_.l2_entry_size();
  uint64_t next_contiguous = 0;
  for (uint64_t i = 0; i < h_.l2_entries(); ++i) {
    uint64_t entry = LoadBE64(&table[i * esize]);
    const uint64_t bitmap = extended ? LoadBE64(&table[i * esize + 8]) : 0;
    const L2Type type = TypeOf(entry, extended);
    if (type != L2Type::kCompressed && (entry & kL2StandardReservedMask)) {
      Msg(res, absl::StrCat("ERROR found l2 entry with reserved bits set: ",
                            Hex(entry)));
      ++res->corruptions;
    }
    switch (type) {
      case L2Type::kCompressed: {
        if (entry & kOflagCopied) {
          const CompressedExtent ext = DecodeCompressed(entry, cb_);
          Msg(res, absl::StrFormat("ERROR: coffset=0x%x: copied flag must "
                                   "never be set for compressed clusters",
                                   ext.host_offset));
          entry &= ~kOflagCopied;
          ++res->corruptions;
        }
        if (bitmap) {
          Msg(res, absl::StrFormat("ERROR compressed cluster %d with non-zero "
                                   "subcluster allocation bitmap, "
                                   "entry=0x%x",
                                   i, entry));
          ++res->corruptions;
          break;
        }
        const CompressedExtent ext = DecodeCompressed(entry, cb_);
        RETURN_IF_ERROR(Inc(res, ext.host_offset, ext.length));
        if (active) {
          ++res->allocated_clusters;
          ++res->compressed_clusters;
          ++res->fragmented_clusters;  // compressed clusters always are
        }
        break;
      }
      case L2Type::kZeroAlloc:
      case L2Type::kNormal: {
        const uint64_t offset = entry & kEntryOffsetMask;
        if ((bitmap >> 32) & bitmap) {
          ++res->corruptions;
          Msg(res, absl::StrFormat("ERROR offset=%x: Allocated cluster has "
                                   "corrupted subcluster allocation bitmap",
                                   offset));
        }
        if (!IsAligned(offset, cs_)) {
          ++res->corruptions;
          const bool contains_data = extended ? (bitmap & kBitmapAllAlloc) != 0
                                              : !(entry & kOflagZero);
          if (!contains_data) {
            Msg(res,
                absl::StrFormat("%s offset=%x: Preallocated cluster is "
                                "not properly aligned; L2 entry "
                                "corrupted.",
                                fix == RepairMode::kAll ? "Repairing" : "ERROR",
                                offset));
            if (fix == RepairMode::kAll &&
                ZeroMisalignedEntry(res, l2_offset, &table, i).ok()) {
              continue;  // the entry no longer references a cluster
            }
          } else {
            Msg(res, absl::StrFormat("ERROR offset=%x: Data cluster is not "
                                     "properly aligned; L2 entry corrupted.",
                                     offset));
          }
        }
        if (active) {
          ++res->allocated_clusters;
          if (next_contiguous != 0 && offset != next_contiguous) {
            ++res->fragmented_clusters;
          }
          next_contiguous = offset + cs_;
        }
        RETURN_IF_ERROR(Inc(res, offset, cs_));
        break;
      }
      case L2Type::kZeroPlain:
        break;
      case L2Type::kUnallocated:
        if (bitmap & kBitmapAllAlloc) {
          ++res->corruptions;
          Msg(res,
              "ERROR: Unallocated cluster has non-zero subcluster "
              "allocation map");
        }
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status Checker::CheckL1(CheckResult* res, uint64_t l1_offset,
                              uint32_t l1_size, bool active, RepairMode fix) {
  if (l1_size == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Inc(res, l1_offset, uint64_t{l1_size} * 8,
                      active ? kMetaActiveL1 : kMetaSnapshotL1));
  std::vector<uint8_t> raw(uint64_t{l1_size} * 8);
  absl::Status st = file_->ReadAt(l1_offset, absl::MakeSpan(raw));
  if (!st.ok()) {
    Msg(res, "ERROR: I/O error in check_refcounts_l1");
    ++res->check_errors;
    return st;
  }
  for (uint32_t i = 0; i < l1_size; ++i) {
    const uint64_t e = LoadBE64(&raw[uint64_t{i} * 8]);
    if (e == 0) continue;
    if (e & kL1ReservedMask) {
      Msg(res, absl::StrCat("ERROR found L1 entry with reserved bits set: ",
                            Hex(e)));
      ++res->corruptions;
    }
    const uint64_t l2_offset = e & kL1OffsetMask;
    RETURN_IF_ERROR(Inc(res, l2_offset, cs_, kMetaL2));
    if (!IsAligned(l2_offset, cs_)) {
      Msg(res, absl::StrFormat("ERROR l2_offset=%x: Table is not cluster "
                               "aligned; L1 entry corrupted",
                               l2_offset));
      ++res->corruptions;
    }
    RETURN_IF_ERROR(CheckL2(res, l2_offset, active, fix));
  }
  return absl::OkStatus();
}

absl::Status Checker::CheckBitmaps(CheckResult* res) {
  if (!(h_.autoclear_features & kAutoclearBitmaps)) return absl::OkStatus();
  const RawExtension* ext = nullptr;
  for (const RawExtension& e : h_.other_extensions) {
    if (e.magic == kExtBitmaps) ext = &e;
  }
  if (ext == nullptr || ext->data.size() < 24) return absl::OkStatus();
  const uint32_t nb_bitmaps = LoadBE32(&ext->data[0]);
  const uint64_t dir_size = LoadBE64(&ext->data[8]);
  const uint64_t dir_offset = LoadBE64(&ext->data[16]);
  if (nb_bitmaps == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Inc(res, dir_offset, dir_size, kMetaBitmap));
  if (dir_size > kMaxSnapshotTableBytes) {
    ++res->corruptions;
    return Einval();
  }
  std::vector<uint8_t> dir(dir_size);
  RETURN_IF_ERROR(file_->ReadAt(dir_offset, absl::MakeSpan(dir)));
  uint64_t pos = 0;
  for (uint32_t b = 0; b < nb_bitmaps; ++b) {
    if (pos + kBitmapDirEntryFixed > dir.size()) {
      ++res->corruptions;  // QEMU cannot load the directory
      return Einval();
    }
    const uint64_t table_offset = LoadBE64(&dir[pos]);
    const uint32_t table_size = LoadBE32(&dir[pos + 8]);
    const uint16_t name_size = LoadBE16(&dir[pos + 18]);
    const uint32_t extra = LoadBE32(&dir[pos + 20]);
    pos += AlignUp(uint64_t{kBitmapDirEntryFixed} + extra + name_size, 8);
    if (pos > dir.size()) {
      ++res->corruptions;
      return Einval();
    }
    RETURN_IF_ERROR(
        Inc(res, table_offset, uint64_t{table_size} * 8, kMetaBitmap));
    std::vector<uint8_t> table(uint64_t{table_size} * 8);
    if (!file_->ReadAt(table_offset, absl::MakeSpan(table)).ok()) {
      ++res->corruptions;
      break;
    }
    for (uint32_t i = 0; i < table_size; ++i) {
      const uint64_t e = LoadBE64(&table[uint64_t{i} * 8]);
      const uint64_t off = e & kEntryOffsetMask;
      if ((e & kBitmapEntryReservedMask) ||
          (off != 0 && ((e & kBitmapEntryAllOnes) || !IsAligned(off, cs_)))) {
        ++res->corruptions;
        continue;
      }
      if (off != 0) RETURN_IF_ERROR(Inc(res, off, cs_, kMetaBitmap));
    }
  }
  return absl::OkStatus();
}

void Checker::CheckRefblocks(CheckResult* res, RepairMode fix, bool* rebuild) {
  const std::vector<uint64_t>& table = stored_.table();
  for (uint64_t i = 0; i < table.size(); ++i) {
    const uint64_t offset = table[i] & kRefTableOffsetMask;
    const uint64_t cluster = offset >> cb_;
    if (table[i] & kRefTableReservedMask) {
      Msg(res, absl::StrFormat("ERROR refcount table entry %d has reserved "
                               "bits set",
                               i));
      ++res->corruptions;
      *rebuild = true;
      continue;
    }
    if (!IsAligned(offset, cs_)) {
      Msg(res, absl::StrFormat("ERROR refcount block %d is not cluster "
                               "aligned; refcount table entry corrupted",
                               i));
      ++res->corruptions;
      *rebuild = true;
      continue;
    }
    if (cluster >= expected_.size()) {
      Msg(res,
          absl::StrFormat("%s refcount block %d is outside image",
                          fix == RepairMode::kAll ? "Repairing" : "ERROR", i));
      ++res->corruptions;
      if (fix != RepairMode::kAll) continue;
      // QEMU grows the file to hold the block, which then reads as zeros:
      // the block's own cluster shows up as "refcount=0 reference=1" and
      // forces a rebuild. We count the same way but write nothing at a
      // possibly wild offset: the rebuild puts the new structure at the
      // real end of the file.
      *rebuild = true;
      if (offset > static_cast<uint64_t>(INT64_MAX) - cs_) {
        Msg(res, "ERROR could not resize image: Invalid argument");
        continue;
      }
      if (offset + cs_ > kTypicalMaxFileSize) {
        Msg(res, "ERROR could not resize image: File too large");
        continue;
      }
      --res->corruptions;
      ++res->corruptions_fixed;
      if (cluster < kMaxCheckClusters) {
        expected_.Grow(cluster + 1);
        expected_.Set(cluster, expected_.Get(cluster) + 1);
      } else {
        // Too far away to track: count the error Compare() would find.
        Msg(res, absl::StrFormat("ERROR cluster %d refcount=0 reference=1",
                                 cluster));
        ++res->corruptions;
      }
      continue;
    }
    if (offset == 0) continue;
    // Cannot fail: the cluster is inside the image.
    (void)Inc(res, offset, cs_, kMetaRefBlock);
    const uint64_t rc = expected_.Get(cluster);
    if (rc != 1) {
      Msg(res, absl::StrFormat("ERROR refcount block %d refcount=%d", i, rc));
      ++res->corruptions;
      *rebuild = true;
    }
  }
}

absl::Status Checker::Calculate(RepairMode fix, bool refcount_structures,
                                CheckResult* res, bool* rebuild) {
  expected_.Reset(DivRoundUp(file_size_, cs_));
  meta_.clear();
  rejected_.clear();
  rejected_overflow_ = false;
  RETURN_IF_ERROR(Inc(res, 0, cs_, kMetaHeader));
  RETURN_IF_ERROR(CheckL1(res, h_.l1_table_offset, h_.l1_size, true, fix));
  for (const Snapshot& sn : snapshots_) {
    if (!IsAligned(sn.l1_offset, cs_)) {
      Msg(res, absl::StrFormat("ERROR snapshot %s (%s) l1_offset=%#x: L1 "
                               "table is not cluster aligned; snapshot table "
                               "entry corrupted",
                               sn.id, sn.name, sn.l1_offset));
      ++res->corruptions;
      continue;
    }
    if (uint64_t{sn.l1_size} * 8 > kMaxL1Bytes) {
      Msg(res, absl::StrFormat("ERROR snapshot %s (%s) l1_size=%#x: L1 table "
                               "is too large; snapshot table entry corrupted",
                               sn.id, sn.name, sn.l1_size));
      ++res->corruptions;
      continue;
    }
    RETURN_IF_ERROR(CheckL1(res, sn.l1_offset, sn.l1_size, false, fix));
  }
  RETURN_IF_ERROR(
      Inc(res, h_.snapshots_offset, snapshots_size_, kMetaSnapshotTable));
  if (refcount_structures) {
    RETURN_IF_ERROR(Inc(res, h_.refcount_table_offset,
                        uint64_t{h_.refcount_table_clusters} << cb_,
                        kMetaRefTable));
  }
  RETURN_IF_ERROR(CheckBitmaps(res));
  if (refcount_structures) CheckRefblocks(res, fix, rebuild);
  return absl::OkStatus();
}

// A descriptive line for each metadata cluster that is also used as
// something else. The counters are not touched: QEMU counts these as
// refcount mismatches ("refcount=1 reference=2"), and so do we.
void Checker::ReportOverlaps(CheckResult* res) {
  std::vector<uint64_t> clusters;
  for (const auto& [k, use] : meta_) {
    const bool several_kinds = (use.kinds & (use.kinds - 1)) != 0;
    if (several_kinds || expected_.Get(k) > use.count) clusters.push_back(k);
  }
  std::sort(clusters.begin(), clusters.end());
  for (uint64_t k : clusters) {
    const MetaUse& use = meta_.at(k);
    std::string what = MetaKindNames(use.kinds);
    if (expected_.Get(k) > use.count) absl::StrAppend(&what, " and guest data");
    Msg(res, absl::StrFormat("ERROR cluster %d (offset 0x%x) is used as %s "
                             "(metadata overlap)",
                             k, k << cb_, what));
  }
}

// --- Phase 3: expected against stored ----------------------------------------

absl::Status Checker::Compare(CheckResult* res, RepairMode fix, bool* rebuild,
                              uint64_t* highest) {
  *highest = 0;
  const uint64_t n = expected_.size();
  const uint64_t per_block = stored_.block_entries();
  bool wrote = false;
  for (uint64_t idx = 0; idx * per_block < n; ++idx) {
    absl::StatusOr<uint8_t*> block = stored_.Block(idx);
    const uint64_t end = std::min(n, (idx + 1) * per_block);
    for (uint64_t i = idx * per_block; i < end; ++i) {
      if (!block.ok()) {
        Msg(res, absl::StrFormat("Can't get refcount for cluster %d: %s", i,
                                 block.status().message()));
        ++res->check_errors;
        continue;
      }
      const uint64_t stored =
          *block ? ReadRefcount(*block, stored_.order(), i % per_block) : 0;
      const uint64_t want = expected_.Get(i);
      if (stored > 0 || want > 0) *highest = i;
      if (stored == want) continue;
      uint64_t* num_fixed = nullptr;
      if (stored == 0) {
        *rebuild = true;
      } else if (stored > want && fix != RepairMode::kNone) {
        num_fixed = &res->leaks_fixed;
      } else if (stored < want && fix == RepairMode::kAll) {
        num_fixed = &res->corruptions_fixed;
      }
      Msg(res, absl::StrFormat("%s cluster %d refcount=%d reference=%d",
                               num_fixed       ? "Repairing"
                               : stored < want ? "ERROR"
                                               : "Leaked",
                               i, stored, want));
      if (num_fixed) {
        stored_.Set(i, want);  // *block is non-null: stored > 0
        wrote = true;
        ++*num_fixed;
        continue;
      }
      if (stored < want) {
        ++res->corruptions;
      } else {
        ++res->leaks;
      }
    }
  }
  if (wrote) {
    RETURN_IF_ERROR(stored_.WriteBack());
    RETURN_IF_ERROR(file_->Flush());
  }
  return absl::OkStatus();
}

// --- Phase 4: a new refcount structure --------------------------------------

// Writes refcount blocks and a refcount table describing exactly the
// clusters in use (without the old refcount structure) past the end of the
// file, then points the header at them.
absl::Status Checker::Rebuild(CheckResult* res) {
  auto fail = [&](const std::string& what, absl::Status st) {
    Msg(res, absl::StrCat("ERROR ", what, ": ", st.message()));
    ++res->check_errors;
    return st;
  };
  // Expected counts without the old refcount table and blocks; the messages
  // and counters of this recount are not wanted.
  CheckResult scratch;
  bool ignored = false;
  RETURN_IF_ERROR(Calculate(RepairMode::kNone, false, &scratch, &ignored));

  if (rejected_overflow_) {
    return fail("allocating reftable",
                absl::ResourceExhaustedError(
                    "too many references past the end of the file"));
  }
  // The new structure goes past the end of the file and past everything
  // the image points at, even where a (broken) pointer lies beyond the end
  // of the file: such a pointer must never meet a refcount block. Ranges
  // below the new structure become part of the file and are counted.
  std::sort(rejected_.begin(), rejected_.end());
  const uint64_t per_block = stored_.block_entries();
  const uint64_t file_clusters = DivRoundUp(file_size_, cs_);
  std::vector<bool> used_blocks(DivRoundUp(expected_.size(), per_block), false);
  for (uint64_t k = 0; k < expected_.size(); ++k) {
    if (expected_.Get(k) != 0) used_blocks[k / per_block] = true;
  }
  uint64_t place = std::max(expected_.size(), file_clusters);
  // Table at `place`, then the blocks; grow both until they cover
  // everything including themselves.
  uint64_t table_clusters = 1, nblocks = 0;
  std::vector<uint64_t> block_idx;
  while (true) {
    if (place + table_clusters + nblocks > kMaxCheckClusters + 1) {
      return fail("allocating reftable", Efbig());
    }
    const uint64_t area_end = place + table_clusters + nblocks;
    std::vector<bool> used = used_blocks;
    used.resize(
        std::max<uint64_t>(used.size(), DivRoundUp(area_end, per_block)),
        false);
    bool collides = false;
    for (const auto& [first, last] : rejected_) {
      if (first < area_end && last >= place) {
        place = last + 1;  // skip past it and start over
        collides = true;
        break;
      }
      if (last < place) {
        for (uint64_t k = first; k <= last; ++k) used[k / per_block] = true;
      }
    }
    if (collides) continue;
    for (uint64_t k = place; k < area_end; ++k) used[k / per_block] = true;
    block_idx.clear();
    for (uint64_t i = 0; i < used.size(); ++i) {
      if (used[i]) block_idx.push_back(i);
    }
    const uint64_t entries = block_idx.empty() ? 1 : block_idx.back() + 1;
    const uint64_t need_table = DivRoundUp(entries * 8, cs_);
    if (need_table <= table_clusters && block_idx.size() <= nblocks) break;
    table_clusters = std::max(table_clusters, need_table);
    nblocks = std::max<uint64_t>(nblocks, block_idx.size());
  }
  if ((table_clusters << cb_) > kMaxRefcountTableBytes) {
    return fail("allocating reftable",
                absl::ResourceExhaustedError(
                    "the refcount table would exceed the 8 MiB limit"));
  }
  const uint64_t area_end = place + table_clusters + block_idx.size();
  expected_.Grow(area_end);
  for (const auto& [first, last] : rejected_) {
    if (last >= place) break;
    for (uint64_t k = first; k <= last; ++k) {
      const uint64_t rc = expected_.Get(k);
      if (rc < max_refcount_) expected_.Set(k, rc + 1);
    }
  }
  for (uint64_t k = place; k < area_end; ++k) expected_.Set(k, 1);

  // Blocks first, each a slice of the expected counts.
  std::vector<uint64_t> table((table_clusters << cb_) / 8, 0);
  std::vector<uint8_t> block(cs_);
  for (size_t j = 0; j < block_idx.size(); ++j) {
    const uint64_t idx = block_idx[j];
    std::fill(block.begin(), block.end(), 0);
    const uint64_t first = idx * per_block;
    const uint64_t last = std::min(expected_.size(), first + per_block);
    for (uint64_t k = first; k < last; ++k) {
      const uint64_t v = expected_.Get(k);
      if (v) WriteRefcount(block.data(), stored_.order(), k - first, v);
    }
    const uint64_t at = (place + table_clusters + j) << cb_;
    absl::Status st = file_->WriteAt(at, block);
    if (!st.ok()) return fail("writing refblock", st);
    table[idx] = at;
  }
  std::vector<uint8_t> raw(table_clusters << cb_, 0);
  for (size_t i = 0; i < table.size(); ++i) StoreBE64(&raw[i * 8], table[i]);
  absl::Status st = file_->WriteAt(place << cb_, raw);
  if (st.ok()) st = file_->Flush();
  if (!st.ok()) return fail("writing reftable", st);

  // Switch the header to the new structure in one write.
  uint8_t ptr[12];
  StoreBE64(ptr, place << cb_);
  StoreBE32(ptr + 8, static_cast<uint32_t>(table_clusters));
  st = file_->WriteAt(kHeaderRefTableOffset, absl::MakeConstSpan(ptr, 12));
  if (st.ok()) st = file_->Flush();
  if (!st.ok()) return fail("setting reftable", st);

  h_.refcount_table_offset = place << cb_;
  h_.refcount_table_clusters = static_cast<uint32_t>(table_clusters);
  stored_.set_table(std::move(table));
  ASSIGN_OR_RETURN(file_size_, file_->Size());
  return absl::OkStatus();
}

// --- Phase 5: COPIED flags ---------------------------------------------------

absl::Status Checker::CheckCopied(CheckResult* res, RepairMode fix) {
  // With -r leaks, QEMU repairs COPIED flags only when the refcounts are
  // known to be right.
  const bool repair = fix == RepairMode::kAll ||
                      (fix == RepairMode::kLeaks && res->check_errors == 0 &&
                       res->corruptions == 0 && res->leaks == 0);
  if (h_.l1_size == 0) return absl::OkStatus();
  std::vector<uint8_t> l1(uint64_t{h_.l1_size} * 8);
  absl::Status st = file_->ReadAt(h_.l1_table_offset, absl::MakeSpan(l1));
  if (!st.ok()) {
    ++res->check_errors;
    return st;
  }
  // Writes into a table that is also some other metadata would destroy it:
  // QEMU's overlap check refuses those, and so do we.
  auto overlaps_other_metadata = [&](uint64_t offset, uint32_t own_kind) {
    auto it = meta_.find(offset >> cb_);
    return !IsAligned(offset, cs_) ||
           (it != meta_.end() && (it->second.kinds & ~own_kind) != 0);
  };
  const bool extended = h_.extended_l2();
  const uint32_t esize = h_.l2_entry_size();
  std::vector<uint8_t> l2(cs_);
  bool wrote = false;
  for (uint32_t i = 0; i < h_.l1_size; ++i) {
    const uint64_t l1e = LoadBE64(&l1[uint64_t{i} * 8]);
    const uint64_t l2_offset = l1e & kL1OffsetMask;
    if (l2_offset == 0) continue;
    absl::StatusOr<uint64_t> rc = stored_.Get(l2_offset >> cb_);
    if (!rc.ok()) continue;  // already reported by Compare()
    if ((*rc == 1) != ((l1e & kOflagCopied) != 0)) {
      ++res->corruptions;
      Msg(res, absl::StrFormat("%s OFLAG_COPIED L2 cluster: l1_index=%d "
                               "l1_entry=%x refcount=%d",
                               repair ? "Repairing" : "ERROR", i, l1e, *rc));
      if (repair) {
        const uint64_t fixed =
            *rc == 1 ? (l1e | kOflagCopied) : (l1e & ~kOflagCopied);
        uint8_t buf[8];
        StoreBE64(buf, fixed);
        if (overlaps_other_metadata(h_.l1_table_offset, kMetaActiveL1)) {
          st = Eio();
        } else {
          st = file_->WriteAt(h_.l1_table_offset + uint64_t{i} * 8,
                              absl::MakeConstSpan(buf, 8));
          if (st.ok()) st = file_->Flush();
        }
        if (!st.ok()) {
          ++res->check_errors;
          return st;
        }
        --res->corruptions;
        ++res->corruptions_fixed;
      }
    }
    st = file_->ReadAt(l2_offset, absl::MakeSpan(l2));
    if (!st.ok()) {
      Msg(res, absl::StrCat("ERROR: Could not read L2 table: ", st.message()));
      ++res->check_errors;
      return st;
    }
    uint64_t dirty = 0;
    for (uint64_t j = 0; j < h_.l2_entries(); ++j) {
      const uint64_t entry = LoadBE64(&l2[j * esize]);
      const L2Type type = TypeOf(entry, extended);
      if (type != L2Type::kNormal && type != L2Type::kZeroAlloc) continue;
      absl::StatusOr<uint64_t> drc =
          stored_.Get((entry & kEntryOffsetMask) >> cb_);
      if (!drc.ok()) continue;
      if ((*drc == 1) == ((entry & kOflagCopied) != 0)) continue;
      ++res->corruptions;
      Msg(res, absl::StrFormat("%s OFLAG_COPIED data cluster: l2_entry=%x "
                               "refcount=%d",
                               repair ? "Repairing" : "ERROR", entry, *drc));
      if (repair) {
        StoreBE64(&l2[j * esize],
                  *drc == 1 ? (entry | kOflagCopied) : (entry & ~kOflagCopied));
        ++dirty;
      }
    }
    if (dirty == 0) continue;
    if (overlaps_other_metadata(l2_offset, kMetaL2)) {
      Msg(res,
          "ERROR: Could not write L2 table; metadata overlap check "
          "failed: Input/output error");
      ++res->check_errors;
      return Eio();
    }
    st = file_->WriteAt(l2_offset, l2);
    if (!st.ok()) {
      Msg(res, absl::StrCat("ERROR: Could not write L2 table: ", st.message()));
      ++res->check_errors;
      return st;
    }
    wrote = true;
    res->corruptions -= dirty;
    res->corruptions_fixed += dirty;
  }
  if (wrote) RETURN_IF_ERROR(file_->Flush());
  return absl::OkStatus();
}

// --- Phase 6
// -------------------------------------------------------------------

absl::Status Checker::MarkCleanAndConsistent() {
  if (h_.version < 3) return absl::OkStatus();
  uint8_t buf[8];
  RETURN_IF_ERROR(file_->ReadAt(kHeaderIncompat, absl::MakeSpan(buf, 8)));
  const uint64_t bits = LoadBE64(buf);
  const uint64_t clean = bits & ~(kIncompatDirty | kIncompatCorrupt);
  if (clean == bits) return absl::OkStatus();
  StoreBE64(buf, clean);
  RETURN_IF_ERROR(file_->WriteAt(kHeaderIncompat, absl::MakeConstSpan(buf, 8)));
  return file_->Flush();
}

// --- The whole check
// -----------------------------------------------------------

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

absl::Status Checker::CheckRefcounts(RepairMode fix, CheckResult* res) {
  bool rebuild = false;
  RETURN_IF_ERROR(Calculate(fix, true, res, &rebuild));
  ReportOverlaps(res);
  // When repairing without a rebuild, Compare() runs a second time with
  // fixes, from these counters.
  CheckResult pre;
  CopyCounters(*res, &pre);
  uint64_t highest = 0;
  RETURN_IF_ERROR(Compare(res, RepairMode::kNone, &rebuild, &highest));

  if (rebuild && fix == RepairMode::kAll) {
    CheckResult old;
    CopyCounters(*res, &old);
    Msg(res, "Rebuilding refcount structure");
    RETURN_IF_ERROR(Rebuild(res));
    // Count again against the new structure; leaks it shows are fixed
    // silently (and not counted), like QEMU.
    res->corruptions = res->leaks = 0;
    res->allocated_clusters = res->fragmented_clusters = 0;
    res->compressed_clusters = 0;
    rebuild = false;
    RETURN_IF_ERROR(Calculate(RepairMode::kNone, true, res, &rebuild));
    CheckResult saved;
    CopyCounters(*res, &saved);
    CopyCounters(CheckResult(), res);
    RETURN_IF_ERROR(Compare(res, RepairMode::kLeaks, &rebuild, &highest));
    if (rebuild) Msg(res, "ERROR rebuilt refcount structure is still broken");
    const uint64_t fresh_leaks = res->leaks;
    CopyCounters(saved, res);
    if (res->corruptions < old.corruptions) {
      res->corruptions_fixed += old.corruptions - res->corruptions;
    }
    if (res->leaks < old.leaks) res->leaks_fixed += old.leaks - res->leaks;
    res->leaks += fresh_leaks;
  } else if (fix != RepairMode::kNone) {
    if (rebuild) {
      Msg(res, "ERROR need to rebuild refcount structures");
      ++res->check_errors;
      return Eio();
    }
    if (res->leaks || res->corruptions) {
      CopyCounters(pre, res);
      RETURN_IF_ERROR(Compare(res, fix, &rebuild, &highest));
    }
  }

  RETURN_IF_ERROR(CheckCopied(res, fix));
  res->image_end_offset = (highest + 1) << cb_;
  return absl::OkStatus();
}

absl::Status Checker::Run(RepairMode fix, CheckResult* res) {
  res->total_clusters = DivRoundUp(AlignUp(h_.size, 512), cs_);
  CheckResult snap;
  absl::Status st = ReadSnapshotTable(&snap, fix);
  MoveMessages(&snap, res);
  if (st.ok()) {
    st = CheckRefcounts(fix, res);
    if (st.ok()) {
      st = FixSnapshotTable(&snap, *res, fix);
      MoveMessages(&snap, res);
    }
  }
  AddCounters(snap, res);
  if (st.ok() && fix != RepairMode::kNone && res->check_errors == 0 &&
      res->corruptions == 0) {
    st = MarkCleanAndConsistent();
  }
  if (suppressed_ > 0) {
    res->messages.push_back(
        absl::StrCat("(", suppressed_, " more lines not shown)"));
  }
  return st;
}

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
  RETURN_IF_ERROR(CheckFeatures(h, name));
  RETURN_IF_ERROR(ValidateForCheck(h, name));
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

absl::StatusOr<CheckResult> CheckImage(File* file, RepairMode mode) {
  ASSIGN_OR_RETURN(CheckResult res, CheckOnce(file, mode));
  if (mode == RepairMode::kNone || !res.failure.empty() ||
      (res.corruptions_fixed == 0 && res.leaks_fixed == 0)) {
    return res;
  }
  // Like qemu-img: check the repaired image again and report that, with the
  // repair pass's *_fixed counters.
  ASSIGN_OR_RETURN(CheckResult again, CheckOnce(file, RepairMode::kNone));
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
