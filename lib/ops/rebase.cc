// SPDX-License-Identifier: Apache-2.0
// qemu-img rebase: the safe copy (CopyForRebase) and the header change.
#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/chain/chain.h"
#include "lib/ops/chunk_runner.h"
#include "lib/ops/rebase_copy.h"

namespace qcow2::ops {
namespace {

constexpr uint64_t kSector = 512;
// Differing sectors closer than this are written as one run.
constexpr uint64_t kMergeGap = 64 * 1024;

// Hands out the chunks of a rebase: ranges the top does not allocate,
// not read from the shared layers, and not zero on both sides.
class RebaseChunks {
 public:
  RebaseChunks(Image* top, Image* new_backing, int shared_depth,
               uint64_t chunk)
      : top_(top),
        new_(new_backing),
        shared_depth_(shared_depth),
        chunk_(chunk),
        size_(top->size()),
        new_size_(new_backing != nullptr ? new_backing->size() : 0) {}

  absl::StatusOr<bool> Next(Chunk* c) {
    while (pos_ < size_) {
      const uint64_t at = pos_;
      ASSIGN_OR_RETURN(BlockStatus st,
                       top_->GetBlockStatus(at, std::min(chunk_, size_ - at)));
      uint64_t len = std::max<uint64_t>(st.length, 1);
      // Allocated in the top, or read from the layers both chains share.
      if ((st.present && st.depth == 0) || st.depth >= shared_depth_) {
        pos_ += len;
        continue;
      }
      if (st.zero) {
        // The old chain reads zeros: work only where the new one does not.
        if (at >= new_size_) {
          pos_ += len;
          continue;
        }
        ASSIGN_OR_RETURN(BlockStatus ns,
                         new_->GetBlockStatus(
                             at, std::min(len, new_size_ - at)));
        len = std::max<uint64_t>(ns.length, 1);
        pos_ += len;
        if (ns.zero) continue;
      } else {
        pos_ += len;
      }
      *c = Chunk{at, len, st.depth, st.zero};
      return true;
    }
    return false;
  }

 private:
  Image* top_;
  Image* new_;
  int shared_depth_;
  uint64_t chunk_;
  uint64_t size_;
  uint64_t new_size_;
  uint64_t pos_ = 0;
};

// Whether sector `i` of the chunk differs between the old data (s.a) and
// the new (s.b, or zeros with no new backing file).
bool SectorDiffers(const Slot& s, uint64_t i, bool have_new) {
  const uint64_t off = i * kSector;
  const uint64_t n = std::min(kSector, s.chunk.len - off);
  if (!have_new) return !AllZero(s.a.data() + off, n);
  return std::memcmp(s.a.data() + off, s.b.data() + off, n) != 0;
}

}  // namespace

std::string FormatName(ImageFormat f) {
  return f == ImageFormat::kRaw ? "raw" : "qcow2";
}

std::string CanonicalPath(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

absl::Status CopyForRebase(Image* top, Image* new_backing, int shared_depth,
                           const ChainOpOptions& opts) {
  QueueOptions qo;
  qo.depth = 1024;
  ASSIGN_OR_RETURN(std::unique_ptr<Queue> tq, top->CreateQueue(qo));
  std::unique_ptr<Queue> nq;
  std::vector<Queue*> queues = {tq.get()};
  if (new_backing != nullptr) {
    ASSIGN_OR_RETURN(nq, new_backing->CreateQueue(qo));
    queues.push_back(nq.get());
  }
  const uint64_t chunk = std::max<uint64_t>(opts.chunk / kSector, 1) * kSector;
  RebaseChunks chunks(top, new_backing, shared_depth, chunk);
  ChunkRunner runner(queues, opts.depth, chunk);
  runner.set_control(opts.control);
  const uint64_t new_size = new_backing ? new_backing->size() : 0;

  // Stage 1: the old data (zeros known from metadata are not read) and
  // the new backing's (zeros past its end).
  auto read = [&](Slot& s) -> absl::Status {
    const Chunk& c = s.chunk;
    if (c.zero) {
      std::memset(s.a.data(), 0, c.len);
    } else {
      RETURN_IF_ERROR(runner.Issue(s, [&](Completion done) {
        return tq->SubmitRead(c.offset, absl::MakeSpan(s.a.data(), c.len),
                              std::move(done));
      }));
    }
    if (new_backing == nullptr) return absl::OkStatus();  // zeros
    const uint64_t in_new =
        c.offset < new_size ? std::min(c.len, new_size - c.offset) : 0;
    std::memset(s.b.data() + in_new, 0, c.len - in_new);
    if (in_new == 0) return absl::OkStatus();
    return runner.Issue(s, [&](Completion done) {
      return nq->SubmitRead(c.offset, absl::MakeSpan(s.b.data(), in_new),
                            std::move(done));
    });
  };
  // Stage 2: the runs of differing sectors go into the top, zeros as
  // write-zeroes.
  const bool have_new = new_backing != nullptr;
  auto write = [&](Slot& s) -> absl::Status {
    const Chunk& c = s.chunk;
    const uint64_t sectors = (c.len + kSector - 1) / kSector;
    for (uint64_t i = 0; i < sectors;) {
      if (!SectorDiffers(s, i, have_new)) {
        ++i;
        continue;
      }
      uint64_t end = i + 1;  // one past the last differing sector
      for (uint64_t j = end; j < sectors && (j - end) * kSector < kMergeGap;
           ++j) {
        if (SectorDiffers(s, j, have_new)) end = j + 1;
      }
      const uint64_t off = i * kSector;
      const uint64_t len = std::min(end * kSector, c.len) - off;
      const uint8_t* data = s.a.data() + off;
      if (AllZero(data, len)) {
        RETURN_IF_ERROR(runner.Issue(s, [&](Completion done) {
          return tq->SubmitWriteZeroes(c.offset + off, len, false,
                                       std::move(done));
        }));
      } else {
        RETURN_IF_ERROR(runner.Issue(s, [&](Completion done) {
          return tq->SubmitWrite(c.offset + off, absl::MakeConstSpan(data, len),
                                 std::move(done));
        }));
      }
      i = end;
    }
    return absl::OkStatus();
  };
  const double total = static_cast<double>(std::max<uint64_t>(top->size(), 1));
  absl::Status s = runner.Run(
      [&](Chunk* c) -> absl::StatusOr<bool> {
        // Progress is the walk's position: chunks finish out of order.
        absl::StatusOr<bool> got = chunks.Next(c);
        if (got.ok() && opts.progress) {
          opts.progress(*got ? static_cast<double>(c->offset) / total : 1.0);
        }
        return got;
      },
      {read, write});
  tq.reset();
  nq.reset();
  RETURN_IF_ERROR(s);
  return top->Flush();
}

}  // namespace qcow2::ops

// --- The public calls (qcow2/maintenance.h).
namespace qcow2 {

using ops::CanonicalPath;
using ops::CopyForRebase;
using ops::FormatName;

absl::Status Rebase(const RebaseSpec& spec, const ChainOpOptions& opts) {
  auto change_error = [&](const absl::Status& s) {
    return absl::Status(s.code(),
                        absl::StrCat("Could not change the backing file to '",
                                     spec.backing, "': ", s.message()));
  };
  if (!spec.backing.empty() && spec.backing_format.empty()) {
    return change_error(
        absl::InvalidArgumentError("backing format must be specified"));
  }
  OpenOptions oo = opts.open;
  oo.read_write = true;
  oo.force_share = false;
  oo.format = spec.format;
  // Unsafe: the old backing file is not needed (it may be gone).
  if (spec.unsafe) oo.open_backing = false;
  ASSIGN_OR_RETURN(std::unique_ptr<Image> top, Image::Open(spec.image, oo));
  const std::vector<LayerInfo> chain = top->GetChainInfo();
  if (chain[0].format == ImageFormat::kRaw) {
    // Refused before anything is copied (qemu-img copies, then fails).
    return change_error(absl::UnimplementedError(
        "a raw image has no backing file (Operation not supported)"));
  }
  if (!spec.unsafe) {
    std::unique_ptr<Image> new_backing;
    int shared = INT_MAX;
    if (!spec.backing.empty()) {
      auto open_error = [&](const absl::Status& s) {
        return absl::Status(s.code(),
                            absl::StrCat("Could not open new backing file '",
                                         spec.backing, "': ", s.message()));
      };
      absl::StatusOr<std::string> path =
          internal::ResolveBackingName(chain[0].filename, spec.backing);
      if (!path.ok()) return open_error(path.status());
      OpenOptions no = opts.open;
      no.read_write = false;
      no.format = spec.backing_format;
      absl::StatusOr<std::unique_ptr<Image>> opened = Image::Open(*path, no);
      if (!opened.ok()) return open_error(opened.status());
      new_backing = std::move(opened).value();
      const std::string key = CanonicalPath(*path);
      for (size_t i = 1; i < chain.size(); ++i) {
        if (CanonicalPath(chain[i].filename) == key &&
            FormatName(chain[i].format) == spec.backing_format) {
          shared = static_cast<int>(i);
          break;
        }
      }
    }
    RETURN_IF_ERROR(CopyForRebase(top.get(), new_backing.get(), shared, opts));
  }
  if (absl::Status s = top->ChangeBackingFile(spec.backing,
                                              spec.backing_format);
      !s.ok()) {
    return change_error(s);
  }
  return top->Close();
}

}  // namespace qcow2
