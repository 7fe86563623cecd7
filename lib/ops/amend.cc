// SPDX-License-Identifier: Apache-2.0
// qemu-img amend: the checks, then the steps (see amend.h). Phases:
//   1. read the header (and unlock a LUKS-encrypted image with the
//      caller's secret, as qemu-img's open does); check every option
//      against it and refuse, with qemu-img 7.2's message, before anything
//      is written;
//   2. a dirty image (lazy refcounts) has its refcounts rebuilt, as
//      QEMU's read-write open does;
//   3. upgrade to version 3 (cluster 0 rewritten: header length 112, the
//      feature-name table);
//   3a. the LUKS key slots (amend_luks.cc);
//   4. the refcount width (amend_refcounts.cc);
//   5. lazy refcounts on or off (one header write);
//   6. the virtual size (through the caller's resizer: Image::Resize);
//   6a. the external data file's name and raw flag (one header write;
//      cluster 0 whole for a new name);
//   7. downgrade to version 2: zero clusters expanded (amend_zeros.cc),
//      then cluster 0 rewritten without the version 3 fields.
#include "lib/ops/amend.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/endian.h"
#include "lib/base/events.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/check/check.h"
#include "lib/format/entries.h"
#include "lib/format/snapshot_table.h"
#include "lib/meta/refcounts.h"

namespace qcow2::internal {

absl::Status AmendTarget::Load() {
  ASSIGN_OR_RETURN(file_size, file->Size());
  // cluster_bits (bytes 20..23) says how much of the file is cluster 0;
  // bytes past the end of the file read as zero.
  uint8_t start[24] = {};
  RETURN_IF_ERROR(file->ReadAt(0, absl::MakeSpan(start)));
  const uint32_t bits = LoadBE32(start + 20);
  const uint64_t want =
      bits >= kMinClusterBits && bits <= kMaxClusterBits ? 1ull << bits : 4096;
  std::vector<uint8_t> c0(std::max<uint64_t>(want, 512));
  RETURN_IF_ERROR(file->ReadAt(0, absl::MakeSpan(c0)));
  ASSIGN_OR_RETURN(h, DecodeHeader(c0, file->name()));
  RETURN_IF_ERROR(CheckFeatures(h, file->name(), /*luks_ok=*/true,
                                /*data_file_ok=*/true));
  return ValidateHeaderTables(h, file_size, file->name());
}

absl::Status AmendTarget::WriteHeaderFields() {
  ASSIGN_OR_RETURN(std::vector<uint8_t> enc, EncodeHeader(h));
  const size_t n = h.version >= 3 ? h.header_length : kV2HeaderLength;
  EmitEvent("header-update");
  RETURN_IF_ERROR(file->WriteAt(0, absl::MakeConstSpan(enc.data(), n)));
  return file->Flush();
}

absl::Status AmendTarget::WriteCluster0() {
  ASSIGN_OR_RETURN(std::vector<uint8_t> enc, EncodeHeader(h));
  enc.resize(h.cluster_size(), 0);
  EmitEvent("header-update");
  RETURN_IF_ERROR(file->WriteAt(0, enc));
  return file->Flush();
}

absl::StatusOr<std::vector<uint64_t>> AmendTarget::ReadL1(uint64_t offset,
                                                         uint32_t entries) {
  const uint64_t bytes = uint64_t{entries} * 8;
  uint64_t end = 0;
  if (bytes > kMaxL1Bytes || AddOverflows(offset, bytes, &end) ||
      end > file_size || !IsAligned(offset, h.cluster_size()) ||
      (entries > 0 && offset == 0)) {
    return absl::DataLossError(absl::StrFormat(
        "%s: L1 table at 0x%x (%u entries) lies outside the file",
        file->name(), offset, entries));
  }
  std::vector<uint8_t> raw(bytes);
  RETURN_IF_ERROR(file->ReadAt(offset, absl::MakeSpan(raw)));
  std::vector<uint64_t> l1(entries);
  for (uint32_t i = 0; i < entries; ++i) l1[i] = LoadBE64(&raw[i * 8]);
  return l1;
}

absl::StatusOr<std::unique_ptr<Refcounts>> OpenRefcounts(AmendTarget* t) {
  const Header& h = t->h;
  Refcounts::Params p;
  ASSIGN_OR_RETURN(p.table,
                   Refcounts::LoadTable(t->file, h.refcount_table_offset,
                                        h.refcount_table_clusters,
                                        h.cluster_bits, t->file->name()));
  p.file = t->file;
  p.filename = t->file->name();
  p.cluster_bits = h.cluster_bits;
  p.refcount_order = h.refcount_order;
  p.table_offset = h.refcount_table_offset;
  p.table_clusters = h.refcount_table_clusters;
  auto refs = std::make_unique<Refcounts>(std::move(p));
  refs->NoteEnd(DivRoundUp(t->file_size, h.cluster_size()));
  refs->set_header_writer([t](uint64_t offset, uint32_t clusters) {
    t->h.refcount_table_offset = offset;
    t->h.refcount_table_clusters = clusters;
    return t->WriteHeaderFields();
  });
  return refs;
}

std::optional<uint64_t> FirstRefcountAbove(const std::vector<uint64_t>& refs,
                                           uint64_t limit) {
  for (uint64_t k = 0; k < refs.size(); ++k) {
    if (refs[k] > limit) return k;
  }
  return std::nullopt;
}

namespace {

absl::Status Refuse(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

// What the amend changes, from the options and the header.
struct AmendPlan {
  uint32_t old_version = 3, new_version = 3;
  uint32_t old_order = 4, new_order = 4;
  bool old_lazy = false, new_lazy = false;
  uint64_t old_size = 0, new_size = 0;
  std::optional<KeySlotPlan> keyslots;
  std::optional<std::string> old_data_file, new_data_file;
  bool old_raw = false, new_raw = false;
  bool data_file_changes() const {
    return new_data_file != old_data_file || new_raw != old_raw;
  }
  int steps() const {
    return (new_version != old_version) + (new_order != old_order) +
           (new_lazy != old_lazy) + (new_size != old_size) +
           keyslots.has_value() + data_file_changes();
  }
};

absl::StatusOr<uint32_t> ParseCompat(const std::string& v) {
  if (v == "0.10" || v == "v2") return 2;
  if (v == "1.1" || v == "v3") return 3;
  return Refuse(absl::StrCat("Unknown compatibility level ", v));
}

// The refcount width checks (QEMU's, in its order).
absl::Status CheckRefcountWidth(AmendTarget* t, const AmendPlan& p) {
  if (p.new_order == p.old_order) return absl::OkStatus();
  if (p.new_version < 3 && p.new_order != 4) {
    return Refuse(
        "Refcount widths other than 16 bits require compatibility level 1.1 "
        "or above (use compat=1.1 or greater)");
  }
  if (p.new_order < p.old_order) {
    ASSIGN_OR_RETURN(std::vector<uint64_t> refs, ReadAllRefcounts(t));
    const uint32_t bits = 1u << p.new_order;
    const uint64_t limit = MaxRefcount(p.new_order);
    if (std::optional<uint64_t> k = FirstRefcountAbove(refs, limit)) {
      return Refuse(absl::StrFormat(
          "Cannot decrease refcount entry width to %u bits: Cluster at "
          "offset %#x has a refcount of %u",
          bits, *k << t->h.cluster_bits, refs[*k]));
    }
  }
  return absl::OkStatus();
}

// The checks of QEMU's qcow2_downgrade, and persistent bitmaps (see
// qcow2/amend.h).
absl::Status CheckDowngrade(AmendTarget* t, const AmendPlan& p) {
  const Header& h = t->h;
  if (p.new_order != 4) return Refuse("compat=0.10 requires refcount_bits=16");
  if (h.incompatible_features & kIncompatDataFile) {
    return Refuse("Cannot downgrade an image with a data file");
  }
  if (h.nb_snapshots > 0) {
    ASSIGN_OR_RETURN(DecodedSnapshotTable table,
                     ReadSnapshotTable(t->file, h, t->file_size));
    for (const SnapshotEntry& e : table.entries) {
      if (e.vm_state_size > UINT32_MAX || e.disk_size != p.new_size) {
        return Refuse("Internal snapshots prevent downgrade of image");
      }
    }
  }
  const uint64_t incompat =
      h.incompatible_features & ~(kIncompatCompression | kIncompatDirty);
  if (incompat != 0) {
    return Refuse(absl::StrFormat(
        "Cannot downgrade an image with incompatible features 0x%x set",
        incompat));
  }
  if (h.incompatible_features & kIncompatCompression) {
    ASSIGN_OR_RETURN(bool compressed, HasCompressedClusters(t));
    if (compressed) {
      return Refuse(
          "Cannot downgrade an image with zstd compression type and "
          "existing compressed clusters");
    }
  }
  for (const RawExtension& e : h.other_extensions) {
    if (e.magic == kExtBitmaps) {
      // QEMU 7.2 downgrades, leaving the bitmaps inconsistent and their
      // clusters leaked; we refuse instead.
      return absl::FailedPreconditionError(
          "Cannot downgrade an image with persistent bitmaps (version 2 "
          "cannot hold them); remove them first ('qcowtool bitmap --remove')");
    }
  }
  return absl::OkStatus();
}

// QEMU's checks of a new size (qcow2_co_truncate), and what
// Image::Resize cannot do yet.
absl::Status CheckSize(AmendTarget* t, const AmendPlan& p) {
  const Header& h = t->h;
  if (p.new_size % 512 != 0) {
    return Refuse("The new size must be a multiple of 512");
  }
  if (h.nb_snapshots > 0 && std::max(p.old_version, p.new_version) < 3) {
    return absl::FailedPreconditionError(
        "Can't resize a v2 image which has snapshots");
  }
  if (p.new_size < p.old_size) {
    bool bitmaps = false;
    for (const RawExtension& e : h.other_extensions) {
      bitmaps |= e.magic == kExtBitmaps;
    }
    if (h.nb_snapshots > 0 || bitmaps) {
      return absl::UnimplementedError(absl::StrCat(
          t->file->name(), ": shrinking an image with ",
          bitmaps ? "persistent bitmaps" : "internal snapshots",
          " is not supported yet"));
    }
  }
  return absl::OkStatus();
}

// data_file and data_file_raw (QEMU checks them after compat and before
// refcount_bits). A new name must fit in cluster 0.
absl::Status CheckDataFile(AmendTarget* t, const AmendOptions& o,
                           AmendPlan* p) {
  const Header& h = t->h;
  p->old_data_file = p->new_data_file = h.data_file;
  p->old_raw = p->new_raw = (h.autoclear_features & kAutoclearDataFileRaw) != 0;
  if (o.data_file && (h.incompatible_features & kIncompatDataFile) == 0) {
    return Refuse(
        "data-file can only be set for images that use an external data "
        "file");
  }
  if (o.data_file_raw) {
    p->new_raw = *o.data_file_raw;
    if (p->new_raw && !p->old_raw) {
      return Refuse("data-file-raw cannot be set on existing images");
    }
  }
  if (!o.data_file) return absl::OkStatus();
  if (o.data_file->find('\0') != std::string::npos) {
    return Refuse("A data file name may not hold a NUL byte");
  }
  p->new_data_file = o.data_file->empty()
                         ? std::nullopt
                         : std::optional<std::string>(*o.data_file);
  Header next = h;
  next.data_file = p->new_data_file;
  if (!EncodeHeader(next).ok()) {
    return Refuse(absl::StrFormat(
        "%s: data file name '%s' (%u bytes) does not fit in the first "
        "cluster (%u bytes) after the header and its extensions",
        t->file->name(), *o.data_file, o.data_file->size(), h.cluster_size()));
  }
  return absl::OkStatus();
}

// Every check, in qemu-img's order; nothing is written. `luks` is the
// unlocked area of an encrypted image, else null.
absl::StatusOr<AmendPlan> Check(AmendTarget* t, const AmendOptions& o,
                                const AmendLuks* luks) {
  const Header& h = t->h;
  AmendPlan p;
  if (o.encrypt && luks == nullptr) {
    return Refuse("Can't amend encryption options - encryption not present");
  }
  p.old_version = p.new_version = h.version;
  p.old_order = p.new_order = h.refcount_order;
  p.old_lazy = p.new_lazy = (h.compatible_features & kCompatLazyRefcounts) != 0;
  if (o.compat) {
    ASSIGN_OR_RETURN(p.new_version, ParseCompat(*o.compat));
  }
  RETURN_IF_ERROR(CheckDataFile(t, o, &p));
  if (o.lazy_refcounts) p.new_lazy = *o.lazy_refcounts;
  p.old_size = p.new_size = h.size;
  if (o.size && *o.size != 0) p.new_size = *o.size;
  if (o.refcount_bits) {
    const uint64_t bits = *o.refcount_bits;
    if (bits == 0 || bits > 64 || (bits & (bits - 1)) != 0) {
      return Refuse(
          "Refcount width must be a power of two and may not exceed 64 bits");
    }
    p.new_order = static_cast<uint32_t>(__builtin_ctzll(bits));
  }
  if (h.incompatible_features & kIncompatCorrupt) {
    return absl::FailedPreconditionError(absl::StrCat(
        t->file->name(),
        ": image is marked corrupt; repair it first with 'qcowtool check -r "
        "all'"));
  }
  RETURN_IF_ERROR(CheckRefcountWidth(t, p));
  if (o.backing_file || o.backing_format) {
    // QEMU compares both with the image's (an option not given is NULL).
    const bool same_file =
        o.backing_file ? (!h.backing_file.empty() &&
                          *o.backing_file == h.backing_file)
                       : h.backing_file.empty();
    const bool same_format = o.backing_format
                                 ? h.backing_format == *o.backing_format
                                 : !h.backing_format.has_value();
    if (!same_file || !same_format) {
      return Refuse(
          "Cannot amend the backing file\n"
          "You can use 'qcowtool rebase' instead.");
    }
  }
  if (p.new_lazy && !p.old_lazy && p.new_version < 3) {
    return Refuse(
        "Lazy refcounts only supported with compatibility level 1.1 and "
        "above (use compat=1.1 or greater)");
  }
  if (p.new_size != p.old_size) RETURN_IF_ERROR(CheckSize(t, p));
  if (p.new_version < p.old_version) RETURN_IF_ERROR(CheckDowngrade(t, p));
  if (o.encrypt) {
    ASSIGN_OR_RETURN(p.keyslots, CheckKeySlots(*luks, *o.encrypt, o.force));
  }
  return p;
}

// Recomputes the refcounts of a dirty image (lazy refcounts), as QEMU's
// read-write open does, and reads the header again.
absl::Status CleanIfDirty(AmendTarget* t) {
  if ((t->h.incompatible_features & kIncompatDirty) == 0) {
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(CheckResult r, CheckImage(t->file, RepairMode::kAll));
  if (!r.failure.empty() || r.corruptions > r.corruptions_fixed) {
    return absl::DataLossError(absl::StrCat(
        t->file->name(), ": rebuilding the refcounts of a dirty image failed",
        r.failure.empty() ? "" : ": ", r.failure));
  }
  return t->Load();
}

// Rewrites the in-memory header as version `version` writes it: feature
// bits cleared (the steps before made them unneeded), refcounts 16 bits
// wide, no compression type, QEMU's header length and feature-name table.
void SetVersion(Header* h, uint32_t version) {
  h->version = version;
  h->header_length = version >= 3 ? kV3HeaderLength : kV2HeaderLength;
  h->incompatible_features = 0;
  h->compatible_features = 0;
  h->autoclear_features = 0;
  h->refcount_order = 4;
  h->compression_type = 0;
  h->tail.clear();
  h->feature_names =
      version >= 3 ? QemuFeatureNames(h->cluster_size())
                   : std::vector<FeatureName>{};
}

// Version 3 needs every snapshot entry to hold the 64-bit VM state size
// and the disk size (extra data of at least 16 bytes). When one lacks
// them the table is written anew (with QEMU's 24 bytes in every entry) to
// new clusters, made durable with their refcounts, and the header that
// names it is the version 3 one; the old table is freed after.
absl::Status Upgrade(AmendTarget* t) {
  Header& h = t->h;
  DecodedSnapshotTable table;
  if (h.nb_snapshots > 0) {
    ASSIGN_OR_RETURN(table, ReadSnapshotTable(t->file, h, t->file_size));
  }
  bool rewrite = false;
  for (const SnapshotEntry& e : table.entries) {
    rewrite |= e.extra_data_size < 16;
  }
  if (!rewrite) {
    SetVersion(&h, 3);
    return t->WriteCluster0();
  }
  ASSIGN_OR_RETURN(std::vector<uint8_t> enc,
                   EncodeSnapshotTable(table.entries));
  ASSIGN_OR_RETURN(std::unique_ptr<Refcounts> refs, OpenRefcounts(t));
  const uint64_t clusters = DivRoundUp(enc.size(), h.cluster_size());
  ASSIGN_OR_RETURN(const uint64_t offset, refs->Allocate(clusters));
  enc.resize(clusters * h.cluster_size(), 0);
  EmitEvent("snapshot-table-write");
  RETURN_IF_ERROR(t->file->WriteAt(offset, enc));
  RETURN_IF_ERROR(refs->Flush());
  RETURN_IF_ERROR(t->file->Flush());
  const uint64_t old_offset = h.snapshots_offset;
  h.snapshots_offset = offset;
  SetVersion(&h, 3);
  RETURN_IF_ERROR(t->WriteCluster0());
  RETURN_IF_ERROR(refs->Update(old_offset, table.size, -1));
  RETURN_IF_ERROR(refs->Flush());
  RETURN_IF_ERROR(t->file->Flush());
  ASSIGN_OR_RETURN(t->file_size, t->file->Size());
  return absl::OkStatus();
}

absl::Status SetLazyRefcounts(AmendTarget* t, bool on) {
  Header& h = t->h;
  if (on) {
    h.compatible_features |= kCompatLazyRefcounts;
  } else {
    h.compatible_features &= ~kCompatLazyRefcounts;
  }
  return t->WriteHeaderFields();
}

// The new data file name and raw flag in one header write: cluster 0
// whole when the name changes (the extensions and the backing name after
// them move), else the header fields.
absl::Status SetDataFile(AmendTarget* t, const AmendPlan& p) {
  Header& h = t->h;
  h.data_file = p.new_data_file;
  if (p.new_raw) {
    h.autoclear_features |= kAutoclearDataFileRaw;
  } else {
    h.autoclear_features &= ~kAutoclearDataFileRaw;
  }
  if (p.new_data_file == p.old_data_file) return t->WriteHeaderFields();
  return t->WriteCluster0();
}

absl::Status Downgrade(AmendTarget* t) {
  RETURN_IF_ERROR(ExpandZeroClusters(t));
  SetVersion(&t->h, 2);
  return t->WriteCluster0();
}

}  // namespace

absl::Status AmendQcow2(File* file, const AmendOptions& opts,
                        const AmendResizer& resize,
                        const AmendDataFileCheck& check_data_file) {
  AmendTarget t;
  t.file = file;
  t.progress = opts.progress;
  RETURN_IF_ERROR(t.Load());
  if ((t.h.incompatible_features & kIncompatDataFile) && check_data_file) {
    RETURN_IF_ERROR(check_data_file(*t.h.data_file));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<AmendLuks> luks,
                   UnlockForAmend(&t, opts.key_secret));
  if (luks != nullptr) t.cipher = luks->volume.get();
  ASSIGN_OR_RETURN(const AmendPlan p, Check(&t, opts, luks.get()));
  const uint64_t total = std::max(p.steps(), 1);
  uint64_t done = 0;
  auto step_done = [&] {
    ++done;
    if (t.progress) t.progress(done, total);
  };
  if (t.progress) t.progress(0, total);
  if (p.steps() == 0) {
    if (t.progress) t.progress(total, total);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CleanIfDirty(&t));
  if (p.new_version > p.old_version) {
    RETURN_IF_ERROR(Upgrade(&t));
    step_done();
  }
  if (p.keyslots) {
    RETURN_IF_ERROR(ApplyKeySlots(&t, luks.get(), *p.keyslots, *opts.encrypt));
    step_done();
  }
  if (p.new_order != t.h.refcount_order) {
    RETURN_IF_ERROR(ChangeRefcountOrder(&t, p.new_order));
    step_done();
  }
  if (p.new_lazy != p.old_lazy) {
    RETURN_IF_ERROR(SetLazyRefcounts(&t, p.new_lazy));
    step_done();
  }
  if (p.new_size != p.old_size) {
    if (!resize) {
      return absl::UnimplementedError("amend: no way to resize this file");
    }
    RETURN_IF_ERROR(resize(p.new_size));
    RETURN_IF_ERROR(t.Load());
    step_done();
  }
  if (p.data_file_changes()) {
    // After the resize: an image whose name was removed opens no more.
    RETURN_IF_ERROR(SetDataFile(&t, p));
    step_done();
  }
  if (p.new_version < p.old_version) {
    RETURN_IF_ERROR(Downgrade(&t));
    step_done();
  }
  return absl::OkStatus();
}

}  // namespace qcow2::internal
