// SPDX-License-Identifier: Apache-2.0
// Whole-image operations of the request engine: block status, resize,
// close and chain facts, each under the metadata lock.
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/driver/qcow2_layer.h"
#include "lib/engine/engine.h"
#include "lib/meta/eviction_scope.h"
#include "lib/meta/metadata_cache.h"

namespace qcow2::internal {

absl::StatusOr<BlockStatus> Engine::GetBlockStatus(uint64_t offset,
                                                   uint64_t max_len) {
  // A table not cached is read with no lock held, as a read request's is:
  // the walk stops at the miss, the entry is read, and the walk starts
  // over. The entries read stay pinned until the walk is done.
  std::vector<MetadataCache::Handle> pinned;
  IoStats stats;
  int stale = 0;
  while (true) {
    MetadataCache* cache = nullptr;
    IoPlan buffers;
    IoOp op;
    uint64_t want = 0, epoch = 0;
    {
      EngineLock lock(&mu_);
      StatsScope scope(&stats);
      std::optional<MissDeferral> deferral;
      // Entries that keep going stale while they are read: read at once.
      if (stale < kMaxStaleMisses) {
        deferral.emplace(&buffers, /*even_with_work=*/true);
      }
      absl::StatusOr<BlockStatus> bs = chain_->BlockStatusAt(offset, max_len);
      if (!deferral.has_value() || !deferral->deferred()) {
        pinned.clear();
        stats_.Retire(stats);
        return bs;
      }
      cache = deferral->cache;
      want = deferral->offset;
      epoch = deferral->epoch;
      op = MissTable::MissRead(*deferral, &buffers);
    }
    absl::Status read = RunOp(op, /*write=*/false);
    uint64_t ticket = 0;
    WriteBackFile* evicted = nullptr;
    {
      EngineLock lock(&mu_);
      StatsScope scope(&stats);
      absl::StatusOr<MetadataCache::Handle> entry = chain_->ClosedError();
      if (!read.ok()) {
        entry = MissTable::ReadError(cache, want, read);
      } else if (!chain_->closed()) {
        // Evictions it causes are recorded, and written below.
        EvictionScope evictions(chain_->TopWriteBack(), &ticket, &evicted);
        const iovec& v = op.iov[0];
        entry = cache->InsertLoaded(
            op.offset, want, epoch,
            absl::MakeConstSpan(static_cast<const uint8_t*>(v.iov_base),
                                v.iov_len));
      }
      if (!entry.ok()) {
        pinned.clear();
        stats_.Retire(stats);
        return entry.status();
      }
      if (*entry == nullptr) {
        ++stale;
      } else {
        pinned.push_back(std::move(*entry));
      }
    }
    // Metadata the insertion evicted, recorded into the log: written now,
    // with no lock held, as a request's executor writes its own.
    absl::Status written =
        evicted != nullptr ? evicted->WriteBack(ticket) : absl::OkStatus();
    if (!written.ok()) {
      EngineLock lock(&mu_);
      pinned.clear();
      stats_.Retire(stats);
      return written;
    }
  }
}

absl::Status Engine::Resize(uint64_t new_size) {
  return ResizePreallocated(new_size, Preallocation::kOff);
}

absl::Status Engine::ShrinkLocked(uint64_t new_size) {
  RETURN_IF_ERROR(chain_->CheckWritable());
  Qcow2Layer* top = chain_->top_qcow2();
  if (top == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        chain_->GetChainInfo()[0].filename,
        ": resizing raw images is not supported"));
  }
  if (!top->bitmaps().List().empty()) {
    return absl::UnimplementedError(absl::StrCat(
        top->filename(),
        ": shrinking an image with persistent bitmaps is not supported yet"));
  }
  return top->writer().Shrink(new_size);
}

absl::Status Engine::ResizePreallocated(uint64_t new_size,
                                       Preallocation prealloc) {
  CountedCall counted(&stats_);
  EngineLock lock(&mu_);
  RETURN_IF_ERROR(RefuseDuringLiveJob("a resize"));
  Qcow2Layer* top = chain_->top_qcow2();
  if (top == nullptr || !top->has_data_file()) {
    return ResizeLocked(new_size, prealloc);
  }
  // An external data file follows the disk's size, as qemu-img resize
  // makes it; a raw one is mapped whole, the grown part too.
  const uint64_t rounded = (new_size + 511) & ~uint64_t{511};
  if (top->data_file_raw() && prealloc == Preallocation::kOff &&
      rounded > chain_->size()) {
    prealloc = Preallocation::kMetadata;
  }
  RETURN_IF_ERROR(ResizeLocked(new_size, prealloc));
  return top->data_file()->Truncate(chain_->size());
}

absl::Status Engine::ResizeLocked(uint64_t new_size, Preallocation prealloc) {
  const uint64_t rounded = (new_size + 511) & ~uint64_t{511};
  if (prealloc == Preallocation::kOff && rounded < chain_->size()) {
    return ShrinkLocked(rounded);
  }
  if (prealloc == Preallocation::kOff) return chain_->Resize(new_size);
  const uint64_t old_size = chain_->size();
  Qcow2Layer* top = chain_->top_qcow2();
  if (new_size <= old_size) {
    return absl::InvalidArgumentError(
        "Preallocation can only be used for growing images");
  }
  if (top == nullptr) {
    return absl::UnimplementedError(
        "preallocation when resizing raw images is not supported");
  }
  if (chain_->length() > 1) {
    return absl::UnimplementedError(
        "preallocation when resizing an image with a backing file is not "
        "supported");
  }
  RETURN_IF_ERROR(chain_->Resize(new_size));
  // A power cut before this leaves the image grown, not preallocated.
  return top->writer().PreallocateGrown(old_size, chain_->size(), prealloc);
}

absl::Status Engine::Close() {
  CountedCall counted(&stats_);
  EngineLock lock(&mu_);
  absl::Status closed = chain_->Close();
  // The image locks go only once nothing of ours can still write the files,
  // so that an opener waiting for them never finds writes still landing.
  // Requests in flight (Close must not race them; a caller that does) hold
  // them until the last one finishes (RequestEndedLocked).
  if (unfinished_ == 0) chain_->DropImageLocksAfterClose();
  return closed;
}

absl::Status Engine::ChangeBackingFile(const std::string& name,
                                       const std::string& format) {
  CountedCall counted(&stats_);
  EngineLock lock(&mu_);
  RETURN_IF_ERROR(RefuseDuringLiveJob("a backing file change"));
  RETURN_IF_ERROR(chain_->CheckWritable());
  Qcow2Layer* top = chain_->top_qcow2();
  if (top == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        chain_->filename(), ": a raw image has no backing file to change"));
  }
  // Everything written before the call is durable before the header can
  // name another backing file.
  RETURN_IF_ERROR(top->Flush());
  return top->header_writer().ChangeBackingFile(name, format);
}

std::vector<LayerInfo> Engine::GetChainInfo() const {
  EngineLock lock(&mu_);
  return chain_->GetChainInfo();
}

uint64_t Engine::size() const {
  EngineLock lock(&mu_);
  return chain_->size();
}

int Engine::length() const {
  EngineLock lock(&mu_);
  return chain_->length();
}

}  // namespace qcow2::internal
