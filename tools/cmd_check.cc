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
#include "qcow2/image.h"
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

// qemu-img check's ImageCheck: members inserted in QAPI's order and
// printed in its dictionary's hash order; optional members only when
// non-zero.
std::string JsonReport(const CheckReport& r, const std::string& filename) {
  Json j = Json::Object();
  auto opt = [&](const char* key, uint64_t v) {
    if (v != 0) j.Set(key, Json::Uint(v));
  };
  j.Set("filename", Json::String(filename));
  j.Set("format", Json::String("qcow2"));
  j.Set("check-errors", Json::Uint(r.check_errors));
  opt("image-end-offset", r.image_end_offset);
  opt("corruptions", r.corruptions);
  opt("leaks", r.leaks);
  opt("corruptions-fixed", r.corruptions_fixed);
  opt("leaks-fixed", r.leaks_fixed);
  opt("total-clusters", r.total_clusters);
  opt("allocated-clusters", r.allocated_clusters);
  opt("fragmented-clusters", r.fragmented_clusters);
  opt("compressed-clusters", r.compressed_clusters);
  return ToJson(j, JsonStyle::kQemuPretty) + "\n";
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

// qemu-img check opens the image as every verb does, so an encrypted one
// fails without its secret (or with a wrong one) before anything is
// checked, though the check itself reads metadata only. Other open
// failures are left to the check, which names what is malformed.
absl::Status CheckSecret(const CheckArgs& a) {
  OpenOptions o;
  o.format = "qcow2";
  o.open_backing = false;
  a.policy.ApplyTo(&o);
  // Only the key slots matter here; the lock is the check's own.
  o.force_share = true;
  auto image = Image::Open(a.filename, o);
  if (image.ok() ||
      image.status().code() != absl::StatusCode::kPermissionDenied) {
    return absl::OkStatus();
  }
  return image.status();
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
  if (absl::Status s = CheckSecret(args); !s.ok()) {
    std::fprintf(stderr, "qcowtool: Could not open '%s': %s\n",
                 args.policy.image_spec.c_str(),
                 std::string(s.message()).c_str());
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
    // As given: qemu-img prints the --image-opts string itself.
    const std::string report =
        json ? JsonReport(r, args.policy.image_spec) : HumanReport(r);
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
