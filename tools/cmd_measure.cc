// SPDX-License-Identifier: Apache-2.0
// qcowtool measure: the file size a new image needs, for a given virtual
// size or to hold a copy of an existing image, printed exactly as
// `qemu-img measure` prints it (qcow2/maintenance.h has the formulas).

#include <cinttypes>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "qcow2/image.h"
#include "qcow2/maintenance.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/create_options.h"
#include "tools/json_writer.h"
#include "tools/option_parser.h"
#include "tools/status_above.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool measure [--output=human|json] [-O FMT] [-o OPTIONS]\n"
    "                        [-f FMT] [-U] [--size N | FILENAME]\n"
    "\n"
    "Prints the size of the file a new image of format FMT needs, as\n"
    "'qemu-img measure' does: for a disk of N bytes, or to hold a copy of\n"
    "FILENAME (read through its backing chain). 'required size' counts\n"
    "the data clusters the copy needs, 'fully allocated size' every\n"
    "cluster; 'bitmaps size' (qcow2 v3 sources and targets) the room the\n"
    "source's persistent bitmaps take.\n"
    "\n"
    "  --output=human|json  the report's form (default human)\n"
    "  -O FMT      format of the new image: raw (default) or qcow2\n"
    "  -o OPTIONS  its creation options, as for create: cluster_size,\n"
    "              compat, extended_l2, refcount_bits, preallocation,\n"
    "              backing_file count ('qcowtool create -o help' lists\n"
    "              them)\n"
    "  -f FMT      format of FILENAME: qcow2 or raw (default: probe)\n"
    "  --size N    the virtual size (k, M, G, T, P, E suffixes)\n"
    "  -l SNAPSHOT is not supported yet (internal snapshots)\n";

constexpr char kHelpTail[] =
    "  -h, --help  show this help\n"
    "\n"
    "Exit status (qemu-img's): 0 measured, 1 on any error.\n";

std::string Usage() {
  return std::string(kUsage) + kForceShareHelp + kBackingRootHelp + kHelpTail;
}

struct MeasureArgs {
  OutputFormat output = OutputFormat::kHuman;
  std::string format;
  std::string out_format = "raw";
  std::vector<std::string> option_lists;
  std::optional<uint64_t> size;
  bool snapshot = false;
  OpenPolicy policy;
  std::optional<std::string> filename;
};

int ParseArgs(int argc, char** argv, MeasureArgs* args) {
  OptionParser parser(Usage());
  parser
      .Add("output", 0, OptionParser::Arg::kRequired,
           [args](const char* v) {
             auto f = ParseOutputFormat(v);
             if (!f.ok()) {
               return ReportFailure(
                   "--output must be used with human or json as argument.");
             }
             args->output = *f;
             return kGoOn;
           })
      .Add("size", 0, OptionParser::Arg::kRequired,
           [args](const char* v) {
             auto n = ParseSize(v);
             if (!n.ok()) return ReportFailure(n.status().message());
             args->size = *n;
             return kGoOn;
           })
      .Policy(&args->policy)
      .Help()
      .Format("", 'f', &args->format)
      .Text("", 'O', &args->out_format)
      .List("", 'o', &args->option_lists)
      .Flag("", 'l', &args->snapshot);
  std::vector<std::string> operands;
  if (int rc = parser.Parse(argc, argv, &operands); rc != kGoOn) return rc;
  if (operands.size() > 1) {
    return ReportFailure("At most one filename argument is allowed.");
  }
  if (operands.size() == 1) args->filename = operands[0];
  if (!args->filename && (!args->format.empty() || args->snapshot)) {
    return ReportFailure("-f and -l require a filename argument.");
  }
  if (args->filename && args->size) {
    return ReportFailure("--size N cannot be used together with a filename.");
  }
  if (!args->filename && !args->size) {
    return ReportFailure("Either --size N or one filename must be specified.");
  }
  if (args->snapshot) {
    return ReportFailure("-l (measuring an internal snapshot) is not supported yet");
  }
  if (args->filename) {
    // --image-opts: the file, driver and secrets of the option string.
    if (auto s = args->policy.ResolveImage(&*args->filename, &args->format);
        !s.ok()) {
      return ReportFailure(s.message());
    }
  }
  return -1;
}

// The new image's options: -O and -o. Returns -1 when parsed, else the
// exit status.
int BuildTarget(const MeasureArgs& args, MeasureTarget* t) {
  if (args.out_format != "qcow2" && args.out_format != "raw") {
    return ReportFailure(absl::StrCat("output format '", args.out_format,
                             "' is not supported (qcow2 or raw)"));
  }
  t->format =
      args.out_format == "raw" ? ImageFormat::kRaw : ImageFormat::kQcow2;
  // "-o help" is no listing here: qemu-img measure refuses it too.
  std::map<std::string, std::string> values;
  if (auto s = ParseOptionLists(args.option_lists, t->format, &values);
      !s.ok()) {
    ReportFailure(s.message());
    return ReportFailure(absl::StrCat("Invalid options for file format '",
                             args.out_format, "'"));
  }
  CreateRequest req;
  req.opts.format = t->format;
  for (const auto& [key, value] : values) {
    if (auto s = ApplyOption(key, value, &req); !s.ok()) {
      return ReportFailure(s.message());
    }
  }
  // Only the combinations qemu-img measure refuses (fewer than create's).
  const CreateOptions& o = req.opts;
  if ((o.compat == "0.10" || o.compat == "v2") && o.refcount_bits != 16) {
    return ReportFailure(
        "Different refcount widths than 16 bits require compatibility "
        "level 1.1 or above (use compat=1.1 or greater)");
  }
  if (o.extended_l2 && o.cluster_size < 16384) {
    return ReportFailure(
        "Extended L2 entries are only supported with cluster sizes of at "
        "least 16384 bytes");
  }
  *t = MeasureTargetFor(o);
  t->size = args.size ? *args.size : req.size.value_or(0);
  return -1;
}

// Walks the source as QEMU does: ranges that read as zeros cost nothing,
// data ranges count whole clusters of the new image.
absl::StatusOr<uint64_t> DataBytes(Image* image, const std::string& name,
                                   uint64_t cs) {
  StatusAbove walker(image, QemuChainNames(name, image->GetChainInfo()));
  const uint64_t size = image->size();
  uint64_t required = 0;
  for (uint64_t offset = 0, n = 0; offset < size; offset += n) {
    absl::StatusOr<StatusRange> r = walker.Get(offset);
    if (!r.ok()) return r.status();
    n = r->length;
    const unsigned data = kStatusData | kStatusAllocated;
    if (!(r->flags & kStatusZero) && (r->flags & data) == data) {
      n = (offset + n + cs - 1) / cs * cs - offset;
      required += offset % cs + n;
    }
  }
  return required;
}

absl::StatusOr<MeasureSource> ReadSource(const MeasureArgs& args,
                                         const MeasureTarget& t) {
  OpenOptions opts;
  opts.format = args.format;
  args.policy.ApplyTo(&opts);
  auto image = Image::Open(*args.filename, opts);
  if (!image.ok()) return image.status();
  MeasureSource src;
  src.size = (*image)->size();
  if (t.format == ImageFormat::kQcow2) {
    auto data = DataBytes(image->get(), *args.filename, t.cluster_size);
    if (!data.ok()) return data.status();
    src.data_bytes = *data;
  }
  const LayerInfo top = (*image)->GetChainInfo().front();
  if (top.format == ImageFormat::kQcow2 && top.version >= 3) {
    if (!top.bitmaps_error.empty()) {
      return absl::DataLossError(top.bitmaps_error);
    }
    std::vector<MeasureSource::Bitmap>& bitmaps = src.bitmaps.emplace();
    for (const BitmapInfo& b : top.bitmaps) {
      bitmaps.push_back({b.name.size(), b.granularity});
    }
  }
  return src;
}

void Print(OutputFormat output, const MeasureReport& r) {
  if (output == OutputFormat::kHuman) {
    std::printf("required size: %" PRIu64 "\n", r.required);
    std::printf("fully allocated size: %" PRIu64 "\n", r.fully_allocated);
    if (r.bitmaps) std::printf("bitmaps size: %" PRIu64 "\n", *r.bitmaps);
    return;
  }
  Json j = Json::Object();
  if (r.bitmaps) j.Set("bitmaps", Json::Uint(*r.bitmaps));
  j.Set("required", Json::Uint(r.required));
  j.Set("fully-allocated", Json::Uint(r.fully_allocated));
  std::printf("%s\n", ToJson(j, JsonStyle::kQemuPretty).c_str());
}

}  // namespace

int RunMeasure(int argc, char** argv) {
  MeasureArgs args;
  if (int rc = ParseArgs(argc, argv, &args); rc >= 0) return rc;
  MeasureTarget target;
  if (int rc = BuildTarget(args, &target); rc >= 0) return rc;
  std::optional<MeasureSource> source;
  if (args.filename) {
    absl::StatusOr<MeasureSource> s = ReadSource(args, target);
    if (!s.ok()) return ReportFailure(s.status().message());
    source = std::move(s).value();
  }
  absl::StatusOr<MeasureReport> r =
      Measure(target, source ? &*source : nullptr);
  if (!r.ok()) return ReportFailure(r.status().message());
  Print(args.output, *r);
  return kExitOk;
}

}  // namespace qcow2::tool
