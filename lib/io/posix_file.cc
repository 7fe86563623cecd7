// SPDX-License-Identifier: Apache-2.0
// File over a POSIX file descriptor: pread/pwrite, fdatasync, fallocate.
// With O_DIRECT, unaligned requests go through an aligned bounce buffer.
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <linux/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/io/file_lock.h"
#include "lib/io/posix_file.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"

namespace qcow2 {
namespace internal {

absl::Status ErrnoError(int err, const std::string& what,
                        const std::string& name) {
  if (err == ENOSPC || err == EDQUOT) {
    absl::string_view op = what;
    if (absl::EndsWith(op, " of")) op.remove_suffix(3);
    return absl::ResourceExhaustedError(absl::StrCat(
        "no space left on ", name, " (", op, ": ", std::strerror(err), ")"));
  }
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", name));
}

std::string ByteCount(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"bytes", "KiB", "MiB", "GiB",
                                           "TiB", "PiB", "EiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return absl::StrCat(bytes, " bytes");
  char buf[32];
  std::snprintf(buf, sizeof(buf), v < 10 ? "%.1f %s" : "%.0f %s", v,
                kUnits[u]);
  std::string out = buf;
  if (absl::StartsWith(out, absl::StrCat(static_cast<uint64_t>(v), ".0 "))) {
    out.erase(out.find(".0 "), 2);
  }
  return out;
}

namespace {

// A regular file on tmpfs or ramfs. (Not a device node: /dev is a tmpfs
// too, but the device is not.)
bool OnPageCacheOnlyFileSystem(int fd) {
  struct stat st;
  struct statfs fs;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (::fstatfs(fd, &fs) != 0) return false;
  return fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC;
}

// The size of a block device; nullopt for anything else (or when the
// kernel will not say).
std::optional<uint64_t> DeviceSize(int fd) {
  struct stat st;
  uint64_t bytes = 0;
  if (::fstat(fd, &st) != 0 || !S_ISBLK(st.st_mode)) return std::nullopt;
  if (::ioctl(fd, BLKGETSIZE64, &bytes) != 0) return std::nullopt;
  return bytes;
}

}  // namespace

PosixFile::PosixFile(int fd, std::string name, uint32_t alignment,
                     bool no_flush, int lock_fd)
    : fd_(fd),
      lock_fd_(lock_fd),
      name_(std::move(name)),
      alignment_(alignment),
      no_flush_(no_flush),
      page_cache_only_(OnPageCacheOnlyFileSystem(fd)),
      device_size_(DeviceSize(fd)) {}

absl::Status PosixFile::Error(int err, const std::string& what) const {
  if (device_size_ && (err == ENOSPC || err == EDQUOT)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no space left on ", name_, " (",
                     ByteCount(*device_size_), "): ", what, " failed"));
  }
  return ErrnoError(err, absl::StrCat(what, " of"), name_);
}

absl::Status PosixFile::DeviceCannotGrow(uint64_t size) const {
  if (size <= *device_size_) return absl::OkStatus();
  return Error(ENOSPC, absl::StrCat("growing the image to ", size, " bytes"));
}

PosixFile::~PosixFile() {
  // The data descriptor first: the locks are the last thing to go.
  ::close(fd_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

absl::StatusOr<int> OpenLockDescriptor(const std::string& path, int data_fd) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot open ", path, " again for its image lock"));
  }
  struct stat data, lock;
  if (::fstat(data_fd, &data) != 0 || ::fstat(fd, &lock) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(err, "fstat of", path);
  }
  if (data.st_dev != lock.st_dev || data.st_ino != lock.st_ino) {
    ::close(fd);
    return absl::AbortedError(absl::StrCat(
        path, " was replaced while it was being opened (its lock would be "
              "on another file); open it again"));
  }
  return fd;
}

absl::Status PosixFile::RawRead(uint64_t offset, uint8_t* buf, size_t len) {
  while (len > 0) {
    ssize_t n = ::pread(fd_, buf, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Error(errno, absl::StrCat("read at ", offset));
    }
    if (n == 0) {  // past the end of the file: zeros
      std::memset(buf, 0, len);
      return absl::OkStatus();
    }
    buf += n;
    offset += n;
    len -= n;
  }
  return absl::OkStatus();
}

absl::Status PosixFile::RawWrite(uint64_t offset, const uint8_t* buf,
                                 size_t len) {
  while (len > 0) {
    ssize_t n = ::pwrite(fd_, buf, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Error(errno, absl::StrCat("write at ", offset));
    }
    if (n == 0) return Error(ENOSPC, absl::StrCat("write at ", offset));
    buf += n;
    offset += n;
    len -= n;
  }
  return absl::OkStatus();
}

bool PosixFile::Aligned(uint64_t offset, const void* buf, size_t len) const {
  return IsAligned(offset, alignment_) && IsAligned(len, alignment_) &&
         IsAligned(reinterpret_cast<uintptr_t>(buf), alignment_);
}

absl::Status PosixFile::RawVector(uint64_t offset, absl::Span<const iovec> iov,
                                  bool write) {
  std::vector<iovec> rest(iov.begin(), iov.end());
  size_t first = 0;
  while (true) {
    while (first < rest.size() && rest[first].iov_len == 0) ++first;
    if (first == rest.size()) break;
    const int count =
        static_cast<int>(std::min<size_t>(rest.size() - first, IOV_MAX));
    const ssize_t n =
        write ? ::pwritev(fd_, &rest[first], count, static_cast<off_t>(offset))
              : ::preadv(fd_, &rest[first], count, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Error(errno, absl::StrCat(write ? "write at " : "read at ",
                                       offset));
    }
    if (n == 0) {
      if (write) return Error(ENOSPC, absl::StrCat("write at ", offset));
      // Past the end of the file: the rest reads as zeros.
      for (size_t i = first; i < rest.size(); ++i) {
        std::memset(rest[i].iov_base, 0, rest[i].iov_len);
      }
      return absl::OkStatus();
    }
    offset += static_cast<uint64_t>(n);
    size_t done = static_cast<size_t>(n);
    while (first < rest.size() && done >= rest[first].iov_len) {
      done -= rest[first].iov_len;
      ++first;
    }
    if (done > 0) {  // a short transfer ended inside this segment
      rest[first].iov_base = static_cast<uint8_t*>(rest[first].iov_base) + done;
      rest[first].iov_len -= done;
    }
  }
  return absl::OkStatus();
}

absl::Status PosixFile::ReadvAt(uint64_t offset, absl::Span<const iovec> iov) {
  uint64_t pos = offset;
  for (const iovec& v : iov) {
    if (!Aligned(pos, v.iov_base, v.iov_len)) return File::ReadvAt(offset, iov);
    pos += v.iov_len;
  }
  return RawVector(offset, iov, /*write=*/false);
}

absl::Status PosixFile::WritevAt(uint64_t offset,
                                 absl::Span<const iovec> iov) {
  uint64_t pos = offset;
  for (const iovec& v : iov) {
    if (!Aligned(pos, v.iov_base, v.iov_len)) {
      return File::WritevAt(offset, iov);
    }
    pos += v.iov_len;
  }
  return RawVector(offset, iov, /*write=*/true);
}

absl::Status PosixFile::ReadAt(uint64_t offset, absl::Span<uint8_t> buf) {
  if (Aligned(offset, buf.data(), buf.size())) {
    return RawRead(offset, buf.data(), buf.size());
  }
  uint64_t start = AlignDown(offset, alignment_);
  uint64_t end = AlignUp(offset + buf.size(), alignment_);
  AlignedBuffer bounce(end - start, alignment_);
  RETURN_IF_ERROR(RawRead(start, bounce.data(), end - start));
  std::memcpy(buf.data(), bounce.data() + (offset - start), buf.size());
  return absl::OkStatus();
}

absl::Status PosixFile::WriteAt(uint64_t offset,
                                absl::Span<const uint8_t> data) {
  if (Aligned(offset, data.data(), data.size())) {
    return RawWrite(offset, data.data(), data.size());
  }
  // Read-modify-write of the aligned blocks around the request.
  uint64_t start = AlignDown(offset, alignment_);
  uint64_t end = AlignUp(offset + data.size(), alignment_);
  AlignedBuffer bounce(end - start, alignment_);
  const bool head_partial =
      start != offset || offset + data.size() < start + alignment_;
  const bool tail_partial = end != offset + data.size();
  if (head_partial) {
    RETURN_IF_ERROR(RawRead(start, bounce.data(), alignment_));
  }
  if (tail_partial && !(head_partial && end - alignment_ == start)) {
    RETURN_IF_ERROR(
        RawRead(end - alignment_, bounce.data() + (end - alignment_ - start),
                alignment_));
  }
  std::memcpy(bounce.data() + (offset - start), data.data(), data.size());
  return RawWrite(start, bounce.data(), end - start);
}

absl::Status PosixFile::Flush() {
  if (no_flush_) return absl::OkStatus();
  while (::fdatasync(fd_) != 0) {
    if (errno == EINTR) continue;
    return ErrnoError(errno, "fdatasync of", name_);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PosixFile::Size() {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoError(errno, "fstat of", name_);
  if (device_size_) return *device_size_;
  return static_cast<uint64_t>(st.st_size);
}

absl::Status PosixFile::Truncate(uint64_t size) {
  // A device keeps its size and its bytes: the new bytes of a grown image
  // hold whatever the device held there, which the driver never assumes
  // reads as zeros (its allocator treats everything below the device's
  // end as written).
  if (device_size_) return DeviceCannotGrow(size);
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
    return ErrnoError(errno, absl::StrCat("truncate to ", size, " of"), name_);
  }
  return absl::OkStatus();
}

absl::Status PosixFile::GrowTo(uint64_t size) {
  if (device_size_) return DeviceCannotGrow(size);
  std::lock_guard<std::mutex> lock(size_mu_);
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoError(errno, "fstat of", name_);
  if (static_cast<uint64_t>(st.st_size) >= size) return absl::OkStatus();
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
    return ErrnoError(errno, absl::StrCat("growing to ", size, " bytes"),
                      name_);
  }
  return absl::OkStatus();
}

absl::Status PosixFile::Extend(uint64_t old_size, uint64_t new_size) {
  if (page_cache_only_ || device_size_) return GrowTo(new_size);
  // Blocks reserved ahead (unwritten extents, reading as zeros) let a direct
  // write land without allocating: ext4 then takes the inode lock shared,
  // where a write into a hole takes it exclusively.
  if (new_size > old_size &&
      ::fallocate(fd_, 0, static_cast<off_t>(old_size),
                  static_cast<off_t>(new_size - old_size)) == 0) {
    return absl::OkStatus();
  }
  // No fallocate here (EOPNOTSUPP), or no room to reserve (ENOSPC,
  // EDQUOT): a size change alone. Writes into the range then report a
  // full disk themselves. The truncate also undoes a partial reservation.
  return Truncate(new_size);
}

absl::Status PosixFile::Reserve(uint64_t offset, uint64_t len) {
  if (page_cache_only_ || device_size_) return GrowTo(offset + len);
  if (::fallocate(fd_, 0, static_cast<off_t>(offset),
                  static_cast<off_t>(len)) == 0) {
    return absl::OkStatus();
  }
  if (errno == EOPNOTSUPP || errno == ENOSYS) {
    // No fallocate on this file system (ext2, some network and FUSE file
    // systems): lengthen the file only, never shortening it, as on tmpfs.
    // Writes there allocate (and report a full disk) themselves.
    return GrowTo(offset + len);
  }
  return ErrnoError(errno, absl::StrCat("reserving ", len, " bytes at ",
                                        offset, " of"),
                    name_);
}

absl::Status PosixFile::Allocate(uint64_t offset, uint64_t len) {
  if (::fallocate(fd_, 0, static_cast<off_t>(offset),
                  static_cast<off_t>(len)) == 0) {
    return absl::OkStatus();
  }
  if (errno != EOPNOTSUPP) {
    return ErrnoError(errno, "fallocate of", name_);
  }
  return File::Allocate(offset, len);
}

absl::Status PosixFile::WriteZeroes(uint64_t offset, uint64_t len) {
  if (::fallocate(fd_, FALLOC_FL_ZERO_RANGE, static_cast<off_t>(offset),
                  static_cast<off_t>(len)) == 0) {
    return absl::OkStatus();
  }
  if (errno == ENOSPC || errno == EIO) {
    return ErrnoError(errno, "zeroing range of", name_);
  }
  if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  static_cast<off_t>(offset), static_cast<off_t>(len)) == 0) {
    // Punching keeps the size: extend explicitly if the range was past EOF.
    ASSIGN_OR_RETURN(uint64_t size, Size());
    if (offset + len > size) return Truncate(offset + len);
    return absl::OkStatus();
  }
  if (alignment_ > 1) {
    AlignedBuffer zeros(std::min<uint64_t>(len, 1 << 20), alignment_);
    std::memset(zeros.data(), 0, zeros.size());
    while (len > 0) {
      size_t n = std::min<uint64_t>(len, zeros.size());
      RETURN_IF_ERROR(WriteAt(offset, absl::MakeConstSpan(zeros.data(), n)));
      offset += n;
      len -= n;
    }
    return absl::OkStatus();
  }
  return File::WriteZeroes(offset, len);
}

absl::Status PosixFile::Discard(uint64_t offset, uint64_t len) {
  if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  static_cast<off_t>(offset), static_cast<off_t>(len)) != 0 &&
      errno != EOPNOTSUPP) {
    return ErrnoError(errno, "discard in", name_);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> PosixFile::DataRun(uint64_t offset, uint64_t max_len,
                                        uint64_t* len) {
  *len = max_len;
  off_t data = ::lseek(fd_, static_cast<off_t>(offset), SEEK_DATA);
  if (data < 0) {
    if (errno == ENXIO) return false;  // only a hole up to the end
    return true;                        // no SEEK_DATA here: all data
  }
  if (static_cast<uint64_t>(data) > offset) {
    *len = std::min<uint64_t>(max_len, data - offset);
    return false;
  }
  off_t hole = ::lseek(fd_, static_cast<off_t>(offset), SEEK_HOLE);
  if (hole > static_cast<off_t>(offset)) {
    *len = std::min<uint64_t>(max_len, hole - offset);
  }
  return true;
}

AlignedBuffer::AlignedBuffer(size_t size, size_t alignment) : size_(size) {
  if (alignment < 64) alignment = 64;
  size_t alloc = AlignUp(size == 0 ? 1 : size, alignment);
  data_ = static_cast<uint8_t*>(std::aligned_alloc(alignment, alloc));
  if (data_ == nullptr) std::abort();
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

absl::StatusOr<uint32_t> ProbeDirectAlignment(int fd) {
  // What the kernel says direct I/O needs for this file (Linux >= 6.1),
  // else the logical block size of a block device; 4096 covers every
  // common device when neither can be learned.
  struct statx sx;
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
      (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align > 0) {
    return std::max(sx.stx_dio_offset_align, sx.stx_dio_mem_align);
  }
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISBLK(st.st_mode)) {
    int bs = 0;
    if (::ioctl(fd, BLKSSZGET, &bs) == 0 && bs > 0) return bs;
  }
  return 4096;
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<File>> OpenPosixFile(const std::string& path,
                                                    const FileOptions& opts) {
  int flags = O_CLOEXEC | (opts.read_only ? O_RDONLY : O_RDWR);
  if (opts.create) flags |= O_CREAT;
  if (opts.create && opts.exclusive) flags |= O_EXCL;
  if (opts.direct) flags |= O_DIRECT;
  int fd;
  do {
    fd = ::open(path.c_str(), flags, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    int err = errno;
    if (err == EINVAL && opts.direct) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot open ", path,
                       " with O_DIRECT: the file system does not support it"));
    }
    return internal::ErrnoError(err, "cannot open", path);
  }
  // The locks go on a descriptor of their own (OpenLockDescriptor says why).
  int lock_fd = -1;
  auto fail = [&](absl::Status s) {
    ::close(fd);
    if (lock_fd >= 0) ::close(lock_fd);
    return s;
  };
  if (opts.lock) {
    absl::StatusOr<int> l = internal::OpenLockDescriptor(path, fd);
    if (!l.ok()) return fail(l.status());
    lock_fd = *l;
    absl::Status locked = internal::LockImageFile(
        lock_fd, path,
        internal::ImageLockPerms(!opts.read_only, opts.force_share));
    if (!locked.ok()) return fail(locked);
  }
  uint32_t alignment = 1;
  if (opts.direct) {
    absl::StatusOr<uint32_t> a = internal::ProbeDirectAlignment(fd);
    if (!a.ok()) return fail(a.status());
    alignment = *a;
  }
  return std::unique_ptr<File>(new internal::PosixFile(
      fd, path, alignment, opts.no_flush, lock_fd));
}

namespace {
class PosixOpener : public FileOpener {
 public:
  absl::StatusOr<std::unique_ptr<File>> Open(
      const std::string& path, const FileOptions& opts) override {
    return OpenPosixFile(path, opts);
  }
};
}  // namespace

FileOpener* DefaultFileOpener() {
  static PosixOpener* opener = new PosixOpener;
  return opener;
}

}  // namespace qcow2
