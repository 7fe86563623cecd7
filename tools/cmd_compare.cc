// SPDX-License-Identifier: Apache-2.0
// qcowtool compare: whether two images show the same contents, with
// qemu-img compare's options, messages and exit codes.
//
// The walk is qemu-img's: both images are stepped through together by
// block status (tools/status_above.h); ranges both know to read as zeros
// are skipped, ranges allocated in both are read and compared, a range
// allocated in one only must read as zeros there. Mismatches are reported
// at the first differing 512-byte sector, counted from the start of the
// range being compared, as QEMU counts.

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "qcow2/image.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/option_parser.h"
#include "tools/progress.h"
#include "tools/status_above.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool compare [-f FMT] [-F FMT] [-p] [-q] [-s] [-U] "
    "[--backing-root=DIR]\n"
    "                        IMAGE1 IMAGE2\n"
    "\n"
    "Compares the virtual disks of IMAGE1 and IMAGE2 (each read through its\n"
    "backing chain), as 'qemu-img compare' does. Images of different sizes\n"
    "are equal when the part past the smaller size reads as zeros.\n"
    "\n"
    "  -f FMT      format of IMAGE1: qcow2 or raw (default: probe)\n"
    "  -F FMT      format of IMAGE2: qcow2 or raw (default: probe)\n"
    "  -p          show progress\n"
    "  -q          quiet: print nothing, only set the exit status\n"
    "  -s          strict: sizes must match, and so must allocation status\n"
    "              range by range (as qemu-img reports it)\n";

constexpr char kHelpTail[] =
    "  -h, --help  show this help\n"
    "\n"
    "Exit status (qemu-img's): 0 the images are identical, 1 they differ\n"
    "(or wrong arguments), 2 an image cannot be opened, 3 the allocation\n"
    "status cannot be read, 4 the data cannot be read.\n";

std::string Usage() {
  return std::string(kUsage) + kForceShareHelp + kBackingRootHelp + kHelpTail;
}

constexpr int kExitSame = 0;
constexpr int kExitDifferent = 1;
constexpr int kExitOpenError = 2;
constexpr int kExitStatusError = 3;
constexpr int kExitReadError = 4;

// qemu-img's read buffer: the most compared at once.
constexpr uint64_t kBufferBytes = 2 << 20;
constexpr uint64_t kSector = 512;

struct CompareArgs {
  std::string format[2];
  OpenPolicy policy;
  bool progress = false;
  bool quiet = false;
  bool strict = false;
  std::string name[2];
};

int ParseArgs(int argc, char** argv, CompareArgs* args) {
  OptionParser parser(Usage());
  parser.Policy(&args->policy)
      .Help()
      .Format("", 'f', &args->format[0])
      .Format("", 'F', &args->format[1])
      .Flag("", 'p', &args->progress)
      .Flag("", 'q', &args->quiet)
      .Flag("", 's', &args->strict);
  std::vector<std::string> operands;
  if (int rc = parser.Parse(argc, argv, &operands); rc != kGoOn) return rc;
  if (operands.size() != 2) {
    return UsageError(Usage(), "expecting two image file names");
  }
  args->name[0] = operands[0];
  args->name[1] = operands[1];
  if (args->quiet) args->progress = false;
  return -1;
}

// One side of the comparison.
struct Side {
  std::string name;
  std::unique_ptr<Image> image;
  std::unique_ptr<StatusAbove> status;
  uint64_t size = 0;
};

// Index of the first 512-byte sector of `buf` holding a non-zero byte,
// in bytes, or -1 (QEMU's find_nonzero).
int64_t FindNonzero(const uint8_t* buf, uint64_t len) {
  for (uint64_t i = 0; i < len; i += kSector) {
    const uint64_t n = std::min(kSector, len - i);
    const uint8_t* p = buf + i;
    if (p[0] != 0 || std::memcmp(p, p + 1, n - 1) != 0) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

// QEMU's compare_buffers(): whether the first sectors differ, and in
// `same` the length of the prefix whose sectors all match that answer.
bool CompareSectors(const uint8_t* a, const uint8_t* b, uint64_t len,
                    uint64_t* same) {
  uint64_t i = std::min(len, kSector);
  const bool differ = std::memcmp(a, b, i) != 0;
  while (i < len) {
    const uint64_t n = std::min(len - i, kSector);
    if ((std::memcmp(a + i, b + i, n) != 0) != differ) break;
    i += n;
  }
  *same = i;
  return differ;
}

class Comparison {
 public:
  Comparison(const CompareArgs& args, Side* a, Side* b)
      : args_(args), side_{a, b}, buf_{std::vector<uint8_t>(kBufferBytes),
                                       std::vector<uint8_t>(kBufferBytes)} {}

  int Run();

 private:
  void Say(const std::string& line) const {
    if (!args_.quiet) std::printf("%s\n", line.c_str());
  }
  int StatusError(const Side& s, const absl::Status& st) const;
  int Read(Side& s, uint64_t offset, uint64_t len, std::vector<uint8_t>* buf);
  // The range [offset, +len) of `s` must read as zeros.
  int CheckZeros(Side& s, uint64_t offset, uint64_t len);
  // One step over the common part; advances offset_.
  int Step(Progress* progress);
  // The part of the larger image past the smaller one's end.
  int CheckTail(Progress* progress);

  const CompareArgs& args_;
  Side* side_[2];
  std::vector<uint8_t> buf_[2];
  uint64_t offset_ = 0;
  float total_ = 0;  // the larger size, for progress
};

int Comparison::StatusError(const Side& s, const absl::Status& st) const {
  std::fprintf(stderr, "qcowtool: Sector allocation test failed for %s: %s\n",
               s.name.c_str(), std::string(st.message()).c_str());
  return kExitStatusError;
}

int Comparison::Read(Side& s, uint64_t offset, uint64_t len,
                     std::vector<uint8_t>* buf) {
  absl::Status st = s.image->Read(offset, absl::MakeSpan(buf->data(), len));
  if (st.ok()) return kExitSame;
  std::fprintf(stderr,
               "qcowtool: Error while reading offset %" PRIu64 " of %s: %s\n",
               offset, s.name.c_str(), std::string(st.message()).c_str());
  return kExitReadError;
}

int Comparison::CheckZeros(Side& s, uint64_t offset, uint64_t len) {
  if (int rc = Read(s, offset, len, &buf_[0]); rc != kExitSame) return rc;
  const int64_t at = FindNonzero(buf_[0].data(), len);
  if (at < 0) return kExitSame;
  Say(absl::StrCat("Content mismatch at offset ",
                   offset + static_cast<uint64_t>(at), "!"));
  return kExitDifferent;
}

int Comparison::Step(Progress* progress) {
  absl::StatusOr<StatusRange> st[2];
  for (int i = 0; i < 2; ++i) {
    st[i] = side_[i]->status->Get(offset_);
    if (!st[i].ok()) return StatusError(*side_[i], st[i].status());
  }
  uint64_t chunk = std::min(st[0]->length, st[1]->length);
  const unsigned f0 = st[0]->flags, f1 = st[1]->flags;
  if (args_.strict && f0 != f1) {
    Say(absl::StrCat("Strict mode: Offset ", offset_,
                     " block status mismatch!"));
    return kExitDifferent;
  }
  const bool alloc0 = f0 & kStatusAllocated, alloc1 = f1 & kStatusAllocated;
  if ((f0 & kStatusZero) && (f1 & kStatusZero)) {
    // Both read as zeros.
  } else if (alloc0 == alloc1) {
    if (alloc0) {
      chunk = std::min(chunk, kBufferBytes);
      for (int i = 0; i < 2; ++i) {
        if (int rc = Read(*side_[i], offset_, chunk, &buf_[i]);
            rc != kExitSame) {
          return rc;
        }
      }
      uint64_t same = 0;
      const bool differ =
          CompareSectors(buf_[0].data(), buf_[1].data(), chunk, &same);
      if (differ || same != chunk) {
        Say(absl::StrCat("Content mismatch at offset ",
                         offset_ + (differ ? 0 : same), "!"));
        return kExitDifferent;
      }
    }
  } else {
    chunk = std::min(chunk, kBufferBytes);
    if (int rc = CheckZeros(*side_[alloc0 ? 0 : 1], offset_, chunk);
        rc != kExitSame) {
      return rc;
    }
  }
  offset_ += chunk;
  progress->Advance(static_cast<float>(chunk) / total_ * 100);
  return kExitSame;
}

int Comparison::CheckTail(Progress* progress) {
  Side& over = side_[0]->size > side_[1]->size ? *side_[0] : *side_[1];
  while (offset_ < over.size) {
    absl::StatusOr<StatusRange> st = over.status->Get(offset_);
    if (!st.ok()) return StatusError(over, st.status());
    uint64_t chunk = st->length;
    if ((st->flags & kStatusAllocated) && !(st->flags & kStatusZero)) {
      chunk = std::min(chunk, kBufferBytes);
      if (int rc = CheckZeros(over, offset_, chunk); rc != kExitSame) {
        return rc;
      }
    }
    offset_ += chunk;
    progress->Advance(static_cast<float>(chunk) / total_ * 100);
  }
  return kExitSame;
}

int Comparison::Run() {
  const uint64_t size0 = side_[0]->size, size1 = side_[1]->size;
  total_ = static_cast<float>(std::max(size0, size1));
  Progress progress(args_.progress, 2.0f);
  progress.Advance(0);
  if (args_.strict && size0 != size1) {
    Say("Strict mode: Image size mismatch!");
    return kExitDifferent;
  }
  const uint64_t common = std::min(size0, size1);
  while (offset_ < common) {
    if (int rc = Step(&progress); rc != kExitSame) return rc;
  }
  if (size0 != size1) {
    Say("Warning: Image size mismatch!");
    if (int rc = CheckTail(&progress); rc != kExitSame) return rc;
  }
  Say("Images are identical.");
  return kExitSame;
}

int OpenSide(const CompareArgs& args, int i, Side* side) {
  OpenOptions opts;
  OpenPolicy policy = args.policy;
  std::string path = args.name[i];
  opts.format = args.format[i];
  if (auto s = policy.ResolveImage(&path, &opts.format); !s.ok()) {
    ReportError(s);
    return kExitOpenError;
  }
  policy.ApplyTo(&opts);
  side->name = path;
  auto image = Image::Open(path, opts);
  if (!image.ok()) {
    ReportError(image.status());
    return kExitOpenError;
  }
  side->image = std::move(image).value();
  side->size = side->image->size();
  side->status = std::make_unique<StatusAbove>(
      side->image.get(),
      QemuChainNames(path, side->image->GetChainInfo()));
  return kExitSame;
}

}  // namespace

int RunCompare(int argc, char** argv) {
  CompareArgs args;
  if (int rc = ParseArgs(argc, argv, &args); rc >= 0) return rc;
  Side sides[2];
  for (int i = 0; i < 2; ++i) {
    if (int rc = OpenSide(args, i, &sides[i]); rc != kExitSame) return rc;
  }
  Comparison cmp(args, &sides[0], &sides[1]);
  return cmp.Run();
}

}  // namespace qcow2::tool
