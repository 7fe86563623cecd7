// SPDX-License-Identifier: Apache-2.0
// qcowtool dd: copies (part of) an image's contents into a new raw or
// qcow2 image, with qemu-img dd's operands (if= of= bs= count= skip=),
// sizes, messages and exit status (1 on any error).
//
// The results follow qemu-img 7.2's img_dd, quirks included, so that a
// script moving between the two tools gets the same bytes:
//   - the input's length is rounded up to 512 bytes (QEMU measures disks
//     in sectors; the tail of a raw file reads as zeros);
//   - count= limits the end of the copy to count*bs bytes from the start
//     of the input, not from the skip= offset;
//   - a skip= past the end is only a message: an empty image is created
//     and the exit status is 0, as dd(1) does;
//   - the output is created with the copy's length rounded up to 512 and
//     every block is written, zeros included.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "qcow2/file.h"
#include "qcow2/image.h"
#include "qcow2/options.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/option_parser.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool dd [-U] [-f FMT] [-O OUTPUT_FMT] [bs=BLOCK_SIZE]\n"
    "                   [count=BLOCKS] [skip=BLOCKS] if=INPUT of=OUTPUT\n"
    "\n"
    "Copies INPUT's contents (through its backing chain) into a new image\n"
    "OUTPUT, as 'qemu-img dd' does. An existing OUTPUT is replaced.\n"
    "\n"
    "  -f FMT      format of INPUT: qcow2 or raw (default: probe)\n"
    "  -O OUTPUT_FMT  format of OUTPUT: raw (default) or qcow2\n";
constexpr char kUsageOperands[] =
    "  -h, --help  show this help\n"
    "\n"
    "Operands:\n"
    "  bs=BYTES    read and write up to BYTES bytes at a time (default:\n"
    "              512; 1 to 2147483647)\n"
    "  count=N     copy only N input blocks (the copy ends N*BYTES bytes\n"
    "              from the start of INPUT, as in qemu-img)\n"
    "  if=FILE     read from FILE\n"
    "  of=FILE     write to FILE\n"
    "  skip=N      skip N bs-sized blocks at the start of INPUT; past the\n"
    "              end, OUTPUT is empty\n"
    "Sizes and counts take the suffixes k, M, G, T, P, E.\n"
    "\n"
    "Exit status (qemu-img's): 0 copied, 1 on any error.\n";

std::string Usage() {
  return absl::StrCat(kUsage, kForceShareHelp, kBackingRootHelp, kSecretHelp,
                      kUsageOperands);
}

struct DdArgs {
  std::string in_format;
  std::string out_format = "raw";
  OpenPolicy policy;  // -U, --backing-root (for INPUT)
  int64_t bs = 512;
  bool has_count = false;
  int64_t count = 0;
  bool has_skip = false;
  int64_t skip = 0;
  bool has_if = false;
  std::string in;
  bool has_of = false;
  std::string out;
};

// qemu-img's cvtnum_full(): a size with suffixes within [min, max], else
// its two messages (invalid text, or out of range).
bool ParseNumber(const char* name, std::string_view text, int64_t min,
                 int64_t max, int64_t* out) {
  absl::StatusOr<uint64_t> v = ParseSize(text);
  // ParseSize refuses values above INT64_MAX with "size '...' is too
  // large": QEMU reports those as out of range, not as bad text.
  const bool too_large =
      !v.ok() && absl::StartsWith(v.status().message(), "size '");
  if (!v.ok() && !too_large) {
    ReportFailure(absl::StrCat("Invalid ", name,
                               " specified. You may use k, M, G, T, P or E "
                               "suffixes for"));
    ReportFailure(
        "kilobytes, megabytes, gigabytes, terabytes, petabytes "
        "and exabytes.");
    return false;
  }
  if (too_large || *v > static_cast<uint64_t>(max) ||
      static_cast<int64_t>(*v) < min) {
    ReportFailure(absl::StrCat("Invalid ", name, " specified. Must be between ",
                               min, " and ", max, "."));
    return false;
  }
  *out = static_cast<int64_t>(*v);
  return true;
}

// One NAME=VALUE operand. Returns false after reporting an error.
bool TakeOperand(std::string_view operand, DdArgs* a) {
  const size_t eq = operand.find('=');
  const std::string_view name = operand.substr(0, eq);
  if (eq == std::string_view::npos) {
    ReportFailure(absl::StrCat("unrecognized operand ", std::string(operand)));
    return false;
  }
  const std::string_view value = operand.substr(eq + 1);
  if (name == "bs") return ParseNumber("bs", value, 1, INT_MAX, &a->bs);
  if (name == "count") {
    a->has_count = true;
    return ParseNumber("count", value, 0, INT64_MAX, &a->count);
  }
  if (name == "skip") {
    a->has_skip = true;
    return ParseNumber("skip", value, 0, INT64_MAX, &a->skip);
  }
  if (name == "if") {
    a->has_if = true;
    a->in = std::string(value);
    return true;
  }
  if (name == "of") {
    a->has_of = true;
    a->out = std::string(value);
    return true;
  }
  ReportFailure(absl::StrCat("unrecognized operand ", std::string(name)));
  return false;
}

// Returns -1 when parsed, else the exit status to return.
int ParseArgs(int argc, char** argv, DdArgs* a) {
  OptionParser parser(Usage());
  parser.Help()
      .Policy(&a->policy)
      .Format("", 'f', &a->in_format)
      .Text("", 'O', &a->out_format);
  std::vector<std::string> operands;
  if (int rc = parser.Parse(argc, argv, &operands); rc != kGoOn) return rc;
  for (const std::string& operand : operands) {
    if (!TakeOperand(operand, a)) return 1;
  }
  if (!a->has_if || !a->has_of) {
    return ReportFailure("Must specify both input and output files");
  }
  return -1;
}

// Makes room for the new output as qemu-img's create does: an existing
// regular file is replaced unless another process holds its image lock
// (the input itself, for of= naming if=). Devices and the like are left
// to CreateImage.
absl::Status ReplaceOutput(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::OkStatus();
  }
  FileOptions probe;
  probe.read_only = false;
  if (auto held = OpenPosixFile(path, probe); !held.ok()) {
    if (absl::IsUnavailable(held.status())) return held.status();
  }
  if (unlink(path.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot replace ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Image>> CreateOutput(const DdArgs& a,
                                                    ImageFormat format,
                                                    uint64_t size) {
  if (absl::Status s = ReplaceOutput(a.out); !s.ok()) return s;
  CreateOptions co;
  co.format = format;
  co.size = (size + 511) / 512 * 512;  // as QEMU's raw and qcow2 drivers
  if (absl::Status s = CreateImage(a.out, co); !s.ok()) return s;
  OpenOptions oo;
  oo.read_write = true;
  oo.format = format == ImageFormat::kRaw ? "raw" : "qcow2";
  return Image::Open(a.out, oo);
}

// Copies [in_pos, end) of `in` to the start of `out`, bs bytes at a time;
// past in's own end (up to the 512-byte rounding) reads as zeros.
absl::Status Copy(Image& in, Image& out, int64_t bs, int64_t in_pos,
                  int64_t end) {
  if (in_pos >= end) return absl::OkStatus();
  const uint64_t in_size = in.size();
  std::vector<uint8_t> buf(static_cast<size_t>(std::min(bs, end - in_pos)));
  for (int64_t out_pos = 0; in_pos < end;) {
    const size_t n = static_cast<size_t>(std::min(bs, end - in_pos));
    const uint64_t pos = static_cast<uint64_t>(in_pos);
    const size_t from_disk =
        pos >= in_size
            ? 0
            : static_cast<size_t>(std::min<uint64_t>(n, in_size - pos));
    std::fill(buf.begin() + static_cast<ptrdiff_t>(from_disk),
              buf.begin() + static_cast<ptrdiff_t>(n), 0);
    if (from_disk > 0) {
      if (absl::Status s = in.Read(pos, absl::MakeSpan(buf.data(), from_disk));
          !s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat("error while reading from input image "
                                         "file: ",
                                         s.message()));
      }
    }
    if (absl::Status s = out.Write(static_cast<uint64_t>(out_pos),
                                   absl::MakeConstSpan(buf.data(), n));
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("error while writing to output image "
                                       "file: ",
                                       s.message()));
    }
    in_pos += static_cast<int64_t>(n);
    out_pos += static_cast<int64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

int RunDd(int argc, char** argv) {
  DdArgs a;
  if (int rc = ParseArgs(argc, argv, &a); rc >= 0) return rc;

  if (absl::Status s = a.policy.ResolveImage(&a.in, &a.in_format); !s.ok()) {
    return ReportError(s);
  }
  OpenOptions io;
  io.format = a.in_format;
  a.policy.ApplyTo(&io);
  auto in = Image::Open(a.in, io);
  if (!in.ok()) {
    return ReportFailure(
        absl::StrCat("Could not open '", a.in, "': ", in.status().message()));
  }
  ImageFormat out_format;
  if (a.out_format == "raw") {
    out_format = ImageFormat::kRaw;
  } else if (a.out_format == "qcow2") {
    out_format = ImageFormat::kQcow2;
  } else {
    return ReportFailure(absl::StrCat("Unknown file format '", a.out_format,
                                      "' (qcow2 or raw)"));
  }

  // qemu-img's arithmetic, overflow checks included.
  int64_t size = static_cast<int64_t>(((*in)->size() + 511) / 512 * 512);
  if (a.has_count && a.count <= INT64_MAX / a.bs && a.count * a.bs < size) {
    size = a.count * a.bs;
  }
  const bool skip_past_end =
      a.has_skip && (a.skip > INT64_MAX / a.bs || size < a.skip * a.bs);
  const int64_t out_size = skip_past_end ? 0 : size - a.skip * a.bs;

  auto out = CreateOutput(a, out_format, static_cast<uint64_t>(out_size));
  if (!out.ok()) {
    return ReportFailure(absl::StrCat(a.out,
                                      ": error while creating output "
                                      "image: ",
                                      out.status().message()));
  }
  int64_t in_pos = size;
  if (skip_past_end) {
    // dd(1)'s behaviour: a message, an empty output, success.
    ReportFailure(absl::StrCat(a.in, ": cannot skip to specified offset"));
  } else {
    in_pos = a.skip * a.bs;
  }
  absl::Status s = Copy(**in, **out, a.bs, in_pos, size);
  absl::Status closed = (*out)->Close();
  if (s.ok()) s = closed;
  if (!s.ok()) return ReportFailure(s.message());
  return kExitOk;
}

}  // namespace qcow2::tool
