// SPDX-License-Identifier: Apache-2.0
#include "lib/format/header.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/endian.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

namespace {

absl::Status Bad(const std::string& filename, const std::string& what) {
  return absl::DataLossError(
      absl::StrCat(filename, ": malformed qcow2 header: ", what));
}

std::string Hex(uint64_t v) { return absl::StrFormat("0x%x", v); }

// Byte offsets of the header fields.
enum : size_t {
  kOffMagic = 0,
  kOffVersion = 4,
  kOffBackingOffset = 8,
  kOffBackingSize = 16,
  kOffClusterBits = 20,
  kOffSize = 24,
  kOffCryptMethod = 32,
  kOffL1Size = 36,
  kOffL1Offset = 40,
  kOffRefcountTableOffset = 48,
  kOffRefcountTableClusters = 56,
  kOffNbSnapshots = 60,
  kOffSnapshotsOffset = 64,
  kOffIncompat = 72,
  kOffCompat = 80,
  kOffAutoclear = 88,
  kOffRefcountOrder = 96,
  kOffHeaderLength = 100,
  kOffCompressionType = 104,
};

constexpr size_t kFeatureNameEntry = 48;

absl::Status DecodeExtensions(absl::Span<const uint8_t> c0, uint64_t start,
                              uint64_t end, const std::string& filename,
                              Header* h) {
  uint64_t pos = start;
  bool seen_backing_format = false, seen_data_file = false;
  while (true) {
    // Like QEMU, the area may end without an end marker.
    if (pos == end) return absl::OkStatus();
    if (pos + 8 > end) {
      return Bad(filename, absl::StrCat("header extension at byte ", pos,
                                        " runs past the extension area (ends "
                                        "at byte ", end, ")"));
    }
    uint32_t magic = LoadBE32(&c0[pos]);
    uint32_t len = LoadBE32(&c0[pos + 4]);
    pos += 8;
    if (magic == kExtEnd) return absl::OkStatus();
    if (len > end - pos) {
      return Bad(filename,
                 absl::StrCat("header extension ", Hex(magic), " length ", len,
                              " at byte ", pos - 8,
                              " overflows the extension area (ends at byte ",
                              end, ")"));
    }
    const uint8_t* data = &c0[pos];
    switch (magic) {
      case kExtBackingFormat:
        if (seen_backing_format) {
          return Bad(filename, "duplicate backing format extension");
        }
        seen_backing_format = true;
        h->backing_format = std::string(reinterpret_cast<const char*>(data),
                                        strnlen(reinterpret_cast<const char*>(
                                                    data), len));
        break;
      case kExtFeatureNames:
        if (len % kFeatureNameEntry != 0) {
          return Bad(filename, absl::StrCat("feature name table length ", len,
                                            " is not a multiple of 48"));
        }
        for (uint32_t i = 0; i < len; i += kFeatureNameEntry) {
          FeatureName f;
          f.type = data[i];
          f.bit = data[i + 1];
          const char* name = reinterpret_cast<const char*>(data + i + 2);
          f.name = std::string(name, strnlen(name, 46));
          h->feature_names.push_back(std::move(f));
        }
        break;
      case kExtDataFile:
        if (seen_data_file) {
          return Bad(filename, "duplicate external data file extension");
        }
        seen_data_file = true;
        h->data_file = std::string(
            reinterpret_cast<const char*>(data),
            strnlen(reinterpret_cast<const char*>(data), len));
        break;
      default:
        h->other_extensions.push_back(
            RawExtension{magic, std::vector<uint8_t>(data, data + len)});
        break;
    }
    uint64_t padded = AlignUp(len, 8);
    if (padded > end - pos) {
      // The last extension may end flush with the area without padding.
      pos = end;
    } else {
      pos += padded;
    }
  }
}

}  // namespace

std::string Header::FeatureNameFor(uint8_t type, uint8_t bit) const {
  for (const FeatureName& f : feature_names) {
    if (f.type == type && f.bit == bit) return f.name;
  }
  return "";
}

std::vector<FeatureName> QemuFeatureNames(uint64_t cluster_size) {
  if (cluster_size <= 4096) return {};
  return {{0, 0, "dirty bit"},          {0, 1, "corrupt bit"},
          {0, 2, "external data file"}, {0, 3, "compression type"},
          {0, 4, "extended L2 entries"}, {1, 0, "lazy refcounts"},
          {2, 0, "bitmaps"},            {2, 1, "raw external data"}};
}

uint64_t RequiredL1Entries(uint64_t virtual_size, uint32_t cluster_bits,
                           uint32_t l2_entry_size) {
  uint64_t cluster_size = 1ull << cluster_bits;
  uint64_t per_l2 = cluster_size / l2_entry_size;
  uint64_t clusters = DivRoundUp(virtual_size, cluster_size);
  return DivRoundUp(clusters, per_l2);
}

absl::StatusOr<Header> DecodeHeader(absl::Span<const uint8_t> c0,
                                    const std::string& filename) {
  if (c0.size() < kV2HeaderLength) {
    return Bad(filename, absl::StrCat("file is ", c0.size(),
                                      " bytes, shorter than a qcow2 header"));
  }
  Header h;
  uint32_t magic = LoadBE32(&c0[kOffMagic]);
  if (magic != kQcowMagic) {
    return Bad(filename, absl::StrCat("bad magic ", Hex(magic),
                                      " (expected 0x514649fb)"));
  }
  h.version = LoadBE32(&c0[kOffVersion]);
  if (h.version != 2 && h.version != 3) {
    return absl::UnimplementedError(absl::StrCat(
        filename, ": qcow2 version ", h.version,
        " is not supported (only 2 and 3)"));
  }
  h.backing_file_offset = LoadBE64(&c0[kOffBackingOffset]);
  h.backing_file_size = LoadBE32(&c0[kOffBackingSize]);
  h.cluster_bits = LoadBE32(&c0[kOffClusterBits]);
  h.size = LoadBE64(&c0[kOffSize]);
  h.crypt_method = LoadBE32(&c0[kOffCryptMethod]);
  h.l1_size = LoadBE32(&c0[kOffL1Size]);
  h.l1_table_offset = LoadBE64(&c0[kOffL1Offset]);
  h.refcount_table_offset = LoadBE64(&c0[kOffRefcountTableOffset]);
  h.refcount_table_clusters = LoadBE32(&c0[kOffRefcountTableClusters]);
  h.nb_snapshots = LoadBE32(&c0[kOffNbSnapshots]);
  h.snapshots_offset = LoadBE64(&c0[kOffSnapshotsOffset]);

  if (h.cluster_bits < kMinClusterBits || h.cluster_bits > kMaxClusterBits) {
    return Bad(filename, absl::StrCat("cluster_bits ", h.cluster_bits,
                                      " out of range 9..21"));
  }
  const uint64_t cluster_size = h.cluster_size();
  if (c0.size() < std::min<uint64_t>(cluster_size, kV3HeaderLength)) {
    return Bad(filename, "header truncated");
  }

  if (h.version == 2) {
    h.header_length = kV2HeaderLength;
    h.refcount_order = 4;
  } else {
    if (c0.size() < kV3MinHeaderLength) {
      return Bad(filename, "version 3 header truncated");
    }
    h.incompatible_features = LoadBE64(&c0[kOffIncompat]);
    h.compatible_features = LoadBE64(&c0[kOffCompat]);
    h.autoclear_features = LoadBE64(&c0[kOffAutoclear]);
    h.refcount_order = LoadBE32(&c0[kOffRefcountOrder]);
    h.header_length = LoadBE32(&c0[kOffHeaderLength]);
    if (h.header_length < kV3MinHeaderLength) {
      return Bad(filename, absl::StrCat("header_length ", h.header_length,
                                        " is below the minimum of 104"));
    }
    if (h.header_length > cluster_size || h.header_length > c0.size()) {
      return Bad(filename,
                 absl::StrCat("header_length ", h.header_length,
                              " exceeds the cluster size ", cluster_size));
    }
    if (h.header_length % 8 != 0) {
      return Bad(filename, absl::StrCat("header_length ", h.header_length,
                                        " is not a multiple of 8"));
    }
    if (h.header_length > kOffCompressionType) {
      h.compression_type = c0[kOffCompressionType];
      h.tail.assign(c0.begin() + kOffCompressionType + 1,
                    c0.begin() + h.header_length);
    }
    if (h.refcount_order > 6) {
      return Bad(filename, absl::StrCat("refcount_order ", h.refcount_order,
                                        " out of range 0..6"));
    }
  }

  if (h.compression_type > 1) {
    return absl::UnimplementedError(
        absl::StrCat(filename, ": unsupported compression_type ",
                     int{h.compression_type}, " (only 0 zlib and 1 zstd)"));
  }
  bool compression_bit = (h.incompatible_features & kIncompatCompression) != 0;
  if (compression_bit != (h.compression_type != 0)) {
    return Bad(filename,
               absl::StrCat("compression type bit is ",
                            compression_bit ? "set" : "clear",
                            " but compression_type is ",
                            int{h.compression_type}));
  }
  if (h.extended_l2() && h.cluster_bits < kMinExtendedL2ClusterBits) {
    return Bad(filename,
               absl::StrCat("extended L2 entries need clusters of at least "
                            "16 KiB, cluster_bits is ",
                            h.cluster_bits));
  }

  // Backing file name: inside cluster 0 and at most 1023 bytes.
  if (h.backing_file_offset != 0 || h.backing_file_size != 0) {
    if (h.backing_file_size > kMaxBackingFileNameSize) {
      return Bad(filename, absl::StrCat("backing file name too long (",
                                        h.backing_file_size,
                                        " bytes, limit 1023)"));
    }
    if (h.backing_file_offset < h.header_length) {
      return Bad(filename,
                 absl::StrCat("backing_file_offset ", h.backing_file_offset,
                              " lies inside the header (header_length ",
                              h.header_length, ")"));
    }
    uint64_t end;
    if (AddOverflows(h.backing_file_offset, h.backing_file_size, &end) ||
        end > cluster_size || end > c0.size()) {
      return Bad(filename,
                 absl::StrCat("backing file name at byte ",
                              h.backing_file_offset, " (", h.backing_file_size,
                              " bytes) lies outside the header cluster"));
    }
    h.backing_file.assign(
        reinterpret_cast<const char*>(&c0[h.backing_file_offset]),
        h.backing_file_size);
  }

  // Extensions live between the header and the backing file name (or the
  // end of the cluster). As in QEMU, any nonzero backing_file_offset ends
  // the area, even one equal to header_length (then there are none); it
  // was checked above to lie in [header_length, cluster).
  uint64_t ext_end = std::min<uint64_t>(cluster_size, c0.size());
  if (h.backing_file_offset != 0) {
    ext_end = std::min<uint64_t>(ext_end, h.backing_file_offset);
  }
  if (h.header_length < ext_end) {
    RETURN_IF_ERROR(
        DecodeExtensions(c0, h.header_length, ext_end, filename, &h));
  }
  return h;
}

absl::Status CheckFeatures(const Header& h, const std::string& filename,
                           bool luks_ok, bool data_file_ok) {
  uint64_t unknown = h.incompatible_features & ~kIncompatKnown;
  if (unknown != 0) {
    int bit = __builtin_ctzll(unknown);
    std::string name = h.FeatureNameFor(0, static_cast<uint8_t>(bit));
    return absl::UnimplementedError(absl::StrCat(
        filename, ": unsupported incompatible feature bit ", bit,
        name.empty() ? "" : absl::StrCat(" (", name, ")")));
  }
  if (h.crypt_method == 1) {
    // Legacy AES-CBC: QEMU 7.2's system emulators refuse to open it ("no
    // longer supported in system emulators"); only its tools (qemu-img,
    // qemu-io) still create, read and write it. We refuse it as the
    // emulators do and point at the way out.
    return absl::UnimplementedError(absl::StrCat(
        filename, ": encrypted images are not supported (crypt_method 1, "
        "legacy AES-CBC): QEMU 7.2's system emulators refuse it too; convert "
        "it with `qemu-img convert --object secret,...` to an unencrypted or "
        "LUKS-encrypted image"));
  }
  if (h.crypt_method != 0 && !(luks_ok && h.crypt_method == 2)) {
    // LUKS (2): the driver and amend unlock it with a key (lib/crypto);
    // callers that have no key refuse it.
    return absl::UnimplementedError(absl::StrCat(
        filename, ": encrypted images are not supported (crypt_method ",
        h.crypt_method, h.crypt_method == 2 ? ", LUKS" : ", unknown method",
        ")"));
  }
  const bool has_data_file = (h.incompatible_features & kIncompatDataFile) != 0;
  if (has_data_file && !h.data_file) {
    // QEMU: "'data-file' is required for this image".
    return absl::DataLossError(absl::StrCat(
        filename, ": the external data file bit is set but the image names "
        "no data file (no data file name extension)"));
  }
  if (!has_data_file && (h.autoclear_features & kAutoclearDataFileRaw)) {
    // QEMU: "data-file-raw requires a data file".
    return absl::DataLossError(absl::StrCat(
        filename, ": the raw external data bit is set but the image has no "
        "external data file"));
  }
  if (has_data_file && h.data_file->empty()) {
    return absl::DataLossError(
        absl::StrCat(filename, ": the external data file name is empty"));
  }
  if (has_data_file && !data_file_ok) {
    return absl::UnimplementedError(absl::StrCat(
        filename, ": this operation does not support images with an external "
        "data file (data file '", *h.data_file, "')"));
  }
  return absl::OkStatus();
}

namespace {

struct Range {
  const char* name;
  uint64_t start;
  uint64_t len;
};

}  // namespace

absl::Status ValidateHeaderTables(const Header& h, uint64_t file_size,
                                  const std::string& filename) {
  const uint64_t cs = h.cluster_size();
  // Virtual size: L1 must cover it, and bounded to what offsets can express.
  if (h.size > (1ull << 62)) {
    return Bad(filename, absl::StrCat("virtual size ", h.size, " is too large"));
  }
  uint64_t l1_needed = RequiredL1Entries(h.size, h.cluster_bits,
                                         h.l2_entry_size());
  if (h.l1_size < l1_needed) {
    return Bad(filename,
               absl::StrCat("l1_size ", h.l1_size, " is too small for virtual "
                            "size ", h.size, " (needs ", l1_needed, ")"));
  }
  if (uint64_t{h.l1_size} * 8 > kMaxL1Bytes) {
    return Bad(filename, absl::StrCat("l1_size ", h.l1_size,
                                      " exceeds the 32 MiB L1 limit"));
  }
  if (h.refcount_table_clusters == 0) {
    return Bad(filename, "refcount_table_clusters is 0");
  }
  if (uint64_t{h.refcount_table_clusters} * cs > kMaxRefcountTableBytes) {
    return Bad(filename,
               absl::StrCat("refcount_table_clusters ",
                            h.refcount_table_clusters,
                            " exceeds the 8 MiB refcount table limit"));
  }
  if (h.nb_snapshots > kMaxSnapshots) {
    return Bad(filename, absl::StrCat("nb_snapshots ", h.nb_snapshots,
                                      " exceeds the limit of 65536"));
  }

  std::vector<Range> ranges;
  ranges.push_back({"header", 0, cs});
  auto check = [&](const char* name, uint64_t offset,
                   uint64_t len) -> absl::Status {
    if (!IsAligned(offset, cs)) {
      return Bad(filename, absl::StrCat(name, " offset ", Hex(offset),
                                        " is not cluster aligned"));
    }
    uint64_t end;
    if (AddOverflows(offset, len, &end)) {
      return Bad(filename, absl::StrCat(name, " at ", Hex(offset), " (",
                                        len, " bytes) overflows"));
    }
    if (end > kMaxHostOffset) {
      return Bad(filename, absl::StrCat(name, " at ", Hex(offset), " (", len,
                                        " bytes) lies beyond the 2^56 host "
                                        "offset limit"));
    }
    if (end > file_size) {
      return Bad(filename,
                 absl::StrCat(name, " at ", Hex(offset), " (", len,
                              " bytes) lies past the end of the file (",
                              file_size, " bytes)"));
    }
    for (const Range& r : ranges) {
      if (len > 0 && offset < r.start + r.len && r.start < end) {
        return Bad(filename, absl::StrCat(name, " at ", Hex(offset),
                                          " overlaps the ", r.name, " at ",
                                          Hex(r.start)));
      }
    }
    ranges.push_back({name, offset, len});
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check("refcount table", h.refcount_table_offset,
                        uint64_t{h.refcount_table_clusters} * cs));
  if (h.l1_size > 0 || h.l1_table_offset != 0) {
    RETURN_IF_ERROR(
        check("L1 table", h.l1_table_offset, uint64_t{h.l1_size} * 8));
  }
  if (h.nb_snapshots > 0) {
    // Entries are variable length; at least 40 bytes each.
    RETURN_IF_ERROR(check("snapshot table", h.snapshots_offset,
                          uint64_t{h.nb_snapshots} * 40));
  } else if (!IsAligned(h.snapshots_offset, cs)) {
    return Bad(filename, absl::StrCat("snapshot table offset ",
                                      Hex(h.snapshots_offset),
                                      " is not cluster aligned"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> EncodeHeader(const Header& h) {
  // Refuse headers whose layout would not fit the buffer below.
  if (h.version != 2 && h.version != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot encode qcow2 version ", h.version));
  }
  if (h.cluster_bits < kMinClusterBits || h.cluster_bits > kMaxClusterBits) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot encode cluster_bits ", h.cluster_bits));
  }
  if (h.version >= 3 &&
      (h.header_length < kV3MinHeaderLength || h.header_length % 8 != 0 ||
       h.header_length + 8 > h.cluster_size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot encode header_length ", h.header_length));
  }
  const uint64_t cs = h.cluster_size();
  std::vector<uint8_t> out(cs, 0);
  uint8_t* p = out.data();
  StoreBE32(p + kOffMagic, kQcowMagic);
  StoreBE32(p + kOffVersion, h.version);
  StoreBE32(p + kOffClusterBits, h.cluster_bits);
  StoreBE64(p + kOffSize, h.size);
  StoreBE32(p + kOffCryptMethod, h.crypt_method);
  StoreBE32(p + kOffL1Size, h.l1_size);
  StoreBE64(p + kOffL1Offset, h.l1_table_offset);
  StoreBE64(p + kOffRefcountTableOffset, h.refcount_table_offset);
  StoreBE32(p + kOffRefcountTableClusters, h.refcount_table_clusters);
  StoreBE32(p + kOffNbSnapshots, h.nb_snapshots);
  StoreBE64(p + kOffSnapshotsOffset, h.snapshots_offset);
  uint64_t pos = kV2HeaderLength;
  if (h.version >= 3) {
    StoreBE64(p + kOffIncompat, h.incompatible_features);
    StoreBE64(p + kOffCompat, h.compatible_features);
    StoreBE64(p + kOffAutoclear, h.autoclear_features);
    StoreBE32(p + kOffRefcountOrder, h.refcount_order);
    StoreBE32(p + kOffHeaderLength, h.header_length);
    if (h.header_length > kOffCompressionType) {
      p[kOffCompressionType] = h.compression_type;
      size_t n = std::min<size_t>(h.tail.size(),
                                  h.header_length - kOffCompressionType - 1);
      if (n > 0) std::memcpy(p + kOffCompressionType + 1, h.tail.data(), n);
    }
    pos = h.header_length;
  }

  auto put_ext = [&](uint32_t magic, const uint8_t* data,
                     size_t len) -> bool {
    uint64_t need = 8 + AlignUp(len, 8);
    if (pos + need + 8 > cs) return false;  // keep room for the end marker
    StoreBE32(p + pos, magic);
    StoreBE32(p + pos + 4, static_cast<uint32_t>(len));
    if (len > 0) std::memcpy(p + pos + 8, data, len);
    pos += need;
    return true;
  };
  auto too_big = [&] {
    return absl::InvalidArgumentError(
        "header extensions and backing file name do not fit in one cluster");
  };
  // Same order as QEMU's qcow2_update_header(): backing format, data file,
  // crypto, feature-name table, bitmaps, then the unknown extensions.
  if (h.backing_format) {
    if (!put_ext(kExtBackingFormat,
                 reinterpret_cast<const uint8_t*>(h.backing_format->data()),
                 h.backing_format->size())) {
      return too_big();
    }
  }
  if (h.data_file) {
    if (!put_ext(kExtDataFile,
                 reinterpret_cast<const uint8_t*>(h.data_file->data()),
                 h.data_file->size())) {
      return too_big();
    }
  }
  for (const RawExtension& e : h.other_extensions) {
    if (e.magic == kExtCrypto &&
        !put_ext(e.magic, e.data.data(), e.data.size())) {
      return too_big();
    }
  }
  if (!h.feature_names.empty() && h.version >= 3) {
    std::vector<uint8_t> table(h.feature_names.size() * kFeatureNameEntry, 0);
    for (size_t i = 0; i < h.feature_names.size(); ++i) {
      uint8_t* e = &table[i * kFeatureNameEntry];
      e[0] = h.feature_names[i].type;
      e[1] = h.feature_names[i].bit;
      std::memcpy(e + 2, h.feature_names[i].name.data(),
                  std::min<size_t>(46, h.feature_names[i].name.size()));
    }
    // The table is optional: like QEMU, leave it out when it would not
    // leave room for the backing file name (small clusters).
    uint64_t need = 8 + AlignUp(table.size(), 8);
    if (pos + need + 8 + h.backing_file.size() <= cs) {
      put_ext(kExtFeatureNames, table.data(), table.size());
    }
  }
  // Bitmaps first, then the unknown extensions in file order.
  for (bool bitmaps : {true, false}) {
    for (const RawExtension& e : h.other_extensions) {
      if (e.magic == kExtCrypto || (e.magic == kExtBitmaps) != bitmaps) {
        continue;
      }
      if (!put_ext(e.magic, e.data.data(), e.data.size())) return too_big();
    }
  }
  // End marker (8 zero bytes, already zero), then the backing file name.
  pos += 8;
  if (!h.backing_file.empty()) {
    if (h.backing_file.size() > kMaxBackingFileNameSize) {
      return absl::InvalidArgumentError(absl::StrCat(
          "backing file name is ", h.backing_file.size(),
          " bytes, longer than the qcow2 limit of 1023"));
    }
    if (pos + h.backing_file.size() > cs) return too_big();
    std::memcpy(p + pos, h.backing_file.data(), h.backing_file.size());
    StoreBE64(p + kOffBackingOffset, pos);
    StoreBE32(p + kOffBackingSize,
              static_cast<uint32_t>(h.backing_file.size()));
    pos += h.backing_file.size();
  }
  out.resize(std::max<uint64_t>(pos, h.version >= 3 ? h.header_length
                                                    : kV2HeaderLength));
  return out;
}

}  // namespace qcow2::internal
