// SPDX-License-Identifier: Apache-2.0
// qcowtool create: new qcow2 and raw images, with qemu-img create's option
// names (-o key=value,...), size syntax and "Formatting ..." line.
//
// Every option is checked (names, values and combinations) before anything
// on disk changes, so a typo never destroys an existing FILE.
#include <getopt.h>
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

std::string DefaultUsage() { return std::string(kUsage) + kExitStatusHelp; }

absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }

// ---------------------------------------------------------------------------
// The -o options.

struct OptionSpec {
  const char* name;
  const char* type;
  const char* help;
  bool raw;  // also valid for raw images (all are valid for qcow2)
};

constexpr OptionSpec kOptionSpecs[] = {
    {"backing_file", "<str>", "File name of a base image", false},
    {"backing_fmt", "<str>", "Image format of the base image (qcow2, raw)",
     false},
    {"cluster_size", "<size>",
     "qcow2 cluster size (a power of two from 512 to 2M; default 64k)", false},
    {"compat", "<str>", "Compatibility level (v2 [0.10] or v3 [1.1])", false},
    {"compression_type", "<str>",
     "Compression method used for image cluster compression (zlib, zstd)",
     false},
    {"extended_l2", "<bool (on/off)>", "Extended L2 tables", false},
    {"lazy_refcounts", "<bool (on/off)>", "Postpone refcount updates", false},
    {"preallocation", "<str>",
     "Preallocation mode (allowed values: off, metadata, falloc, full)", true},
    {"refcount_bits", "<num>",
     "Width of a reference count entry in bits (1, 2, 4, ... 64)", false},
    {"size", "<size>", "Virtual disk size", true},
};

const OptionSpec* FindOption(std::string_view name) {
  for (const OptionSpec& o : kOptionSpecs) {
    if (name == o.name) return &o;
  }
  return nullptr;
}

// qemu-img options that qcowtool recognises but does not implement.
bool IsUnsupportedQemuOption(std::string_view name) {
  return name == "data_file" || name == "data_file_raw" ||
         name == "encryption" || name.substr(0, 8) == "encrypt.";
}

std::string OptionHelp(ImageFormat format) {
  const bool raw = format == ImageFormat::kRaw;
  std::string out =
      absl::StrCat("Supported ", raw ? "raw" : "qcow2", " options:\n");
  for (const OptionSpec& o : kOptionSpecs) {
    if (raw && !o.raw) continue;
    std::string head = absl::StrCat(o.name, "=", o.type);
    char line[256];
    std::snprintf(line, sizeof line, "  %-22s - %s\n", head.c_str(),
                  raw && std::string_view(o.name) == "preallocation"
                      ? "Preallocation mode (allowed values: off, falloc, "
                        "full)"
                      : o.help);
    out += line;
  }
  return out;
}

bool IsHelpList(std::string_view list) { return list == "help" || list == "?"; }

// Splits "a=1,b=x,,y" into {"a=1", "b=x,y"} (",," is a literal comma, as
// in QEMU's option strings).
std::vector<std::string> SplitOptionList(std::string_view list) {
  std::vector<std::string> items(1);
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] != ',') {
      items.back().push_back(list[i]);
    } else if (i + 1 < list.size() && list[i + 1] == ',') {
      items.back().push_back(',');
      ++i;
    } else {
      items.emplace_back();
    }
  }
  return items;
}

// Parses every -o list into key -> value (the last value of a key wins).
absl::Status ParseOptionLists(const std::vector<std::string>& lists,
                              ImageFormat format,
                              std::map<std::string, std::string>* values) {
  for (const std::string& list : lists) {
    for (const std::string& item : SplitOptionList(list)) {
      if (item.empty()) continue;  // "a=1,,"-style trailing commas
      size_t eq = item.find('=');
      std::string key = item.substr(0, eq);
      const OptionSpec* spec = FindOption(key);
      if (spec == nullptr) {
        if (IsUnsupportedQemuOption(key)) {
          return absl::InvalidArgumentError(
              absl::StrCat("option '", key, "' is not supported by qcowtool"));
        }
        return absl::InvalidArgumentError(
            absl::StrCat("unknown option '", key, "' (see -o help)"));
      }
      if (format == ImageFormat::kRaw && !spec->raw) {
        return absl::InvalidArgumentError(
            absl::StrCat("option '", key, "' is not valid for raw images"));
      }
      if (eq == std::string::npos) {
        // QEMU's shorthand: a bare boolean name means "on".
        if (std::string_view(spec->type).find("bool") ==
            std::string_view::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat("option '", key, "' needs a value"));
        }
        (*values)[key] = "on";
      } else {
        (*values)[key] = item.substr(eq + 1);
      }
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// From options to CreateOptions.

struct CreateRequest {
  std::string file;
  CreateOptions opts;
  std::optional<uint64_t> size;  // as asked (before rounding to 512)
  bool unsafe = false;
  bool quiet = false;
  // How to print the options that qemu-img prints only when given.
  std::optional<std::string> preallocation;
  std::optional<std::string> compat;
};

absl::StatusOr<bool> ParseBool(std::string_view key, std::string_view v) {
  if (v == "on" || v == "yes" || v == "true" || v == "y") return true;
  if (v == "off" || v == "no" || v == "false" || v == "n") return false;
  return absl::InvalidArgumentError(absl::StrCat(
      "option '", AV(key), "' expects 'on' or 'off', not '", AV(v), "'"));
}

absl::StatusOr<uint64_t> ParseDecimal(std::string_view key,
                                      std::string_view v) {
  uint64_t n = 0;
  if (v.empty() || v.size() > 18) n = UINT64_MAX;
  for (char c : v) {
    if (c < '0' || c > '9') {
      n = UINT64_MAX;
      break;
    }
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  if (n == UINT64_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option '", AV(key), "' expects a number, not '", AV(v), "'"));
  }
  return n;
}

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

absl::Status ApplyPreallocation(std::string_view v, ImageFormat format,
                                CreateOptions* o) {
  if (v == "off") {
    o->preallocation = Preallocation::kOff;
  } else if (v == "metadata" && format == ImageFormat::kQcow2) {
    o->preallocation = Preallocation::kMetadata;
  } else if (v == "falloc") {
    o->preallocation = Preallocation::kFalloc;
  } else if (v == "full") {
    o->preallocation = Preallocation::kFull;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "preallocation '", AV(v), "' is not one of off, ",
        format == ImageFormat::kQcow2 ? "metadata, " : "", "falloc, full"));
  }
  return absl::OkStatus();
}

// Applies one parsed -o value. Sizes and numbers are range-checked here;
// combinations in CheckCombinations().
absl::Status ApplyOption(const std::string& key, const std::string& v,
                         CreateRequest* req) {
  CreateOptions& o = req->opts;
  if (key == "size") {
    auto size = ParseSize(v);
    if (!size.ok()) return size.status();
    req->size = *size;
  } else if (key == "backing_file") {
    o.backing_file = v;
  } else if (key == "backing_fmt") {
    o.backing_format = v;
  } else if (key == "cluster_size") {
    auto cs = ParseSize(v);
    if (!cs.ok()) return cs.status();
    if (*cs < 512 || *cs > (2u << 20) || !IsPowerOfTwo(*cs)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster size ", AV(v),
                       " must be a power of two between 512 and 2M"));
    }
    o.cluster_size = static_cast<uint32_t>(*cs);
  } else if (key == "compat") {
    if (v != "0.10" && v != "1.1" && v != "v2" && v != "v3") {
      return absl::InvalidArgumentError(
          absl::StrCat("compat '", v, "' is not one of 0.10, 1.1 (or v2, v3)"));
    }
    o.compat = v;
    req->compat = v;
  } else if (key == "compression_type") {
    if (v == "zlib") {
      o.compression_type = CompressionType::kZlib;
    } else if (v == "zstd") {
      o.compression_type = CompressionType::kZstd;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("compression_type '", v, "' is not one of zlib, zstd"));
    }
  } else if (key == "extended_l2") {
    auto b = ParseBool(key, v);
    if (!b.ok()) return b.status();
    o.extended_l2 = *b;
  } else if (key == "lazy_refcounts") {
    auto b = ParseBool(key, v);
    if (!b.ok()) return b.status();
    o.lazy_refcounts = *b;
  } else if (key == "preallocation") {
    if (auto s = ApplyPreallocation(v, o.format, &o); !s.ok()) return s;
    req->preallocation = v;
  } else if (key == "refcount_bits") {
    auto n = ParseDecimal(key, v);
    if (!n.ok()) return n.status();
    if (*n > 64 || !IsPowerOfTwo(*n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "refcount_bits ", v, " must be a power of two up to 64"));
    }
    o.refcount_bits = static_cast<uint32_t>(*n);
  }
  return absl::OkStatus();
}

// The checks qemu-img makes on option combinations (qcow2 only).
absl::Status CheckCombinations(const CreateOptions& o) {
  if (o.format == ImageFormat::kRaw) return absl::OkStatus();
  const bool v2 = o.compat == "0.10" || o.compat == "v2";
  const std::string need_v3 = " require compat=1.1";
  if (v2 && o.extended_l2) {
    return absl::InvalidArgumentError(
        absl::StrCat("extended L2 entries (extended_l2=on)", need_v3));
  }
  if (v2 && o.compression_type != CompressionType::kZlib) {
    return absl::InvalidArgumentError(
        "compression_type=zstd requires compat=1.1");
  }
  if (v2 && o.lazy_refcounts) {
    return absl::InvalidArgumentError(
        absl::StrCat("lazy refcounts (lazy_refcounts=on)", need_v3));
  }
  if (v2 && o.refcount_bits != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("refcount widths other than 16 bits", need_v3));
  }
  if (o.extended_l2 && o.cluster_size < 16384) {
    return absl::InvalidArgumentError(
        "extended L2 entries (extended_l2=on) need a cluster size of at "
        "least 16k");
  }
  if (!o.backing_file.empty() && o.preallocation != Preallocation::kOff &&
      !o.extended_l2) {
    return absl::InvalidArgumentError(
        "a backing file and preallocation can only be used together with "
        "extended_l2=on");
  }
  if (!o.backing_format.empty() && o.backing_format != "qcow2" &&
      o.backing_format != "raw") {
    return absl::InvalidArgumentError(absl::StrCat(
        "backing format '", o.backing_format, "' is not one of qcow2, raw"));
  }
  return absl::OkStatus();
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
  std::vector<std::string> positional;
};

// Returns -1 when parsed, else the exit status to return.
int ParseArgs(int argc, char** argv, const std::string& usage, CreateArgs* a) {
  static const option kOptions[] = {
      {"help", no_argument, nullptr, 'h'},
      {"format", required_argument, nullptr, 'f'},
      {"options", required_argument, nullptr, 'o'},
      {"backing", required_argument, nullptr, 'b'},
      {"backing-format", required_argument, nullptr, 'F'},
      {"unsafe", no_argument, nullptr, 'u'},
      {"quiet", no_argument, nullptr, 'q'},
      {nullptr, 0, nullptr, 0},
  };
  ResetGetopt();
  int c;
  while ((c = getopt_long(argc, argv, "f:o:b:F:uqh", kOptions, nullptr)) !=
         -1) {
    switch (c) {
      case 'h':
        return PrintHelp(usage);
      case 'f':
        if (auto s = CheckImageFormat(optarg); !s.ok()) {
          return UsageError(usage, s.message());
        }
        a->format = optarg;
        break;
      case 'o':
        a->option_lists.push_back(optarg);
        break;
      case 'b':
        a->backing = optarg;
        break;
      case 'F':
        a->backing_format = optarg;
        break;
      case 'u':
        a->unsafe = true;
        break;
      case 'q':
        a->quiet = true;
        break;
      default:
        return UsageError(usage, "");
    }
  }
  for (int i = optind; i < argc; ++i) a->positional.push_back(argv[i]);
  return -1;
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
  if (auto s = InspectBacking(&req); !s.ok()) return ReportError(s);

  if (!req.quiet) {
    std::printf("%s\n", FormattingLine(req).c_str());
    std::fflush(stdout);
  }
  if (auto s = CheckSizeFits(req); !s.ok()) return ReportError(s);
  if (auto s = RemoveExisting(req); !s.ok()) return ReportError(s);
  // 0 would mean "the backing file's size" to CreateImage; with a backing
  // file the size is known by now (or given, with -u).
  req.opts.size = req.size.value_or(0);
  if (auto s = CreateImage(req.file, req.opts); !s.ok()) return ReportError(s);
  return kExitOk;
}

int RunCreate(int argc, char** argv) {
  return RunCreateWithUsage(argc, argv, DefaultUsage());
}

}  // namespace qcow2::tool
