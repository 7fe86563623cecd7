// SPDX-License-Identifier: Apache-2.0
#include "tools/host_probe.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/format/entries.h"
#include "lib/format/header.h"
#include "lib/base/endian.h"

namespace qcow2::tool {

using internal::LoadBE32;
using internal::LoadBE64;

absl::StatusOr<std::unique_ptr<HostFile>> HostFile::Open(
    const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open ", path));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat("cannot stat ", path));
  }
  return std::unique_ptr<HostFile>(
      new HostFile(fd, path, static_cast<uint64_t>(st.st_size),
                   static_cast<uint64_t>(st.st_blocks) * 512));
}

HostFile::~HostFile() { close(fd_); }

HostFile::Extent HostFile::Probe(uint64_t offset, uint64_t len) const {
  Extent e;
  if (offset >= size_) {
    e.eof = true;
    return e;
  }
  len = std::min(len, size_ - offset);
  const auto finish = [&](uint64_t n, bool zero) {
    e.length = std::min(n, len);
    e.zero = zero;
    e.eof = offset + e.length == size_;
    return e;
  };
  // find_allocation() and raw_co_block_status() in block/file-posix.c.
  off_t data = lseek(fd_, static_cast<off_t>(offset), SEEK_DATA);
  if (data < 0) return finish(len, errno == ENXIO);  // trailing hole
  uint64_t d = static_cast<uint64_t>(data);
  if (d < offset) return finish(len, false);
  if (d > offset) return finish(d - offset, true);
  off_t hole = lseek(fd_, static_cast<off_t>(offset), SEEK_HOLE);
  if (hole < 0) return finish(len, errno == ENXIO);
  uint64_t h = static_cast<uint64_t>(hole);
  if (h > offset) return finish(h - offset, false);
  return finish(len, false);  // a hole appeared under us: know nothing
}

absl::Status HostFile::ReadAt(uint64_t offset, uint8_t* buf,
                              size_t buf_len) const {
  size_t done = 0;
  while (done < buf_len) {
    ssize_t n = pread(fd_, buf + done, buf_len - done,
                      static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      return absl::ErrnoToStatus(err, absl::StrCat("reading ", path_));
    }
    if (n == 0) {
      std::memset(buf + done, 0, buf_len - done);
      break;
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

namespace {

// The header fields the heuristic needs.
struct RefcountGeometry {
  uint32_t cluster_bits = 16;
  uint32_t refcount_order = 4;
  uint64_t table_offset = 0;
  uint32_t table_clusters = 0;
};

absl::StatusOr<RefcountGeometry> ReadGeometry(const HostFile& file) {
  uint8_t h[104];
  if (auto s = file.ReadAt(0, h, sizeof h); !s.ok()) return s;
  if (LoadBE32(h) != internal::kQcowMagic) {
    return absl::DataLossError(absl::StrCat(file.path(), ": not qcow2"));
  }
  RefcountGeometry g;
  uint32_t version = LoadBE32(h + 4);
  g.cluster_bits = LoadBE32(h + 20);
  g.table_offset = LoadBE64(h + 48);
  g.table_clusters = LoadBE32(h + 56);
  g.refcount_order = version >= 3 ? LoadBE32(h + 96) : 4;
  if (g.cluster_bits < internal::kMinClusterBits ||
      g.cluster_bits > internal::kMaxClusterBits || g.refcount_order > 6 ||
      (uint64_t{g.table_clusters} << g.cluster_bits) >
          internal::kMaxRefcountTableBytes) {
    return absl::DataLossError(
        absl::StrCat(file.path(), ": bad refcount geometry"));
  }
  return g;
}

// Reads refcounts cluster by cluster, keeping the last refcount block.
class RefcountReader {
 public:
  RefcountReader(const HostFile& file, const RefcountGeometry& g)
      : file_(file), g_(g) {}

  absl::Status LoadTable() {
    std::vector<uint8_t> raw(uint64_t{g_.table_clusters} << g_.cluster_bits);
    if (auto s = file_.ReadAt(g_.table_offset, raw.data(), raw.size());
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
    const uint64_t block = table_[index] & internal::kRefTableOffsetMask;
    if (block == 0) return false;
    if (block & (cluster_size - 1)) {
      return absl::DataLossError(
          absl::StrCat(file_.path(), ": unaligned refcount block offset"));
    }
    if (block != block_offset_) {
      block_.resize(cluster_size);
      block_offset_ = 0;
      if (auto s = file_.ReadAt(block, block_.data(), block_.size()); !s.ok()) {
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
  const HostFile& file_;
  RefcountGeometry g_;
  std::vector<uint64_t> table_;
  uint64_t block_offset_ = 0;
  std::vector<uint8_t> block_;
};

}  // namespace

absl::StatusOr<bool> DetectMetadataPreallocation(const HostFile& file) {
  absl::StatusOr<RefcountGeometry> g = ReadGeometry(file);
  if (!g.ok()) return g.status();
  const uint64_t cluster_size = uint64_t{1} << g->cluster_bits;
  const uint64_t real_clusters = file.allocated() / cluster_size;
  const uint64_t threshold =
      std::max(real_clusters * 10 / 9, real_clusters + 2);
  const uint64_t end_cluster = (file.size() + cluster_size - 1) / cluster_size;

  RefcountReader reader(file, *g);
  if (auto s = reader.LoadTable(); !s.ok()) return s;
  uint64_t in_use = 0;
  for (uint64_t i = 0; i < end_cluster && in_use < threshold; ++i) {
    absl::StatusOr<bool> used = reader.InUse(i);
    if (!used.ok()) return used.status();
    in_use += *used ? 1 : 0;
  }
  return in_use >= threshold;
}

}  // namespace qcow2::tool
