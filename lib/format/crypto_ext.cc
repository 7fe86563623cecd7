// SPDX-License-Identifier: Apache-2.0
#include "lib/format/crypto_ext.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/endian.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

namespace {

absl::Status Bad(const std::string& filename, const std::string& what) {
  return absl::DataLossError(absl::StrCat(
      filename, ": malformed encryption header extension: ", what));
}

// Fails when [offset, offset+len) overlaps a table the header points at.
absl::Status CheckOverlaps(const Header& h, const CryptoExtension& e,
                           const std::string& filename) {
  const uint64_t cs = h.cluster_size();
  struct Table {
    const char* name;
    uint64_t start, len;
  };
  const Table tables[] = {
      {"header cluster", 0, cs},
      {"refcount table", h.refcount_table_offset,
       uint64_t{h.refcount_table_clusters} * cs},
      {"L1 table", h.l1_table_offset, uint64_t{h.l1_size} * 8},
      {"snapshot table", h.snapshots_offset,
       h.nb_snapshots ? uint64_t{h.nb_snapshots} * 40 : 0},
  };
  // The area owns whole clusters.
  const uint64_t end = e.offset + e.clusters(cs) * cs;
  for (const Table& t : tables) {
    if (t.len > 0 && e.offset < t.start + t.len && t.start < end) {
      return Bad(filename,
                 absl::StrFormat("LUKS area at 0x%x (%u bytes) overlaps the "
                                 "%s at 0x%x",
                                 e.offset, e.length, t.name, t.start));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<CryptoExtension>> DecodeCryptoExtension(
    const Header& h, uint64_t file_size, const std::string& filename) {
  const RawExtension* raw = nullptr;
  for (const RawExtension& e : h.other_extensions) {
    if (e.magic != kExtCrypto) continue;
    if (raw != nullptr) return Bad(filename, "more than one crypto extension");
    raw = &e;
  }
  if (raw == nullptr) {
    if (h.crypt_method == kCryptLuks) {
      return Bad(filename, "crypt_method 2 (LUKS) without the crypto header "
                           "extension");
    }
    return std::nullopt;
  }
  if (h.crypt_method != kCryptLuks) {
    return Bad(filename, absl::StrCat("crypto header extension with "
                                      "crypt_method ", h.crypt_method,
                                      " (only LUKS, 2, has one)"));
  }
  if (raw->data.size() != kCryptoExtSize) {
    return Bad(filename, absl::StrCat("length ", raw->data.size(),
                                      " (must be 16)"));
  }
  CryptoExtension e;
  e.offset = LoadBE64(raw->data.data());
  e.length = LoadBE64(raw->data.data() + 8);
  const uint64_t cs = h.cluster_size();
  if (!IsAligned(e.offset, cs)) {
    return Bad(filename, absl::StrFormat("offset 0x%x is not a multiple of "
                                         "the cluster size %u",
                                         e.offset, cs));
  }
  if (e.length == 0 || e.length > kMaxCryptoAreaBytes) {
    return Bad(filename, absl::StrCat("length ", e.length,
                                      " is out of range 1..", kMaxCryptoAreaBytes));
  }
  uint64_t end;
  if (AddOverflows(e.offset, e.length, &end) || end > file_size) {
    return Bad(filename, absl::StrFormat("LUKS area at 0x%x (%u bytes) lies "
                                         "past the end of the file (%u bytes)",
                                         e.offset, e.length, file_size));
  }
  RETURN_IF_ERROR(CheckOverlaps(h, e, filename));
  return e;
}

RawExtension EncodeCryptoExtension(const CryptoExtension& ext) {
  RawExtension raw{kExtCrypto, std::vector<uint8_t>(kCryptoExtSize)};
  StoreBE64(raw.data.data(), ext.offset);
  StoreBE64(raw.data.data() + 8, ext.length);
  return raw;
}

}  // namespace qcow2::internal
