// SPDX-License-Identifier: Apache-2.0
// qcowtool info: facts about an image (and its backing chain), printed as
// `qemu-img info` prints them.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "qcow2/image.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/image_info.h"
#include "tools/option_parser.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool info [--output=human|json] [--backing-chain] [-f FMT] "
    "[-U]\n"
    "                     [--backing-root=DIR] IMAGE\n"
    "\n"
    "Shows the format, sizes, backing file and format-specific facts of\n"
    "IMAGE, as 'qemu-img info' does, internal snapshots listed.\n"
    "\n"
    "  --output=human   text (default)\n"
    "  --output=json    a JSON object (an array of them with\n"
    "                   --backing-chain), top image first\n"
    "  --backing-chain  also every file of the backing chain; without it\n"
    "                   the backing file is not opened at all\n"
    "  -f FMT           format of IMAGE: qcow2 or raw (default: probe)\n";

constexpr char kHelpTail[] =
    "  -h, --help       show this help\n"
    "\n";

std::string Usage() {
  return std::string(kUsage) + kForceShareHelp + kBackingRootHelp +
         kHelpTail + kQemuImgExitStatusHelp;
}

struct InfoArgs {
  OutputFormat output = OutputFormat::kHuman;
  bool backing_chain = false;
  std::string format;
  OpenPolicy policy;
  std::string image;
};

// Returns -1 when parsed, else the exit status to return.
int ParseArgs(int argc, char** argv, InfoArgs* args) {
  OptionParser parser(Usage());
  parser.Output(&args->output)
      .Flag("backing-chain", 0, &args->backing_chain)
      .Format(&args->format)
      .Policy(&args->policy)
      .Help();
  return ParseOneImage(&parser, argc, argv, &args->image);
}

// qemu-img info opens the image without its backing file
// (BDRV_O_NO_BACKING), so a backing.* option is left over and refused, as
// QEMU words it, naming the key its QDict iterates first.
absl::Status RefuseBackingOptions(const OpenPolicy& policy) {
  if (policy.backing_keys.empty()) return absl::OkStatus();
  const std::string* first = &policy.backing_keys[0];
  for (const std::string& k : policy.backing_keys) {
    if (QemuKeyBucket(k) <= QemuKeyBucket(*first)) first = &k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("Could not open '", policy.image_spec,
                   "': Block format 'qcow2' does not support the option '",
                   *first, "'"));
}

}  // namespace

int RunInfo(int argc, char** argv) {
  InfoArgs args;
  if (int rc = ParseArgs(argc, argv, &args); rc >= 0) return rc;
  if (auto s = args.policy.ResolveImage(&args.image, &args.format); !s.ok()) {
    return ReportQemuImgError(s);
  }
  if (auto s = RefuseBackingOptions(args.policy); !s.ok()) {
    return ReportFailure(s.message());  // a wrong argument: exit 1
  }

  OpenOptions opts;
  opts.format = args.format;
  // Like qemu-img, plain `info` neither needs nor opens the backing file.
  opts.open_backing = args.backing_chain;
  args.policy.ApplyTo(&opts);
  // Like qemu-img (BDRV_O_NO_IO): an encrypted image shows its LUKS
  // header without its key secret, and no data is read; a secret given
  // is not even tried (qemu-img info shows a wrong one's image too).
  opts.metadata_only = true;
  opts.key_secret.clear();
  auto image = Image::Open(args.image, opts);
  if (!image.ok()) return ReportQemuImgError(image.status());
  std::vector<LayerInfo> chain = (*image)->GetChainInfo();
  if (!args.backing_chain) chain.resize(1);
  const std::vector<std::string> names = QemuChainNames(args.image, chain);

  std::vector<ImageFacts> facts;
  for (size_t i = 0; i < chain.size(); ++i) {
    ImageFacts f{chain[i], names[i], std::nullopt};
    if (auto size = AllocatedFileSize(names[i]); size.ok()) {
      f.actual_size = *size;
    }
    // The backing files keep their own names: qemu-img opens each by name.
    if (i == 0) {
      f.name = args.policy.QemuImageName(names[0],
                                         FormatName(chain[0].format));
    }
    facts.push_back(std::move(f));
  }

  std::string out;
  if (args.output == OutputFormat::kJson) {
    if (args.backing_chain) {
      Json list = Json::Array();
      for (const ImageFacts& f : facts) list.Append(ImageInfoJson(f));
      out = ToJson(list, JsonStyle::kQemuPretty);
    } else {
      out = ToJson(ImageInfoJson(facts[0]), JsonStyle::kQemuPretty);
    }
    out.push_back('\n');
  } else {
    for (size_t i = 0; i < facts.size(); ++i) {
      if (i > 0) out.push_back('\n');
      out += ImageInfoHuman(facts[i]);
    }
  }
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() ||
      std::fflush(stdout) != 0) {
    return ReportQemuImgError(absl::InternalError("cannot write to stdout"));
  }
  return kExitOk;
}

}  // namespace qcow2::tool
