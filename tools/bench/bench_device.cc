// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/bench_device.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace qcow2::tool::bench {
namespace {

bool At(const uint8_t* head, size_t len, size_t offset, const char* magic,
        size_t n) {
  return offset + n <= len && std::memcmp(head + offset, magic, n) == 0;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

std::string DescribeDeviceContents(const uint8_t* head, size_t len) {
  struct Magic {
    size_t offset;
    const char* bytes;
    size_t n;
    const char* what;
  };
  static constexpr Magic kMagics[] = {
      {0, "QFI\xfb", 4, "a qcow2 image"},
      {0, "LUKS\xba\xbe", 6, "LUKS encryption metadata"},
      {0, "XFSB", 4, "an XFS file system"},
      {512, "EFI PART", 8, "a GPT partition table"},
      {4096, "EFI PART", 8, "a GPT partition table"},
      {512, "LABELONE", 8, "an LVM physical volume"},
      {1080, "\x53\xef", 2, "an ext2/3/4 file system"},
      {65536 + 64, "_BHRfS_M", 8, "a btrfs file system"},
      {4086, "SWAPSPACE2", 10, "swap space"},
      {32769, "CD001", 5, "an ISO 9660 file system"},
      {3, "NTFS    ", 8, "an NTFS file system"},
  };
  for (const Magic& m : kMagics) {
    if (At(head, len, m.offset, m.bytes, m.n)) return m.what;
  }
  // An MBR (or a FAT boot sector, which ends the same way).
  if (len >= 512 && head[510] == 0x55 && head[511] == 0xaa) {
    return "a partition table or boot sector";
  }
  return "";
}

absl::StatusOr<uint64_t> CheckBenchDevice(const std::string& path,
                                          bool force) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISBLK(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device ", path, " is not a block device"));
  }
  // O_EXCL on a block device: EBUSY while it is mounted or held (device
  // mapper, md, swap) by anyone.
  Fd fd(::open(path.c_str(), O_RDONLY | O_EXCL | O_CLOEXEC));
  if (fd.get() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", path, ": ",
        errno == EBUSY ? "in use (mounted, or held by another device)"
                       : std::strerror(errno)));
  }
  uint64_t size = 0;
  if (::ioctl(fd.get(), BLKGETSIZE64, &size) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", path, ": cannot read its size: ", std::strerror(errno)));
  }
  std::vector<uint8_t> head(128 << 10);
  const ssize_t n = ::pread(fd.get(), head.data(), head.size(), 0);
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", path, ": cannot read it: ", std::strerror(errno)));
  }
  const std::string holds =
      DescribeDeviceContents(head.data(), static_cast<size_t>(n));
  if (!holds.empty() && !force) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device ", path, " holds ", holds,
                     "; the benchmark would overwrite it (--force to do so)"));
  }
  return size;
}

absl::Status WipeBenchDevice(const std::string& path) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  std::vector<uint8_t> zeros(1 << 20, 0);
  if (::pwrite(fd.get(), zeros.data(), zeros.size(), 0) < 0 ||
      ::fdatasync(fd.get()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot wipe ", path));
  }
  return absl::OkStatus();
}

}  // namespace qcow2::tool::bench
