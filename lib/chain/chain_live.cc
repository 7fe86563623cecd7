// SPDX-License-Identifier: Apache-2.0
// The chain's side of live stream and live commit (lib/engine/engine_live.cc):
// which ranges the layers above a base allocate, a layer's file lent to a
// writer of its own, and the switch that takes layers out of the chain.
#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/chain/chain.h"
#include "lib/driver/qcow2_layer.h"
#include "lib/io/file_lock.h"

namespace qcow2::internal {

absl::StatusOr<uint64_t> Chain::AllocatedAbove(int below, uint64_t offset,
                                               uint64_t max_len,
                                               bool* allocated, int from) {
  uint64_t n = max_len;
  for (int d = from; d < below && d < length(); ++d) {
    Layer* layer = layers_[d].get();
    if (offset >= layer->size()) {
      // Past a layer's end the chain reads zeros, whatever lies below.
      *allocated = true;
      return n;
    }
    ASSIGN_OR_RETURN(Extent e, layer->MapStatus(offset, n));
    n = std::min(n, e.length);
    if (e.kind != Extent::kUnallocated) {
      *allocated = true;
      return n;
    }
  }
  *allocated = false;
  return n;
}

absl::Status Chain::LockForWrite(int depth) {
  RETURN_IF_ERROR(CheckWritable());
  Layer* layer = layers_[depth].get();
  const int fd = LockFd(layer->file());
  if (!opts_.lock || fd < 0) return absl::OkStatus();
  absl::Status s =
      LockImageFile(fd, layer->filename(), ImageLockPerms(true, false));
  if (!s.ok()) {
    // A failed lock lets go of every byte: take the read locks back.
    LockImageFile(fd, layer->filename(),
                  ImageLockPerms(false, opts_.force_share))
        .IgnoreError();
  }
  return s;
}

void Chain::UnlockForWrite(int depth) {
  if (const int fd = LockFd(layers_[depth]->file()); fd >= 0 && opts_.lock) {
    DropImageLocks(fd, ImageLockPerms(true, false),
                   ImageLockPerms(false, opts_.force_share));
  }
}

absl::StatusOr<std::unique_ptr<Layer>> Chain::Reopen(int depth) {
  Layer* old = layers_[depth].get();
  // The writer lent the file is done: back to a backing file's locks, so
  // that the new open's shared locks do not conflict with them.
  UnlockForWrite(depth);
  FileOpener* opener = opts_.opener ? opts_.opener : DefaultFileOpener();
  FileOptions fo;
  fo.read_only = true;
  fo.direct = opts_.direct_io;
  fo.lock = opts_.lock;
  fo.force_share = opts_.force_share;
  const std::string& path = resolved_backing_[depth - 1];
  absl::StatusOr<std::unique_ptr<File>> file = opener->Open(path, fo);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("reopening ", path, ": ",
                                     file.status().message()));
  }
  OpenOptions oo = opts_;
  oo.read_write = false;
  return OpenLayer(std::move(file).value(),
                   old->AsQcow2() != nullptr ? "qcow2" : "raw", oo);
}

std::string Chain::BackingNameFor(int depth) const {
  if (depth >= length()) return "";
  namespace fs = std::filesystem;
  const std::string& path = resolved_backing_[depth - 1];
  const fs::path top(layers_[0]->filename());
  const fs::path above(layers_[depth - 1]->filename());
  // The name the layer above stores, when the top shares its directory;
  // else the absolute path.
  if (top.parent_path() == above.parent_path()) {
    return layers_[depth - 1]->backing_file();
  }
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  return ec ? path : abs.string();
}

std::string Chain::FormatOf(int depth) {
  if (depth >= length()) return "";
  return layers_[depth]->AsQcow2() != nullptr ? "qcow2" : "raw";
}

void Chain::DropLayers(int last, std::unique_ptr<Layer> replacement) {
  if (Qcow2Layer* q = top_qcow2()) q->cow().set_backing(nullptr, nullptr);
  // resolved_backing_[i] names layer i + 1.
  const std::string new_backing = resolved_backing_[last];
  const std::string below = resolved_backing_[last - 1];
  for (int d = 1; d <= last; ++d) {
    // Kept open for I/O planned against them and still in flight, but no
    // longer holding any image lock: others may open them at once.
    if (const int fd = LockFd(layers_[d]->file()); fd >= 0 && opts_.lock) {
      DropImageLocks(fd, LockPerms{kPermAll, 0}, LockPerms{});
    }
    retired_.push_back(std::move(layers_[d]));
  }
  layers_.erase(layers_.begin() + 1, layers_.begin() + last + 1);
  resolved_backing_.erase(resolved_backing_.begin() + 1,
                          resolved_backing_.begin() + last + 1);
  if (replacement != nullptr) {
    // The layer `last` opened afresh (a live commit's base).
    layers_.insert(layers_.begin() + 1, std::move(replacement));
    resolved_backing_.insert(resolved_backing_.begin() + 1, new_backing);
    resolved_backing_[0] = below;
  } else {
    resolved_backing_[0] = new_backing;
  }
  backing_map_.Clear();
  ConnectBacking();
}

absl::Status Chain::PivotTo(int base) {
  RETURN_IF_ERROR(CheckWritable());
  Layer* old_base = layers_[base].get();
  const int old_fd = LockFd(old_base->file());
  const bool locking = opts_.lock && old_fd >= 0;
  // Two descriptors of one process conflict under OFD locks: the old one
  // lets go before the new one takes QEMU's write lock (a peer that opens
  // the file in between makes the open fail, and the commit with it).
  if (locking) DropImageLocks(old_fd, LockPerms{kPermAll, 0}, LockPerms{});
  auto relock = [&] {
    if (locking) {
      LockImageFile(old_fd, old_base->filename(), ImageLockPerms(true, false))
          .IgnoreError();
    }
  };
  const std::string path = resolved_backing_[base - 1];
  FileOpener* opener = opts_.opener ? opts_.opener : DefaultFileOpener();
  FileOptions fo;
  fo.read_only = false;
  fo.direct = opts_.direct_io;
  fo.lock = opts_.lock && old_fd >= 0;
  absl::StatusOr<std::unique_ptr<Layer>> fresh = [&]()
      -> absl::StatusOr<std::unique_ptr<Layer>> {
    ASSIGN_OR_RETURN(std::unique_ptr<File> file, opener->Open(path, fo));
    OpenOptions oo = opts_;
    oo.read_write = true;
    oo.format = FormatOf(base);
    return OpenLayer(std::move(file), oo.format, oo);
  }();
  if (!fresh.ok()) {
    relock();
    return absl::Status(fresh.status().code(),
                        absl::StrCat("reopening ", path, " read-write: ",
                                     fresh.status().message()));
  }
  // The old top stops taking writes: flushed and marked clean, as a new
  // overlay leaves it. If that fails it stays the top.
  if (absl::Status s = layers_[0]->Close(); !s.ok()) {
    fresh->reset();
    relock();
    return s;
  }
  if (Qcow2Layer* q = top_qcow2()) q->cow().set_backing(nullptr, nullptr);
  for (int d = 0; d <= base; ++d) {
    if (const int fd = LockFd(layers_[d]->file()); fd >= 0 && opts_.lock) {
      DropImageLocks(fd, LockPerms{kPermAll, 0}, LockPerms{});
    }
    retired_.push_back(std::move(layers_[d]));
  }
  layers_.erase(layers_.begin(), layers_.begin() + base + 1);
  layers_.insert(layers_.begin(), std::move(fresh).value());
  // resolved_backing_[i] names layer i + 1.
  resolved_backing_.erase(resolved_backing_.begin(),
                          resolved_backing_.begin() + base);
  backing_map_.Clear();
  ConnectBacking();
  return absl::OkStatus();
}

}  // namespace qcow2::internal
