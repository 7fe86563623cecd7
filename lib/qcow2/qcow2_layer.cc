#include "lib/qcow2/qcow2_layer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/format/compress.h"
#include "lib/qcow2/check.h"
#include "lib/format/entries.h"
#include "lib/base/endian.h"
#include "lib/base/events.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"

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

}  // namespace

Qcow2Layer::Qcow2Layer(std::unique_ptr<File> file, Header header,
                       uint64_t file_size)
    : file_(std::move(file)),
      meta_(std::make_unique<WriteBackFile>(file_.get())),
      header_(std::move(header)),
      file_size_(file_size) {}

Qcow2Layer::~Qcow2Layer() = default;

absl::StatusOr<std::unique_ptr<Qcow2Layer>> Qcow2Layer::Open(
    std::unique_ptr<File> file, const OpenOptions& opts) {
  const std::string name = file->name();
  ASSIGN_OR_RETURN(uint64_t file_size, file->Size());
  ASSIGN_OR_RETURN(std::vector<uint8_t> c0, ReadCluster0(file.get()));
  ASSIGN_OR_RETURN(Header h, DecodeHeader(c0, name));
  RETURN_IF_ERROR(CheckFeatures(h, name));
  RETURN_IF_ERROR(ValidateHeaderTables(h, file_size, name));
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
        name, ": image is marked corrupt; it can be opened read-only, or "
              "repaired with 'qcowtool check -r all'"));
  }

  // L1 table.
  std::vector<uint64_t> l1(h.l1_size);
  if (h.l1_size > 0) {
    std::vector<uint8_t> raw(uint64_t{h.l1_size} * 8);
    absl::Status s = file->ReadAt(h.l1_table_offset, absl::MakeSpan(raw));
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat(name, ": reading the L1 table: ",
                                       s.message()));
    }
    for (uint32_t i = 0; i < h.l1_size; ++i) l1[i] = LoadBE64(&raw[i * 8]);
  }

  auto layer = std::unique_ptr<Qcow2Layer>(
      new Qcow2Layer(std::move(file), std::move(h), file_size));
  const Header& hh = layer->header_;
  Geometry g = Geometry::From(hh, opts.l2_slice_bytes);
  layer->map_ = std::make_unique<ClusterMap>(
      layer->meta_.get(), name, g, std::move(l1), hh.l1_table_offset,
      opts.l2_cache_bytes);
  layer->map_->l2_cache().set_counters(&IoStats::l2_read_bytes,
                                       &IoStats::l2_write_bytes);
  // L2 tables must start inside the file.
  layer->map_->set_file_limit(std::max<uint64_t>(
      AlignUp(file_size, g.cluster_size), g.cluster_size));
  if (opts.read_write) RETURN_IF_ERROR(layer->OpenForWriting(opts));
  return layer;
}

absl::Status Qcow2Layer::OpenForWriting(const OpenOptions& opts) {
  const Header& h = header_;
  ASSIGN_OR_RETURN(std::vector<uint64_t> table,
                   Refcounts::LoadTable(file_.get(), h.refcount_table_offset,
                                        h.refcount_table_clusters,
                                        h.cluster_bits, file_->name()));
  Refcounts::Params p;
  p.file = meta_.get();
  p.filename = file_->name();
  p.cluster_bits = h.cluster_bits;
  p.refcount_order = h.refcount_order;
  p.table_offset = h.refcount_table_offset;
  p.table_clusters = h.refcount_table_clusters;
  p.table = std::move(table);
  p.cache_bytes = opts.refcount_cache_bytes;
  refcounts_ = std::make_unique<Refcounts>(std::move(p));
  refcounts_->NoteEnd(DivRoundUp(file_size_, h.cluster_size()));
  refcounts_->set_header_writer([this](uint64_t offset, uint32_t clusters) {
    header_.refcount_table_offset = offset;
    header_.refcount_table_clusters = clusters;
    return WriteHeaderFields();
  });
  refcounts_->set_free_hook([this](uint64_t offset) {
    const uint64_t cs = header_.cluster_size();
    map_->l2_cache().Invalidate(offset, cs);
    refcounts_->cache().Invalidate(offset, cs);
  });
  refcounts_->cache().set_counters(&IoStats::refcount_read_bytes,
                                   &IoStats::refcount_write_bytes);
  map_->l2_cache().set_write_hook(
      [](uint64_t, uint32_t) { EmitEvent("l2-update"); });
  refcounts_->cache().set_write_hook(
      [](uint64_t, uint32_t) { EmitEvent("refblock-update"); });
  metadata_ = std::make_unique<MetadataSet>(h.cluster_bits);
  metadata_->Add(MetadataSet::kHeader, 0, h.cluster_size());
  map_->TrackMetadata(metadata_.get());
  refcounts_->TrackMetadata(metadata_.get());
  lazy_refcounts_ = (h.compatible_features & kCompatLazyRefcounts) != 0;
  writable_ = true;
  return absl::OkStatus();
}

absl::Status Qcow2Layer::RebuildRefcounts(File* file) {
  ASSIGN_OR_RETURN(CheckResult r, CheckImage(file, RepairMode::kAll));
  if (!r.failure.empty()) {
    return absl::DataLossError(absl::StrCat(
        file->name(), ": rebuilding refcounts of a dirty image failed: ",
        r.failure));
  }
  if (r.corruptions > r.corruptions_fixed) {
    return absl::DataLossError(absl::StrCat(
        file->name(), ": dirty image has ", r.corruptions - r.corruptions_fixed,
        " corruptions that a refcount rebuild cannot fix"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Extent> Qcow2Layer::Map(uint64_t offset, uint64_t max_len) {
  const Geometry& g = map_->geometry();
  max_len = std::min(max_len, header_.size - offset);
  uint64_t cluster = offset >> g.cluster_bits;
  if (!pending_.empty()) {
    // Clusters waiting for their L2 entry (deferred copy-on-write).
    if (auto it = pending_.find(cluster); it != pending_.end()) {
      return MapPending(it->second, offset, max_len);
    }
    max_len = ClipAtPending(offset, max_len);
  }
  ASSIGN_OR_RETURN(L2Ref ref, map_->Lookup(cluster));
  if (ref.slice == nullptr) {
    // No L2 table: unallocated up to the end of the table's coverage.
    uint64_t table_span = g.l2_entries << g.cluster_bits;
    uint64_t end = AlignDown(offset, table_span) + table_span;
    Extent e;
    e.kind = Extent::kUnallocated;
    e.length = std::min(max_len, end - offset);
    return e;
  }
  ASSIGN_OR_RETURN(Extent first, MapInCluster(ref, offset, max_len));
  // Extend across following clusters of the same slice while the run
  // continues with the same kind (and contiguous host offsets for data).
  uint64_t left = g.slice_entries - ref.index;
  uint64_t pos = offset + first.length;
  const bool plain_unallocated =
      first.kind == Extent::kUnallocated && !first.has_host_cluster;
  while (first.kind != Extent::kCompressed && first.length < max_len &&
         --left > 0 && IsAligned(pos, g.cluster_size)) {
    ref.index++;
    if (plain_unallocated && ref.entry() == 0 && ref.bitmap() == 0) {
      // An all-zero entry (and bitmap) is valid and unallocated: the
      // common case in a sparse overlay, taken without the full check.
      const uint64_t n = std::min(g.cluster_size, max_len - first.length);
      first.length += n;
      pos += n;
      continue;
    }
    ASSIGN_OR_RETURN(Extent next, MapInCluster(ref, pos, max_len - first.length));
    if (next.kind != first.kind) break;
    if (first.kind == Extent::kData &&
        next.host_offset != first.host_offset + first.length) {
      break;
    }
    if ((first.kind == Extent::kZero || first.kind == Extent::kUnallocated) &&
        (next.has_host_cluster != first.has_host_cluster ||
         (first.has_host_cluster &&
          next.host_offset != first.host_offset + first.length))) {
      break;
    }
    first.length += next.length;
    pos += next.length;
  }
  return first;
}

uint64_t Qcow2Layer::HostLimit() const {
  uint64_t limit = map_->file_limit();
  if (refcounts_ != nullptr) {
    // Clusters allocated since the open lie past the file size seen then.
    limit = std::max(limit, refcounts_->end_cluster() << header_.cluster_bits);
  }
  return limit;
}

absl::Status Qcow2Layer::ValidateEntry(uint64_t entry, uint64_t bitmap,
                                       uint64_t guest_offset) const {
  const Geometry& g = map_->geometry();
  const uint64_t host = entry & kEntryOffsetMask;
  auto corrupt = [&](const std::string& why) {
    return map_->Corrupt(absl::StrFormat(
        "L2 entry 0x%016x%s for guest offset 0x%x %s", entry,
        g.extended_l2 ? absl::StrFormat(" (bitmap 0x%016x)", bitmap) : "",
        guest_offset, why));
  };
  if (entry & kOflagCompressed) {
    CompressedExtent c = DecodeCompressed(entry, g.cluster_bits);
    uint64_t end;
    if (AddOverflows(c.host_offset, c.length, &end) || end > kMaxHostOffset ||
        c.host_offset < g.cluster_size) {
      return corrupt("points outside the image");
    }
    if (g.extended_l2 && bitmap != 0) {
      // The bitmap of a compressed cluster is reserved (all zero).
      return corrupt("is compressed but has a non-zero subcluster bitmap");
    }
    return absl::OkStatus();
  }
  if (!g.extended_l2 && (entry & kL2StandardReservedMask)) {
    return corrupt("has reserved bits set");
  }
  if (g.extended_l2 && (entry & (kL2StandardReservedMask | kOflagZero))) {
    return corrupt("has reserved bits set");
  }
  if (host != 0 && (host & (g.cluster_size - 1)) != 0) {
    return corrupt("points at an unaligned host offset");
  }
  if (host == 0 && (entry & kOflagCopied)) {
    return corrupt("has the COPIED flag but no host offset");
  }
  if (host != 0 && host < g.cluster_size) {
    return corrupt("points into the header cluster");
  }
  if (host != 0 && host >= HostLimit()) {
    return corrupt("points past the end of the file");
  }
  if (g.extended_l2) {
    const uint32_t alloc = static_cast<uint32_t>(bitmap);
    const uint32_t zero = static_cast<uint32_t>(bitmap >> 32);
    if ((alloc & zero) != 0) {
      return corrupt(
          "has an invalid subcluster bitmap (subclusters both allocated and "
          "zero)");
    }
    if (host == 0 && alloc != 0) {
      return corrupt(
          "has an invalid subcluster bitmap (allocated subclusters but no "
          "host cluster)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Extent> Qcow2Layer::MapInCluster(const L2Ref& ref,
                                                uint64_t offset,
                                                uint64_t max_len) {
  const Geometry& g = map_->geometry();
  const uint64_t entry = ref.entry();
  const uint64_t bitmap = ref.bitmap();
  const uint64_t in_cluster = offset & (g.cluster_size - 1);
  const uint64_t host = entry & kEntryOffsetMask;
  RETURN_IF_ERROR(ValidateEntry(entry, bitmap, offset));
  auto corrupt = [&](const std::string& why) {
    return map_->Corrupt(absl::StrFormat(
        "L2 entry 0x%016x%s for guest offset 0x%x %s", entry,
        g.extended_l2 ? absl::StrFormat(" (bitmap 0x%016x)", bitmap) : "",
        offset, why));
  };

  Extent e;
  if (entry & kOflagCompressed) {
    e.kind = Extent::kCompressed;
    e.entry = entry;
    e.length = std::min(max_len, g.cluster_size - in_cluster);
    return e;
  }

  int sc = static_cast<int>(in_cluster / g.subcluster_size);
  SubclusterType type = ClassifySubcluster(entry, bitmap, g.extended_l2, sc);
  if (type == SubclusterType::kInvalid) {
    return corrupt("has an invalid subcluster bitmap");
  }
  // Extend over following subclusters of the same type.
  const uint64_t run_end =
      static_cast<uint64_t>(SubclusterRunEnd(bitmap, sc, g.subclusters)) *
      g.subcluster_size;
  e.length = std::min(max_len, run_end - in_cluster);
  switch (type) {
    case SubclusterType::kNormal:
      e.kind = Extent::kData;
      e.host_offset = host + in_cluster;
      break;
    case SubclusterType::kZeroAlloc:
      e.kind = Extent::kZero;
      e.has_host_cluster = true;
      e.host_offset = host + in_cluster;
      break;
    case SubclusterType::kZeroPlain:
      e.kind = Extent::kZero;
      break;
    case SubclusterType::kUnallocated:
      e.kind = Extent::kUnallocated;
      break;
    case SubclusterType::kUnallocatedAlloc:
      e.kind = Extent::kUnallocated;
      e.has_host_cluster = true;
      e.host_offset = host + in_cluster;
      break;
    default:
      return corrupt("is inconsistent");
  }
  return e;
}

absl::Status Qcow2Layer::ReadCompressed(uint64_t entry, uint8_t* out) {
  const Geometry& g = map_->geometry();
  CompressedExtent c = DecodeCompressed(entry, g.cluster_bits);
  std::vector<uint8_t> in(c.length);
  RETURN_IF_ERROR(file_->ReadAt(c.host_offset, absl::MakeSpan(in)));
  absl::Status s = DecompressCluster(
      static_cast<CompressionType>(header_.compression_type), in,
      absl::MakeSpan(out, g.cluster_size));
  if (!s.ok()) {
    return absl::DataLossError(absl::StrFormat(
        "%s: compressed cluster at host offset 0x%x: %s", file_->name(),
        c.host_offset, s.message()));
  }
  return absl::OkStatus();
}

absl::Status Qcow2Layer::ReadExtent(const Extent& e, uint64_t extent_start,
                                    uint64_t offset, absl::Span<uint8_t> buf) {
  if (e.kind != Extent::kCompressed) {
    return Layer::ReadExtent(e, extent_start, offset, buf);
  }
  return ReadFromCompressed(e.entry, offset, buf);
}

absl::Status Qcow2Layer::ReadFromCompressed(uint64_t entry, uint64_t offset,
                                            absl::Span<uint8_t> buf) {
  const Geometry& g = map_->geometry();
  if (decompressed_.size() != g.cluster_size || decompressed_entry_ != entry) {
    decompressed_.resize(g.cluster_size);
    decompressed_entry_ = 0;
    RETURN_IF_ERROR(ReadCompressed(entry, decompressed_.data()));
    decompressed_entry_ = entry;
  }
  std::memcpy(buf.data(),
              decompressed_.data() + (offset & (g.cluster_size - 1)),
              buf.size());
  return absl::OkStatus();
}

LayerInfo Qcow2Layer::Info() const {
  LayerInfo info;
  info.filename = file_->name();
  info.format = ImageFormat::kQcow2;
  info.virtual_size = header_.size;
  info.file_size = file_size_;
  info.version = header_.version;
  info.cluster_size = static_cast<uint32_t>(header_.cluster_size());
  info.refcount_bits = header_.refcount_bits();
  info.extended_l2 = header_.extended_l2();
  info.compression_type =
      static_cast<CompressionType>(header_.compression_type);
  info.lazy_refcounts =
      (header_.compatible_features & kCompatLazyRefcounts) != 0;
  info.dirty = (header_.incompatible_features & kIncompatDirty) != 0;
  info.corrupt = (header_.incompatible_features & kIncompatCorrupt) != 0;
  info.incompatible_features = header_.incompatible_features;
  info.compatible_features = header_.compatible_features;
  info.autoclear_features = header_.autoclear_features;
  info.snapshot_count = header_.nb_snapshots;
  info.backing_file = header_.backing_file;
  info.backing_format = header_.backing_format.value_or("");
  info.data_file = header_.data_file.value_or("");
  return info;
}

}  // namespace qcow2::internal
