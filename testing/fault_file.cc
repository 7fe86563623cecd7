// SPDX-License-Identifier: Apache-2.0
#include "testing/fault_file.h"

#include <errno.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "lib/io/posix_file.h"

namespace qcow2::internal {

void FaultDisk::PowerCut(std::mt19937* rng) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [offset, bytes] : pending) {
    if (rng == nullptr || (*rng)() % 2 == 0) continue;
    Land(offset, bytes);
  }
  Restart();
}

size_t FaultDisk::PowerCutKeepingNewest() {
  std::lock_guard<std::mutex> lock(mu);
  const size_t n = pending.size();
  if (n > 0) Land(pending.back().first, pending.back().second);
  Restart();
  return n;
}

void FaultDisk::Land(uint64_t offset, const std::vector<uint8_t>& bytes) {
  if (offset + bytes.size() > durable.size()) {
    durable.resize(offset + bytes.size());
  }
  std::memcpy(durable.data() + offset, bytes.data(), bytes.size());
}

void FaultDisk::Reset(const std::vector<uint8_t>& bytes, uint64_t die_at_op) {
  std::lock_guard<std::mutex> lock(mu);
  durable = bytes;
  current = bytes;
  pending.clear();
  ops = 0;
  die_at = die_at_op;
  fail_once_at = 0;
  fail_once_errno = 0;
  dead = false;
}

void FaultDisk::Restart() {
  pending.clear();
  current = durable;
  dead = false;
  die_at = 0;
  fail_once_at = 0;
}

FaultFile::FaultFile(std::string name, std::shared_ptr<FaultDisk> disk,
                     bool read_only)
    : name_(std::move(name)), disk_(std::move(disk)), read_only_(read_only) {}

absl::Status FaultFile::Op(const char* kind) {
  // Caller holds disk_->mu.
  FaultDisk& d = *disk_;
  uint64_t op = ++d.ops;
  if (d.on_op) d.on_op(op, kind);
  if (d.die_at != 0 && op >= d.die_at) d.dead = true;
  if (d.dead) {
    return ErrnoError(EIO, absl::StrCat(kind, " (simulated power loss) of"),
                      name_);
  }
  if (d.fail_once_at == op) {
    return ErrnoError(d.fail_once_errno,
                      absl::StrCat(kind, " (injected fault) of"), name_);
  }
  return absl::OkStatus();
}

absl::Status FaultFile::ReadAt(uint64_t offset, absl::Span<uint8_t> buf) {
  std::lock_guard<std::mutex> lock(disk_->mu);
  if (disk_->dead) {
    return ErrnoError(EIO, "read (simulated power loss) of", name_);
  }
  const auto& cur = disk_->current;
  size_t have = 0;
  if (offset < cur.size()) {
    have = std::min<uint64_t>(buf.size(), cur.size() - offset);
    std::memcpy(buf.data(), cur.data() + offset, have);
  }
  std::memset(buf.data() + have, 0, buf.size() - have);
  return absl::OkStatus();
}

absl::Status FaultFile::WriteAt(uint64_t offset,
                                absl::Span<const uint8_t> data) {
  if (read_only_) {
    return absl::PermissionDeniedError(absl::StrCat(name_, " is read-only"));
  }
  std::lock_guard<std::mutex> lock(disk_->mu);
  if (absl::Status s = Op("write"); !s.ok()) return s;
  auto& cur = disk_->current;
  if (offset + data.size() > cur.size()) cur.resize(offset + data.size());
  std::memcpy(cur.data() + offset, data.data(), data.size());
  disk_->pending.emplace_back(offset,
                              std::vector<uint8_t>(data.begin(), data.end()));
  return absl::OkStatus();
}

absl::Status FaultFile::Flush() {
  std::lock_guard<std::mutex> lock(disk_->mu);
  if (absl::Status s = Op("flush"); !s.ok()) return s;
  disk_->durable = disk_->current;
  disk_->pending.clear();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> FaultFile::Size() {
  std::lock_guard<std::mutex> lock(disk_->mu);
  return disk_->current.size();
}

absl::Status FaultFile::Truncate(uint64_t size) {
  if (read_only_) {
    return absl::PermissionDeniedError(absl::StrCat(name_, " is read-only"));
  }
  std::lock_guard<std::mutex> lock(disk_->mu);
  if (absl::Status s = Op("truncate"); !s.ok()) return s;
  // Size changes are metadata the file system journals: make them durable
  // at once (a conservative model: qcow2 never relies on them for order).
  disk_->current.resize(size);
  disk_->durable.resize(size);
  for (auto& [offset, bytes] : disk_->pending) {
    if (offset >= size) bytes.clear();
    else if (offset + bytes.size() > size) bytes.resize(size - offset);
  }
  return absl::OkStatus();
}

absl::Status FaultFile::Discard(uint64_t offset, uint64_t len) {
  if (read_only_) {
    return absl::PermissionDeniedError(absl::StrCat(name_, " is read-only"));
  }
  std::lock_guard<std::mutex> lock(disk_->mu);
  if (absl::Status s = Op("discard"); !s.ok()) return s;
  for (auto* bytes : {&disk_->current, &disk_->durable}) {
    if (offset >= bytes->size()) continue;
    uint64_t n = std::min<uint64_t>(len, bytes->size() - offset);
    std::memset(bytes->data() + offset, 0, n);
  }
  for (auto& [off, bytes] : disk_->pending) {
    for (uint64_t i = 0; i < bytes.size(); ++i) {
      if (off + i >= offset && off + i < offset + len) bytes[i] = 0;
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<FaultDisk> FaultFileSystem::Disk(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& d = disks_[path];
  if (!d) d = std::make_shared<FaultDisk>();
  return d;
}

absl::StatusOr<std::unique_ptr<File>> FaultFileSystem::Open(
    const std::string& path, const FileOptions& opts) {
  std::shared_ptr<FaultDisk> disk;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = disks_.find(path);
    if (it == disks_.end()) {
      if (!opts.create) {
        return absl::NotFoundError(
            absl::StrCat("cannot open ", path, ": No such file or directory"));
      }
      it = disks_.emplace(path, std::make_shared<FaultDisk>()).first;
    } else if (opts.create && opts.exclusive) {
      return absl::AlreadyExistsError(
          absl::StrCat("cannot create ", path, ": File exists"));
    }
    disk = it->second;
  }
  return std::unique_ptr<File>(
      new FaultFile(path, std::move(disk), opts.read_only));
}

}  // namespace qcow2::internal
