// SPDX-License-Identifier: Apache-2.0
// qcowtool convert: copies the virtual disk of an image (through its
// backing chain) into a raw file, like `qemu-img convert -O raw`.
#include <fcntl.h>
#include <getopt.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "qcow2/image.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool convert [-f FMT] [-O raw] [-U] [--backing-root=DIR] "
    "SOURCE DEST\n"
    "\n"
    "Writes the contents of SOURCE (read through its backing chain) to DEST\n"
    "as a raw image, replacing DEST if it exists. Ranges that read as zeros\n"
    "are left as holes. A block device DEST is written over in place, zeros\n"
    "included.\n"
    "\n"
    "  -f FMT      format of SOURCE: qcow2 or raw (default: probe)\n"
    "  -O FMT      output format; only raw (the default) is supported\n"
    "  (-U and --backing-root apply to SOURCE)\n";

constexpr char kHelpTail[] =
    "  -h, --help  show this help\n"
    "\n";

std::string Usage() {
  return std::string(kUsage) + kForceShareHelp + kBackingRootHelp +
         kHelpTail + kExitStatusHelp;
}

// Bytes read from the image at a time.
constexpr uint64_t kChunkBytes = 1 << 20;
// Granularity of zero detection in data ranges (qemu-img's default -S).
constexpr size_t kSparseBytes = 4096;

struct ConvertArgs {
  std::string format;
  OpenPolicy policy;
  std::string source;
  std::string dest;
};

int ParseArgs(int argc, char** argv, ConvertArgs* args) {
  static const option kOptions[] = {
      {"format", required_argument, nullptr, 'f'},
      {"force-share", no_argument, nullptr, 'U'},
      {"backing-root", required_argument, nullptr, kOptBackingRoot},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  ResetGetopt();
  int c;
  while ((c = getopt_long(argc, argv, "f:O:Uh", kOptions, nullptr)) != -1) {
    switch (c) {
      case 'h':
        return PrintHelp(Usage());
      case 'f':
        if (auto s = CheckImageFormat(optarg); !s.ok()) {
          return UsageError(Usage(), s.message());
        }
        args->format = optarg;
        break;
      case 'O':
        if (std::string_view(optarg) != "raw") {
          return UsageError(Usage(),
                            absl::StrCat("output format '", optarg,
                                         "' is not supported (only raw)"));
        }
        break;
      default:
        if (args->policy.Take(c, optarg)) break;
        return UsageError(Usage(), "");
    }
  }
  if (argc - optind < 2) {
    return UsageError(Usage(), "expecting a source and a destination");
  }
  if (argc - optind > 2) {
    return UsageError(
        Usage(), absl::StrCat("unexpected argument '", argv[optind + 2], "'"));
  }
  args->source = argv[optind];
  args->dest = argv[optind + 1];
  return -1;
}

absl::Status Errno(int err, const std::string& what) {
  return absl::ErrnoToStatus(err, what);
}

absl::Status WriteAll(int fd, const uint8_t* p, size_t len, uint64_t offset,
                      const std::string& name) {
  while (len > 0) {
    ssize_t n = pwrite(fd, p, len, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(errno, absl::StrCat("writing ", name));
    p += n;
    len -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

bool AllZero(const uint8_t* p, size_t len) {
  return len == 0 || (p[0] == 0 && std::memcmp(p, p + 1, len - 1) == 0);
}

// Writes the blocks of `buf` that are not all zeros (the file already
// reads as zeros there).
absl::Status WriteSparse(int fd, const uint8_t* buf, size_t len,
                         uint64_t offset, const std::string& name) {
  size_t pos = 0;
  while (pos < len) {
    size_t n = std::min(kSparseBytes, len - pos);
    if (AllZero(buf + pos, n)) {
      pos += n;
      continue;
    }
    size_t run_end = pos + n;
    while (run_end < len) {
      size_t m = std::min(kSparseBytes, len - run_end);
      if (AllZero(buf + run_end, m)) break;
      run_end += m;
    }
    if (auto s = WriteAll(fd, buf + pos, run_end - pos, offset + pos, name);
        !s.ok()) {
      return s;
    }
    pos = run_end;
  }
  return absl::OkStatus();
}

// Makes [offset, +len) of a block device read as zeros: its unwritten
// space holds whatever it held before, never zeros for sure.
absl::Status ZeroDevice(int fd, uint64_t offset, uint64_t len,
                        const std::string& name) {
  if (fallocate(fd, FALLOC_FL_ZERO_RANGE, static_cast<off_t>(offset),
                static_cast<off_t>(len)) == 0) {
    return absl::OkStatus();
  }
  const std::vector<uint8_t> zeros(std::min<uint64_t>(len, kChunkBytes), 0);
  for (uint64_t done = 0; done < len;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(zeros.size(),
                                                            len - done));
    if (auto s = WriteAll(fd, zeros.data(), n, offset + done, name); !s.ok()) {
      return s;
    }
    done += n;
  }
  return absl::OkStatus();
}

// `device`: `fd` is a block device of `device_bytes` bytes, written over
// in place (never resized; zeros written, not assumed).
absl::Status Copy(Image& image, int fd, const std::string& dest,
                  bool device, uint64_t device_bytes) {
  const uint64_t size = image.size();
  if (device && size > device_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no space left on ", dest, " (", FormatSize(device_bytes),
        "): the disk is ", FormatSize(size)));
  }
  if (!device && ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return Errno(errno, absl::StrCat("resizing ", dest));
  }
  std::vector<uint8_t> buf(kChunkBytes);
  uint64_t pos = 0;
  while (pos < size) {
    absl::StatusOr<BlockStatus> bs = image.GetBlockStatus(pos, size - pos);
    if (!bs.ok()) return bs.status();
    const uint64_t end = pos + bs->length;
    if (bs->zero) {
      if (device) {
        if (auto s = ZeroDevice(fd, pos, end - pos, dest); !s.ok()) return s;
      }
      pos = end;
      continue;
    }
    while (pos < end) {
      const size_t n = static_cast<size_t>(std::min(kChunkBytes, end - pos));
      auto span = absl::MakeSpan(buf.data(), n);
      if (auto s = image.Read(pos, span); !s.ok()) return s;
      if (auto s = device ? WriteAll(fd, buf.data(), n, pos, dest)
                          : WriteSparse(fd, buf.data(), n, pos, dest);
          !s.ok()) {
        return s;
      }
      pos += n;
    }
  }
  if (fsync(fd) != 0) return Errno(errno, absl::StrCat("syncing ", dest));
  return absl::OkStatus();
}

// Refuses a destination that is one of the source's files: truncating it
// would destroy what is about to be read.
absl::Status CheckNotInChain(const std::string& dest,
                             const std::vector<std::string>& names) {
  struct stat d;
  if (stat(dest.c_str(), &d) != 0) return absl::OkStatus();
  for (const std::string& name : names) {
    struct stat s;
    if (stat(name.c_str(), &s) == 0 && s.st_dev == d.st_dev &&
        s.st_ino == d.st_ino) {
      return absl::InvalidArgumentError(absl::StrCat(
          "destination ", dest, " is the source image file ", name));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int RunConvert(int argc, char** argv) {
  ConvertArgs args;
  if (int rc = ParseArgs(argc, argv, &args); rc >= 0) return rc;

  OpenOptions opts;
  opts.format = args.format;
  args.policy.ApplyTo(&opts);
  auto image = Image::Open(args.source, opts);
  if (!image.ok()) return ReportError(image.status());
  const std::vector<std::string> names =
      QemuChainNames(args.source, (*image)->GetChainInfo());
  if (auto s = CheckNotInChain(args.dest, names); !s.ok()) {
    return ReportError(s);
  }

  struct stat st;
  const bool device =
      stat(args.dest.c_str(), &st) == 0 && S_ISBLK(st.st_mode);
  int fd = open(args.dest.c_str(),
                device ? O_WRONLY | O_CLOEXEC
                       : O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                0644);
  if (fd < 0) {
    return ReportError(Errno(errno, absl::StrCat("cannot create ", args.dest)));
  }
  uint64_t device_bytes = 0;
  if (device && ioctl(fd, BLKGETSIZE64, &device_bytes) != 0) {
    absl::Status s = Errno(errno, absl::StrCat("size of ", args.dest));
    close(fd);
    return ReportError(s);
  }
  absl::Status s = Copy(**image, fd, args.dest, device, device_bytes);
  if (close(fd) != 0 && s.ok()) {
    s = Errno(errno, absl::StrCat("closing ", args.dest));
  }
  if (!s.ok()) return ReportError(s);
  return kExitOk;
}

}  // namespace qcow2::tool
