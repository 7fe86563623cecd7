// SPDX-License-Identifier: Apache-2.0
// qcowtool snapshot: internal snapshots as `qemu-img snapshot -l/-c/-a/-d`
// makes them, or (with two file names and none of those flags) an external
// snapshot, i.e. a new qcow2 overlay whose backing file is the image.
#include <stdio.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "qcow2/image.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/image_info.h"
#include "tools/option_parser.h"

namespace qcow2::tool {

// Defined in tools/cmd_create.cc: `qcowtool create` printing `usage` for
// --help and argument errors.
int RunCreateWithUsage(int argc, char** argv, const std::string& usage);

namespace {

constexpr char kUsage[] =
    "usage: qcowtool snapshot [-q] [-f FMT] [-U] -l IMAGE\n"
    "       qcowtool snapshot [-q] [-f FMT] -c NAME | -a NAME | -d NAME IMAGE\n"
    "       qcowtool snapshot [-q] [-o OPTIONS] [-F FMT] [--no-extended-l2]\n"
    "                         IMAGE OVERLAY\n"
    "\n"
    "With -l, -c, -a or -d: the internal snapshots of the qcow2 IMAGE, as\n"
    "'qemu-img snapshot' handles them (the same table, refcounts and\n"
    "listing, readable by QEMU):\n"
    "  -l          list them (ID, TAG, VM SIZE, DATE, VM CLOCK, ICOUNT)\n"
    "  -c NAME     create one named NAME (at most 255 bytes; names may\n"
    "              repeat; the id is one more than the largest)\n"
    "  -a NAME     apply (revert to) the snapshot whose id, else whose\n"
    "              name, is NAME\n"
    "  -d NAME     delete the first snapshot named NAME\n"
    "  -f FMT      format of IMAGE (qcow2)\n"
    "  -U, --force-share\n"
    "              with -l: list while another process has IMAGE open\n"
    "The backing file is not opened.\n"
    "\n"
    "Otherwise: takes an external snapshot of IMAGE: creates the qcow2\n"
    "image OVERLAY (which must not exist) backed by IMAGE; from then on\n"
    "writes go to OVERLAY and IMAGE stays as it was. OVERLAY records\n"
    "IMAGE by its bare name when both are in the same directory, else by\n"
    "its absolute path, and IMAGE's format (probed unless -F is given).\n"
    "The size is IMAGE's unless -o size= says otherwise.\n"
    "\n"
    "OVERLAY gets extended L2 entries (subcluster allocation) unless -o\n"
    "says otherwise or its cluster size is below 16k: a small write into it\n"
    "then copies at most one subcluster (cluster_size/32) from IMAGE instead\n"
    "of a whole cluster. Opening such an image needs QEMU 5.2 or later;\n"
    "--no-extended-l2 (or -o extended_l2=off) makes one that older QEMU\n"
    "can open.\n"
    "\n"
    "  -o OPTIONS  OVERLAY's creation options, as for 'qcowtool create'\n"
    "              (cluster_size, extended_l2, compression_type, ...;\n"
    "              '-o help' lists them)\n"
    "  --no-extended-l2\n"
    "              standard L2 entries (for QEMU before 5.2)\n"
    "  -F FMT      format of IMAGE: qcow2 or raw (default: probe)\n"
    "  -q          do not print the \"Formatting ...\" line\n"
    "  -h, --help  show this help\n"
    "\n";

std::string Usage() {
  return std::string(kUsage) + kSecretHelp + kQemuImgExitStatusHelp;
}

struct SnapshotArgs {
  std::vector<std::string> option_lists;
  std::string backing_format;
  std::string format;  // -f: IMAGE's own format (internal snapshots)
  bool quiet = false;
  bool internal = false;  // -l, -c, -a or -d
  char action = 0;        // 'l', 'c', 'a' or 'd'
  std::string name;       // the argument of -c, -a or -d
  OpenPolicy policy;      // -U
  bool no_extended_l2 = false;
  std::string image;
  std::string overlay;
};

// -l, -c NAME, -a NAME, -d NAME: one internal-snapshot action at most.
OptionParser::Handler Action(const OptionParser& parser, char action,
                             SnapshotArgs* args) {
  return [&parser, action, args](const char* name) {
    if (args->internal) {
      return parser.Error("Cannot mix '-l', '-a', '-c', '-d'");
    }
    args->internal = true;
    args->action = action;
    if (name != nullptr) args->name = name;
    return kGoOn;
  };
}

// Returns -1 when parsed, else the exit status to return.
int ParseArgs(int argc, char** argv, SnapshotArgs* args) {
  using Arg = OptionParser::Arg;
  OptionParser parser(Usage());
  parser.Help()
      .List("options", 'o', &args->option_lists)
      .Format("backing-format", 'F', &args->backing_format)
      .Flag("quiet", 'q', &args->quiet)
      .Flag("no-extended-l2", 0, &args->no_extended_l2)
      .Format(&args->format)
      .ForceShare(&args->policy)
      .Secrets(&args->policy)
      .Add("", 'l', Arg::kNone, Action(parser, 'l', args))
      .Add("", 'c', Arg::kRequired, Action(parser, 'c', args))
      .Add("", 'a', Arg::kRequired, Action(parser, 'a', args))
      .Add("", 'd', Arg::kRequired, Action(parser, 'd', args));
  std::vector<std::string> rest;
  if (int rc = parser.Parse(argc, argv, &rest); rc != kGoOn) return rc;
  for (const std::string& list : args->option_lists) {
    if (list == "help" || list == "?") return -1;  // create prints it
    for (const char* key : {"backing_file", "backing_fmt"}) {
      if (absl::StrContains(absl::StrCat(",", list), absl::StrCat(",", key))) {
        return UsageError(Usage(),
                          absl::StrCat("-o ", key,
                                       " cannot be used: the "
                                       "overlay's backing file is IMAGE"));
      }
    }
  }
  if (args->internal) {
    if (rest.size() != 1) return UsageError(Usage(), "expecting one image");
    if (args->policy.force_share && args->action != 'l') {
      return UsageError(Usage(),
                        "-U (force share) can only be used with -l: the "
                        "other operations write IMAGE");
    }
    args->image = rest[0];
    if (absl::Status s = args->policy.ResolveImage(&args->image, &args->format);
        !s.ok()) {
      return ReportQemuImgError(s);
    }
    return -1;
  }
  if (!args->format.empty() || args->policy.force_share) {
    return UsageError(Usage(), "-f and -U go with -l, -c, -a or -d");
  }
  if (rest.size() < 2) {
    return UsageError(Usage(), "expecting an image and an overlay name");
  }
  if (rest.size() > 2) {
    return UsageError(Usage(),
                      absl::StrCat("unexpected argument '", rest[2], "'"));
  }
  args->image = rest[0];
  args->overlay = rest[1];
  return -1;
}

// The backing name OVERLAY stores for IMAGE: the bare name when both are
// in the same directory, else IMAGE's absolute path (its directory made
// canonical; IMAGE itself is not resolved, so a symlink stays a symlink).
absl::StatusOr<std::string> BackingName(const std::string& image,
                                        const std::string& overlay) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path image_path(image);
  fs::path image_dir = image_path.parent_path();
  if (image_dir.empty()) image_dir = ".";
  fs::path overlay_dir = fs::path(overlay).parent_path();
  if (overlay_dir.empty()) overlay_dir = ".";
  const fs::path canon_image_dir = fs::canonical(image_dir, ec);
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", image, ": ", ec.message()));
  }
  const fs::path canon_overlay_dir = fs::canonical(overlay_dir, ec);
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("cannot create ", overlay, ": directory ",
                     overlay_dir.string(), ": ", ec.message()));
  }
  if (canon_image_dir == canon_overlay_dir) {
    return image_path.filename().string();
  }
  return (canon_image_dir / image_path.filename()).string();
}

// Whether OVERLAY gets extended L2 entries by default: when no -o list
// names extended_l2 and the cluster size (if given) allows them.
bool DefaultExtendedL2(const SnapshotArgs& args) {
  if (args.no_extended_l2) return false;
  for (const std::string& list : args.option_lists) {
    for (absl::string_view item : absl::StrSplit(list, ',')) {
      if (absl::StartsWith(item, "extended_l2")) return false;
      if (absl::ConsumePrefix(&item, "cluster_size=")) {
        absl::StatusOr<uint64_t> cs =
            ParseSize(std::string_view(item.data(), item.size()));
        // A bad size is for create to report.
        if (!cs.ok() || *cs < (16u << 10)) return false;
      }
    }
  }
  return true;
}

// `qemu-img snapshot -l/-c/-a/-d IMAGE`, with qemu-img's messages.
int RunInternal(const SnapshotArgs& args) {
  OpenOptions opts;
  opts.format = args.format;
  opts.open_backing = false;  // qemu-img: BDRV_O_NO_BACKING
  opts.read_write = args.action != 'l';
  args.policy.ApplyTo(&opts);
  auto image = Image::Open(args.image, opts);
  if (!image.ok()) return ReportQemuImgError(image.status());
  auto failed = [&](const char* verb, const absl::Status& s) {
    return ReportQemuImgError(
        absl::Status(s.code(), absl::StrCat("Could not ", verb, " snapshot '",
                                            args.name, "': ", s.message())));
  };
  absl::Status st;
  switch (args.action) {
    case 'l': {
      auto list = (*image)->ListSnapshots();
      if (!list.ok()) return ReportQemuImgError(list.status());
      const std::string text = SnapshotListText(*list);
      std::fwrite(text.data(), 1, text.size(), stdout);
      break;
    }
    case 'c': {
      // qemu-img keeps a name in 256 bytes, NUL included.
      auto created = (*image)->CreateSnapshot(args.name.substr(0, 255));
      if (!created.ok()) return failed("create", created.status());
      break;
    }
    case 'a':
      st = (*image)->ApplySnapshot(args.name);
      if (!st.ok()) return failed("apply", st);
      break;
    case 'd': {
      // qemu-img deletes the first snapshot with that name (ids do not
      // count here, unlike for -a).
      auto list = (*image)->ListSnapshots();
      if (!list.ok()) return failed("delete", list.status());
      const SnapshotInfo* found = nullptr;
      for (const SnapshotInfo& sn : *list) {
        if (sn.name == args.name) {
          found = &sn;
          break;
        }
      }
      if (found == nullptr) {
        return failed("delete", absl::NotFoundError("snapshot not found"));
      }
      st = (*image)->DeleteSnapshot(found->id);
      if (!st.ok()) return failed("delete", st);
      break;
    }
  }
  st = (*image)->Close();
  if (!st.ok()) return ReportQemuImgError(st);
  return std::fflush(stdout) == 0 ? kExitOk : kExitFailure;
}

}  // namespace

int RunSnapshot(int argc, char** argv) {
  SnapshotArgs args;
  if (int rc = ParseArgs(argc, argv, &args); rc >= 0) return rc;

  std::vector<std::string> create = {argv[0], "-f", "qcow2"};
  if (!args.internal && !args.overlay.empty() && DefaultExtendedL2(args)) {
    create.push_back("-o");
    create.push_back("extended_l2=on");
  }
  for (const std::string& list : args.option_lists) {
    create.push_back("-o");
    create.push_back(list);
  }
  if (args.overlay.empty() && !args.internal) {  // -o help
    std::vector<char*> cargv;
    for (std::string& s : create) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    return RunCreateWithUsage(static_cast<int>(cargv.size()) - 1, cargv.data(),
                              Usage());
  }
  if (args.internal) return RunInternal(args);

  struct stat st;
  if (lstat(args.overlay.c_str(), &st) == 0) {
    return ReportQemuImgError(absl::AlreadyExistsError(absl::StrCat(
        args.overlay, " already exists (snapshot never overwrites a file)")));
  }
  auto backing = BackingName(args.image, args.overlay);
  if (!backing.ok()) return ReportQemuImgError(backing.status());

  create.push_back("-b");
  create.push_back(*backing);
  if (!args.backing_format.empty()) {
    create.push_back("-F");
    create.push_back(args.backing_format);
  }
  if (args.quiet) create.push_back("-q");
  create.push_back("--");
  create.push_back(args.overlay);
  std::vector<char*> cargv;
  for (std::string& s : create) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  return RunCreateWithUsage(static_cast<int>(cargv.size()) - 1, cargv.data(),
                            Usage());
}

}  // namespace qcow2::tool
