// SPDX-License-Identifier: Apache-2.0
// What QEMU learns from the host file under an image when `qemu-img map`
// digs below the format layer: holes found with SEEK_DATA/SEEK_HOLE
// (block/file-posix.c), and whether a qcow2 file looks metadata-
// preallocated, which is when QEMU digs at all for qcow2
// (qcow2_detect_metadata_preallocation()).
//
// libqcow2's BlockStatus describes the format layer only, so `map` uses
// these to report what qemu-img reports (the heuristic itself is the
// library's, qcow2/maintenance.h). Read-only; not thread-safe.
#ifndef QCOW2_TOOLS_HOST_PROBE_H_
#define QCOW2_TOOLS_HOST_PROBE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace qcow2::tool {

class HostFile {
 public:
  // Opens `path` read-only. Errors name the path.
  static absl::StatusOr<std::unique_ptr<HostFile>> Open(
      const std::string& path);
  ~HostFile();
  HostFile(const HostFile&) = delete;
  HostFile& operator=(const HostFile&) = delete;

  // The answer file-posix gives for [offset, offset + len).
  struct Extent {
    uint64_t length = 0;  // bytes with this status; 0 only at/after EOF
    bool zero = false;    // a hole (reads as zeros); else data
    bool eof = false;     // the extent reaches the end of the file
  };
  // Never fails: like QEMU, an lseek() error means "data, as asked".
  Extent Probe(uint64_t offset, uint64_t len) const;

  uint64_t size() const { return size_; }
  uint64_t allocated() const { return allocated_; }  // st_blocks * 512
  const std::string& path() const { return path_; }

 private:
  HostFile(int fd, std::string path, uint64_t size, uint64_t allocated)
      : fd_(fd), path_(std::move(path)), size_(size), allocated_(allocated) {}

  int fd_;
  std::string path_;
  uint64_t size_;
  uint64_t allocated_;
};

// QEMU's metadata-preallocation heuristic for a qcow2 file: true when the
// clusters with a non-zero refcount reach max(n * 10 / 9, n + 2), n being
// the file's allocated bytes / cluster size (counting only clusters below
// the end of the file). Errors (unreadable or corrupt refcount structures)
// mean QEMU would treat the answer as false.
absl::StatusOr<bool> DetectMetadataPreallocation(const HostFile& file);

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_HOST_PROBE_H_
