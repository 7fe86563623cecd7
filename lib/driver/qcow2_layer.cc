// SPDX-License-Identifier: Apache-2.0
#include "lib/driver/qcow2_layer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/endian.h"
#include "lib/base/events.h"
#include "lib/base/io_context.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/check/check.h"
#include "lib/format/entries.h"
#include "lib/io/accounted_file.h"
#include "lib/format/snapshot_table.h"

namespace qcow2::internal {

namespace {

// The first read: enough for any header field; the rest of cluster 0 is
// read once cluster_bits is known.
constexpr size_t kProbeBytes = 4096;

absl::StatusOr<std::vector<uint8_t>> ReadCluster0(File* file) {
  std::vector<uint8_t> buf(kProbeBytes);
  RETURN_IF_ERROR(file->ReadAt(0, absl::MakeSpan(buf)));
  uint32_t cluster_bits = LoadBE32(&buf[20]);
  if (cluster_bits >= kMinClusterBits && cluster_bits <= kMaxClusterBits &&
      (1u << cluster_bits) > kProbeBytes) {
    buf.resize(1u << cluster_bits);
    RETURN_IF_ERROR(file->ReadAt(0, absl::MakeSpan(buf)));
  } else if (cluster_bits >= kMinClusterBits &&
             cluster_bits <= kMaxClusterBits) {
    buf.resize(1u << cluster_bits);
  }
  return buf;
}

// The data file of an image opened for its metadata only (QEMU's
// BDRV_O_NO_IO: `qemu-img info` opens no data file, so it works while the
// data file is missing): every I/O fails, naming why.
class UnopenedDataFile final : public File {
 public:
  explicit UnopenedDataFile(std::string name) : name_(std::move(name)) {}
  absl::Status ReadAt(uint64_t, absl::Span<uint8_t>) override {
    return Refused();
  }
  absl::Status WriteAt(uint64_t, absl::Span<const uint8_t>) override {
    return Refused();
  }
  absl::Status Flush() override { return absl::OkStatus(); }
  absl::StatusOr<uint64_t> Size() override { return Refused(); }
  absl::Status Truncate(uint64_t) override { return Refused(); }
  const std::string& name() const override { return name_; }

 private:
  absl::Status Refused() const {
    return absl::FailedPreconditionError(absl::StrCat(
        name_, ": the external data file is not open (the image was opened "
        "for its metadata only)"));
  }
  const std::string name_;
};

// What QEMU 7.2 refuses beside an external data file: internal
// snapshots (which would share data clusters that have no refcounts).
// LUKS is allowed: the data clusters in the data file are encrypted with
// the data file's offset as the IV's sector number (QEMU's host offset).
absl::Status CheckDataFileFeatures(const Header& h, const std::string& name) {
  if (h.nb_snapshots != 0) {
    return absl::UnimplementedError(absl::StrCat(
        name, ": internal snapshots in an image with an external data file "
        "are not supported"));
  }
  return absl::OkStatus();
}

// Recomputes every refcount from the metadata (dirty images).
absl::Status RebuildRefcounts(File* file) {
  ASSIGN_OR_RETURN(CheckResult r, CheckImage(file, RepairMode::kAll));
  if (!r.failure.empty()) {
    return absl::DataLossError(absl::StrCat(
        file->name(),
        ": rebuilding refcounts of a dirty image failed: ", r.failure));
  }
  if (r.corruptions > r.corruptions_fixed) {
    return absl::DataLossError(absl::StrCat(
        file->name(), ": dirty image has ", r.corruptions - r.corruptions_fixed,
        " corruptions that a refcount rebuild cannot fix"));
  }
  return absl::OkStatus();
}

// The write side of Open: loads the refcount table, and sets up the
// refcounts, the metadata set and the caches' hooks. The hooks keep `s` and
// `header`, which the layer owns.
absl::Status OpenForWriting(Qcow2State* s, HeaderWriter* header,
                            const OpenOptions& opts) {
  const Header& h = s->header;
  ASSIGN_OR_RETURN(std::vector<uint64_t> table,
                   Refcounts::LoadTable(s->file.get(), h.refcount_table_offset,
                                        h.refcount_table_clusters,
                                        h.cluster_bits, s->file->name()));
  Refcounts::Params p;
  p.file = s->meta.get();
  p.filename = s->file->name();
  p.cluster_bits = h.cluster_bits;
  p.refcount_order = h.refcount_order;
  p.table_offset = h.refcount_table_offset;
  p.table_clusters = h.refcount_table_clusters;
  p.table = std::move(table);
  p.cache_bytes = opts.refcount_cache_bytes;
  s->refcounts = std::make_unique<Refcounts>(std::move(p));
  s->refcounts->NoteEnd(DivRoundUp(s->file_size, h.cluster_size()));
  s->refcounts->set_header_writer(
      [s, header](uint64_t offset, uint32_t clusters) {
        s->header.refcount_table_offset = offset;
        s->header.refcount_table_clusters = clusters;
        return header->WriteHeaderFields();
      });
  s->refcounts->set_free_hook([s](uint64_t offset) {
    const uint64_t cs = s->header.cluster_size();
    s->map->l2_cache().Invalidate(offset, cs);
    s->refcounts->cache().Invalidate(offset, cs);
    if (s->compressed_next / cs == offset / cs) s->compressed_next = 0;
  });
  s->refcounts->cache().set_counters(&IoStats::refcount_read_bytes,
                                     &IoStats::refcount_write_bytes);
  s->map->l2_cache().set_write_hook(
      [](uint64_t, uint32_t) { EmitEvent("l2-update"); });
  s->refcounts->cache().set_write_hook(
      [](uint64_t, uint32_t) { EmitEvent("refblock-update"); });
  s->metadata = std::make_unique<MetadataSet>(h.cluster_bits);
  s->metadata->Add(MetadataSet::kHeader, 0, h.cluster_size());
  s->map->TrackMetadata(s->metadata.get());
  s->refcounts->TrackMetadata(s->metadata.get());
  s->lazy_refcounts = (h.compatible_features & kCompatLazyRefcounts) != 0;
  s->writable = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Qcow2Layer>> Qcow2Layer::Open(
    std::unique_ptr<File> file, const OpenOptions& opts,
    const DataFileOpener& open_data) {
  const std::string name = file->name();
  ASSIGN_OR_RETURN(uint64_t file_size, file->Size());
  ASSIGN_OR_RETURN(std::vector<uint8_t> c0, ReadCluster0(file.get()));
  ASSIGN_OR_RETURN(Header h, DecodeHeader(c0, name));
  RETURN_IF_ERROR(CheckFeatures(h, name, /*luks_ok=*/true,
                                /*data_file_ok=*/open_data != nullptr));
  RETURN_IF_ERROR(ValidateHeaderTables(h, file_size, name));
  // The data file is opened before anything is written: a missing one
  // leaves the image untouched.
  std::unique_ptr<File> data_file;
  if (h.incompatible_features & kIncompatDataFile) {
    RETURN_IF_ERROR(CheckDataFileFeatures(h, name));
    if (opts.metadata_only && !opts.read_write) {
      data_file = std::make_unique<UnopenedDataFile>(*h.data_file);
    } else {
      ASSIGN_OR_RETURN(data_file, open_data(*h.data_file));
    }
    data_file = AccountedFile::Wrap(std::move(data_file));
  }
  // Unlocked before anything is written (a dirty image's rebuild below):
  // a missing or wrong secret leaves the file untouched.
  OpenedLuks luks;
  if (h.crypt_method == kCryptLuks) {
    ASSIGN_OR_RETURN(luks, OpenLuks(file.get(), h, file_size, opts.key_secret,
                                    opts.metadata_only, name));
    // The LUKS header stays in the image file; the cipher goes with the
    // file that holds the data clusters.
    if (data_file == nullptr) file = AccountedFile::Wrap(std::move(file));
    auto* accounted = dynamic_cast<AccountedFile*>(
        data_file != nullptr ? data_file.get() : file.get());
    if (accounted == nullptr) return absl::InternalError("no AccountedFile");
    accounted->set_cipher(luks.cipher());
  }
  if (opts.read_write && (h.incompatible_features & kIncompatDirty) &&
      !(h.incompatible_features & kIncompatCorrupt)) {
    // Lazy refcounts and no clean close: refcounts may be stale. Rebuild
    // them before anything is allocated, then read the header again (the
    // rebuild may move the refcount table and clears the dirty bit).
    RETURN_IF_ERROR(RebuildRefcounts(file.get()));
    ASSIGN_OR_RETURN(file_size, file->Size());
    ASSIGN_OR_RETURN(c0, ReadCluster0(file.get()));
    ASSIGN_OR_RETURN(h, DecodeHeader(c0, name));
    RETURN_IF_ERROR(ValidateHeaderTables(h, file_size, name));
  }

  if (opts.read_write && (h.incompatible_features & kIncompatCorrupt)) {
    return absl::FailedPreconditionError(absl::StrCat(
        name,
        ": image is marked corrupt; it can be opened read-only, or "
        "repaired with 'qcowtool check -r all'"));
  }

  // L1 table.
  std::vector<uint64_t> l1(h.l1_size);
  if (h.l1_size > 0) {
    std::vector<uint8_t> raw(uint64_t{h.l1_size} * 8);
    absl::Status s = file->ReadAt(h.l1_table_offset, absl::MakeSpan(raw));
    if (!s.ok()) {
      return absl::Status(
          s.code(),
          absl::StrCat(name, ": reading the L1 table: ", s.message()));
    }
    for (uint32_t i = 0; i < h.l1_size; ++i) l1[i] = LoadBE64(&raw[i * 8]);
  }

  const bool hh_crypt_luks = h.crypt_method == kCryptLuks;
  auto layer = std::unique_ptr<Qcow2Layer>(
      new Qcow2Layer(std::move(file), std::move(h), file_size));
  layer->luks_ = std::move(luks);
  Qcow2State& s = layer->state_;
  s.data_file = std::move(data_file);
  if (s.data_file) s.meta->set_flush_first(s.data_file.get());
  s.encrypted = hh_crypt_luks;
  s.locked = s.encrypted && layer->luks_.volume == nullptr;
  const Header& hh = s.header;
  Geometry g = Geometry::From(hh, opts.l2_slice_bytes);
  s.map = std::make_unique<ClusterMap>(s.meta.get(), name, g, std::move(l1),
                                       hh.l1_table_offset, opts.l2_cache_bytes);
  s.map->l2_cache().set_counters(&IoStats::l2_read_bytes,
                                 &IoStats::l2_write_bytes);
  // L2 tables must start inside the file.
  s.map->set_file_limit(
      std::max<uint64_t>(AlignUp(file_size, g.cluster_size), g.cluster_size));
  if (opts.read_write) {
    RETURN_IF_ERROR(OpenForWriting(&s, &layer->header_writer_, opts));
    if (layer->luks()) {
      // The LUKS area: never allocated, never written with guest data.
      const CryptoExtension& ext = layer->luks_.ext;
      s.metadata->Add(MetadataSet::kHeader, ext.offset,
                      ext.clusters(hh.cluster_size()) * hh.cluster_size());
    }
    // Bitmaps are marked in use before any guest write can reach the file.
    RETURN_IF_ERROR(layer->bitmaps_.OpenForWriting());
  }
  return layer;
}

absl::Status Qcow2Layer::ReadExtent(const Extent& e, uint64_t extent_start,
                                    uint64_t offset, absl::Span<uint8_t> buf) {
  if (e.kind != Extent::kCompressed) {
    return Layer::ReadExtent(e, extent_start, offset, buf);
  }
  return reader_.ReadFromCompressed(e.entry, offset, buf);
}

absl::Status Qcow2Layer::Close() {
  if (state_.closed) return absl::OkStatus();
  RETURN_IF_ERROR(Flush());
  if (state_.writable && bitmaps_.maintained()) {
    // Stored after the data they describe is durable; what the store
    // freed is written by the second flush.
    RETURN_IF_ERROR(bitmaps_.Store());
    RETURN_IF_ERROR(Flush());
  }
  RETURN_IF_ERROR(host_space_.GiveBackUnused());
  RETURN_IF_ERROR(header_writer_.MarkClean());
  state_.closed = true;
  return absl::OkStatus();
}

LayerInfo Qcow2Layer::Info() const {
  const Header& h = state_.header;
  LayerInfo info;
  info.filename = state_.file->name();
  info.format = ImageFormat::kQcow2;
  info.virtual_size = h.size;
  info.file_size = state_.file_size;
  info.version = h.version;
  info.cluster_size = static_cast<uint32_t>(h.cluster_size());
  info.refcount_bits = h.refcount_bits();
  info.extended_l2 = h.extended_l2();
  info.compression_type = static_cast<CompressionType>(h.compression_type);
  info.lazy_refcounts = (h.compatible_features & kCompatLazyRefcounts) != 0;
  info.dirty = (h.incompatible_features & kIncompatDirty) != 0;
  info.corrupt = (h.incompatible_features & kIncompatCorrupt) != 0;
  info.incompatible_features = h.incompatible_features;
  info.compatible_features = h.compatible_features;
  info.autoclear_features = h.autoclear_features;
  info.snapshot_count = h.nb_snapshots;
  absl::StatusOr<uint64_t> size = state_.file->Size();
  if (h.nb_snapshots > 0) {
    absl::StatusOr<DecodedSnapshotTable> table =
        size.ok() ? ReadSnapshotTable(state_.file.get(), h, *size)
                  : absl::StatusOr<DecodedSnapshotTable>(size.status());
    if (table.ok()) {
      for (const SnapshotEntry& e : table->entries) {
        info.snapshots.push_back(ToSnapshotInfo(e));
      }
    }
  }
  absl::StatusOr<std::vector<BitmapInfo>> bitmaps =
      size.ok() ? ListBitmaps(state_.file.get(), h, *size)
                : absl::StatusOr<std::vector<BitmapInfo>>(size.status());
  if (bitmaps.ok()) {
    info.bitmaps = std::move(bitmaps).value();
  } else {
    info.bitmaps_error = std::string(bitmaps.status().message());
  }
  info.backing_file = h.backing_file;
  info.backing_format = h.backing_format.value_or("");
  info.data_file = h.data_file.value_or("");
  info.has_data_file = (h.incompatible_features & kIncompatDataFile) != 0;
  info.data_file_raw = (h.autoclear_features & kAutoclearDataFileRaw) != 0;
  if (state_.data_file) info.data_file_path = state_.data_file->name();
  info.encrypted = h.crypt_method != 0;
  if (luks() != nullptr) info.encryption = LuksInfo(luks_.header);
  return info;
}

}  // namespace qcow2::internal
