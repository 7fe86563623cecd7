// SPDX-License-Identifier: Apache-2.0
// CreateImage: new qcow2 and raw images, laid out as qemu-img lays them out
// (header, refcount table, first refcount block, L1 table), then optional
// preallocation through the normal write path.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/chain/chain.h"
#include "lib/crypto/luks_keys.h"
#include "lib/crypto/secure_buffer.h"
#include "lib/format/crypto_ext.h"
#include "lib/format/entries.h"
#include "lib/format/header.h"
#include "lib/driver/qcow2_layer.h"
#include "lib/base/endian.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "qcow2/image.h"

namespace qcow2 {

namespace internal {
namespace {

absl::Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// qemu-img's rules for data_file and data_file_raw (its messages).
absl::Status ValidateDataFile(const std::string& path, const CreateOptions& o) {
  const bool v2 = o.compat == "0.10" || o.compat == "v2";
  if (o.data_file_raw && o.data_file.empty()) {
    return Invalid(path, "data-file-raw requires data-file");
  }
  if (o.data_file.empty()) return absl::OkStatus();
  if (v2) {
    return Invalid(path,
                   "External data files are only supported with "
                   "compatibility level 1.1 and above (use version=v3 or "
                   "greater)");
  }
  if (o.data_file_raw && !o.backing_file.empty()) {
    return Invalid(path,
                   "Backing file and data-file-raw cannot be used at the "
                   "same time");
  }
  return absl::OkStatus();
}

absl::Status ValidateCreate(const std::string& path, const CreateOptions& o) {
  if (o.format == ImageFormat::kRaw) {
    if (!o.backing_file.empty()) {
      return Invalid(path, "raw images cannot have a backing file");
    }
    if (!o.data_file.empty() || o.data_file_raw) {
      return Invalid(path, "raw images cannot have a data file");
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ValidateDataFile(path, o));
  const uint32_t cs = o.cluster_size;
  if (cs < 512 || cs > (2u << 20) || (cs & (cs - 1)) != 0) {
    return Invalid(path, absl::StrCat("cluster size ", cs,
                                      " must be a power of two between 512 "
                                      "and 2M"));
  }
  const uint32_t rb = o.refcount_bits;
  if (rb == 0 || rb > 64 || (rb & (rb - 1)) != 0) {
    return Invalid(path, absl::StrCat("refcount width ", rb,
                                      " must be a power of two up to 64"));
  }
  if (o.compat != "1.1" && o.compat != "0.10" && o.compat != "v3" &&
      o.compat != "v2") {
    return Invalid(path, absl::StrCat("compat '", o.compat,
                                      "' is not one of 0.10, 1.1"));
  }
  const bool v2 = o.compat == "0.10" || o.compat == "v2";
  if (v2 && o.extended_l2) {
    return Invalid(path, "extended L2 entries need compat=1.1");
  }
  if (v2 && o.compression_type != CompressionType::kZlib) {
    return Invalid(path, "zstd compression needs compat=1.1");
  }
  if (v2 && o.lazy_refcounts) {
    return Invalid(path, "lazy refcounts need compat=1.1");
  }
  if (v2 && rb != 16) {
    return Invalid(path, "refcount widths other than 16 need compat=1.1");
  }
  if (o.extended_l2 && cs < 16384) {
    return Invalid(path,
                   "extended L2 entries need a cluster size of at least 16k");
  }
  if (!o.backing_file.empty() && o.preallocation != Preallocation::kOff &&
      !o.extended_l2) {
    return Invalid(path,
                   "backing file and preallocation can only be used together "
                   "with extended_l2=on");
  }
  if (o.backing_file.size() > kMaxBackingFileNameSize) {
    return Invalid(path, "backing file name is longer than 1023 bytes");
  }
  if (!o.encrypt.format.empty()) {
    if (o.encrypt.format != "luks") {
      return Invalid(path, absl::StrCat(
          "encrypt.format=", o.encrypt.format,
          " is not supported (luks is; legacy aes images are refused as "
          "QEMU 7.2's emulators refuse them)"));
    }
    if (o.encrypt.key_secret.empty()) {
      return Invalid(path, "Parameter 'encrypt.key-secret' is required for cipher");
    }
  }
  if (!o.backing_format.empty() && o.backing_format != "qcow2" &&
      o.backing_format != "raw") {
    return Invalid(path, absl::StrCat("backing format '", o.backing_format,
                                      "' is not supported (qcow2, raw)"));
  }
  return absl::OkStatus();
}

// The size of the backing file, for images created without a size.
absl::StatusOr<uint64_t> BackingSize(const std::string& path,
                                     const CreateOptions& o) {
  ASSIGN_OR_RETURN(std::string resolved,
                   ResolveBackingName(path, o.backing_file));
  OpenOptions oo;
  oo.format = o.backing_format;
  oo.opener = o.opener;
  oo.metadata_only = true;  // its size only: an encrypted one needs no key
  auto image = Image::Open(resolved, oo);
  if (!image.ok()) {
    return absl::Status(image.status().code(),
                        absl::StrCat("cannot open backing file: ",
                                     image.status().message()));
  }
  return (*image)->size();
}

// The L1 table of a `size`-byte disk must fit QEMU's limit.
absl::Status CheckSizeFits(const std::string& path, const CreateOptions& o,
                           uint64_t size) {
  if (o.format == ImageFormat::kRaw) return absl::OkStatus();
  const uint32_t cluster_bits =
      static_cast<uint32_t>(__builtin_ctz(o.cluster_size));
  const uint64_t l1_entries = RequiredL1Entries(
      size, cluster_bits, o.extended_l2 ? 16 : 8);
  if (l1_entries * 8 > kMaxL1Bytes) {
    return Invalid(path, absl::StrCat("virtual size ", size,
                                      " is too large for cluster size ",
                                      o.cluster_size,
                                      " (try a larger cluster size)"));
  }
  return absl::OkStatus();
}

// What is at `path` before the create: nothing (or not a path on this
// machine's file system), a file, or a block device.
enum class Existing { kNothing, kFile, kDevice };

absl::StatusOr<Existing> LookAt(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Existing::kNothing;
  if (S_ISDIR(st.st_mode)) return Invalid(path, "is a directory");
  return S_ISBLK(st.st_mode) ? Existing::kDevice : Existing::kFile;
}

absl::Status CreateQcow2(File* file, const std::string& path,
                         const CreateOptions& o, uint64_t size,
                         bool device) {
  Header h;
  const bool v2 = o.compat == "0.10" || o.compat == "v2";
  h.version = v2 ? 2 : 3;
  h.cluster_bits = static_cast<uint32_t>(__builtin_ctz(o.cluster_size));
  h.size = size;
  h.refcount_order = static_cast<uint32_t>(__builtin_ctz(o.refcount_bits));
  h.header_length = v2 ? kV2HeaderLength : kV3HeaderLength;
  if (o.extended_l2) h.incompatible_features |= kIncompatExtendedL2;
  if (o.compression_type == CompressionType::kZstd) {
    h.incompatible_features |= kIncompatCompression;
    h.compression_type = 1;
  }
  if (o.lazy_refcounts) h.compatible_features |= kCompatLazyRefcounts;
  // QEMU leaves the feature-name table out of small header clusters.
  if (!v2) h.feature_names = QemuFeatureNames(o.cluster_size);
  h.backing_file = o.backing_file;
  if (!o.backing_format.empty()) h.backing_format = o.backing_format;
  if (!o.data_file.empty()) {
    h.incompatible_features |= kIncompatDataFile;
    h.data_file = o.data_file;
    if (o.data_file_raw) h.autoclear_features |= kAutoclearDataFileRaw;
  }

  const uint64_t cs = o.cluster_size;
  // LUKS: the area (header and key slots) in the clusters after the L1
  // table, as QEMU 7.2 places it.
  std::optional<LuksArea> luks;
  if (o.encrypt.format == "luks") {
    LuksCreateOptions lo;
    lo.cipher_alg = o.encrypt.cipher_alg;
    lo.cipher_mode = o.encrypt.cipher_mode;
    lo.ivgen_alg = o.encrypt.ivgen_alg;
    lo.ivgen_hash_alg = o.encrypt.ivgen_hash_alg;
    lo.hash_alg = o.encrypt.hash_alg;
    lo.iter_time_ms = o.encrypt.iter_time_ms;
    lo.slot_iterations = o.encrypt.iterations;
    lo.digest_iterations = o.encrypt.iterations;
    auto area = CreateLuks(
        lo, absl::MakeConstSpan(
                reinterpret_cast<const uint8_t*>(o.encrypt.key_secret.data()),
                o.encrypt.key_secret.size()));
    if (!area.ok()) {
      return absl::Status(area.status().code(),
                          absl::StrCat(path, ": ", area.status().message()));
    }
    luks.emplace(std::move(area).value());
    h.crypt_method = kCryptLuks;
  }
  const uint64_t area_clusters =
      luks ? DivRoundUp(uint64_t{luks->bytes.size()}, cs) : 0;
  h.l1_size = static_cast<uint32_t>(
      RequiredL1Entries(size, h.cluster_bits, h.l2_entry_size()));
  if (uint64_t{h.l1_size} * 8 > kMaxL1Bytes) {
    return Invalid(path, absl::StrCat("virtual size ", size,
                                      " is too large for cluster size ", cs));
  }
  // Layout: header, refcount table, refcount blocks, L1 table; grow the
  // table and block counts until they describe the whole layout.
  const uint64_t block_entries =
      RefcountBlockEntries(h.cluster_bits, h.refcount_order);
  const uint64_t l1_clusters =
      std::max<uint64_t>(1, DivRoundUp(uint64_t{h.l1_size} * 8, cs));
  uint64_t table_clusters = 1, blocks = 1;
  while (true) {
    uint64_t total = 1 + table_clusters + blocks + l1_clusters + area_clusters;
    uint64_t need_blocks = DivRoundUp(total, block_entries);
    uint64_t need_table = DivRoundUp(need_blocks * 8, cs);
    if (need_blocks <= blocks && need_table <= table_clusters) break;
    blocks = std::max(blocks, need_blocks);
    table_clusters = std::max(table_clusters, need_table);
  }
  if (table_clusters * cs > kMaxRefcountTableBytes) {
    return Invalid(path, "image metadata would exceed the refcount limits");
  }
  const uint64_t total =
      1 + table_clusters + blocks + l1_clusters + area_clusters;
  h.refcount_table_offset = cs;
  h.refcount_table_clusters = static_cast<uint32_t>(table_clusters);
  h.l1_table_offset = (1 + table_clusters + blocks) * cs;
  const uint64_t area_offset = h.l1_table_offset + l1_clusters * cs;
  if (luks) {
    h.other_extensions.push_back(
        EncodeCryptoExtension({area_offset, luks->bytes.size()}));
  }

  // Refcount table and blocks.
  std::vector<uint8_t> table(table_clusters * cs, 0);
  std::vector<uint8_t> block_bytes(blocks * cs, 0);
  for (uint64_t b = 0; b < blocks; ++b) {
    StoreBE64(&table[b * 8], (1 + table_clusters + b) * cs);
  }
  // The blocks lie end to end: cluster c's entry is the c-th across them.
  for (uint64_t c = 0; c < total; ++c) {
    WriteRefcount(block_bytes.data(), h.refcount_order, c, 1);
  }
  ASSIGN_OR_RETURN(std::vector<uint8_t> header, EncodeHeader(h));
  RETURN_IF_ERROR(file->Truncate(0));
  RETURN_IF_ERROR(file->WriteAt(0, header));
  RETURN_IF_ERROR(file->WriteAt(cs, table));
  RETURN_IF_ERROR(file->WriteAt((1 + table_clusters) * cs, block_bytes));
  // A device keeps whatever it held past what is written: the whole
  // cluster of the L1 table is written there, in case the table grows in
  // place.
  std::vector<uint8_t> l1(
      device ? l1_clusters * cs : uint64_t{h.l1_size} * 8, 0);
  RETURN_IF_ERROR(file->WriteAt(h.l1_table_offset, l1));
  if (!luks) {
    RETURN_IF_ERROR(file->Truncate(h.l1_table_offset + l1.size()));
    return file->Flush();
  }
  std::vector<uint8_t> area(area_clusters * cs, 0);
  std::copy(luks->bytes.begin(), luks->bytes.end(), area.begin());
  RETURN_IF_ERROR(file->WriteAt(area_offset, area));
  RETURN_IF_ERROR(file->Truncate(area_offset + area.size()));
  return file->Flush();
}

}  // namespace
}  // namespace internal

namespace internal {
namespace {

// Lays out the new image in `file`, which this create made (or a device).
absl::Status WriteNewImage(std::unique_ptr<File> file, const std::string& path,
                           const CreateOptions& opts, uint64_t size,
                           bool device) {
  if (opts.format == ImageFormat::kRaw) {
    RETURN_IF_ERROR(file->Truncate(size));
    if (opts.preallocation == Preallocation::kFalloc) {
      RETURN_IF_ERROR(file->Allocate(0, size));
    } else if (opts.preallocation == Preallocation::kFull) {
      std::vector<uint8_t> zeros(std::min<uint64_t>(size, 1 << 20), 0);
      for (uint64_t off = 0; off < size; off += zeros.size()) {
        uint64_t n = std::min<uint64_t>(zeros.size(), size - off);
        RETURN_IF_ERROR(file->WriteAt(off, absl::MakeConstSpan(zeros.data(), n)));
      }
    }
    return file->Flush();
  }

  std::string data_path;
  if (!opts.data_file.empty()) {
    // Made (or emptied) first and sized to the disk, as qemu-img does:
    // at the name as given (a relative one from the working directory,
    // as qemu-img makes it), while an open resolves the stored name
    // against the image's directory.
    data_path = opts.data_file;
    FileOptions dfo;
    dfo.read_only = false;
    dfo.create = true;
    FileOpener* opener = opts.opener ? opts.opener : DefaultFileOpener();
    ASSIGN_OR_RETURN(std::unique_ptr<File> data, opener->Open(data_path, dfo));
    RETURN_IF_ERROR(data->Truncate(0));
    RETURN_IF_ERROR(data->Truncate(size));
    RETURN_IF_ERROR(data->Flush());
  }
  RETURN_IF_ERROR(CreateQcow2(file.get(), path, opts, size, device));
  Preallocation prealloc = opts.preallocation;
  // A raw data file is mapped whole from the start (qemu-img does so):
  // what is written into it from outside is what the image reads.
  if (opts.data_file_raw && prealloc == Preallocation::kOff) {
    prealloc = Preallocation::kMetadata;
  }
  if (prealloc == Preallocation::kOff) return absl::OkStatus();
  OpenOptions oo;
  oo.read_write = true;
  oo.open_backing = false;
  oo.format = "qcow2";
  oo.key_secret = opts.encrypt.key_secret;
  oo.opener = opts.opener;
  oo.data_file = data_path;  // the file just made
  auto open_data = [&](const std::string&) {
    return OpenDataFile(path, opts.data_file, oo);
  };
  auto opened = Qcow2Layer::Open(std::move(file), oo, open_data);
  WipeString(&oo.key_secret);
  ASSIGN_OR_RETURN(auto layer, std::move(opened));
  RETURN_IF_ERROR(layer->writer().Preallocate(prealloc));
  return layer->Close();
}

}  // namespace
}  // namespace internal

absl::Status CreateImage(const std::string& path, const CreateOptions& opts) {
  using namespace internal;
  RETURN_IF_ERROR(ValidateCreate(path, opts));
  uint64_t size = opts.size;
  if (size == 0 && !opts.backing_file.empty()) {
    ASSIGN_OR_RETURN(size, BackingSize(path, opts));
  }
  size = AlignUp(size, 512);
  RETURN_IF_ERROR(CheckSizeFits(path, opts, size));
  ASSIGN_OR_RETURN(Existing existing, LookAt(path));
  const bool device = existing == Existing::kDevice;
  FileOpener* opener = opts.opener ? opts.opener : DefaultFileOpener();
  FileOptions fo;
  fo.read_only = false;
  // A device is formatted in place (as qemu-img does): never created,
  // never truncated; its locks keep QEMU out meanwhile.
  fo.create = !device;
  fo.exclusive = !device;
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, opener->Open(path, fo));
  absl::Status s = WriteNewImage(std::move(file), path, opts, size, device);
  if (!s.ok() && existing == Existing::kNothing) {
    // Made here (O_EXCL): a failed create leaves nothing behind. A file
    // or device that was there before is never removed.
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
  return s;
}

}  // namespace qcow2
