// SPDX-License-Identifier: Apache-2.0
// The qcow2 header (cluster 0): fields, header extensions and the backing
// file name, with the validation that runs before any other structure is
// trusted. Layout: QEMU's docs/interop/qcow2.txt; summary in
// docs/format.md.
#ifndef QCOW2_LIB_FORMAT_HEADER_H_
#define QCOW2_LIB_FORMAT_HEADER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace qcow2::internal {

inline constexpr uint32_t kQcowMagic = 0x514649fb;  // "QFI\xfb"
inline constexpr uint32_t kV2HeaderLength = 72;
inline constexpr uint32_t kV3MinHeaderLength = 104;
inline constexpr uint32_t kV3HeaderLength = 112;  // what QEMU and we write

inline constexpr uint32_t kMinClusterBits = 9;
inline constexpr uint32_t kMaxClusterBits = 21;
inline constexpr uint32_t kMinExtendedL2ClusterBits = 14;
inline constexpr uint32_t kMaxBackingFileNameSize = 1023;

// Limits QEMU enforces and so do we (see docs/format.md).
inline constexpr uint64_t kMaxL1Bytes = 32ull << 20;
inline constexpr uint64_t kMaxRefcountTableBytes = 8ull << 20;
inline constexpr uint32_t kMaxSnapshots = 65536;
inline constexpr uint64_t kMaxHostOffset = 1ull << 56;

// Incompatible feature bits.
inline constexpr uint64_t kIncompatDirty = 1ull << 0;
inline constexpr uint64_t kIncompatCorrupt = 1ull << 1;
inline constexpr uint64_t kIncompatDataFile = 1ull << 2;
inline constexpr uint64_t kIncompatCompression = 1ull << 3;
inline constexpr uint64_t kIncompatExtendedL2 = 1ull << 4;
inline constexpr uint64_t kIncompatKnown = 0x1f;
// Compatible feature bits.
inline constexpr uint64_t kCompatLazyRefcounts = 1ull << 0;
// Autoclear feature bits.
inline constexpr uint64_t kAutoclearBitmaps = 1ull << 0;
inline constexpr uint64_t kAutoclearDataFileRaw = 1ull << 1;

// Header extension magics.
inline constexpr uint32_t kExtEnd = 0x00000000;
inline constexpr uint32_t kExtBackingFormat = 0xe2792aca;
inline constexpr uint32_t kExtFeatureNames = 0x6803f857;
inline constexpr uint32_t kExtBitmaps = 0x23852875;
inline constexpr uint32_t kExtCrypto = 0x0537be77;
inline constexpr uint32_t kExtDataFile = 0x44415441;

struct FeatureName {
  uint8_t type = 0;  // 0 incompatible, 1 compatible, 2 autoclear
  uint8_t bit = 0;
  std::string name;
};

// A header extension kept as bytes (unknown ones, and the bitmaps and
// crypto extensions whose contents we do not interpret).
struct RawExtension {
  uint32_t magic = 0;
  std::vector<uint8_t> data;
};

struct Header {
  uint32_t version = 3;
  uint64_t backing_file_offset = 0;
  uint32_t backing_file_size = 0;
  uint32_t cluster_bits = 16;
  uint64_t size = 0;
  uint32_t crypt_method = 0;
  uint32_t l1_size = 0;
  uint64_t l1_table_offset = 0;
  uint64_t refcount_table_offset = 0;
  uint32_t refcount_table_clusters = 0;
  uint32_t nb_snapshots = 0;
  uint64_t snapshots_offset = 0;
  uint64_t incompatible_features = 0;
  uint64_t compatible_features = 0;
  uint64_t autoclear_features = 0;
  uint32_t refcount_order = 4;
  uint32_t header_length = kV3HeaderLength;
  uint8_t compression_type = 0;
  // Header bytes between offset 105 and header_length, kept verbatim.
  std::vector<uint8_t> tail;

  std::string backing_file;
  std::optional<std::string> backing_format;
  std::vector<FeatureName> feature_names;
  std::optional<std::string> data_file;
  // Extensions we do not interpret, in file order (bitmaps, crypto,
  // unknown ones). Rewritten unchanged.
  std::vector<RawExtension> other_extensions;

  uint64_t cluster_size() const { return 1ull << cluster_bits; }
  uint32_t refcount_bits() const { return 1u << refcount_order; }
  bool extended_l2() const {
    return (incompatible_features & kIncompatExtendedL2) != 0;
  }
  // Bytes per L2 entry: 8, or 16 with extended L2.
  uint32_t l2_entry_size() const { return extended_l2() ? 16 : 8; }
  uint64_t l2_entries() const { return cluster_size() / l2_entry_size(); }
  // The feature-name table's name for a bit, or "" if none.
  std::string FeatureNameFor(uint8_t type, uint8_t bit) const;
};

// The feature-name table QEMU writes into a version 3 header: none for
// clusters of 4 KiB or less (qemu-img create and amend leave it out).
std::vector<FeatureName> QemuFeatureNames(uint64_t cluster_size);

// L1 entries needed to map `virtual_size` bytes.
uint64_t RequiredL1Entries(uint64_t virtual_size, uint32_t cluster_bits,
                           uint32_t l2_entry_size);

// Parses cluster 0. `cluster0` holds the file's first bytes (at least 512;
// the whole first cluster when the file has it, zero padded past EOF).
// Validates every header-local field: errors are kDataLoss naming the field
// and `filename`, or kUnimplemented for unsupported features.
absl::StatusOr<Header> DecodeHeader(absl::Span<const uint8_t> cluster0,
                                    const std::string& filename);

// Checks the tables the header points at against the file size: alignment,
// overflow, size limits, lying inside the file, and not overlapping each
// other or the header cluster.
absl::Status ValidateHeaderTables(const Header& h, uint64_t file_size,
                                  const std::string& filename);

// Policy on feature bits when opening: unknown incompatible bits and
// unsupported features are refused with kUnimplemented naming them.
// `luks_ok`: the caller handles LUKS encryption (crypt_method 2: the
// driver with a key, the checker); others refuse it. `data_file_ok`: the
// caller handles an external data file (incompatible bit 2); others refuse
// it. Either way the data-file bits must agree with each other as QEMU
// requires (the bit with a name, the raw autoclear bit only with the bit).
absl::Status CheckFeatures(const Header& h, const std::string& filename,
                           bool luks_ok = false, bool data_file_ok = false);

// Serialises the header, its extensions and the backing file name into one
// cluster. Fails if they do not fit.
absl::StatusOr<std::vector<uint8_t>> EncodeHeader(const Header& h);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_FORMAT_HEADER_H_
