// SPDX-License-Identifier: Apache-2.0
// qcowtool convert: copies the virtual disk of an image (through its
// backing chain) into a new qcow2 or raw image, as `qemu-img convert`
// does, with its flags (-O, -o, -c, -B/-F, -n, -S, -p, -q, -W, -m) and
// messages. The copy itself is tools/convert_copy.cc.
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "qcow2/image.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/convert_copy.h"
#include "tools/create_options.h"
#include "tools/option_parser.h"
#include "tools/progress.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool convert [-f FMT] [-O FMT] [-o OPTIONS] [-c] [-B BACKING "
    "[-F FMT]]\n"
    "                        [-n] [-S SIZE] [-p] [-q] [-W] [-m N] [-U]\n"
    "                        [-t CACHE] [-T SRC_CACHE]\n"
    "                        [--backing-root=DIR] SOURCE DEST\n"
    "\n"
    "Writes the contents of SOURCE (read through its backing chain) to DEST,\n"
    "as 'qemu-img convert' does. DEST is created (replaced if it exists)\n"
    "unless -n; a block device DEST (raw) is written over in place, zeros\n"
    "included.\n"
    "\n"
    "  -f FMT      format of SOURCE: qcow2 or raw (default: probe)\n"
    "  -O FMT      output format: raw (the default) or qcow2\n"
    "  -o OPTIONS  creation options of DEST, as 'qcowtool create -o' takes\n"
    "              them (may be repeated; '-o help' lists them)\n"
    "  -c          write every data cluster compressed (qcow2 only)\n"
    "  -B BACKING  DEST gets BACKING as its backing file: what SOURCE's top\n"
    "              image does not allocate is left to it (qcow2 only)\n"
    "  -F FMT      format of BACKING, qcow2 or raw (default: probe)\n"
    "  -n          DEST exists: write into it, do not create it\n"
    "  -S SIZE     zero runs of at least SIZE bytes (a multiple of 512,\n"
    "              default 4k) are not written as data; 0 writes\n"
    "              everything (a fully allocated DEST)\n"
    "  -p          show progress\n"
    "  -q          quiet (no progress)\n"
    "  -W          allow out-of-order writes: each of the N workers writes\n"
    "              what it read at once, up to one per CPU at a time (with\n"
    "              -c: compression on N threads)\n"
    "  -m N        requests in flight, 1 to 16 (default 8)\n"
    "  -t CACHE    DEST's cache mode, as qemu-img's: unsafe (the default:\n"
    "              nothing is synced, as qemu-img convert), writeback and\n"
    "              writethrough (synced at the end), none and directsync\n"
    "              (O_DIRECT for a qcow2 DEST, synced at the end)\n"
    "  -T SRC_CACHE SOURCE's: none and directsync read with O_DIRECT, the\n"
    "              others through the page cache (default writeback)\n"
    "  (-U and --backing-root apply to SOURCE)\n";

constexpr char kHelpTail[] =
    "  -h, --help  show this help\n"
    "\n";

std::string Usage() {
  return std::string(kUsage) + kForceShareHelp + kBackingRootHelp +
         kHelpTail + kQemuImgExitStatusHelp;
}

constexpr uint64_t kMaxSparse = 16 << 20;  // qemu-img's limit for -S

struct ConvertArgs {
  std::string format;
  std::string out_format = "raw";
  std::vector<std::string> option_lists;
  bool compress = false;
  std::optional<std::string> backing;
  std::optional<std::string> backing_format;
  bool no_create = false;
  uint64_t min_sparse = 4096;
  bool progress = false;
  bool quiet = false;
  bool out_of_order = false;
  int workers = 8;
  std::string cache = "unsafe";         // -t
  std::string src_cache = "writeback";  // -T
  OpenPolicy policy;
  std::string source;
  std::string dest;
};

// -O: the output formats convert writes.
int TakeOutFormat(const OptionParser& parser, const char* v,
                  ConvertArgs* args) {
  if (std::string_view(v) != "raw" && std::string_view(v) != "qcow2") {
    return parser.Error(absl::StrCat("output format '", v,
                                     "' is not supported (qcow2 or raw)"));
  }
  args->out_format = v;
  return kGoOn;
}

// -S: qemu-img's limits for the sparse-detection size.
int TakeMinSparse(const char* v, ConvertArgs* args) {
  absl::StatusOr<uint64_t> n = ParseSize(v);
  if (!n.ok() || *n % 512 != 0 || *n > kMaxSparse) {
    return ReportFailure(
        "Invalid buffer size for sparse output specified. Valid sizes "
        "are multiples of 512 up to 16777216. Select 0 to disable "
        "sparse detection (fully allocates output).");
  }
  args->min_sparse = *n;
  return kGoOn;
}

// -m: requests in flight, qemu-img's 1 to 16.
int TakeWorkers(const char* v, ConvertArgs* args) {
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || n < 1 || n > 16) {
    return ReportFailure(
        "Invalid number of coroutines. Allowed number of coroutines is "
        "between 1 and 16");
  }
  args->workers = static_cast<int>(n);
  return kGoOn;
}

// Returns -1 when parsed, else the exit status to return.
int ParseArgs(int argc, char** argv, ConvertArgs* args) {
  using Arg = OptionParser::Arg;
  OptionParser parser(Usage());
  parser.Format(&args->format)
      .Policy(&args->policy)
      .Help()
      .Add("", 'O', Arg::kRequired,
           [&parser, args](const char* v) {
             return TakeOutFormat(parser, v, args);
           })
      .List("", 'o', &args->option_lists)
      .Flag("", 'c', &args->compress)
      .Text("", 'B', &args->backing)
      .Text("", 'F', &args->backing_format)
      .Flag("", 'n', &args->no_create)
      .Add("", 'S', Arg::kRequired,
           [args](const char* v) { return TakeMinSparse(v, args); })
      .Flag("", 'p', &args->progress)
      .Flag("", 'q', &args->quiet)
      .Flag("", 'W', &args->out_of_order)
      .Add("", 'm', Arg::kRequired,
           [args](const char* v) { return TakeWorkers(v, args); })
      .Text("", 't', &args->cache)
      .Text("", 'T', &args->src_cache);
  std::vector<std::string> operands;
  if (int rc = parser.Parse(argc, argv, &operands); rc != kGoOn) return rc;
  if (operands.size() < 2) {
    return UsageError(Usage(), "expecting a source and a destination");
  }
  if (operands.size() > 2) {
    return UsageError(
        Usage(), absl::StrCat("unexpected argument '", operands[2], "'"));
  }
  args->source = operands[0];
  args->dest = operands[1];
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

// A raw file or block device, written with pwrite.
class FdTarget : public ConvertTarget {
 public:
  // `sync`: fsync at the end (every cache mode but unsafe).
  FdTarget(int fd, std::string name, bool device, bool sync)
      : fd_(fd), name_(std::move(name)), device_(device), sync_(sync) {}
  ~FdTarget() override {
    if (fd_ >= 0) close(fd_);
  }

  absl::Status Write(uint64_t offset, absl::Span<const uint8_t> data) override {
    return WriteAll(fd_, data.data(), data.size(), offset, name_);
  }
  // A hole in a file; a device's unwritten space holds whatever it held,
  // so zeros are made there (zero-range, else written).
  absl::Status WriteZeroes(uint64_t offset, uint64_t len) override {
    const int mode = device_ ? FALLOC_FL_ZERO_RANGE
                             : FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    if (fallocate(fd_, mode, static_cast<off_t>(offset),
                  static_cast<off_t>(len)) == 0) {
      return absl::OkStatus();
    }
    const std::vector<uint8_t> zeros(std::min<uint64_t>(len, 1 << 20), 0);
    for (uint64_t done = 0; done < len;) {
      const size_t n = static_cast<size_t>(
          std::min<uint64_t>(zeros.size(), len - done));
      if (auto s = WriteAll(fd_, zeros.data(), n, offset + done, name_);
          !s.ok()) {
        return s;
      }
      done += n;
    }
    return absl::OkStatus();
  }
  absl::Status WriteCompressed(uint64_t, absl::Span<const uint8_t>) override {
    return absl::UnimplementedError(
        "Compression not supported for this file format");
  }
  absl::Status Finish() override {
    if (sync_ && fsync(fd_) != 0) {
      return Errno(errno, absl::StrCat("syncing ", name_));
    }
    const int fd = fd_;
    fd_ = -1;
    if (close(fd) != 0) return Errno(errno, absl::StrCat("closing ", name_));
    return absl::OkStatus();
  }

 private:
  int fd_;
  const std::string name_;
  const bool device_;
  const bool sync_;
};

// An image opened through the library.
class ImageTarget : public ConvertTarget {
 public:
  explicit ImageTarget(std::unique_ptr<Image> image)
      : image_(std::move(image)) {}
  absl::Status Write(uint64_t offset, absl::Span<const uint8_t> data) override {
    return image_->Write(offset, data);
  }
  absl::Status WriteZeroes(uint64_t offset, uint64_t len) override {
    return image_->WriteZeroes(offset, len, /*unmap=*/true);
  }
  absl::Status WriteCompressed(uint64_t offset,
                               absl::Span<const uint8_t> data) override {
    return image_->WriteCompressed(offset, data);
  }
  absl::Status Finish() override { return image_->Close(); }
  Image& image() { return *image_; }

 private:
  std::unique_ptr<Image> image_;
};

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

absl::Status OutputSmaller() {
  return absl::InvalidArgumentError("output file is smaller than input file");
}

// The raw destination: a new (or, with -n, existing) file, or a device.
absl::StatusOr<std::unique_ptr<FdTarget>> OpenRawTarget(const ConvertArgs& a,
                                                        uint64_t size,
                                                        bool* zero_init) {
  struct stat st;
  const bool device = stat(a.dest.c_str(), &st) == 0 && S_ISBLK(st.st_mode);
  const bool create = !device && !a.no_create;
  int fd = open(a.dest.c_str(),
                create ? O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC
                       : O_WRONLY | O_CLOEXEC,
                0644);
  if (fd < 0) {
    return Errno(errno, absl::StrCat(create ? "cannot create " : "cannot open ",
                                     a.dest));
  }
  auto target = std::make_unique<FdTarget>(fd, a.dest, device,
                                           a.cache != "unsafe");
  *zero_init = create;
  if (device) {
    uint64_t bytes = 0;
    if (ioctl(fd, BLKGETSIZE64, &bytes) != 0) {
      return Errno(errno, absl::StrCat("size of ", a.dest));
    }
    if (size > bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no space left on ", a.dest, " (", FormatSize(bytes),
                       "): the disk is ", FormatSize(size)));
    }
  } else if (create) {
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
      return Errno(errno, absl::StrCat("resizing ", a.dest));
    }
  } else if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < size) {
    return OutputSmaller();
  }
  return target;
}

// Creates the qcow2 destination as the -o options, -B and -F ask, the size
// of the source. Returns -1 when done, else the exit status.
int CreateQcow2(const ConvertArgs& a, uint64_t size, CreateRequest* req) {
  req->file = a.dest;
  req->opts.format = ImageFormat::kQcow2;
  std::map<std::string, std::string> values;
  if (auto s = ParseOptionLists(a.option_lists, ImageFormat::kQcow2, &values);
      !s.ok()) {
    return UsageError(Usage(), s.message());
  }
  if (values.count("backing_file") && a.backing) {
    return UsageError(Usage(),
                      "the backing file is given twice (-B and -o "
                      "backing_file)");
  }
  if (values.count("backing_fmt") && a.backing_format) {
    return UsageError(Usage(),
                      "the backing format is given twice (-F and -o "
                      "backing_fmt)");
  }
  if (a.backing) values["backing_file"] = *a.backing;
  if (a.backing_format) values["backing_fmt"] = *a.backing_format;
  values.erase("size");
  for (const auto& [key, value] : values) {
    if (auto s = ApplyOption(key, value, req); !s.ok()) {
      return UsageError(Usage(), s.message());
    }
  }
  CreateOptions& o = req->opts;
  o.size = size;
  if (o.backing_file.empty() && !o.backing_format.empty()) {
    return ReportFailure("Backing format cannot be used without backing file");
  }
  if (auto s = CheckCombinations(o); !s.ok()) {
    return UsageError(Usage(), s.message());
  }
  if (!o.backing_file.empty() && o.backing_format.empty()) {
    // Probed, as qcowtool create does (qemu-img 7.2 insists on -F).
    OpenOptions oo;
    oo.open_backing = false;
    auto b = Image::Open(QemuPathCombine(a.dest, o.backing_file), oo);
    if (!b.ok()) {
      return ReportQemuImgError(absl::Status(
          b.status().code(), absl::StrCat("Could not open backing file: ",
                                          b.status().message())));
    }
    o.backing_format =
        (*b)->GetChainInfo()[0].format == ImageFormat::kQcow2 ? "qcow2" : "raw";
  }
  struct stat st;
  if (lstat(a.dest.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      unlink(a.dest.c_str()) != 0) {
    return ReportQemuImgError(
        Errno(errno, absl::StrCat("cannot replace ", a.dest)));
  }
  if (auto s = ResolveCreateSecret(a.policy.secrets, req); !s.ok()) {
    return ReportQemuImgError(s);
  }
  if (!o.encrypt.format.empty() && a.compress) {
    return ReportFailure("Compression and encryption not supported at the same time");
  }
  if (auto s = CreateImage(a.dest, o); !s.ok()) return ReportQemuImgError(s);
  return -1;
}

// Checks the flag combinations qemu-img refuses. Returns -1 when fine.
int CheckCombination(const ConvertArgs& a) {
  const bool raw = a.out_format == "raw";
  if (a.compress && raw) {
    return ReportFailure("Compression not supported for this file format");
  }
  if (a.backing && raw) {
    return ReportFailure("Backing file not supported for file format 'raw'");
  }
  if (a.backing_format && !a.backing) {
    return ReportFailure("Backing format cannot be used without backing file");
  }
  if (a.no_create && !a.option_lists.empty()) {
    return ReportFailure("-o has no effect when skipping image creation");
  }
  if (raw && !a.no_create) {
    std::map<std::string, std::string> values;
    if (auto s = ParseOptionLists(a.option_lists, ImageFormat::kRaw, &values);
        !s.ok()) {
      return UsageError(Usage(), s.message());
    }
  }
  return -1;
}

}  // namespace

int RunConvert(int argc, char** argv) {
  ConvertArgs args;
  if (int rc = ParseArgs(argc, argv, &args); rc >= 0) return rc;
  for (const std::string& list : args.option_lists) {
    if (IsHelpList(list)) {
      return PrintHelp(OptionHelp(args.out_format == "raw"
                                      ? ImageFormat::kRaw
                                      : ImageFormat::kQcow2));
    }
  }
  if (int rc = CheckCombination(args); rc >= 0) return rc;
  if (auto s = args.policy.ResolveImage(&args.source, &args.format); !s.ok()) {
    return ReportQemuImgError(s);
  }

  OpenOptions opts;
  opts.format = args.format;
  if (!ApplyCacheMode(args.src_cache, &opts).ok()) {
    return ReportFailure(
        absl::StrCat("Invalid source cache option: ", args.src_cache));
  }
  OpenOptions to;
  to.read_write = true;
  to.format = "qcow2";
  if (auto s = ApplyCacheMode(args.cache, &to); !s.ok()) {
    return ReportFailure(std::string(s.message()));
  }
  args.policy.ApplyTo(&opts);
  auto image = Image::Open(args.source, opts);
  if (!image.ok()) return ReportQemuImgError(image.status());
  Image& source = **image;
  const std::vector<std::string> names =
      QemuChainNames(args.source, source.GetChainInfo());
  if (auto s = CheckNotInChain(args.dest, names); !s.ok()) {
    return ReportQemuImgError(s);
  }

  CopyOptions copy;
  copy.min_sparse = args.min_sparse;
  copy.compressed = args.compress;
  copy.workers = args.workers;
  copy.out_of_order = args.out_of_order;
  std::unique_ptr<ConvertTarget> target;
  if (args.out_format == "raw") {
    auto raw = OpenRawTarget(args, source.size(), &copy.zero_init);
    if (!raw.ok()) return ReportQemuImgError(raw.status());
    target = std::move(raw).value();
  } else {
    CreateRequest req;
    if (!args.no_create) {
      if (int rc = CreateQcow2(args, source.size(), &req); rc >= 0) return rc;
    }
    to.key_secret = req.opts.encrypt.key_secret;
    auto out = Image::Open(args.dest, to);
    if (!out.ok()) return ReportQemuImgError(out.status());
    if ((*out)->size() < source.size()) {
      return ReportQemuImgError(OutputSmaller());
    }
    const LayerInfo top = (*out)->GetChainInfo()[0];
    copy.cluster_size = top.cluster_size;
    copy.compression_type = top.compression_type;
    // With -n, only -B says so (qemu-img: the target's own backing file
    // is not looked at).
    copy.target_has_backing = args.no_create ? args.backing.has_value()
                                             : !top.backing_file.empty();
    // An encrypted image's raw data file is mapped whole from creation
    // and its zero bytes decrypt to noise, so nothing reads as zero
    // before it is written (QEMU's qcow2_has_zero_init says no too).
    copy.zero_init = !args.no_create && top.backing_file.empty() &&
                     !(top.encrypted && top.data_file_raw);
    target = std::make_unique<ImageTarget>(std::move(out).value());
  }
  absl::Status s;
  {
    Progress progress(args.progress && !args.quiet, 1.0f);
    copy.progress = [&progress](float p) { progress.Advance(p); };
    s = CopyImage(source, *target, copy);
  }
  if (!s.ok()) return ReportQemuImgError(s);
  return kExitOk;
}

}  // namespace qcow2::tool
