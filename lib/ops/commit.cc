// SPDX-License-Identifier: Apache-2.0
// qemu-img commit: the ranges above the base are found first (one walk of
// the whole chain, before anything is written), then copied from the
// layer that holds each into the base, then the top is emptied.
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/chain/chain.h"
#include "lib/ops/make_empty.h"
#include "lib/driver/qcow2_layer.h"
#include "lib/io/accounted_file.h"
#include "lib/ops/chunk_runner.h"
#include "lib/ops/rebase_copy.h"

namespace qcow2::ops {
namespace {

// The ranges that layers above `base_depth` decide, merged where they
// follow one another with the same layer and kind. Walked on an image of
// its own, closed before the base is written: no reader of the base's
// metadata sees it change.
absl::StatusOr<std::vector<Chunk>> RangesAbove(Image* image, int base_depth) {
  std::vector<Chunk> out;
  const uint64_t size = image->size();
  for (uint64_t pos = 0; pos < size;) {
    ASSIGN_OR_RETURN(BlockStatus st, image->GetBlockStatus(pos, size - pos));
    const uint64_t len = std::max<uint64_t>(st.length, 1);
    if (st.present && st.depth < base_depth) {
      if (!out.empty() && out.back().offset + out.back().len == pos &&
          out.back().depth == st.depth && out.back().zero == st.zero) {
        out.back().len += len;
      } else {
        out.push_back(Chunk{pos, len, st.depth, st.zero});
      }
    }
    pos += len;
  }
  return out;
}

// Empties the top image in place (lib/ops/make_empty.h), opened on its
// own: no chain, no engine, the image's locks taken as for any writer.
absl::Status EmptyTop(const std::string& path, const OpenOptions& base_opts) {
  FileOpener* opener =
      base_opts.opener ? base_opts.opener : DefaultFileOpener();
  FileOptions fo;
  fo.read_only = false;
  fo.direct = base_opts.direct_io;
  fo.lock = base_opts.lock;
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, opener->Open(path, fo));
  OpenOptions oo = base_opts;
  oo.read_write = true;
  oo.force_share = false;
  oo.format = "qcow2";
  // A top with an external data file opens it as any open does (the
  // data file's clusters are let go of there).
  auto open_data = [&](const std::string& stored)
      -> absl::StatusOr<std::unique_ptr<File>> {
    return internal::OpenDataFile(path, stored, oo);
  };
  ASSIGN_OR_RETURN(
      std::unique_ptr<internal::Qcow2Layer> layer,
      internal::Qcow2Layer::Open(
          internal::AccountedFile::Wrap(std::move(file)), oo, open_data));
  absl::Status s = internal::MakeEmpty(layer.get());
  absl::Status closed = layer->Close();
  return s.ok() ? closed : s;
}

// Copies `ranges` from `readers` (one per layer above the base, indexed
// by depth) into `base`, zeros as write-zeroes.
absl::Status CopyDown(const std::vector<Chunk>& ranges,
                      const std::vector<std::unique_ptr<Image>>& readers,
                      Image* base, const ChainOpOptions& opts) {
  QueueOptions qo;
  qo.depth = 1024;
  std::vector<std::unique_ptr<Queue>> rq(readers.size());
  std::vector<Queue*> queues;
  ASSIGN_OR_RETURN(std::unique_ptr<Queue> wq, base->CreateQueue(qo));
  queues.push_back(wq.get());
  for (size_t i = 0; i < readers.size(); ++i) {
    if (readers[i] == nullptr) continue;
    ASSIGN_OR_RETURN(rq[i], readers[i]->CreateQueue(qo));
    queues.push_back(rq[i].get());
  }
  const uint64_t chunk = std::max<uint64_t>(opts.chunk / 512, 1) * 512;
  uint64_t total = 0;
  for (const Chunk& c : ranges) total += c.len;
  size_t next = 0;
  uint64_t in_range = 0;  // bytes of ranges[next] handed out already
  ChunkRunner runner(queues, opts.depth, chunk);
  runner.set_control(opts.control);
  auto source = [&](Chunk* c) -> absl::StatusOr<bool> {
    if (next == ranges.size()) return false;
    const Chunk& r = ranges[next];
    *c = r;
    c->offset = r.offset + in_range;
    c->len = std::min(chunk, r.len - in_range);
    in_range += c->len;
    if (in_range == r.len) {
      ++next;
      in_range = 0;
    }
    return true;
  };
  auto read = [&](Slot& s) -> absl::Status {
    const Chunk& c = s.chunk;
    if (c.zero) return absl::OkStatus();
    return runner.Issue(s, [&](Completion done) {
      return rq[c.depth]->SubmitRead(
          c.offset, absl::MakeSpan(s.a.data(), c.len), std::move(done));
    });
  };
  auto write = [&](Slot& s) -> absl::Status {
    const Chunk& c = s.chunk;
    return runner.Issue(s, [&](Completion done) {
      if (c.zero) {
        return wq->SubmitWriteZeroes(c.offset, c.len, false, std::move(done));
      }
      return wq->SubmitWrite(c.offset, absl::MakeConstSpan(s.a.data(), c.len),
                             std::move(done));
    });
  };
  uint64_t done_bytes = 0;
  auto progress = [&](uint64_t n) {
    done_bytes += n;
    if (opts.progress && total > 0) {
      opts.progress(static_cast<double>(done_bytes) / total);
    }
  };
  absl::Status s = runner.Run(source, {read, write}, progress);
  wq.reset();
  rq.clear();
  return s;
}

// Grows a raw base to `size` bytes (the library does not resize raw
// images; QEMU's commit truncates the file up): the new part reads as
// zeros.
absl::Status GrowRawFile(const std::string& path, uint64_t size,
                         const OpenOptions& base_opts) {
  FileOpener* opener =
      base_opts.opener ? base_opts.opener : DefaultFileOpener();
  FileOptions fo;
  fo.read_only = false;
  fo.lock = base_opts.lock;
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, opener->Open(path, fo));
  ASSIGN_OR_RETURN(uint64_t have, file->Size());
  if (have >= size) return absl::OkStatus();
  RETURN_IF_ERROR(file->Truncate(size));
  return file->Flush();
}

}  // namespace

}  // namespace qcow2::ops

// --- The public calls (qcow2/maintenance.h).
namespace qcow2 {

using ops::CanonicalPath;
using ops::Chunk;
using ops::CopyDown;
using ops::EmptyTop;
using ops::FormatName;
using ops::GrowRawFile;
using ops::RangesAbove;

absl::StatusOr<int> FindInChain(const std::vector<LayerInfo>& chain,
                                const std::string& name) {
  const std::string key = CanonicalPath(name);
  for (size_t i = 1; i < chain.size(); ++i) {
    const LayerInfo& above = chain[i - 1];
    if (name == above.backing_file) return static_cast<int>(i);
    const std::string layer = CanonicalPath(chain[i].filename);
    absl::StatusOr<std::string> rel =
        internal::ResolveBackingName(above.filename, name);
    if ((rel.ok() && CanonicalPath(*rel) == layer) || key == layer) {
      return static_cast<int>(i);
    }
  }
  return absl::NotFoundError(absl::StrCat("Did not find '", name,
                                          "' in the backing chain of '",
                                          chain[0].filename, "'"));
}

absl::StatusOr<CommitResult> Commit(const CommitSpec& spec,
                                    const ChainOpOptions& opts) {
  std::vector<LayerInfo> chain;
  std::vector<Chunk> ranges;
  int base_depth = 1;
  uint64_t top_size = 0;
  {
    OpenOptions oo = opts.open;
    oo.read_write = false;
    oo.format = spec.format;
    ASSIGN_OR_RETURN(std::unique_ptr<Image> image,
                     Image::Open(spec.image, oo));
    chain = image->GetChainInfo();
    if (chain.size() < 2) {
      return absl::FailedPreconditionError(
          "Image does not have a backing file");
    }
    if (!spec.base.empty()) {
      ASSIGN_OR_RETURN(base_depth, FindInChain(chain, spec.base));
    }
    if (!spec.keep_top && spec.base.empty() && chain[0].snapshot_count > 0) {
      return absl::UnimplementedError(absl::StrCat(
          chain[0].filename,
          ": emptying an image with internal snapshots after a commit is not "
          "supported yet (commit -d leaves it as it is)"));
    }
    top_size = image->size();
    ASSIGN_OR_RETURN(ranges, RangesAbove(image.get(), base_depth));
    RETURN_IF_ERROR(image->Close());
  }
  // Each layer above the base on its own (no backing), so that a read of
  // a range it decides touches nothing below it.
  std::vector<std::unique_ptr<Image>> readers(base_depth);
  std::vector<bool> used(base_depth, false);
  for (const Chunk& c : ranges) used[c.depth] = used[c.depth] || !c.zero;
  for (int d = 0; d < base_depth; ++d) {
    if (!used[d]) continue;
    OpenOptions ro = opts.open;
    ro.read_write = false;
    ro.open_backing = false;
    ro.format = FormatName(chain[d].format);
    ASSIGN_OR_RETURN(readers[d], Image::Open(chain[d].filename, ro));
  }
  if (chain[base_depth].format == ImageFormat::kRaw &&
      chain[base_depth].virtual_size < top_size) {
    RETURN_IF_ERROR(
        GrowRawFile(chain[base_depth].filename, top_size, opts.open));
  }
  {
    OpenOptions wo = opts.open;
    wo.read_write = true;
    wo.force_share = false;
    wo.format = FormatName(chain[base_depth].format);
    ASSIGN_OR_RETURN(std::unique_ptr<Image> base,
                     Image::Open(chain[base_depth].filename, wo));
    if (base->size() < top_size) RETURN_IF_ERROR(base->Resize(top_size));
    RETURN_IF_ERROR(CopyDown(ranges, readers, base.get(), opts));
    // Durable in the base before anything leaves the top.
    RETURN_IF_ERROR(base->Close());
  }
  readers.clear();
  CommitResult result;
  if (!spec.keep_top && spec.base.empty()) {
    RETURN_IF_ERROR(EmptyTop(chain[0].filename, opts.open));
    result.emptied = true;
  }
  return result;
}

}  // namespace qcow2
