// SPDX-License-Identifier: Apache-2.0
// qcowtool create: new qcow2 and raw images, with qemu-img create's option
// names (-o key=value,...), size syntax and "Formatting ..." line.
//
// Every option is checked (names, values and combinations) before anything
// on disk changes, so a typo never destroys an existing FILE.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "qcow2/image.h"
#include "qcow2/options.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/create_options.h"
#include "tools/option_parser.h"

namespace qcow2::tool {

// Shared with tools/cmd_snapshot.cc, which declares it (tools/commands.h
// holds only the command handlers): RunCreate with another usage text for
// error messages and --help.
int RunCreateWithUsage(int argc, char** argv, const std::string& usage);

namespace {

constexpr char kUsage[] =
    "usage: qcowtool create [-q] [-f FMT] [-o OPTIONS] [-b BACKING [-F FMT]] "
    "[-u]\n"
    "                       FILE [SIZE]\n"
    "\n"
    "Creates FILE as 'qemu-img create' does. An existing regular FILE is\n"
    "replaced (once every option has been checked), unless another process\n"
    "holds it open (its image lock). A block device FILE is formatted in\n"
    "place. A create that fails removes the file it made.\n"
    "\n"
    "  -f FMT      qcow2 (default) or raw\n"
    "  -o OPTIONS  comma-separated key=value list of qemu-img's creation\n"
    "              options (',,' is a literal comma); may be repeated, the\n"
    "              last value of a key wins. '-o help' lists them.\n"
    "  -b BACKING  backing file (same as -o backing_file=BACKING); a\n"
    "              relative name is relative to FILE's directory\n"
    "  -F FMT      backing file format, qcow2 or raw (-o backing_fmt=FMT).\n"
    "              Unlike qemu-img 7.2 it may be left out: the backing file\n"
    "              is then probed and the format found is recorded.\n"
    "  -u          do not open the backing file (needs SIZE)\n"
    "  -q          do not print the \"Formatting ...\" line\n"
    "  -h, --help  show this help\n"
    "\n"
    "SIZE takes qemu's forms: 512, 4k, 10G, 1.5T, 0x100000 (suffixes are\n"
    "powers of 1024; the size is rounded up to 512 bytes). Without SIZE the\n"
    "backing file's size is used, or a block device's size.\n"
    "\n";

std::string DefaultUsage() {
  return std::string(kUsage) + kQemuImgExitStatusHelp;
}

// Opens the backing file (unless -u) to learn its size and, when not
// given, its format.
absl::Status InspectBacking(CreateRequest* req) {
  CreateOptions& o = req->opts;
  if (o.backing_file.empty() || req->unsafe) return absl::OkStatus();
  const std::string path = QemuPathCombine(req->file, o.backing_file);
  OpenOptions oo;
  oo.format = o.backing_format;
  oo.open_backing = false;
  oo.metadata_only = true;  // as qemu-img: an encrypted one needs no key
  auto backing = Image::Open(path, oo);
  if (!backing.ok()) {
    return absl::Status(backing.status().code(),
                        absl::StrCat("cannot open backing file ", path, ": ",
                                     backing.status().message()));
  }
  if (o.backing_format.empty()) {
    o.backing_format =
        (*backing)->GetChainInfo()[0].format == ImageFormat::kQcow2 ? "qcow2"
                                                                    : "raw";
  }
  if (!req->size.has_value() || *req->size == 0) req->size = (*backing)->size();
  return absl::OkStatus();
}

std::string FormattingLine(const CreateRequest& req) {
  const CreateOptions& o = req.opts;
  const char* fmt = o.format == ImageFormat::kRaw ? "raw" : "qcow2";
  std::string line =
      absl::StrCat("Formatting '", req.file, "', fmt=", fmt, " ");
  const uint64_t size = req.size.value_or(0);
  if (o.format == ImageFormat::kRaw) {
    absl::StrAppend(&line, "size=", size);
    if (req.preallocation)
      absl::StrAppend(&line, " preallocation=", *req.preallocation);
    return line;
  }
  // The order qemu-img 7.2 prints them in.
  absl::StrAppend(&line, "cluster_size=", o.cluster_size,
                  " extended_l2=", o.extended_l2 ? "on" : "off");
  if (req.preallocation)
    absl::StrAppend(&line, " preallocation=", *req.preallocation);
  absl::StrAppend(
      &line, " compression_type=",
      o.compression_type == CompressionType::kZstd ? "zstd" : "zlib",
      " size=", size);
  if (!o.backing_file.empty()) {
    absl::StrAppend(&line, " backing_file=", o.backing_file);
  }
  if (!o.backing_format.empty()) {
    absl::StrAppend(&line, " backing_fmt=", o.backing_format);
  }
  if (req.compat) absl::StrAppend(&line, " compat=", *req.compat);
  if (!o.data_file.empty()) absl::StrAppend(&line, " data_file=", o.data_file);
  if (o.data_file_raw) absl::StrAppend(&line, " data_file_raw=on");
  absl::StrAppend(&line, " lazy_refcounts=", o.lazy_refcounts ? "on" : "off",
                  " refcount_bits=", o.refcount_bits);
  return line;
}

// The disk's L1 table must fit the 32 MiB QEMU allows, as CreateImage
// checks too; checked here before an existing file is replaced, so that a
// create that cannot succeed destroys nothing.
absl::Status CheckSizeFits(const CreateRequest& req) {
  const CreateOptions& o = req.opts;
  if (o.format == ImageFormat::kRaw) return absl::OkStatus();
  const uint64_t size = (req.size.value_or(0) + 511) / 512 * 512;
  const uint64_t cs = o.cluster_size;
  const uint64_t per_l2 = cs / (o.extended_l2 ? 16 : 8) * cs;
  const uint64_t l1_entries = size / per_l2 + (size % per_l2 != 0);
  if (l1_entries > (uint64_t{32} << 20) / 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        req.file, ": virtual size ", size, " is too large for cluster size ",
        cs, " (try a larger cluster size)"));
  }
  return absl::OkStatus();
}

bool SameFile(const struct stat& a, const std::string& path) {
  struct stat b;
  return stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

// Like qemu-img, replaces an existing regular file, unless another
// process (QEMU, qcowtool) has it open: then its lock refuses the create.
// Anything else that exists is left for CreateImage: a device is
// formatted in place, a directory or a symlink refused.
absl::Status RemoveExisting(const CreateRequest& req) {
  struct stat st;
  if (lstat(req.file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::OkStatus();
  }
  FileOptions probe;
  probe.read_only = false;
  if (auto held = OpenPosixFile(req.file, probe);
      !held.ok() && absl::IsUnavailable(held.status())) {
    return held.status();
  }
  if (!req.opts.backing_file.empty() &&
      SameFile(st, QemuPathCombine(req.file, req.opts.backing_file))) {
    return absl::InvalidArgumentError(
        absl::StrCat(req.file, " is its own backing file"));
  }
  if (unlink(req.file.c_str()) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot replace ", req.file));
  }
  return absl::OkStatus();
}

struct CreateArgs {
  std::string format = "qcow2";
  std::vector<std::string> option_lists;
  std::optional<std::string> backing;
  std::optional<std::string> backing_format;
  bool unsafe = false;
  bool quiet = false;
  OpenPolicy policy;  // --object secrets, for encrypt.key-secret
  std::vector<std::string> positional;
};

// Returns -1 when parsed, else the exit status to return.
int ParseArgs(int argc, char** argv, const std::string& usage, CreateArgs* a) {
  OptionParser parser(usage);
  parser.Help()
      .Format(&a->format)
      .List("options", 'o', &a->option_lists)
      .Text("backing", 'b', &a->backing)
      .Text("backing-format", 'F', &a->backing_format)
      .Flag("unsafe", 'u', &a->unsafe)
      .Flag("quiet", 'q', &a->quiet)
      .Secrets(&a->policy);
  return parser.Parse(argc, argv, &a->positional);
}

// Turns the parsed arguments into a checked request. Returns -1 when done,
// else the exit status to return.
int BuildRequest(const CreateArgs& a, const std::string& usage, CreateRequest* req) {
  req->opts.format =
      a.format == "raw" ? ImageFormat::kRaw : ImageFormat::kQcow2;
  if (a.positional.empty()) {
    return UsageError(usage, "expecting an image file name");
  }
  if (a.positional.size() > 2) {
    return UsageError(
        usage, absl::StrCat("unexpected argument '", a.positional[2], "'"));
  }
  req->file = a.positional[0];
  req->unsafe = a.unsafe;
  req->quiet = a.quiet;

  std::map<std::string, std::string> values;
  if (auto s = ParseOptionLists(a.option_lists, req->opts.format, &values);
      !s.ok()) {
    return UsageError(usage, s.message());
  }
  if (values.count("backing_file") && a.backing) {
    return UsageError(usage,
                      "the backing file is given twice (-b and -o "
                      "backing_file)");
  }
  if (values.count("backing_fmt") && a.backing_format) {
    return UsageError(usage,
                      "the backing format is given twice (-F and -o "
                      "backing_fmt)");
  }
  if (values.count("size") && a.positional.size() == 2) {
    return UsageError(usage,
                      "the image size must be given only once (SIZE "
                      "or -o size)");
  }
  if (a.backing) values["backing_file"] = *a.backing;
  if (a.backing_format) values["backing_fmt"] = *a.backing_format;
  if (a.positional.size() == 2) values["size"] = a.positional[1];
  if (req->opts.format == ImageFormat::kRaw &&
      (values.count("backing_file") || values.count("backing_fmt"))) {
    return UsageError(usage, "raw images cannot have a backing file");
  }
  for (const auto& [key, value] : values) {
    if (auto s = ApplyOption(key, value, req); !s.ok()) {
      return UsageError(usage, s.message());
    }
  }
  if (req->opts.backing_file.empty() && !req->opts.backing_format.empty()) {
    return UsageError(usage, "a backing format (-F) needs a backing file (-b)");
  }
  if (auto s = CheckCombinations(req->opts); !s.ok()) {
    return UsageError(usage, s.message());
  }
  const bool has_backing = !req->opts.backing_file.empty();
  if (!req->size.has_value() && !has_backing) {
    // A block device: the image takes the whole device by default.
    struct stat st;
    FileOptions fo;
    fo.lock = false;
    if (stat(req->file.c_str(), &st) == 0 && S_ISBLK(st.st_mode)) {
      if (auto dev = OpenPosixFile(req->file, fo); dev.ok()) {
        if (auto size = (*dev)->Size(); size.ok()) req->size = *size;
      }
    }
  }
  if (!req->size.has_value() && (!has_backing || req->unsafe)) {
    return UsageError(usage, has_backing ? "-u needs the image size"
                                         : "image creation needs a size");
  }
  return -1;
}

}  // namespace

int RunCreateWithUsage(int argc, char** argv, const std::string& usage) {
  CreateArgs args;
  if (int rc = ParseArgs(argc, argv, usage, &args); rc >= 0) return rc;
  for (const std::string& list : args.option_lists) {
    if (IsHelpList(list)) {
      return PrintHelp(OptionHelp(args.format == "raw" ? ImageFormat::kRaw
                                                       : ImageFormat::kQcow2));
    }
  }
  CreateRequest req;
  if (int rc = BuildRequest(args, usage, &req); rc >= 0) return rc;
  if (auto s = InspectBacking(&req); !s.ok()) return ReportQemuImgError(s);

  if (!req.quiet) {
    std::printf("%s\n", FormattingLine(req).c_str());
    std::fflush(stdout);
  }
  if (auto s = CheckSizeFits(req); !s.ok()) return ReportQemuImgError(s);
  if (auto s = RemoveExisting(req); !s.ok()) return ReportQemuImgError(s);
  // 0 would mean "the backing file's size" to CreateImage; with a backing
  // file the size is known by now (or given, with -u).
  req.opts.size = req.size.value_or(0);
  if (auto s = ResolveCreateSecret(args.policy.secrets, &req); !s.ok()) {
    return ReportQemuImgError(s);
  }
  if (auto s = CreateImage(req.file, req.opts); !s.ok()) {
    return ReportQemuImgError(s);
  }
  return kExitOk;
}

int RunCreate(int argc, char** argv) {
  return RunCreateWithUsage(argc, argv, DefaultUsage());
}

}  // namespace qcow2::tool
