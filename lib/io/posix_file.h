// SPDX-License-Identifier: Apache-2.0
// Internal: the POSIX File and helpers shared with the io_uring backend.
#ifndef QCOW2_LIB_IO_POSIX_FILE_H_
#define QCOW2_LIB_IO_POSIX_FILE_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "lib/io/ring_file.h"
#include "qcow2/file.h"

namespace qcow2::internal {

// Converts an errno into a Status naming the operation and file: "<what>
// <name>: <strerror>". ENOSPC and EDQUOT become kResourceExhausted "no
// space left on <name> (<what> without a trailing " of": <strerror>)".
absl::Status ErrnoError(int err, const std::string& what,
                        const std::string& name);

// "512 bytes", "64 MiB", "1.5 GiB": a size for a message.
std::string ByteCount(uint64_t bytes);

// A heap buffer aligned for O_DIRECT. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer(size_t size, size_t alignment);
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  uint8_t* data() { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_;
  size_t size_;
};

// The alignment O_DIRECT needs for `fd`.
absl::StatusOr<uint32_t> ProbeDirectAlignment(int fd);

// The descriptor that carries a file's image locks (file_lock.h): an open
// file description of its own, onto the same file as `data_fd`, that no
// I/O ever uses. The io_uring executor holds references to the data
// descriptor's open file description for as long as requests are in flight,
// and the kernel tears a dead process's ring down only after the process
// is reaped; locks on that description would outlive the process. Locks on
// this one go when the process's descriptors are closed, whatever is still
// in flight. Opened O_RDONLY (F_RDLCK needs read access, nothing more),
// O_CLOEXEC and O_NONBLOCK (a FIFO never blocks it); fails if `path` no longer names the file `data_fd` opened
// (replaced in between: st_dev and st_ino differ).
absl::StatusOr<int> OpenLockDescriptor(const std::string& path, int data_fd);

class PosixFile : public File, public RingFile {
 public:
  // Takes ownership of `fd` (a regular file or a block device) and of
  // `lock_fd` (OpenLockDescriptor's, or -1 for a file opened without
  // locks). `no_flush`: Flush() does nothing (FileOptions::no_flush).
  PosixFile(int fd, std::string name, uint32_t alignment,
            bool no_flush = false, int lock_fd = -1);
  ~PosixFile() override;

  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) override;
  absl::Status WriteAt(uint64_t offset,
                       absl::Span<const uint8_t> data) override;
  // One preadv/pwritev for every segment when all are aligned (always,
  // without O_DIRECT); else segment by segment through ReadAt/WriteAt.
  absl::Status ReadvAt(uint64_t offset, absl::Span<const iovec> iov) override;
  absl::Status WritevAt(uint64_t offset, absl::Span<const iovec> iov) override;
  absl::Status Flush() override;
  absl::StatusOr<uint64_t> Size() override;
  absl::Status Truncate(uint64_t size) override;
  // Reserves the new range with fallocate (unwritten blocks) where it
  // can, else a plain truncate. On a file system that lives in the page
  // cache (tmpfs, ramfs), where fallocate would allocate and zero every
  // page only for the writes to fill them again, both just lengthen the
  // file.
  absl::Status Extend(uint64_t old_size, uint64_t new_size) override;
  absl::Status Reserve(uint64_t offset, uint64_t len) override;
  absl::Status Allocate(uint64_t offset, uint64_t len) override;
  absl::Status WriteZeroes(uint64_t offset, uint64_t len) override;
  absl::Status Discard(uint64_t offset, uint64_t len) override;
  absl::StatusOr<bool> DataRun(uint64_t offset, uint64_t max_len,
                               uint64_t* len) override;
  const std::string& name() const override { return name_; }
  uint32_t alignment() const override { return alignment_; }
  // The descriptor for I/O (pread, pwrite, io_uring). Never locked.
  int fd() const { return fd_; }
  // The descriptor that carries the image locks, -1 without: every lock
  // change of the file goes here, never to fd().
  int lock_fd() const { return lock_fd_; }
  // Flush() makes nothing durable: the io_uring executor skips it too.
  bool no_flush() const { return no_flush_; }
  // The error of a failed call (`what`: "write at 4096") on this file, as
  // ErrnoError gives it; ENOSPC on a device names the device's size. For
  // the io_uring executor, whose calls fail outside this class.
  absl::Status Error(int err, const std::string& what) const;

  // RingFile: the io_uring ring does this file's I/O on fd().
  RingFile* ring_file() override { return this; }
  int ring_fd() const override { return fd_; }
  uint32_t ring_alignment() const override { return alignment_; }
  bool ring_skips_flush() const override { return no_flush_; }
  absl::Status RingError(int err, const std::string& what) const override {
    return Error(err, what);
  }

 private:
  absl::Status RawRead(uint64_t offset, uint8_t* buf, size_t len);
  absl::Status RawWrite(uint64_t offset, const uint8_t* buf, size_t len);
  bool Aligned(uint64_t offset, const void* buf, size_t len) const;
  // preadv/pwritev until every byte of `iov` is done (short transfers
  // resumed; a read past the end of the file fills zeros).
  absl::Status RawVector(uint64_t offset, absl::Span<const iovec> iov,
                         bool write);
  // Makes the file at least `size` bytes long; never shorter. Reserve's
  // way on tmpfs and ramfs, and where the file system has no fallocate.
  // (Reserve runs with no lock of the image's held: size_mu_ orders the
  // two steps against other lengthenings.)
  absl::Status GrowTo(uint64_t size);
  // A device's size is fixed: OK up to it, kResourceExhausted past it.
  // REQUIRES: device_size_.
  absl::Status DeviceCannotGrow(uint64_t size) const;

  const int fd_;
  const int lock_fd_;
  const std::string name_;
  const uint32_t alignment_;
  const bool no_flush_;
  const bool page_cache_only_;  // tmpfs or ramfs
  // Set for a block device: its size (BLKGETSIZE64), which never changes.
  const std::optional<uint64_t> device_size_;
  std::mutex size_mu_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_IO_POSIX_FILE_H_
