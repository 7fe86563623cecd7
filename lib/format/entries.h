// SPDX-License-Identifier: Apache-2.0
// Codecs for L1, L2 (standard and extended), refcount table and refcount
// block entries.
#ifndef QCOW2_LIB_FORMAT_ENTRIES_H_
#define QCOW2_LIB_FORMAT_ENTRIES_H_

#include <cstdint>

#include "lib/base/endian.h"

namespace qcow2::internal {

inline constexpr uint64_t kOflagCopied = 1ull << 63;
inline constexpr uint64_t kOflagCompressed = 1ull << 62;
inline constexpr uint64_t kOflagZero = 1ull << 0;

// Bits 9..55: a cluster-aligned host offset in L1 and standard L2 entries.
inline constexpr uint64_t kEntryOffsetMask = 0x00fffffffffffe00ull;
inline constexpr uint64_t kL1ReservedMask = 0x7f000000000001ffull;
inline constexpr uint64_t kL2StandardReservedMask = 0x3f000000000001feull;
// Refcount table entries: bits 9..63.
inline constexpr uint64_t kRefTableOffsetMask = 0xfffffffffffffe00ull;

inline constexpr int kSubclustersPerCluster = 32;

// How one subcluster (or, without extended L2, one cluster) reads.
enum class SubclusterType {
  kUnallocated,       // from the backing chain (or zeros)
  kUnallocatedAlloc,  // host cluster reserved, contents from the backing
  kZeroPlain,         // zeros, no host cluster
  kZeroAlloc,         // zeros, host cluster preallocated
  kNormal,            // data at the host offset
  kCompressed,        // whole cluster, compressed
  kInvalid,           // inconsistent entry (corruption)
};

// Whether a (non-compressed) entry names a host cluster. With an external
// data file, host offset 0 is guest cluster 0's data cluster: QEMU tells
// it from an unallocated entry by the COPIED flag, which every cluster of
// a data file has (its refcount is 1 by definition).
inline bool HasHostCluster(uint64_t entry, bool data_file) {
  return (entry & kEntryOffsetMask) != 0 ||
         (data_file && (entry & kOflagCopied) && !(entry & kOflagCompressed));
}

// Classifies subcluster `sc` of an L2 entry. For standard entries pass
// bitmap = 0 and extended = false (the cluster is one "subcluster").
// `data_file`: the image has an external data file (HasHostCluster).
inline SubclusterType ClassifySubcluster(uint64_t entry, uint64_t bitmap,
                                         bool extended, int sc,
                                         bool data_file = false) {
  if (entry & kOflagCompressed) return SubclusterType::kCompressed;
  const uint64_t offset = entry & kEntryOffsetMask;
  if (!extended) {
    if (entry & kOflagZero) {
      // As QEMU: offset 0 is plain zero even with COPIED.
      return offset ? SubclusterType::kZeroAlloc : SubclusterType::kZeroPlain;
    }
    return HasHostCluster(entry, data_file) ? SubclusterType::kNormal
                                            : SubclusterType::kUnallocated;
  }
  const uint32_t alloc = static_cast<uint32_t>(bitmap);
  const uint32_t zero = static_cast<uint32_t>(bitmap >> 32);
  if ((alloc & zero) != 0 || (entry & kOflagZero)) {
    return SubclusterType::kInvalid;
  }
  const bool a = (alloc >> sc) & 1, z = (zero >> sc) & 1;
  if (HasHostCluster(entry, data_file)) {
    if (a) return SubclusterType::kNormal;
    return z ? SubclusterType::kZeroAlloc : SubclusterType::kUnallocatedAlloc;
  }
  if (alloc != 0) return SubclusterType::kInvalid;
  return z ? SubclusterType::kZeroPlain : SubclusterType::kUnallocated;
}

// One past the last subcluster of the run that starts at `sc` and reads the
// same way: the same allocation and zero bits in `bitmap` (for a valid
// extended entry, the type depends on nothing else that varies inside the
// cluster). Without extended L2, `subclusters` is 1 and so is the answer.
inline int SubclusterRunEnd(uint64_t bitmap, int sc, int subclusters) {
  if (sc + 1 >= subclusters) return subclusters;
  const uint32_t alloc = static_cast<uint32_t>(bitmap);
  const uint32_t zero = static_cast<uint32_t>(bitmap >> 32);
  const uint32_t a = ((alloc >> sc) & 1) ? ~0u : 0u;
  const uint32_t z = ((zero >> sc) & 1) ? ~0u : 0u;
  const uint32_t differs = ((alloc ^ a) | (zero ^ z)) & (~0u << (sc + 1));
  if (differs == 0) return subclusters;
  const int end = __builtin_ctz(differs);
  return end < subclusters ? end : subclusters;
}

// A compressed cluster descriptor decoded for a given cluster size.
struct CompressedExtent {
  uint64_t host_offset;  // first byte of compressed data (not aligned)
  uint64_t length;       // bytes to read (end of the last sector)
};

inline CompressedExtent DecodeCompressed(uint64_t entry,
                                         uint32_t cluster_bits) {
  const uint32_t shift = 62 - (cluster_bits - 8);
  const uint64_t offset = entry & ((1ull << shift) - 1);
  const uint64_t sectors =
      ((entry >> shift) & ((1ull << (cluster_bits - 8)) - 1)) + 1;
  return CompressedExtent{offset, sectors * 512 - (offset & 511)};
}

// Builds a compressed descriptor. REQUIRES: the data fits the field widths
// (offset below 2^(62 - (cluster_bits - 8)), length <= 2 * cluster size).
inline uint64_t EncodeCompressed(uint64_t host_offset, uint64_t length,
                                 uint32_t cluster_bits) {
  const uint32_t shift = 62 - (cluster_bits - 8);
  const uint64_t last = (host_offset + length - 1) / 512;
  const uint64_t extra_sectors = last - host_offset / 512;
  return kOflagCompressed | (extra_sectors << shift) | host_offset;
}

// Refcount block entries: 2^order bits each (order 0..6, 1 to 64 bits).
// Widths of a byte and more are big-endian; narrower ones pack into each
// byte from its least significant bit. `block` is one refcount block (or
// several laid end to end: entry i is the i-th across them).
inline uint64_t ReadRefcount(const uint8_t* block, uint32_t order,
                             uint64_t i) {
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

// Stores `v` (truncated to the width) as entry i; the other entries
// sharing its byte keep their bits.
inline void WriteRefcount(uint8_t* block, uint32_t order, uint64_t i,
                          uint64_t v) {
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

// The largest refcount an entry of 2^order bits holds.
inline uint64_t MaxRefcount(uint32_t order) {
  return order >= 6 ? ~0ull : (1ull << (1u << order)) - 1;
}

// Entries in one refcount block of 2^cluster_bits bytes.
inline uint64_t RefcountBlockEntries(uint32_t cluster_bits, uint32_t order) {
  return (1ull << cluster_bits) * 8 >> order;
}

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_FORMAT_ENTRIES_H_
