// SPDX-License-Identifier: Apache-2.0
// Write-side operations of the chain: everything goes to the top layer;
// layers below are read for copy-on-write only.
#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "lib/chain/chain.h"
#include "lib/chain/probe_guard.h"
#include "lib/io/accounted_file.h"
#include "lib/io/file_lock.h"
#include "lib/io/posix_file.h"
#include "lib/driver/qcow2_layer.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

WriteBackFile* Chain::TopWriteBack() {
  Qcow2Layer* top = top_qcow2();
  return top != nullptr && writable_ ? top->meta_file() : nullptr;
}

absl::Status Chain::CheckWritable() const {
  if (closed_) return ClosedError();
  if (!writable_) {
    return absl::FailedPreconditionError(
        layers_[0]->filename() + " is open read-only");
  }
  return absl::OkStatus();
}

void Chain::ConnectBacking() {
  // A resolution window inside one cached L2 slice of every layer below,
  // so that resolving it meets at most one miss per layer.
  resolve_window_ = kMaxResolveWindow;
  for (int d = 1; d < length(); ++d) {
    if (auto* q = layers_[d]->AsQcow2()) {
      const Geometry& g = q->cluster_map().geometry();
      resolve_window_ = std::min(
          resolve_window_,
          std::max<uint64_t>(g.slice_entries << g.cluster_bits,
                             BackingMap::kGranule));
    }
  }
  Qcow2Layer* top = top_qcow2();
  if (top == nullptr || length() < 2) return;
  top->cow().set_backing(
      [this](uint64_t offset, uint8_t* dest, uint64_t len, IoPlan* plan) {
        return PlanRead(1, offset, dest, len, plan, IoCategory::kCow);
      },
      [this](uint64_t offset, uint64_t len) {
        return ReadsAsZero(1, offset, len);
      });
}

absl::Status Chain::Resize(uint64_t new_size) {
  RETURN_IF_ERROR(CheckWritable());
  new_size = (new_size + 511) & ~uint64_t{511};
  if (new_size < size()) {
    return absl::UnimplementedError(absl::StrCat(
        layers_[0]->filename(), ": shrinking an image is not supported"));
  }
  if (new_size == size()) return absl::OkStatus();
  Qcow2Layer* top = top_qcow2();
  if (top == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        layers_[0]->filename(), ": resizing raw images is not supported"));
  }
  return top->flusher().Grow(new_size);
}

int LockFd(File* file) {
  file = Unwrapped(file);
  if (File* inner = GuardedFile(file)) file = Unwrapped(inner);
  auto* posix = dynamic_cast<PosixFile*>(file);
  return posix != nullptr ? posix->lock_fd() : -1;
}

absl::Status Chain::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  absl::Status result;
  if (writable_ && top_qcow2() == nullptr) result = layers_[0]->Flush();
  for (auto& layer : layers_) {
    absl::Status s = layer->Close();
    if (result.ok() && !s.ok()) result = s;
  }
  return result;
}

void Chain::DropImageLocksAfterClose() {
  if (!closed_ || locks_dropped_) return;
  locks_dropped_ = true;
  for (auto& layer : layers_) {
    if (int fd = LockFd(layer->file()); fd >= 0) {
      DropImageLocks(fd, LockPerms{kPermAll, 0}, LockPerms{});
    }
  }
}

absl::Status Chain::CreateOverlay(const std::string& path,
                                  const CreateOptions& opts,
                                  ImageCreator create) {
  RETURN_IF_ERROR(CheckWritable());
  if (length() > opts_.max_chain_depth) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a new overlay would make the chain deeper than ",
        opts_.max_chain_depth, " images"));
  }
  Layer* old_top = layers_[0].get();
  // Everything written so far reaches the old top before the overlay
  // exists; its Close() below then has only the dirty bit left to do.
  RETURN_IF_ERROR(old_top->Flush());

  // Name the backing file the way a person would: by its base name when
  // both files share a directory, else by absolute path.
  namespace fs = std::filesystem;
  const fs::path top_path(old_top->filename());
  const fs::path new_path(path);
  std::string backing = top_path.string();
  if (top_path.parent_path() == new_path.parent_path()) {
    backing = top_path.filename().string();
  } else if (!top_path.is_absolute()) {
    std::error_code ec;
    fs::path abs = fs::absolute(top_path, ec);
    if (!ec) backing = abs.string();
  }
  CreateOptions co = opts;
  co.format = ImageFormat::kQcow2;
  co.backing_file = backing;
  co.backing_format =
      dynamic_cast<Qcow2Layer*>(old_top) != nullptr ? "qcow2" : "raw";
  if (co.size == 0) co.size = size();
  co.opener = opts_.opener;

  // On failure the chain stays as it was (the old top open and writable)
  // and the half-made overlay goes away. Only a file this call created is
  // removed; with an opener that keeps files elsewhere (in memory) there
  // is nothing on disk to remove.
  std::error_code ec;
  const bool existed = fs::exists(new_path, ec) || ec;
  auto fail = [&](const absl::Status& s) {
    if (!existed) {
      std::error_code ignored;
      fs::remove(new_path, ignored);
    }
    return absl::Status(s.code(), absl::StrCat("creating overlay ", path,
                                               " over ", old_top->filename(),
                                               ": ", s.message()));
  };
  if (absl::Status s = create(path, co); !s.ok()) return fail(s);
  FileOpener* opener = opts_.opener ? opts_.opener : DefaultFileOpener();
  FileOptions fo;
  fo.read_only = false;
  fo.direct = opts_.direct_io;
  fo.lock = opts_.lock;
  absl::StatusOr<std::unique_ptr<File>> file = opener->Open(path, fo);
  if (!file.ok()) return fail(file.status());
  OpenOptions oo = opts_;
  oo.read_write = true;
  oo.format = "qcow2";
  absl::StatusOr<std::unique_ptr<Qcow2Layer>> layer =
      Qcow2Layer::Open(AccountedFile::Wrap(std::move(file).value()), oo);
  if (!layer.ok()) return fail(layer.status());
  // The old top stops taking writes: flush it and mark it clean. If that
  // fails it stays open and is still the top.
  if (absl::Status s = old_top->Close(); !s.ok()) {
    layer->reset();  // close the overlay's file before removing it
    return fail(s);
  }
  // Now a backing file: read-only locks, as QEMU keeps on it.
  if (int fd = LockFd(old_top->file()); fd >= 0) {
    DropImageLocks(fd, ImageLockPerms(true, false), ImageLockPerms(false, false));
  }
  if (Qcow2Layer* q = top_qcow2()) q->cow().set_backing(nullptr, nullptr);
  layers_.insert(layers_.begin(), std::move(layer).value());
  backing_map_.Clear();  // resolved for the layers under the old top
  resolved_backing_.insert(resolved_backing_.begin(), top_path.string());
  ConnectBacking();
  return absl::OkStatus();
}

}  // namespace qcow2::internal
