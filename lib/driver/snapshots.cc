// SPDX-License-Identifier: Apache-2.0
// Internal snapshots (QEMU's block/qcow2-snapshot.c). Each operation:
//   create: copy the active L1 table to new clusters; clear the COPIED
//           flags of the active tree (durable); raise the refcount of every
//           cluster it names (durable); write the new snapshot table; one
//           header write (count and offset) commits; free the old table.
//   apply:  raise the snapshot tree's refcounts and clear its COPIED flags
//           (durable); write its L1 table to new clusters (durable); one
//           header write switches L1 offset, L1 size and disk size; drop
//           the old active tree's references; set COPIED where a cluster
//           is now owned alone.
//   delete: write the table without the entry; one header write commits;
//           drop the snapshot tree's references; fix COPIED flags.
// A power cut before the header write leaks clusters at most; after it,
// the old structures leak until their references are dropped.
#include "lib/driver/snapshots.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/endian.h"
#include "lib/base/events.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/driver/qcow2_layer.h"
#include "lib/format/entries.h"

namespace qcow2::internal {

namespace {

// How COPIED flags are set in a pass over a tree.
enum class CopiedFlags {
  kClearAll,    // every cluster is (about to be) shared
  kByRefcount,  // set exactly where the refcount is 1
};

// One operation's view of the layer, with the helpers the three share.
class SnapshotOps {
 public:
  explicit SnapshotOps(Qcow2Layer* layer)
      : layer_(layer),
        g_(layer->cluster_map().geometry()),
        map_(layer->cluster_map()),
        refs_(layer->refcounts()),
        name_(layer->filename()) {}

  // Reads the table and sets file_end_ (no change to the image).
  absl::StatusOr<DecodedSnapshotTable> Table() {
    ASSIGN_OR_RETURN(file_end_, layer_->file()->Size());
    if (refs_ != nullptr) {
      file_end_ = std::max(file_end_, refs_->end_cluster() << g_.cluster_bits);
    }
    return ReadSnapshotTable(layer_->file(), layer_->header(), file_end_);
  }

  // Checks, flushes, and orders L2 writes after refcount writes.
  absl::Status Begin() {
    if (!layer_->writable() || refs_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(name_, " is not open for writing"));
    }
    if (layer_->header().incompatible_features & kIncompatDataFile) {
      return absl::UnimplementedError(
          absl::StrCat(name_,
                       ": internal snapshots of an image with an external data "
                       "file are not supported (nor are they in QEMU)"));
    }
    RETURN_IF_ERROR(layer_->header_writer().PrepareWrite());
    RETURN_IF_ERROR(layer_->Flush());
    return layer_->flusher().OrderL2AfterAllocation();
  }

  // The L1 table of snapshot `sn`, after checking where it lies.
  absl::StatusOr<std::vector<uint64_t>> ReadL1(const SnapshotEntry& sn) {
    const uint64_t bytes = uint64_t{sn.l1_size} * 8;
    uint64_t end = 0;
    if (!IsAligned(sn.l1_offset, g_.cluster_size) || bytes > kMaxL1Bytes ||
        AddOverflows(sn.l1_offset, bytes, &end) || end > file_end_ ||
        (bytes > 0 && sn.l1_offset == 0)) {
      return Corrupt(sn, absl::StrFormat("L1 table (offset 0x%x, %u entries) "
                                         "is misplaced or too large",
                                         sn.l1_offset, sn.l1_size));
    }
    std::vector<uint8_t> raw(bytes);
    RETURN_IF_ERROR(layer_->file()->ReadAt(sn.l1_offset, absl::MakeSpan(raw)));
    std::vector<uint64_t> l1(sn.l1_size);
    for (uint64_t i = 0; i < l1.size(); ++i) l1[i] = LoadBE64(&raw[i * 8]);
    return l1;
  }

  // Every L1 entry and every L2 entry of the tree names a sound place:
  // checked before anything is written.
  absl::Status CheckTree(const SnapshotEntry& sn,
                         const std::vector<uint64_t>& l1) {
    for (uint64_t i = 0; i < l1.size(); ++i) {
      const uint64_t table = l1[i] & kEntryOffsetMask;
      if ((l1[i] & kL1ReservedMask) ||
          (table != 0 && !Inside(table, g_.cluster_size, true))) {
        return Corrupt(
            sn, absl::StrFormat("L1 entry %d (0x%016x) is invalid", i, l1[i]));
      }
      if (table == 0) continue;
      RETURN_IF_ERROR(ForEachEntry(table, [&](L2Ref& ref) -> absl::Status {
        uint64_t off = 0, len = 0;
        if (!DataRange(ref.entry(), &off, &len)) {
          return Corrupt(
              sn, absl::StrFormat("L2 entry 0x%016x in the table at 0x%x is "
                                  "invalid",
                                  ref.entry(), table));
        }
        return absl::OkStatus();
      }));
    }
    return absl::OkStatus();
  }

  // Fails (kOutOfRange, nothing written) if raising the refcount of every
  // cluster the tree names would take one past the refcount width's
  // maximum (QEMU fails then too, after leaking what it raised).
  absl::Status CheckRaise(const std::vector<uint64_t>& l1) {
    absl::flat_hash_map<uint64_t, uint64_t> adds;  // cluster -> references
    auto add = [&](uint64_t off, uint64_t len) {
      for (uint64_t c = off >> g_.cluster_bits;
           c <= (off + len - 1) >> g_.cluster_bits; ++c) {
        ++adds[c];
      }
    };
    RETURN_IF_ERROR(ForEachTree(
        l1,
        [&](L2Ref& ref) {
          uint64_t off = 0, len = 0;
          DataRange(ref.entry(), &off, &len);
          if (len != 0) add(off, len);
          return absl::OkStatus();
        },
        [&](uint64_t table) {
          add(table, g_.cluster_size);
          return absl::OkStatus();
        }));
    for (const auto& [cluster, n] : adds) {
      ASSIGN_OR_RETURN(uint64_t rc, refs_->Get(cluster));
      if (rc + n > refs_->max_refcount()) {
        return absl::OutOfRangeError(absl::StrFormat(
            "%s: cluster 0x%x cannot be shared once more: its refcount "
            "would exceed %u, the most refcount_bits=%u can count",
            name_, cluster << g_.cluster_bits, refs_->max_refcount(),
            layer_->header().refcount_bits()));
      }
    }
    return absl::OkStatus();
  }

  // Adds `delta` to the refcount of every cluster the tree names (its
  // data, then each L2 table).
  absl::Status UpdateTree(const std::vector<uint64_t>& l1, int64_t delta) {
    return ForEachTree(
        l1,
        [&](L2Ref& ref) -> absl::Status {
          uint64_t off = 0, len = 0;
          DataRange(ref.entry(), &off, &len);
          return len == 0 ? absl::OkStatus() : refs_->Update(off, len, delta);
        },
        [&](uint64_t table) {
          return refs_->Update(table, g_.cluster_size, delta);
        });
  }

  // Sets the COPIED flags of the L2 entries of the tree (in the cache).
  absl::Status SetL2Flags(const std::vector<uint64_t>& l1, CopiedFlags how) {
    return ForEachTree(
        l1,
        [&](L2Ref& ref) -> absl::Status {
          const uint64_t entry = ref.entry();
          ASSIGN_OR_RETURN(bool owned, Owned(entry, how));
          const uint64_t want =
              owned ? (entry | kOflagCopied) : (entry & ~kOflagCopied);
          if (want != entry) ref.Set(want, ref.bitmap());
          return absl::OkStatus();
        },
        [](uint64_t) { return absl::OkStatus(); });
  }

  // Sets the COPIED flags of the active L1 table and writes it whole.
  absl::Status SetActiveL1Flags(CopiedFlags how) {
    const std::vector<uint64_t>& l1 = map_.l1();
    for (uint64_t i = 0; i < l1.size(); ++i) {
      const uint64_t table = l1[i] & kEntryOffsetMask;
      bool owned = false;
      if (table != 0 && how == CopiedFlags::kByRefcount) {
        ASSIGN_OR_RETURN(uint64_t rc, refs_->Get(table >> g_.cluster_bits));
        owned = rc == 1;
      }
      const uint64_t want =
          owned ? (l1[i] | kOflagCopied) : (l1[i] & ~kOflagCopied);
      if (want != l1[i]) map_.SetL1(i, want);
    }
    return WriteL1(map_.l1(), map_.l1_offset());
  }

  // Refcount blocks, then L2 slices, each made durable.
  absl::Status Durable() {
    RETURN_IF_ERROR(refs_->Flush());
    RETURN_IF_ERROR(layer_->meta_file()->Flush());
    RETURN_IF_ERROR(map_.l2_cache().Flush());
    return layer_->meta_file()->Flush();
  }

  // Allocates clusters for `l1` and writes it there (not flushed).
  absl::StatusOr<uint64_t> WriteNewL1(const std::vector<uint64_t>& l1) {
    if (l1.empty()) return 0;
    const uint64_t clusters = DivRoundUp(l1.size() * 8, g_.cluster_size);
    ASSIGN_OR_RETURN(uint64_t offset, refs_->Allocate(clusters));
    refs_->NoteMetadataEnd((offset >> g_.cluster_bits) + clusters);
    EmitEvent("snapshot-l1-write");
    std::vector<uint64_t> padded = l1;
    padded.resize(clusters * g_.cluster_size / 8, 0);
    RETURN_IF_ERROR(WriteL1(padded, offset));
    return offset;
  }

  // Writes `entries` as the new table, commits it with one header write
  // (after the table and its refcounts are durable), frees `old`'s.
  absl::Status CommitTable(const std::vector<SnapshotEntry>& entries,
                           const DecodedSnapshotTable& old) {
    ASSIGN_OR_RETURN(std::vector<uint8_t> table, EncodeSnapshotTable(entries));
    uint64_t offset = 0;
    if (!table.empty()) {
      const uint64_t clusters = DivRoundUp(table.size(), g_.cluster_size);
      ASSIGN_OR_RETURN(offset, refs_->Allocate(clusters));
      refs_->NoteMetadataEnd((offset >> g_.cluster_bits) + clusters);
      table.resize(clusters * g_.cluster_size, 0);
      EmitEvent("snapshot-table-write");
      RETURN_IF_ERROR(layer_->meta_file()->WriteAt(offset, table));
    }
    RETURN_IF_ERROR(Durable());
    Header& h = layer_->mutable_header();
    const Header saved = h;
    const uint64_t old_offset = h.snapshots_offset;
    h.nb_snapshots = static_cast<uint32_t>(entries.size());
    h.snapshots_offset = offset;
    if (absl::Status s = layer_->header_writer().WriteHeaderFields(); !s.ok()) {
      h = saved;  // the new table leaks at most
      return s;
    }
    if (old.size == 0) return absl::OkStatus();
    return refs_->Update(old_offset, old.size, -1);
  }

  // After the commit: drops the references of a tree nothing names any
  // more and frees its L1 table, then sets COPIED where the active tree
  // now owns a cluster alone. Leaves the layer flushed.
  absl::Status ReleaseTree(const std::vector<uint64_t>& l1,
                           uint64_t l1_offset) {
    RETURN_IF_ERROR(UpdateTree(l1, -1));
    if (!l1.empty()) {
      RETURN_IF_ERROR(refs_->Update(l1_offset, l1.size() * 8, -1));
    }
    RETURN_IF_ERROR(SetL2Flags(map_.l1(), CopiedFlags::kByRefcount));
    RETURN_IF_ERROR(SetActiveL1Flags(CopiedFlags::kByRefcount));
    RETURN_IF_ERROR(Durable());
    return layer_->Flush();
  }

  // After a failure past Begin(): kDataLoss marks the image corrupt.
  absl::Status Fail(absl::Status s) {
    return layer_->header_writer().Fail(std::move(s));
  }

  absl::Status NotFound(const std::string& key) const {
    return absl::NotFoundError(
        absl::StrCat(name_, ": no snapshot with id or name '", key, "'"));
  }

  Qcow2Layer* layer() { return layer_; }
  const Geometry& geometry() const { return g_; }
  ClusterMap& map() { return map_; }

 private:
  absl::Status Corrupt(const SnapshotEntry& sn, const std::string& what) {
    return absl::DataLossError(absl::StrCat(name_, ": snapshot '", sn.name,
                                            "' (id ", sn.id, "): ", what));
  }

  // [offset, +len) lies inside the file (and past the header cluster).
  bool Inside(uint64_t offset, uint64_t len, bool aligned) const {
    uint64_t end = 0;
    return (!aligned || IsAligned(offset, g_.cluster_size)) &&
           offset >= g_.cluster_size && !AddOverflows(offset, len, &end) &&
           end <= file_end_;
  }

  // The host bytes an L2 entry holds a reference to (len 0: none). False
  // for an entry that names a place it may not.
  bool DataRange(uint64_t entry, uint64_t* off, uint64_t* len) const {
    if (entry & kOflagCompressed) {
      const CompressedExtent c = DecodeCompressed(entry, g_.cluster_bits);
      *off = c.host_offset;
      *len = c.length;
      return Inside(*off, *len, false);
    }
    *off = entry & kEntryOffsetMask;
    *len = *off != 0 ? g_.cluster_size : 0;
    return *off == 0 || Inside(*off, *len, true);
  }

  // Whether an L2 entry should carry COPIED.
  absl::StatusOr<bool> Owned(uint64_t entry, CopiedFlags how) {
    const uint64_t off = entry & kEntryOffsetMask;
    if ((entry & kOflagCompressed) || off == 0 ||
        how == CopiedFlags::kClearAll) {
      return false;
    }
    ASSIGN_OR_RETURN(uint64_t rc, refs_->Get(off >> g_.cluster_bits));
    return rc == 1;
  }

  // Calls on_entry for every L2 entry of the tree, then on_table for the
  // table that holds them.
  template <typename EntryFn, typename TableFn>
  absl::Status ForEachTree(const std::vector<uint64_t>& l1, EntryFn on_entry,
                           TableFn on_table) {
    for (uint64_t e : l1) {
      const uint64_t table = e & kEntryOffsetMask;
      if (table == 0) continue;
      RETURN_IF_ERROR(ForEachEntry(table, on_entry));
      RETURN_IF_ERROR(on_table(table));
    }
    return absl::OkStatus();
  }

  template <typename Fn>
  absl::Status ForEachEntry(uint64_t table, Fn fn) {
    for (uint64_t s = 0; s < g_.cluster_size; s += g_.slice_bytes) {
      ASSIGN_OR_RETURN(MetadataCache::Handle slice,
                       map_.l2_cache().Get(table + s));
      for (uint32_t i = 0; i < g_.slice_entries; ++i) {
        L2Ref ref;
        ref.slice = slice;
        ref.index = i;
        ref.extended = g_.extended_l2;
        RETURN_IF_ERROR(fn(ref));
      }
    }
    return absl::OkStatus();
  }

  absl::Status WriteL1(const std::vector<uint64_t>& l1, uint64_t offset) {
    if (l1.empty()) return absl::OkStatus();
    std::vector<uint8_t> raw(l1.size() * 8);
    for (size_t i = 0; i < l1.size(); ++i) StoreBE64(&raw[i * 8], l1[i]);
    EmitEvent("l1-update");
    return layer_->meta_file()->WriteAt(offset, raw);
  }

  Qcow2Layer* const layer_;
  const Geometry& g_;
  ClusterMap& map_;
  Refcounts* const refs_;
  const std::string name_;
  uint64_t file_end_ = 0;
};

}  // namespace

absl::StatusOr<SnapshotEntry> CreateSnapshot(Qcow2Layer* layer,
                                             const NewSnapshot& sn) {
  SnapshotOps ops(layer);
  ASSIGN_OR_RETURN(DecodedSnapshotTable table, ops.Table());
  if (table.entries.size() >= kMaxSnapshots) {
    return absl::OutOfRangeError(absl::StrCat(
        layer->filename(), ": cannot create snapshot '", sn.name,
        "': the image has the most snapshots allowed (", kMaxSnapshots, ")"));
  }
  SnapshotEntry e;
  e.id = sn.id.empty() ? NextSnapshotId(table.entries) : sn.id;
  for (const SnapshotEntry& other : table.entries) {
    if (other.id == e.id) {
      return absl::AlreadyExistsError(
          absl::StrCat(layer->filename(), ": cannot create snapshot '", sn.name,
                       "': id ", e.id, " is in use"));
    }
  }
  e.name = sn.name;
  e.date_sec = sn.date_sec;
  e.date_nsec = sn.date_nsec;
  e.vm_clock_nsec = sn.vm_clock_nsec;
  e.icount = sn.icount;
  e.disk_size = layer->header().size;
  {
    // Fails here, before anything is written, if the entry cannot be
    // stored.
    std::vector<SnapshotEntry> all = table.entries;
    all.push_back(e);
    RETURN_IF_ERROR(EncodeSnapshotTable(all).status());
  }
  RETURN_IF_ERROR(ops.Begin());
  const std::vector<uint64_t> active = ops.map().l1();
  RETURN_IF_ERROR(ops.CheckTree(e, active));
  RETURN_IF_ERROR(ops.CheckRaise(active));
  auto run = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(e.l1_offset, ops.WriteNewL1(active));
    e.l1_size = static_cast<uint32_t>(active.size());
    // Flags first: a cut then leaves clusters owned alone that say they
    // are shared (harmless), never shared ones that say they are owned.
    RETURN_IF_ERROR(ops.SetL2Flags(active, CopiedFlags::kClearAll));
    RETURN_IF_ERROR(ops.SetActiveL1Flags(CopiedFlags::kClearAll));
    RETURN_IF_ERROR(ops.Durable());
    RETURN_IF_ERROR(ops.UpdateTree(active, +1));
    RETURN_IF_ERROR(ops.Durable());
    std::vector<SnapshotEntry> all = table.entries;
    all.push_back(e);
    RETURN_IF_ERROR(ops.CommitTable(all, table));
    return layer->Flush();
  };
  if (absl::Status s = run(); !s.ok()) return ops.Fail(std::move(s));
  return e;
}

absl::Status ApplySnapshot(Qcow2Layer* layer, const std::string& key) {
  SnapshotOps ops(layer);
  ASSIGN_OR_RETURN(DecodedSnapshotTable table, ops.Table());
  const int idx = FindSnapshotByIdOrName(table.entries, key);
  if (idx < 0) return ops.NotFound(key);
  const SnapshotEntry& sn = table.entries[idx];
  const Geometry& g = ops.geometry();
  const uint64_t needed =
      RequiredL1Entries(sn.disk_size, g.cluster_bits, g.entry_size);
  if (needed * 8 > kMaxL1Bytes || sn.disk_size % 512 != 0) {
    return absl::DataLossError(absl::StrCat(
        layer->filename(), ": snapshot '", sn.name, "' records a disk size of ",
        sn.disk_size, " bytes, which this format cannot map"));
  }
  // QEMU refuses while the image has persistent bitmaps (enabled or not):
  // they would no longer describe the disk.
  if (!layer->bitmaps().List().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        layer->filename(), ": snapshot '", sn.name,
        "' cannot be applied: the image has persistent bitmaps (as in "
        "QEMU: \"Device has active dirty bitmaps\")"));
  }
  ASSIGN_OR_RETURN(std::vector<uint64_t> sn_l1, ops.ReadL1(sn));
  RETURN_IF_ERROR(ops.CheckTree(sn, sn_l1));
  RETURN_IF_ERROR(ops.Begin());
  RETURN_IF_ERROR(ops.CheckRaise(sn_l1));
  auto run = [&]() -> absl::Status {
    RETURN_IF_ERROR(ops.UpdateTree(sn_l1, +1));
    RETURN_IF_ERROR(ops.SetL2Flags(sn_l1, CopiedFlags::kClearAll));
    RETURN_IF_ERROR(ops.Durable());
    std::vector<uint64_t> l1 = sn_l1;
    for (uint64_t& e : l1) e &= ~kOflagCopied;
    l1.resize(std::max<uint64_t>(l1.size(), needed), 0);
    ASSIGN_OR_RETURN(const uint64_t l1_offset, ops.WriteNewL1(l1));
    RETURN_IF_ERROR(ops.Durable());
    // The switch: L1 offset, L1 size and disk size in one header write.
    Header& h = layer->mutable_header();
    const Header saved = h;
    h.l1_table_offset = l1_offset;
    h.l1_size = static_cast<uint32_t>(l1.size());
    h.size = sn.disk_size;
    if (absl::Status s = layer->header_writer().WriteHeaderFields(); !s.ok()) {
      h = saved;  // the new L1 table and the raised refcounts leak
      return s;
    }
    const std::vector<uint64_t> old_l1 = ops.map().l1();
    const uint64_t old_offset = ops.map().l1_offset();
    ops.map().ReplaceL1(std::move(l1), l1_offset);
    return ops.ReleaseTree(old_l1, old_offset);
  };
  if (absl::Status s = run(); !s.ok()) return ops.Fail(std::move(s));
  return absl::OkStatus();
}

absl::Status DeleteSnapshot(Qcow2Layer* layer, const std::string& key) {
  SnapshotOps ops(layer);
  ASSIGN_OR_RETURN(DecodedSnapshotTable table, ops.Table());
  const int idx = FindSnapshotByIdOrName(table.entries, key);
  if (idx < 0) return ops.NotFound(key);
  const SnapshotEntry sn = table.entries[idx];
  ASSIGN_OR_RETURN(std::vector<uint64_t> sn_l1, ops.ReadL1(sn));
  RETURN_IF_ERROR(ops.CheckTree(sn, sn_l1));
  RETURN_IF_ERROR(ops.Begin());
  auto run = [&]() -> absl::Status {
    std::vector<SnapshotEntry> rest = table.entries;
    rest.erase(rest.begin() + idx);
    RETURN_IF_ERROR(ops.CommitTable(rest, table));
    return ops.ReleaseTree(sn_l1, sn.l1_offset);
  };
  if (absl::Status s = run(); !s.ok()) return ops.Fail(std::move(s));
  return absl::OkStatus();
}

}  // namespace qcow2::internal
