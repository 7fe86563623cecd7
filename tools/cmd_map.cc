// SPDX-License-Identifier: Apache-2.0
// qcowtool map: where each range of the virtual disk comes from, printed
// exactly as `qemu-img map` prints it.

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "qcow2/image.h"
#include "tools/cli_util.h"
#include "tools/json_writer.h"
#include "tools/commands.h"
#include "tools/map_walk.h"
#include "tools/option_parser.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool map [--output=human|json] [-f FMT] "
    "[--start-offset=OFFSET]\n"
    "                    [--max-length=LEN] [-U] [--backing-root=DIR] "
    "IMAGE\n"
    "\n"
    "Shows how the virtual disk of IMAGE (through its backing chain) maps\n"
    "to the image files, as 'qemu-img map' does.\n"
    "\n"
    "  --output=human   a table of the data ranges: offset, length, host\n"
    "                   offset and file (default); fails on compressed\n"
    "                   clusters, which have no host offset\n"
    "  --output=json    one object per range: start, length, depth,\n"
    "                   present, zero, data and offset (when known)\n"
    "  -f FMT           format of IMAGE: qcow2 or raw (default: probe)\n"
    "  --start-offset=OFFSET, --max-length=LEN\n"
    "                   map only that part (sizes like 4k, 1M, 0x1000)\n";

constexpr char kHelpTail[] =
    "  -h, --help       show this help\n"
    "\n";

struct MapArgs {
  OutputFormat output = OutputFormat::kHuman;
  std::string format;
  OpenPolicy policy;
  uint64_t start = 0;
  std::optional<uint64_t> max_length;
  std::string image;
};

std::string Usage() {
  return std::string(kUsage) + kForceShareHelp + kBackingRootHelp +
         kHelpTail + kQemuImgExitStatusHelp;
}

// Returns -1 when parsed, else the exit status to return.
int ParseArgs(int argc, char** argv, MapArgs* args) {
  OptionParser parser(Usage());
  auto size = [&parser](auto store) {
    return [&parser, store](const char* v) {
      auto n = ParseSize(v);
      if (!n.ok()) return parser.Error(n.status().message());
      store(*n);
      return kGoOn;
    };
  };
  parser.Output(&args->output)
      .Add("start-offset", 0, OptionParser::Arg::kRequired,
           size([args](uint64_t n) { args->start = n; }))
      .Add("max-length", 0, OptionParser::Arg::kRequired,
           size([args](uint64_t n) { args->max_length = n; }))
      .Format(&args->format)
      .Policy(&args->policy)
      .Help();
  return ParseOneImage(&parser, argc, argv, &args->image);
}

// QEMU's dump_map_entry(). `next` may be modified (human output folds
// every non-data range into "zero" so that they coalesce). Returns false
// on the human-output error for ranges without a host offset.
bool DumpEntry(OutputFormat output, const MapEntry& e, MapEntry* next,
               const std::vector<std::string>& names) {
  if (output == OutputFormat::kJson) {
    Json entry = Json::Object();
    entry.Set("start", Json::Uint(e.start))
        .Set("length", Json::Uint(e.length))
        .Set("depth", Json::Int(e.depth))
        .Set("present", Json::Bool(e.present))
        .Set("zero", Json::Bool(e.zero))
        .Set("data", Json::Bool(e.data));
    if (e.offset) entry.Set("offset", Json::Uint(*e.offset));
    std::fputs(ToJson(entry, JsonFormat::MapEntry()).c_str(), stdout);
    if (next != nullptr) std::puts(",");
    return true;
  }
  if (e.data && !e.offset) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "qcowtool: File contains external, encrypted or compressed "
                 "clusters.\n");
    return false;
  }
  if (e.data && !e.zero) {
    std::printf("%#-16" PRIx64 "%#-16" PRIx64 "%#-16" PRIx64 "%s\n", e.start,
                e.length, e.offset.value_or(0),
                e.offset ? names[e.depth].c_str() : "");
  }
  if (next != nullptr && (!next->data || next->zero)) {
    next->data = false;
    next->zero = true;
  }
  return true;
}

}  // namespace

int RunMap(int argc, char** argv) {
  MapArgs args;
  if (int rc = ParseArgs(argc, argv, &args); rc >= 0) return rc;
  if (auto s = args.policy.ResolveImage(&args.image, &args.format); !s.ok()) {
    return ReportQemuImgError(s);
  }

  OpenOptions opts;
  opts.format = args.format;
  args.policy.ApplyTo(&opts);
  auto image = Image::Open(args.image, opts);
  if (!image.ok()) return ReportQemuImgError(image.status());
  const std::vector<LayerInfo> chain = (*image)->GetChainInfo();
  const std::vector<std::string> images = QemuChainNames(args.image, chain);
  std::vector<std::string> names = images;
  for (size_t i = 0; i < chain.size(); ++i) {
    // Data extents of a layer with an external data file are in that
    // file, which QEMU names as the image stores it (and opens it).
    if (chain[i].has_data_file) names[i] = chain[i].data_file;
  }
  MapWalker walker(image->get(), images);

  uint64_t length = (*image)->size();
  if (args.max_length) {
    uint64_t end = args.start + *args.max_length;  // both <= INT64_MAX
    length = std::min(end, length);
  }
  if (args.output == OutputFormat::kHuman) {
    std::printf("%-16s%-16s%-16s%s\n", "Offset", "Length", "Mapped to", "File");
  } else {
    std::putchar('[');
  }
  // img_map(): extend the current entry while the next one continues it.
  MapEntry cur;
  cur.start = args.start;
  while (cur.start + cur.length < length) {
    uint64_t offset = cur.start + cur.length;
    absl::StatusOr<MapEntry> next = walker.Get(offset, length - offset);
    if (!next.ok()) {
      std::fflush(stdout);
      return ReportQemuImgError(next.status());
    }
    if (Mergeable(cur, *next)) {
      cur.length += next->length;
      continue;
    }
    if (cur.length > 0 && !DumpEntry(args.output, cur, &*next, names)) {
      return kExitFailure;
    }
    cur = *next;
  }
  if (!DumpEntry(args.output, cur, nullptr, names)) return kExitFailure;
  if (args.output == OutputFormat::kJson) std::puts("]");
  if (std::fflush(stdout) != 0) {
    return ReportQemuImgError(absl::InternalError("cannot write to stdout"));
  }
  return kExitOk;
}

}  // namespace qcow2::tool
