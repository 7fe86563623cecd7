// SPDX-License-Identifier: Apache-2.0
#include "tools/host_probe.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "qcow2/maintenance.h"

namespace qcow2::tool {

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

absl::StatusOr<bool> DetectMetadataPreallocation(const HostFile& file) {
  return ::qcow2::DetectMetadataPreallocation(file.path());
}

}  // namespace qcow2::tool
