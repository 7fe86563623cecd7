// SPDX-License-Identifier: Apache-2.0
// qcowtool bitmap (--merge SOURCE | --add | --remove | --clear | --enable |
//                  --disable)... [-b source_file [-F source_fmt]]
//                  [-g granularity] [-f fmt] FILENAME BITMAP
//
// The equivalent of `qemu-img bitmap`: the operations run in the order
// given on the persistent dirty bitmap BITMAP of FILENAME, which is opened
// read-write (its bitmaps marked in use) and closed cleanly (stored). Same
// messages and exit status as qemu-img: 0 success, 1 any failure.
#include <getopt.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/driver/qcow2_layer.h"
#include "qcow2/file.h"
#include "qcow2/options.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace qcow2::tool {
namespace {

using ::qcow2::internal::Qcow2Layer;

constexpr int kExitFailure = 1;  // qemu-img bitmap's only failure status

constexpr char kUsage[] =
    "usage: qcowtool bitmap (--merge SOURCE | --add | --remove | --clear |\n"
    "                        --enable | --disable)... [-b source_file\n"
    "                        [-F source_fmt]] [-g granularity] [-f fmt]\n"
    "                        FILENAME BITMAP\n"
    "\n"
    "Changes the persistent dirty bitmap BITMAP of the qcow2 image FILENAME,\n"
    "like qemu-img bitmap. The operations run in the order given:\n"
    "  --add          create BITMAP (enabled unless --disable is given too)\n"
    "  --remove       delete BITMAP and free its clusters\n"
    "  --clear        clear every bit of BITMAP\n"
    "  --enable       let writes set BITMAP's bits (the auto flag)\n"
    "  --disable      stop writes from setting BITMAP's bits\n"
    "  --merge SOURCE set in BITMAP every bit set in bitmap SOURCE (of\n"
    "                 FILENAME, or of source_file with -b)\n"
    "  -g SIZE        granularity of an added bitmap (default: the cluster\n"
    "                 size, at least 4 KiB)\n"
    "  -b FILE        the image holding the --merge source\n"
    "  -F FMT, -f FMT the formats of source_file and FILENAME (qcow2)\n"
    "Exit status (as qemu-img bitmap): 0 success, 1 failure.\n";

enum class Op { kAdd, kRemove, kClear, kEnable, kDisable, kMerge };

const char* OpName(Op op) {
  switch (op) {
    case Op::kAdd:
      return "add";
    case Op::kRemove:
      return "remove";
    case Op::kClear:
      return "clear";
    case Op::kEnable:
      return "enable";
    case Op::kDisable:
      return "disable";
    case Op::kMerge:
      return "merge";
  }
  return "";
}

struct Action {
  Op op;
  std::string source;  // --merge
};

struct Args {
  std::vector<Action> actions;
  std::string source_file, source_fmt, fmt;
  std::string image, bitmap;
  bool granularity_set = false;
  uint64_t granularity = 0;
  bool add = false;
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "qcowtool: %s\n", message.c_str());
  return kExitFailure;
}

// Opens `path` as a qcow2 layer, read-write or not, taking the image locks.
absl::StatusOr<std::unique_ptr<Qcow2Layer>> OpenLayer(const std::string& path,
                                                      bool read_write) {
  FileOptions fo;
  fo.read_only = !read_write;
  absl::StatusOr<std::unique_ptr<File>> file =
      DefaultFileOpener()->Open(path, fo);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("Could not open '", path,
                                     "': ", file.status().message()));
  }
  OpenOptions oo;
  oo.read_write = read_write;
  oo.format = "qcow2";
  absl::StatusOr<std::unique_ptr<Qcow2Layer>> layer =
      Qcow2Layer::Open(std::move(file).value(), oo);
  if (!layer.ok()) {
    return absl::Status(layer.status().code(),
                        absl::StrCat("Could not open '", path,
                                     "': ", layer.status().message()));
  }
  return layer;
}

// Parses the command line; returns -1 to go on, else the exit status.
int Parse(int argc, char** argv, Args* a) {
  enum { kOptAdd = 300, kOptRemove, kOptClear, kOptEnable, kOptDisable,
         kOptMerge, kOptObject, kOptImageOpts };
  static const option kLong[] = {
      {"help", no_argument, nullptr, 'h'},
      {"add", no_argument, nullptr, kOptAdd},
      {"remove", no_argument, nullptr, kOptRemove},
      {"clear", no_argument, nullptr, kOptClear},
      {"enable", no_argument, nullptr, kOptEnable},
      {"disable", no_argument, nullptr, kOptDisable},
      {"merge", required_argument, nullptr, kOptMerge},
      {"object", required_argument, nullptr, kOptObject},
      {"image-opts", no_argument, nullptr, kOptImageOpts},
      {"granularity", required_argument, nullptr, 'g'},
      {"source-file", required_argument, nullptr, 'b'},
      {"source-format", required_argument, nullptr, 'F'},
      {nullptr, 0, nullptr, 0}};
  ResetGetopt();
  int c;
  while ((c = getopt_long(argc, argv, ":b:f:F:g:h", kLong, nullptr)) != -1) {
    switch (c) {
      case 'h':
        return PrintHelp(kUsage);
      case 'b':
        a->source_file = optarg;
        break;
      case 'f':
        a->fmt = optarg;
        break;
      case 'F':
        a->source_fmt = optarg;
        break;
      case 'g': {
        absl::StatusOr<uint64_t> g = ParseSize(optarg);
        if (!g.ok() || *g == 0) {
          return Fail(
              "Invalid granularity specified. You may use k, M, G, T, P or "
              "E suffixes for kilobytes, megabytes, gigabytes, terabytes, "
              "petabytes and exabytes.");
        }
        a->granularity = *g;
        a->granularity_set = true;
        break;
      }
      case kOptAdd:
        a->actions.push_back({Op::kAdd, ""});
        a->add = true;
        break;
      case kOptRemove:
        a->actions.push_back({Op::kRemove, ""});
        break;
      case kOptClear:
        a->actions.push_back({Op::kClear, ""});
        break;
      case kOptEnable:
        a->actions.push_back({Op::kEnable, ""});
        break;
      case kOptDisable:
        a->actions.push_back({Op::kDisable, ""});
        break;
      case kOptMerge:
        a->actions.push_back({Op::kMerge, optarg});
        break;
      case kOptObject:
        return Fail("--object is not supported (no QEMU objects here)");
      case kOptImageOpts:
        return Fail("--image-opts is not supported");
      case ':':
        return UsageError(kUsage, absl::StrCat("option '", argv[optind - 1],
                                               "' needs an argument"));
      default:
        return UsageError(kUsage, absl::StrCat("unknown option '",
                                               argv[optind - 1], "'"));
    }
  }
  if (a->actions.empty()) {
    return Fail(
        "Need at least one of --add, --remove, --clear, --enable, "
        "--disable, or --merge");
  }
  if (a->granularity_set && !a->add) {
    return Fail("granularity only supported with --add");
  }
  if (!a->source_fmt.empty() && a->source_file.empty()) {
    return Fail("-F only supported with -b");
  }
  if (!a->source_file.empty() && a->actions.back().op != Op::kMerge) {
    bool merge = false;
    for (const Action& act : a->actions) merge |= act.op == Op::kMerge;
    if (!merge) return Fail("Merge bitmap source file only supported with --merge");
  }
  if (optind != argc - 2) return Fail("Expecting filename and bitmap name");
  a->image = argv[optind];
  a->bitmap = argv[optind + 1];
  for (const std::string* f : {&a->fmt, &a->source_fmt}) {
    if (!f->empty() && *f != "qcow2") {
      return Fail(absl::StrCat("Format '", *f,
                               "' does not support persistent bitmaps"));
    }
  }
  return -1;
}

}  // namespace

int RunBitmap(int argc, char** argv) {
  Args a;
  if (int rc = Parse(argc, argv, &a); rc >= 0) return rc;
  absl::StatusOr<std::unique_ptr<Qcow2Layer>> image =
      OpenLayer(a.image, /*read_write=*/true);
  if (!image.ok()) return Fail(std::string(image.status().message()));
  Qcow2Layer& layer = **image;
  internal::DirtyBitmaps& bitmaps = layer.bitmaps();
  absl::Status result;
  for (const Action& act : a.actions) {
    absl::Status s;
    switch (act.op) {
      case Op::kAdd: {
        uint64_t g = a.granularity;
        if (!a.granularity_set) {
          g = std::max<uint64_t>(4096, layer.header().cluster_size());
        }
        s = bitmaps.Add(a.bitmap, g, /*enabled=*/true);
        break;
      }
      case Op::kRemove:
        s = bitmaps.Remove(a.bitmap);
        break;
      case Op::kClear:
        s = bitmaps.Clear(a.bitmap);
        break;
      case Op::kEnable:
        s = bitmaps.SetEnabled(a.bitmap, true);
        break;
      case Op::kDisable:
        s = bitmaps.SetEnabled(a.bitmap, false);
        break;
      case Op::kMerge: {
        absl::StatusOr<std::pair<std::vector<uint8_t>, uint32_t>> bits;
        if (a.source_file.empty()) {
          bits = bitmaps.Bits(act.source);
        } else {
          absl::StatusOr<std::unique_ptr<Qcow2Layer>> src =
              OpenLayer(a.source_file, /*read_write=*/false);
          if (!src.ok()) return Fail(std::string(src.status().message()));
          absl::Status loaded = (*src)->bitmaps().LoadReadOnly();
          bits = loaded.ok() ? (*src)->bitmaps().Bits(act.source)
                             : absl::StatusOr<std::pair<std::vector<uint8_t>,
                                                        uint32_t>>(loaded);
        }
        s = bits.ok() ? bitmaps.MergeInto(a.bitmap, bits->first, bits->second)
                      : bits.status();
        break;
      }
    }
    if (!s.ok()) {
      result = absl::Status(
          s.code(), absl::StrCat("Operation ", OpName(act.op), " on bitmap ",
                                 a.bitmap, " failed: ", s.message()));
      break;
    }
  }
  // Stores what was changed, even after a failed operation (as qemu-img
  // does: the image is closed either way).
  absl::Status closed = layer.Close();
  if (!result.ok()) return Fail(std::string(result.message()));
  if (!closed.ok()) return Fail(std::string(closed.message()));
  return 0;
}

}  // namespace qcow2::tool
