// SPDX-License-Identifier: Apache-2.0
// qcowtool resize: changes the virtual size of an image, with qemu-img
// resize's syntax, checks, messages and exit status (1 on any error).
//
// qcow2 images grow through libqcow2 (Image::Resize, with the
// preallocation mode); raw files are truncated or extended in place, with
// --preallocation=falloc|full allocating the new part as QEMU's file
// driver does. qcow2 images shrink through Image::Resize too.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "qcow2/image.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/option_parser.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool resize [-f FMT] [--preallocation=MODE] [--shrink] [-q]\n"
    "                       IMAGE [+|-]SIZE\n"
    "\n"
    "Changes the virtual size of IMAGE to SIZE bytes (or by SIZE with + or\n"
    "-), as 'qemu-img resize' does. SIZE takes the suffixes k, M, G, T, P,\n"
    "E. The new part reads as zeros.\n"
    "\n"
    "  -f FMT      format of IMAGE: qcow2 or raw (default: probe)\n"
    "  --preallocation=MODE\n"
    "              off (default); metadata (qcow2: data clusters for the\n"
    "              new part), falloc (also allocate their space; raw: the\n"
    "              new part), full (also write zeros); growing only. Not\n"
    "              over a backing file\n"
    "  --shrink    allow making the image smaller: the data past the new\n"
    "              end is lost (not yet for qcow2 images with internal\n"
    "              snapshots or persistent bitmaps)\n"
    "  -q          quiet: no \"Image resized.\" message\n"
    "  --object secret,id=ID,data=STRING|file=PATH  a secret, for\n"
    "              encrypt.key-secret=ID\n"
    "  --image-opts  IMAGE is driver=qcow2,file.filename=PATH,\n"
    "              encrypt.key-secret=ID\n"
    "  -h, --help  show this help\n"
    "\n"
    "Exit status (qemu-img's): 0 resized, 1 on any error.\n";

enum class Prealloc { kOff, kMetadata, kFalloc, kFull };

struct ResizeArgs {
  std::string format;
  Prealloc prealloc = Prealloc::kOff;
  bool shrink = false;
  bool quiet = false;
  std::string image;
  int relative = 0;  // +1 grow by, -1 shrink by, 0 absolute
  std::string size;
  OpenPolicy policy;  // --object, --image-opts
};

bool ParsePrealloc(std::string_view v, Prealloc* out) {
  if (v == "off") {
    *out = Prealloc::kOff;
  } else if (v == "metadata") {
    *out = Prealloc::kMetadata;
  } else if (v == "falloc") {
    *out = Prealloc::kFalloc;
  } else if (v == "full") {
    *out = Prealloc::kFull;
  } else {
    return false;
  }
  return true;
}

int ParseArgs(int argc, char** argv, ResizeArgs* args) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") return PrintHelp(kUsage);
  }
  // The size goes first, so that "-1G" is not taken for an option.
  if (argc < 3) return UsageError(kUsage, "not enough arguments");
  args->size = argv[--argc];
  OptionParser parser(kUsage);
  parser.Format(&args->format)
      .Add("preallocation", 0, OptionParser::Arg::kRequired,
           [args](const char* v) {
             if (!ParsePrealloc(v, &args->prealloc)) {
               return ReportFailure(
                   absl::StrCat("Invalid preallocation mode '", v, "'"));
             }
             return kGoOn;
           })
      .Flag("shrink", 0, &args->shrink)
      .Secrets(&args->policy)
      .Help()
      .Flag("", 'q', &args->quiet);
  std::vector<std::string> operands;
  if (int rc = parser.Parse(argc, argv, &operands); rc != kGoOn) return rc;
  if (operands.size() != 1) {
    return UsageError(kUsage, "expecting an image file name and a size");
  }
  args->image = operands[0];
  if (absl::Status s = args->policy.ResolveImage(&args->image, &args->format);
      !s.ok()) {
    return ReportError(s);
  }
  if (!args->size.empty() && (args->size[0] == '+' || args->size[0] == '-')) {
    args->relative = args->size[0] == '+' ? 1 : -1;
    args->size.erase(0, 1);
  }
  return -1;
}

absl::Status Errno(const std::string& what) {
  return absl::ErrnoToStatus(errno, what);
}

// Writes zeros over [from, to) of `fd`.
absl::Status WriteZeros(int fd, uint64_t from, uint64_t to,
                        const std::string& name) {
  const std::vector<uint8_t> zeros(std::min<uint64_t>(to - from, 1 << 20), 0);
  while (from < to) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(zeros.size(),
                                                            to - from));
    const ssize_t w = pwrite(fd, zeros.data(), n, static_cast<off_t>(from));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Errno(absl::StrCat("writing zeros to ", name));
    from += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

// Resizes a raw file from `old_size` to `new_size` bytes.
absl::Status ResizeRaw(const std::string& name, uint64_t old_size,
                       uint64_t new_size, Prealloc prealloc) {
  if (prealloc == Prealloc::kMetadata) {
    return absl::InvalidArgumentError(
        "Unsupported preallocation mode: metadata");
  }
  const int fd = open(name.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Errno(absl::StrCat("cannot open ", name));
  absl::Status s;
  if (prealloc == Prealloc::kFalloc && new_size > old_size &&
      fallocate(fd, 0, static_cast<off_t>(old_size),
                static_cast<off_t>(new_size - old_size)) != 0) {
    s = Errno(absl::StrCat("allocating space in ", name));
  }
  if (s.ok() && prealloc == Prealloc::kFull && new_size > old_size) {
    s = WriteZeros(fd, old_size, new_size, name);
  }
  if (s.ok() && ftruncate(fd, static_cast<off_t>(new_size)) != 0) {
    s = Errno(absl::StrCat("resizing ", name));
  }
  if (s.ok() && fsync(fd) != 0) s = Errno(absl::StrCat("syncing ", name));
  close(fd);
  return s;
}

Preallocation ToPreallocation(Prealloc p) {
  switch (p) {
    case Prealloc::kMetadata:
      return Preallocation::kMetadata;
    case Prealloc::kFalloc:
      return Preallocation::kFalloc;
    case Prealloc::kFull:
      return Preallocation::kFull;
    case Prealloc::kOff:
      break;
  }
  return Preallocation::kOff;
}

// qemu-img's checks on a qcow2 image, then the library's grow.
absl::Status ResizeQcow2(Image& image, const LayerInfo& top,
                         uint64_t new_size, Prealloc prealloc) {
  if (new_size % 512 != 0) {
    return absl::InvalidArgumentError("The new size must be a multiple of 512");
  }
  if (top.snapshot_count > 0 && top.version < 3) {
    return absl::FailedPreconditionError(
        "Can't resize a v2 image which has snapshots");
  }
  if (absl::Status s = image.Resize(new_size, ToPreallocation(prealloc));
      !s.ok()) {
    return s;
  }
  return image.Close();
}

}  // namespace

int RunResize(int argc, char** argv) {
  ResizeArgs args;
  if (int rc = ParseArgs(argc, argv, &args); rc >= 0) return rc;
  absl::StatusOr<uint64_t> n = ParseSize(args.size);
  if (!n.ok()) return ReportFailure(n.status().message());

  OpenOptions opts;
  opts.read_write = true;
  opts.format = args.format;
  opts.key_secret = args.policy.key_secret;
  opts.backing_key_secrets = args.policy.backing_key_secrets;
  auto image = Image::Open(args.image, opts);
  if (!image.ok()) return ReportFailure(image.status().message());
  const uint64_t current = (*image)->size();
  int64_t total = static_cast<int64_t>(*n);
  if (args.relative != 0) {
    total = static_cast<int64_t>(current) + args.relative * total;
  }
  if (total <= 0) return ReportFailure("New image size must be positive");
  const uint64_t new_size = static_cast<uint64_t>(total);
  if (new_size <= current && args.prealloc != Prealloc::kOff) {
    return ReportFailure("Preallocation can only be used for growing images");
  }
  if (new_size < current && !args.shrink) {
    ReportFailure("Use the --shrink option to perform a shrink operation.");
    return ReportFailure(
        "warning: Shrinking an image will delete all data beyond the "
        "shrunken image's end. Before performing such an operation, make "
        "sure there is no important data there.");
  }

  const LayerInfo top = (*image)->GetChainInfo().front();
  absl::Status s;
  if (top.format == ImageFormat::kRaw) {
    s = (*image)->Close();
    image->reset();
    if (s.ok()) s = ResizeRaw(args.image, top.file_size, new_size,
                              args.prealloc);
  } else {
    s = ResizeQcow2(**image, top, new_size, args.prealloc);
  }
  if (!s.ok()) return ReportFailure(s.message());
  if (!args.quiet) std::printf("Image resized.\n");
  return kExitOk;
}

}  // namespace qcow2::tool
