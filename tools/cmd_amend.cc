// SPDX-License-Identifier: Apache-2.0
// qcowtool amend: changes format options of an existing qcow2 image in
// place (qcow2::AmendImage), with qemu-img amend's syntax, option names,
// messages and exit status (1 on any error).

#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "qcow2/amend.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/create_options.h"
#include "tools/option_parser.h"
#include "tools/progress.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool amend [--object OBJDEF] [--image-opts] [-f FMT] [-p]\n"
    "                      [-q] [-t CACHE] [--force] -o OPTIONS IMAGE\n"
    "\n"
    "Changes format options of the qcow2 image IMAGE in place, as\n"
    "'qemu-img amend' does. OPTIONS is a comma-separated list of\n"
    "key=value pairs ('-o help' lists them): compat=0.10|1.1 (v2|v3),\n"
    "lazy_refcounts=on|off, refcount_bits=1|2|4|...|64, size=SIZE;\n"
    "for an image with an external data file: data_file=NAME (the name\n"
    "it stores; the data stays where it is) and data_file_raw=off.\n"
    "backing_file and backing_fmt are accepted only with the image's own\n"
    "values (use 'qcowtool rebase' to change them). The key slots of a\n"
    "LUKS-encrypted image (opened with --image-opts ...,encrypt.key-secret=ID):\n"
    "encrypt.state=active,encrypt.new-secret=ID[,encrypt.keyslot=N]\n"
    "[,encrypt.iter-time=MS] adds a secret; encrypt.state=inactive with\n"
    "encrypt.keyslot=N and/or encrypt.old-secret=ID erases slots. Every\n"
    "option is checked before anything is written: a refused amend leaves\n"
    "IMAGE untouched.\n"
    "\n"
    "  -f FMT      format of IMAGE: qcow2 (raw images have no options to\n"
    "              amend)\n"
    "  -o OPTIONS  the options to change (may be repeated)\n"
    "  -p          show progress\n"
    "  -q          quiet\n"
    "  -t CACHE    accepted for qemu-img compatibility (ignored)\n"
    "  --force     let encrypt.* overwrite an active key slot, or erase\n"
    "              the last active ones (the data is then lost for good)\n"
    "  --object secret,id=ID,data=STRING|file=PATH  a secret, for\n"
    "              encrypt.key-secret=ID, encrypt.new-secret=ID and\n"
    "              encrypt.old-secret=ID\n"
    "  --image-opts  IMAGE is driver=qcow2,file.filename=PATH,\n"
    "              encrypt.key-secret=ID\n"
    "  -h, --help  show this help\n"
    "\n"
    "Exit status (qemu-img's): 0 amended, 1 on any error.\n";

// qemu-img 7.2's amend options for qcow2 ("-o help"), in its order.
constexpr char kAmendHelp[] =
    "Amend options for 'qcow2':\n"
    "  backing_file=<str>     - File name of a base image\n"
    "  backing_fmt=<str>      - Image format of the base image\n"
    "  compat=<str>           - Compatibility level (v2 [0.10] or v3 [1.1])\n"
    "  data_file=<str>        - File name of an external data file\n"
    "  data_file_raw=<bool (on/off)> - The external data file must stay "
    "valid as a raw image\n"
    "  encrypt.iter-time=<num> - Time to spend in PBKDF in milliseconds\n"
    "  encrypt.keyslot=<num>  - Select a single keyslot to modify "
    "explicitly\n"
    "  encrypt.new-secret=<str> - New secret to set in the matching "
    "keyslots. Empty string to erase\n"
    "  encrypt.old-secret=<str> - Select all keyslots that match this "
    "password\n"
    "  encrypt.state=<str>    - Select new state of affected keyslots "
    "(active/inactive)\n"
    "  lazy_refcounts=<bool (on/off)> - Postpone refcount updates\n"
    "  refcount_bits=<num>    - Width of a reference count entry in bits\n"
    "  size=<size>            - Virtual disk size\n";

struct AmendArgs {
  OpenPolicy policy;  // --object, --image-opts
  bool force = false;
  std::string format;
  std::vector<std::string> lists;
  bool progress = false;
  bool quiet = false;
  std::string image;
};

bool IsAmendOption(std::string_view key) {
  return key == "backing_file" || key == "backing_fmt" || key == "compat" ||
         key == "data_file" || key == "data_file_raw" ||
         key == "lazy_refcounts" || key == "refcount_bits" || key == "size" ||
         key.substr(0, 8) == "encrypt.";
}

bool IsCreateOnlyOption(std::string_view key) {
  return key == "cluster_size" || key == "extended_l2" ||
         key == "preallocation" || key == "compression_type" ||
         key == "encryption" || key == "encrypt.format" ||
         key == "encrypt.key-secret" || key.substr(0, 13) == "encrypt.ciph" ||
         key.substr(0, 13) == "encrypt.ivgen" || key == "encrypt.hash-alg";
}

// Splits the -o lists into key -> value (the last value wins; a bare key
// means "on", as in QEMU). Refuses keys amend does not take.
absl::Status ParseLists(const std::vector<std::string>& lists,
                        std::map<std::string, std::string>* values) {
  for (const std::string& list : lists) {
    if (list.empty()) return absl::InvalidArgumentError("Invalid option list: ");
    std::string item;
    auto take = [&]() -> absl::Status {
      if (item.empty()) return absl::OkStatus();
      const size_t eq = item.find('=');
      const std::string key = item.substr(0, eq);
      if (!IsAmendOption(key) || IsCreateOnlyOption(key)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Invalid parameter '", key, "'",
            IsCreateOnlyOption(key)
                ? "\nThis option is only supported for image creation"
                : ""));
      }
      (*values)[key] = eq == std::string::npos ? "on" : item.substr(eq + 1);
      item.clear();
      return absl::OkStatus();
    };
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i] == ',' && i + 1 < list.size() && list[i + 1] == ',') {
        item.push_back(',');
        ++i;
      } else if (list[i] == ',') {
        if (absl::Status s = take(); !s.ok()) return s;
      } else {
        item.push_back(list[i]);
      }
    }
    if (absl::Status s = take(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ParseOnOff(const std::string& key, const std::string& v) {
  if (v == "on") return true;
  if (v == "off") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("Parameter '", key, "' expects 'on' or 'off'"));
}

// A number as QEMU's option parser takes it (decimal, no sign).
absl::StatusOr<uint64_t> ParseNumber(const std::string& key,
                                     const std::string& v) {
  uint64_t n = 0;
  bool ok = !v.empty() && v.size() <= 19;
  for (char c : v) ok = ok && c >= '0' && c <= '9';
  for (char c : v) n = ok ? n * 10 + static_cast<uint64_t>(c - '0') : 0;
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("Parameter '", key, "' expects a number"));
  }
  return n;
}

// encrypt.keyslot: QEMU's parser takes a negative number too (and the
// library refuses it with QEMU's message).
absl::StatusOr<int64_t> ParseKeySlot(const std::string& v) {
  const bool negative = !v.empty() && v[0] == '-';
  auto n = ParseNumber("encrypt.keyslot", negative ? v.substr(1) : v);
  if (!n.ok()) return n.status();
  return negative ? -static_cast<int64_t>(*n) : static_cast<int64_t>(*n);
}

// The secret --object gave `id` (new-secret=ID, old-secret=ID).
absl::StatusOr<std::string> SecretById(const OpenPolicy& policy,
                                       const std::string& id) {
  auto it = policy.secrets.find(id);
  if (it == policy.secrets.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("No secret with id '", id, "'"));
  }
  return it->second;
}

// One encrypt.* option into o->encrypt.
absl::Status ToEncryptOption(const std::string& key, const std::string& v,
                             const OpenPolicy& policy, AmendOptions* o) {
  if (!o->encrypt) o->encrypt.emplace();
  KeySlotAmendment& e = *o->encrypt;
  if (key == "encrypt.state") {
    e.state = v;
  } else if (key == "encrypt.new-secret" || key == "encrypt.old-secret") {
    auto secret = SecretById(policy, v);
    if (!secret.ok()) return secret.status();
    (key == "encrypt.new-secret" ? e.new_secret : e.old_secret) = *secret;
  } else if (key == "encrypt.keyslot") {
    auto slot = ParseKeySlot(v);
    if (!slot.ok()) return slot.status();
    e.keyslot = *slot;
  } else if (key == "encrypt.iter-time") {
    auto ms = ParseNumber(key, v);
    if (!ms.ok()) return ms.status();
    e.iter_time_ms = *ms;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("Invalid parameter '", key, "'"));
  }
  return absl::OkStatus();
}

// Turns the parsed values into AmendOptions, with qemu-img's messages.
absl::Status ToOptions(const std::map<std::string, std::string>& values,
                       const OpenPolicy& policy, AmendOptions* o) {
  for (const auto& [key, v] : values) {
    if (key == "compat") {
      o->compat = v;
    } else if (key == "lazy_refcounts") {
      auto on = ParseOnOff(key, v);
      if (!on.ok()) return on.status();
      o->lazy_refcounts = *on;
    } else if (key == "refcount_bits") {
      auto n = ParseNumber(key, v);
      if (!n.ok()) return n.status();
      o->refcount_bits = *n;  // the library refuses bad widths
    } else if (key == "backing_file") {
      o->backing_file = v;
    } else if (key == "backing_fmt") {
      o->backing_format = v;
    } else if (key == "data_file") {
      o->data_file = v;  // the library checks it against the image
    } else if (key == "data_file_raw") {
      auto on = ParseOnOff(key, v);
      if (!on.ok()) return on.status();
      o->data_file_raw = *on;
    } else if (key.substr(0, 8) == "encrypt.") {
      if (absl::Status s = ToEncryptOption(key, v, policy, o); !s.ok()) {
        return s;
      }
    } else if (key == "size") {
      auto size = ParseSize(v);
      if (!size.ok()) {
        return absl::InvalidArgumentError(
            "Parameter 'size' expects a non-negative number below 2^64\n"
            "Optional suffix k, M, G, T, P or E means kilo-, mega-, giga-, "
            "tera-, peta-\nand exabytes, respectively.");
      }
      o->size = *size;
    }
  }
  return absl::OkStatus();
}

int ParseArgs(int argc, char** argv, AmendArgs* args) {
  OptionParser parser(kUsage);
  parser.Text("format", 'f', &args->format)
      .Flag("force", 0, &args->force)
      .Secrets(&args->policy)
      .Help()
      .List("", 'o', &args->lists)
      .Flag("", 'p', &args->progress)
      .Flag("", 'q', &args->quiet)
      .Ignore("", 't', OptionParser::Arg::kRequired);
  std::vector<std::string> operands;
  if (int rc = parser.Parse(argc, argv, &operands); rc != kGoOn) return rc;
  if (args->lists.empty()) return ReportFailure("Must specify options (-o)");
  if (operands.size() != 1) {
    return UsageError(kUsage, "expecting one image file name");
  }
  args->image = operands[0];
  return -1;
}

}  // namespace

int RunAmend(int argc, char** argv) {
  AmendArgs args;
  if (int rc = ParseArgs(argc, argv, &args); rc >= 0) return rc;
  for (const std::string& list : args.lists) {
    if (IsHelpList(list) || list.find(",help") != std::string::npos ||
        list.rfind("help,", 0) == 0) {
      std::fputs(kAmendHelp, stdout);
      return kExitOk;
    }
  }
  if (absl::Status s = args.policy.ResolveImage(&args.image, &args.format);
      !s.ok()) {
    return ReportFailure(s.message());
  }
  if (!args.format.empty() && args.format != "qcow2") {
    if (auto s = CheckImageFormat(args.format); !s.ok()) {
      return ReportFailure(s.message());
    }
    return ReportFailure(absl::StrCat("Format driver '", args.format,
                                      "' does not support option amendment"));
  }
  std::map<std::string, std::string> values;
  AmendOptions opts;
  if (absl::Status s = ParseLists(args.lists, &values); !s.ok()) {
    return ReportFailure(s.message());
  }
  if (absl::Status s = ToOptions(values, args.policy, &opts); !s.ok()) {
    return ReportFailure(s.message());
  }
  opts.key_secret = args.policy.key_secret;
  opts.force = args.force;
  Progress progress(args.progress && !args.quiet, 0.01f);
  float shown = 0;
  opts.progress = [&](uint64_t done, uint64_t total) {
    const float pct = total == 0 ? 100.0f : 100.0f * done / total;
    progress.Advance(pct - shown);
    shown = pct;
  };
  if (absl::Status s = AmendImage(args.image, opts); !s.ok()) {
    return ReportFailure(s.message());
  }
  return kExitOk;
}

}  // namespace qcow2::tool
