// SPDX-License-Identifier: Apache-2.0
// The host clusters of a writable qcow2 image that hold metadata: the
// header, the L1 table, the L2 tables it names, the refcount table and the
// refcount blocks it names. Guest data must never be written there, and the allocator must
// never hand such a cluster out, whatever the refcounts say.
//
// Built when an image is opened for writing (ClusterMap::TrackMetadata,
// Refcounts::TrackMetadata) and kept up to date wherever an L1 entry or a
// refcount table entry changes, so that a lookup is one hash probe per
// cluster. Not thread-safe: used under the image's metadata lock.
#ifndef QCOW2_LIB_META_METADATA_SET_H_
#define QCOW2_LIB_META_METADATA_SET_H_

#include <cstdint>

#include "absl/container/flat_hash_map.h"

namespace qcow2::internal {

class MetadataSet {
 public:
  enum Kind : int {
    kHeader,
    kL1Table,
    kL2Table,
    kRefcountTable,
    kRefcountBlock
  };
  static constexpr int kKinds = 5;

  explicit MetadataSet(uint32_t cluster_bits) : cluster_bits_(cluster_bits) {}

  // Counts every cluster overlapping [offset, offset + len) as `kind`. A
  // cluster may be counted more than once (even as several kinds, in a
  // corrupt image); it stays metadata until every use is removed.
  void Add(Kind kind, uint64_t offset, uint64_t len) {
    if (len == 0) return;
    for (uint64_t c = First(offset); c <= Last(offset, len); ++c) {
      ++uses_[c].count[kind];
    }
  }
  // Undoes one Add() of the same range.
  void Remove(Kind kind, uint64_t offset, uint64_t len) {
    if (len == 0) return;
    for (uint64_t c = First(offset); c <= Last(offset, len); ++c) {
      auto it = uses_.find(c);
      if (it == uses_.end() || it->second.count[kind] == 0) continue;
      if (--it->second.count[kind] == 0 && it->second.empty()) uses_.erase(it);
    }
  }

  // The first cluster overlapping [offset, offset + len) that holds
  // metadata of a kind in `kinds` (a mask of 1 << Kind), and its kind.
  // Returns false when there is none.
  bool Find(uint64_t offset, uint64_t len, uint32_t kinds, uint64_t* cluster,
            Kind* kind) const {
    if (len == 0 || uses_.empty()) return false;
    for (uint64_t c = First(offset); c <= Last(offset, len); ++c) {
      auto it = uses_.find(c);
      if (it == uses_.end()) continue;
      for (int k = 0; k < kKinds; ++k) {
        if (((kinds >> k) & 1) && it->second.count[k] > 0) {
          *cluster = c;
          *kind = static_cast<Kind>(k);
          return true;
        }
      }
    }
    return false;
  }

  // "the L1 table", "an L2 table", ... for messages.
  static const char* Name(Kind kind) {
    switch (kind) {
      case kHeader:
        return "the header";
      case kL1Table:
        return "the L1 table";
      case kL2Table:
        return "an L2 table";
      case kRefcountTable:
        return "the refcount table";
      case kRefcountBlock:
        return "a refcount block";
    }
    return "metadata";
  }

 private:
  struct Uses {
    uint32_t count[kKinds] = {};
    bool empty() const {
      for (uint32_t n : count) {
        if (n != 0) return false;
      }
      return true;
    }
  };
  uint64_t First(uint64_t offset) const { return offset >> cluster_bits_; }
  uint64_t Last(uint64_t offset, uint64_t len) const {
    return (offset + len - 1) >> cluster_bits_;
  }

  const uint32_t cluster_bits_;
  absl::flat_hash_map<uint64_t, Uses> uses_;  // by host cluster index
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_META_METADATA_SET_H_
