// SPDX-License-Identifier: Apache-2.0
// qcowtool check [-q] [-f qcow2] [--output=human|json] [-r leaks|all] IMAGE
//
// The equivalent of `qemu-img check`: same report (human or JSON, same
// keys in the same order), same lines on stderr, same exit codes: 0 clean,
// 1 check not completed (or bad arguments), 2 corruptions, 3 leaks only,
// 63 the file is not qcow2 and no format was given.

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "qcow2/file.h"
#include "qcow2/maintenance.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/option_parser.h"

namespace qcow2::tool {
namespace {

// qemu-img check's exit codes.
constexpr int kExitClean = 0;
constexpr int kExitFailed = 1;  // check not completed, or bad arguments
constexpr int kExitCorruptions = 2;
constexpr int kExitLeaks = 3;
constexpr int kExitNotSupported = 63;

constexpr char kUsage[] =
    "usage: qcowtool check [-q] [-f qcow2] [--output=human|json] "
    "[-r leaks|all] [-U] FILENAME\n"
    "\n"
    "Checks the refcounts and metadata of a qcow2 image, like qemu-img "
    "check.\n"
    "  -r leaks      repair refcounts that are too high (leaked clusters)\n"
    "  -r all        repair every error that can be repaired\n"
    "  -q            print nothing on stdout\n"
    "  --output=FMT  human (default) or json\n"
    "  -f qcow2      the image format (only qcow2 can be checked)\n"
    "  -U            force-share: check IMAGE even while another process\n"
    "                writes it (the result may be meaningless); not with -r\n"
    "Exit status (as qemu-img check): 0 no errors, 1 check not completed or\n"
    "wrong arguments, 2 corruptions, 3 leaked clusters only, 63 the format\n"
    "does not support checks.\n";

int Usage(const std::string& message) { return UsageError(kUsage, message); }

// A JSON string literal the way QEMU writes one: non-ASCII characters as
// \uXXXX (upper case hex, surrogate pairs above the BMP).
std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp = c;
    size_t len = 1;
    if (c >= 0x80) {
      len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
      bool ok = len > 0 && i + len <= s.size();
      cp = ok ? (c & (0x7f >> len)) : 0;
      for (size_t k = 1; ok && k < len; ++k) {
        const unsigned char cc = static_cast<unsigned char>(s[i + k]);
        ok = (cc & 0xc0) == 0x80;
        cp = (cp << 6) | (cc & 0x3f);
      }
      if (!ok) {
        cp = 0xfffd;
        len = 1;
      }
    }
    i += len;
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      default:
        break;
    }
    if (cp >= 0x20 && cp <= 0x7e) {
      out += static_cast<char>(cp);
    } else if (cp < 0x10000) {
      out += absl::StrFormat("\\u%04X", cp);
    } else {
      cp -= 0x10000;
      out += absl::StrFormat("\\u%04X\\u%04X", 0xd800 | (cp >> 10),
                             0xdc00 | (cp & 0x3ff));
    }
  }
  return out + "\"";
}

// qemu-img prints the ImageCheck members in its dictionary's hash order;
// optional members only when non-zero.
std::string JsonReport(const CheckReport& r, const std::string& filename) {
  std::vector<std::pair<std::string, std::string>> members;
  auto opt = [&](const char* key, uint64_t v) {
    if (v != 0) members.emplace_back(key, absl::StrCat(v));
  };
  opt("image-end-offset", r.image_end_offset);
  opt("compressed-clusters", r.compressed_clusters);
  opt("total-clusters", r.total_clusters);
  opt("corruptions", r.corruptions);
  opt("corruptions-fixed", r.corruptions_fixed);
  members.emplace_back("check-errors", absl::StrCat(r.check_errors));
  opt("leaks", r.leaks);
  opt("leaks-fixed", r.leaks_fixed);
  opt("allocated-clusters", r.allocated_clusters);
  members.emplace_back("filename", JsonQuote(filename));
  members.emplace_back("format", JsonQuote("qcow2"));
  opt("fragmented-clusters", r.fragmented_clusters);
  std::string out = "{\n";
  for (size_t i = 0; i < members.size(); ++i) {
    absl::StrAppend(&out, "    \"", members[i].first, "\": ", members[i].second,
                    i + 1 < members.size() ? ",\n" : "\n");
  }
  return out + "}\n";
}

std::string HumanReport(const CheckReport& r) {
  std::string out;
  if (r.corruptions == 0 && r.leaks == 0 && r.check_errors == 0) {
    out += "No errors were found on the image.\n";
  } else {
    if (r.corruptions) {
      absl::StrAppend(&out, "\n", r.corruptions,
                      " errors were found on the image.\nData may be "
                      "corrupted, or further writes to the image may corrupt "
                      "it.\n");
    }
    if (r.leaks) {
      absl::StrAppend(&out, "\n", r.leaks,
                      " leaked clusters were found on the image.\nThis means "
                      "waste of disk space, but no harm to data.\n");
    }
    if (r.check_errors) {
      absl::StrAppend(&out, "\n", r.check_errors,
                      " internal errors have occurred during the check.\n");
    }
  }
  if (r.total_clusters != 0 && r.allocated_clusters != 0) {
    out += absl::StrFormat(
        "%d/%d = %0.2f%% allocated, %0.2f%% fragmented, %0.2f%% compressed "
        "clusters\n",
        r.allocated_clusters, r.total_clusters,
        r.allocated_clusters * 100.0 / r.total_clusters,
        r.fragmented_clusters * 100.0 / r.allocated_clusters,
        r.compressed_clusters * 100.0 / r.allocated_clusters);
  }
  if (r.image_end_offset) {
    absl::StrAppend(&out, "Image end offset: ", r.image_end_offset, "\n");
  }
  return out;
}

void PrintMessages(const CheckReport& r, size_t begin, size_t end) {
  for (size_t i = begin; i < end && i < r.messages.size(); ++i) {
    std::fprintf(stderr, "%s\n", r.messages[i].c_str());
  }
  std::fflush(stderr);
}

// qemu-img check's words for a bad option.
int BadOption(const OptionParser::BadOption& bad) {
  const std::string letter(1, static_cast<char>(bad.letter));
  if (bad.missing_value) {
    return Usage(bad.letter != 0
                     ? absl::StrCat("option requires an argument -- '",
                                    letter, "'")
                     : absl::StrCat("option '", bad.word,
                                    "' requires an argument"));
  }
  return Usage(bad.letter != 0
                   ? absl::StrCat("invalid option -- '", letter, "'")
                   : absl::StrCat("unrecognized option '", bad.word, "'"));
}

struct CheckArgs {
  RepairMode mode = RepairMode::kNone;
  bool json = false;
  bool quiet = false;
  OpenPolicy policy;
  std::string format;
  std::string filename;
};

// -r: what to repair.
int TakeRepairMode(const char* v, RepairMode* mode) {
  if (std::string_view(v) == "leaks") {
    *mode = RepairMode::kLeaks;
  } else if (std::string_view(v) == "all") {
    *mode = RepairMode::kAll;
  } else {
    return Usage(absl::StrCat(
        "Unknown option value for -r (expecting 'leaks' or 'all'): ", v));
  }
  return kGoOn;
}

// --output=human|json, in qemu-img check's words.
int TakeOutput(const char* v, bool* json) {
  const std::string_view o = v;
  if (o != "json" && o != "human") {
    return Usage("--output must be used with human or json as argument.");
  }
  *json = o == "json";
  return kGoOn;
}

// Returns -1 when parsed, else the exit status to return.
int ParseArgs(int argc, char** argv, CheckArgs* a) {
  using Arg = OptionParser::Arg;
  OptionParser parser(kUsage);
  parser.OnBadOption(BadOption)
      .Help()
      .Add("output", 0, Arg::kRequired,
           [a](const char* v) { return TakeOutput(v, &a->json); })
      .ForceShare(&a->policy)
      .Secrets(&a->policy)
      .Text("", 'f', &a->format)
      .Add("", 'r', Arg::kRequired,
           [a](const char* v) { return TakeRepairMode(v, &a->mode); })
      .Flag("", 'q', &a->quiet)
      .Ignore("", 'T', Arg::kRequired);  // cache mode
  std::vector<std::string> operands;
  if (int rc = parser.Parse(argc, argv, &operands); rc != kGoOn) return rc;
  if (operands.size() != 1) return Usage("Expecting one image file name");
  a->filename = operands[0];
  // --image-opts: the file and driver. (The check reads metadata only: an
  // encrypted image's secret, named as qemu-img check needs it, is not
  // used.)
  if (absl::Status s = a->policy.ResolveImage(&a->filename, &a->format);
      !s.ok()) {
    ReportError(s);
    return kExitFailed;
  }
  return kGoOn;
}

}  // namespace

int RunCheck(int argc, char** argv) {
  CheckArgs args;
  if (int rc = ParseArgs(argc, argv, &args); rc != kGoOn) return rc;
  const RepairMode mode = args.mode;
  const bool json = args.json, quiet = args.quiet;
  const bool force_share = args.policy.force_share;
  const std::string& format = args.format;
  const std::string& filename = args.filename;
  if (!format.empty() && format != "qcow2") {
    if (format == "raw") {
      std::fprintf(stderr,
                   "qcowtool: This image format does not support checks\n");
      return kExitNotSupported;
    }
    std::fprintf(stderr, "qcowtool: Unknown or unsupported format '%s'\n",
                 format.c_str());
    return kExitFailed;
  }

  if (force_share && mode != RepairMode::kNone) {
    std::fprintf(stderr,
                 "qcowtool: force-share=on can only be used with read-only "
                 "images\n");
    return kExitFailed;
  }
  qcow2::FileOptions opts;
  opts.read_only = mode == RepairMode::kNone;
  opts.force_share = force_share;
  auto file = qcow2::OpenPosixFile(filename, opts);
  if (!file.ok()) {
    std::fprintf(stderr, "qcowtool: Could not open '%s': %s\n",
                 filename.c_str(),
                 std::string(file.status().message()).c_str());
    return kExitFailed;
  }
  absl::StatusOr<CheckReport> result = CheckFile(file->get(), mode);
  if (!result.ok()) {
    if (format.empty() &&
        result.status().code() == absl::StatusCode::kInvalidArgument) {
      // Not qcow2: qemu-img would probe it as raw, which has no check.
      std::fprintf(stderr,
                   "qcowtool: This image format does not support checks\n");
      return kExitNotSupported;
    }
    std::fprintf(stderr, "qcowtool: Could not open '%s': %s\n",
                 filename.c_str(),
                 std::string(result.status().message()).c_str());
    return kExitFailed;
  }
  const CheckReport& r = *result;
  const size_t first_end =
      r.rechecked ? r.recheck_first_message : r.messages.size();
  PrintMessages(r, 0, first_end);
  if (!r.failure.empty()) {
    PrintMessages(r, first_end, r.messages.size());
    std::fprintf(stderr, "qcowtool: Check failed: %s\n", r.failure.c_str());
    return kExitFailed;
  }
  if (r.rechecked && !json && !quiet) {
    std::printf(
        "The following inconsistencies were found and repaired:\n\n"
        "    %llu leaked clusters\n"
        "    %llu corruptions\n\n"
        "Double checking the fixed image now...\n",
        static_cast<unsigned long long>(r.leaks_fixed),
        static_cast<unsigned long long>(r.corruptions_fixed));
    std::fflush(stdout);
  }
  PrintMessages(r, first_end, r.messages.size());
  if (!quiet) {
    const std::string report = json ? JsonReport(r, filename) : HumanReport(r);
    std::fwrite(report.data(), 1, report.size(), stdout);
    std::fflush(stdout);
  }
  if (r.check_errors) {
    std::fprintf(stderr, "qcowtool: Check failed\n");
    return kExitFailed;
  }
  if (r.corruptions) return kExitCorruptions;
  if (r.leaks) return kExitLeaks;
  return kExitClean;
}

}  // namespace qcow2::tool
