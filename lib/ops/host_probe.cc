// SPDX-License-Identifier: Apache-2.0
// QEMU's metadata-preallocation heuristic (qcow2/maintenance.h): what
// `qemu-img map` asks of a qcow2 file before it digs into the host file's
// holes. Reads the header and the refcount structures straight from the
// file, with no image open.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/endian.h"
#include "lib/format/entries.h"
#include "lib/format/header.h"
#include "qcow2/maintenance.h"

namespace qcow2 {
namespace {

using internal::kMaxClusterBits;
using internal::kMaxRefcountTableBytes;
using internal::kMinClusterBits;
using internal::kQcowMagic;
using internal::kRefTableOffsetMask;
using internal::LoadBE32;
using internal::LoadBE64;

// The header fields the heuristic needs.
struct RefcountGeometry {
  uint32_t cluster_bits = 16;
  uint32_t refcount_order = 4;
  uint64_t table_offset = 0;
  uint32_t table_clusters = 0;
};

absl::StatusOr<RefcountGeometry> ReadGeometry(File* file) {
  uint8_t h[104];
  if (auto s = file->ReadAt(0, absl::MakeSpan(h, sizeof h)); !s.ok()) return s;
  if (LoadBE32(h) != kQcowMagic) {
    return absl::DataLossError(absl::StrCat(file->name(), ": not qcow2"));
  }
  RefcountGeometry g;
  uint32_t version = LoadBE32(h + 4);
  g.cluster_bits = LoadBE32(h + 20);
  g.table_offset = LoadBE64(h + 48);
  g.table_clusters = LoadBE32(h + 56);
  g.refcount_order = version >= 3 ? LoadBE32(h + 96) : 4;
  if (g.cluster_bits < kMinClusterBits ||
      g.cluster_bits > kMaxClusterBits || g.refcount_order > 6 ||
      (uint64_t{g.table_clusters} << g.cluster_bits) >
          kMaxRefcountTableBytes) {
    return absl::DataLossError(
        absl::StrCat(file->name(), ": bad refcount geometry"));
  }
  return g;
}

// Reads refcounts cluster by cluster, keeping the last refcount block.
class RefcountReader {
 public:
  RefcountReader(File* file, const RefcountGeometry& g)
      : file_(file), g_(g) {}

  absl::Status LoadTable() {
    std::vector<uint8_t> raw(uint64_t{g_.table_clusters} << g_.cluster_bits);
    if (auto s = file_->ReadAt(g_.table_offset, absl::MakeSpan(raw));
        !s.ok()) {
      return s;
    }
    table_.resize(raw.size() / 8);
    for (size_t i = 0; i < table_.size(); ++i) {
      table_[i] = LoadBE64(&raw[i * 8]);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<bool> InUse(uint64_t cluster) {
    const uint64_t cluster_size = uint64_t{1} << g_.cluster_bits;
    const uint64_t per_block = (cluster_size * 8) >> g_.refcount_order;
    const uint64_t index = cluster / per_block;
    if (index >= table_.size()) return false;
    const uint64_t block = table_[index] & kRefTableOffsetMask;
    if (block == 0) return false;
    if (block & (cluster_size - 1)) {
      return absl::DataLossError(
          absl::StrCat(file_->name(), ": unaligned refcount block offset"));
    }
    if (block != block_offset_) {
      block_.resize(cluster_size);
      block_offset_ = 0;
      if (auto s = file_->ReadAt(block, absl::MakeSpan(block_)); !s.ok()) {
        return s;
      }
      block_offset_ = block;
    }
    const uint64_t entry = cluster % per_block;
    const uint32_t bits = 1u << g_.refcount_order;
    if (bits < 8) {
      const uint64_t bit = entry * bits;
      return ((block_[bit / 8] >> (bit % 8)) & ((1u << bits) - 1)) != 0;
    }
    const size_t bytes = bits / 8;
    const uint8_t* p = &block_[entry * bytes];
    return std::any_of(p, p + bytes, [](uint8_t b) { return b != 0; });
  }

 private:
  File* file_;
  RefcountGeometry g_;
  std::vector<uint64_t> table_;
  uint64_t block_offset_ = 0;
  std::vector<uint8_t> block_;
};

}  // namespace

absl::StatusOr<bool> DetectMetadataPreallocation(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot stat ", path));
  }
  FileOptions fo;
  fo.read_only = true;
  fo.lock = false;
  absl::StatusOr<std::unique_ptr<File>> file =
      DefaultFileOpener()->Open(path, fo);
  if (!file.ok()) return file.status();
  absl::StatusOr<RefcountGeometry> g = ReadGeometry(file->get());
  if (!g.ok()) return g.status();
  const uint64_t cluster_size = uint64_t{1} << g->cluster_bits;
  const uint64_t allocated = static_cast<uint64_t>(st.st_blocks) * 512;
  const uint64_t real_clusters = allocated / cluster_size;
  const uint64_t threshold =
      std::max(real_clusters * 10 / 9, real_clusters + 2);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint64_t end_cluster = (size + cluster_size - 1) / cluster_size;

  RefcountReader reader(file->get(), *g);
  if (auto s = reader.LoadTable(); !s.ok()) return s;
  uint64_t in_use = 0;
  for (uint64_t i = 0; i < end_cluster && in_use < threshold; ++i) {
    absl::StatusOr<bool> used = reader.InUse(i);
    if (!used.ok()) return used.status();
    in_use += *used ? 1 : 0;
  }
  return in_use >= threshold;
}

}  // namespace qcow2
