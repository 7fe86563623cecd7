// SPDX-License-Identifier: Apache-2.0
// qcowtool bitmap (--merge SOURCE | --add | --remove | --clear | --enable |
//                  --disable)... [-b source_file [-F source_fmt]]
//                  [-g granularity] [-f fmt] FILENAME BITMAP
//
// The equivalent of `qemu-img bitmap`: the operations run in the order
// given on the persistent dirty bitmap BITMAP of FILENAME, which is opened
// read-write (its bitmaps marked in use) and closed cleanly (stored). Same
// messages and exit status as qemu-img: 0 success, 1 any failure.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "qcow2/image.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/option_parser.h"

namespace qcow2::tool {
namespace {

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
    "  --object secret,id=ID,data=STRING|file=PATH  a secret, for\n"
    "                 encrypt.key-secret=ID (of FILENAME and source_file)\n"
    "  --image-opts   FILENAME is driver=qcow2,file.filename=PATH,\n"
    "                 encrypt.key-secret=ID\n"
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
  OpenPolicy policy;  // --object, --image-opts
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "qcowtool: %s\n", message.c_str());
  return kExitFailure;
}

// Opens qcow2 image `path` alone (no backing file), read-write or not,
// taking the image locks.
absl::StatusOr<std::unique_ptr<Image>> OpenImage(const std::string& path,
                                                 bool read_write,
                                                 const std::string& secret) {
  OpenOptions oo;
  oo.key_secret = secret;
  oo.read_write = read_write;
  oo.format = "qcow2";
  oo.open_backing = false;
  absl::StatusOr<std::unique_ptr<Image>> image = Image::Open(path, oo);
  if (!image.ok()) {
    return absl::Status(image.status().code(),
                        absl::StrCat("Could not open '", path,
                                     "': ", image.status().message()));
  }
  return image;
}

// -g: qemu-img's granularity check and message.
int TakeGranularity(const char* v, Args* a) {
  absl::StatusOr<uint64_t> g = ParseSize(v);
  if (!g.ok() || *g == 0) {
    return Fail(
        "Invalid granularity specified. You may use k, M, G, T, P or "
        "E suffixes for kilobytes, megabytes, gigabytes, terabytes, "
        "petabytes and exabytes.");
  }
  a->granularity = *g;
  a->granularity_set = true;
  return kGoOn;
}

// A bad option, in this command's words.
int BadOption(const OptionParser::BadOption& bad) {
  return UsageError(kUsage, bad.missing_value
                                ? absl::StrCat("option '", bad.word,
                                               "' needs an argument")
                                : absl::StrCat("unknown option '", bad.word,
                                               "'"));
}

// Parses the command line; returns -1 to go on, else the exit status.
int Parse(int argc, char** argv, Args* a) {
  using Arg = OptionParser::Arg;
  auto action = [a](Op op) {
    return [a, op](const char* v) {
      a->actions.push_back({op, v != nullptr ? v : ""});
      a->add |= op == Op::kAdd;
      return kGoOn;
    };
  };
  OptionParser parser(kUsage);
  parser.OnBadOption(BadOption)
      .Help()
      .Add("add", 0, Arg::kNone, action(Op::kAdd))
      .Add("remove", 0, Arg::kNone, action(Op::kRemove))
      .Add("clear", 0, Arg::kNone, action(Op::kClear))
      .Add("enable", 0, Arg::kNone, action(Op::kEnable))
      .Add("disable", 0, Arg::kNone, action(Op::kDisable))
      .Add("merge", 0, Arg::kRequired, action(Op::kMerge))
      .Secrets(&a->policy)
      .Add("granularity", 'g', Arg::kRequired,
           [a](const char* v) { return TakeGranularity(v, a); })
      .Text("source-file", 'b', &a->source_file)
      .Text("source-format", 'F', &a->source_fmt)
      .Text("", 'f', &a->fmt);
  std::vector<std::string> operands;
  if (int rc = parser.Parse(argc, argv, &operands); rc != kGoOn) return rc;
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
  if (operands.size() != 2) return Fail("Expecting filename and bitmap name");
  a->image = operands[0];
  a->bitmap = operands[1];
  if (absl::Status s = a->policy.ResolveImage(&a->image, &a->fmt); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  for (const std::string* f : {&a->fmt, &a->source_fmt}) {
    if (!f->empty() && *f != "qcow2") {
      return Fail(absl::StrCat("Format '", *f,
                               "' does not support persistent bitmaps"));
    }
  }
  return -1;
}

// Runs one action on bitmap `a.bitmap` of `image`; a merge takes its
// source from `source` (null: `image` itself).
absl::Status Apply(Image& image, const Args& a, const Action& act,
                   const Image* source) {
  switch (act.op) {
    case Op::kAdd:
      return image.AddBitmap(a.bitmap, a.granularity_set ? a.granularity : 0,
                             /*enabled=*/true);
    case Op::kRemove:
      return image.RemoveBitmap(a.bitmap);
    case Op::kClear:
      return image.ClearBitmap(a.bitmap);
    case Op::kEnable:
      return image.EnableBitmap(a.bitmap);
    case Op::kDisable:
      return image.DisableBitmap(a.bitmap);
    case Op::kMerge:
      return image.MergeBitmap(a.bitmap, act.source, source);
  }
  return absl::OkStatus();
}

}  // namespace

int RunBitmap(int argc, char** argv) {
  Args a;
  if (int rc = Parse(argc, argv, &a); rc >= 0) return rc;
  absl::StatusOr<std::unique_ptr<Image>> image =
      OpenImage(a.image, /*read_write=*/true, a.policy.key_secret);
  if (!image.ok()) return Fail(std::string(image.status().message()));
  absl::Status result;
  for (const Action& act : a.actions) {
    std::unique_ptr<Image> source;
    if (act.op == Op::kMerge && !a.source_file.empty()) {
      absl::StatusOr<std::unique_ptr<Image>> src =
          OpenImage(a.source_file, /*read_write=*/false,
                    a.policy.key_secret);
      if (!src.ok()) return Fail(std::string(src.status().message()));
      source = std::move(src).value();
    }
    absl::Status s = Apply(**image, a, act, source.get());
    if (!s.ok()) {
      result = absl::Status(
          s.code(), absl::StrCat("Operation ", OpName(act.op), " on bitmap ",
                                 a.bitmap, " failed: ", s.message()));
      break;
    }
  }
  // Stores what was changed, even after a failed operation (as qemu-img
  // does: the image is closed either way).
  absl::Status closed = (*image)->Close();
  if (!result.ok()) return Fail(std::string(result.message()));
  if (!closed.ok()) return Fail(std::string(closed.message()));
  return 0;
}

}  // namespace qcow2::tool
