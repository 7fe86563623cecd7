// SPDX-License-Identifier: Apache-2.0
// The byte store that images live in. The library reaches storage only
// through this interface, so embedders can supply their own (network block
// stores, encrypted files, test doubles).
#ifndef QCOW2_FILE_H_
#define QCOW2_FILE_H_

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "qcow2/export.h"

namespace qcow2 {

namespace internal {
class RingFile;  // lib/io/ring_file.h: not part of the public API
}  // namespace internal

// A random-access file. Implementations must be safe to call from several
// threads at once for non-overlapping ranges; the library orders
// overlapping requests itself.
class QCOW2_EXPORT File {
 public:
  virtual ~File() = default;

  // Fills `buf` with the bytes at `offset`. Bytes past the end of the file
  // read as zero (qcow2 images may legally end inside a data cluster).
  virtual absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) = 0;

  // Writes all of `data` at `offset`, growing the file if needed.
  virtual absl::Status WriteAt(uint64_t offset,
                               absl::Span<const uint8_t> data) = 0;

  // Vectored forms. The default implementations loop over ReadAt/WriteAt.
  virtual absl::Status ReadvAt(uint64_t offset, absl::Span<const iovec> iov);
  virtual absl::Status WritevAt(uint64_t offset, absl::Span<const iovec> iov);

  // Makes every completed write durable.
  virtual absl::Status Flush() = 0;

  // Current size in bytes.
  virtual absl::StatusOr<uint64_t> Size() = 0;

  // Sets the size; new bytes read as zero.
  virtual absl::Status Truncate(uint64_t size) = 0;

  // Extends the file from `old_size` (its size now) to `new_size` for
  // writes that will follow there; the new bytes read as zero. An
  // implementation may reserve the space too where that is cheap. Default:
  // Truncate(new_size).
  virtual absl::Status Extend(uint64_t old_size, uint64_t new_size);

  // Like Extend to offset+len, from an `offset` at or past the end the
  // caller last set, but safe while writes anywhere in the file are in
  // flight: it only reserves blocks there (fallocate) and never shrinks
  // the file or changes bytes already written. The library grows images
  // ahead this way with no lock held. Default: kUnimplemented, and the
  // library calls Extend under its lock instead.
  virtual absl::Status Reserve(uint64_t offset, uint64_t len);

  // Reserves space for [offset, offset+len) so later writes there cannot
  // fail for lack of space. Default: writes zeroes where the range lies past
  // the current end of the file.
  virtual absl::Status Allocate(uint64_t offset, uint64_t len);

  // Makes [offset, offset+len) read as zero. Default: writes zero buffers.
  virtual absl::Status WriteZeroes(uint64_t offset, uint64_t len);

  // Tells the store the range is no longer needed; afterwards it reads as
  // either its old contents or zero. Default: does nothing.
  virtual absl::Status Discard(uint64_t offset, uint64_t len);

  // Whether the bytes at `offset` are stored data (true) or a hole that
  // reads as zeros (false); sets *len to the length of that run, at most
  // `max_len`. Default: everything is data.
  virtual absl::StatusOr<bool> DataRun(uint64_t /*offset*/, uint64_t max_len,
                                       uint64_t* len) {
    *len = max_len;
    return true;
  }

  // A name for error messages (usually the path).
  virtual const std::string& name() const = 0;

  // Required alignment of offsets, lengths and buffers (O_DIRECT); 1 when
  // any alignment works. Implementations that need alignment handle
  // unaligned requests themselves, more slowly.
  virtual uint32_t alignment() const { return 1; }

  // Internal to the library: the files it opens itself (OpenPosixFile)
  // return what its io_uring queues need to submit their I/O to the
  // kernel directly, bypassing the calls above. Every other File returns
  // null (the default), and a Queue calls it like a synchronous Image
  // does. A wrapper that watches or changes calls must keep the default.
  virtual internal::RingFile* ring_file() { return nullptr; }
};

struct FileOptions {
  bool read_only = true;
  // Open with O_DIRECT (bypass the page cache). Default: false.
  bool direct = false;
  // Create the file if it does not exist. Default: false.
  bool create = false;
  // With `create`: fail if the file exists (O_EXCL). Default: false.
  bool exclusive = false;
  // Take the image locks QEMU takes (open file description locks on bytes
  // 100-103 and 200-203, see docs/security.md): a writable file excludes
  // every other writer and every reader that does not share writes; a
  // read-only file excludes writers unless `force_share`. A conflict fails
  // the open with kUnavailable naming the file. The locks last as long as
  // the File. Only files with a descriptor (OpenPosixFile) take locks; an
  // embedder's own File has none unless it takes them itself.
  // Default: true.
  bool lock = true;
  // With `lock` and `read_only`: hold only the read lock and let writers
  // in (qemu-img -U). The reader may then see a torn, changing image.
  // Default: false.
  bool force_share = false;
  // Flush() returns at once and makes nothing durable: QEMU's
  // cache.no-flush (qemu-img -t unsafe), for an image whose result is
  // synced or thrown away as a whole, such as a conversion's target.
  // Reads and writes are as without it (a Queue still sends them through
  // io_uring). Default: false.
  bool no_flush = false;
};

// Opens a file with pread/pwrite/fdatasync, and locks it as `opts.lock`
// says. A block device works as a file of fixed size (BLKGETSIZE64):
// growing it past its end fails with kResourceExhausted ("no space left
// on /dev/X (N GiB)"), and its unwritten space is never assumed to read as
// zeros. Errors name the path; ENOSPC and EDQUOT are kResourceExhausted
// "no space left on <path>".
QCOW2_EXPORT
absl::StatusOr<std::unique_ptr<File>> OpenPosixFile(const std::string& path,
                                                    const FileOptions& opts);

// Opens the files of a backing chain. The default opener uses
// OpenPosixFile; tests and embedders substitute their own.
class QCOW2_EXPORT FileOpener {
 public:
  virtual ~FileOpener() = default;
  virtual absl::StatusOr<std::unique_ptr<File>> Open(
      const std::string& path, const FileOptions& opts) = 0;
};

// The process-wide opener that calls OpenPosixFile. Never null.
QCOW2_EXPORT FileOpener* DefaultFileOpener();

}  // namespace qcow2

#endif  // QCOW2_FILE_H_
