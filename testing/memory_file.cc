// SPDX-License-Identifier: Apache-2.0
#include "testing/memory_file.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace qcow2::internal {

MemoryFile::MemoryFile(std::string name, std::shared_ptr<MemoryStore> store,
                       bool read_only)
    : name_(std::move(name)), store_(std::move(store)), read_only_(read_only) {}

absl::Status MemoryFile::CheckWritable() const {
  if (read_only_ || store_->read_only) {
    return absl::PermissionDeniedError(
        absl::StrCat(name_, " is open read-only"));
  }
  return absl::OkStatus();
}

absl::Status MemoryFile::ReadAt(uint64_t offset, absl::Span<uint8_t> buf) {
  if (buf.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(store_->mu);
  const auto& bytes = store_->bytes;
  size_t have = 0;
  if (offset < bytes.size()) {
    have = std::min<uint64_t>(buf.size(), bytes.size() - offset);
    std::memcpy(buf.data(), bytes.data() + offset, have);
  }
  std::memset(buf.data() + have, 0, buf.size() - have);
  return absl::OkStatus();
}

absl::Status MemoryFile::WriteAt(uint64_t offset,
                                 absl::Span<const uint8_t> data) {
  if (auto s = CheckWritable(); !s.ok()) return s;
  const uint64_t max = store_->max_size;
  if (offset > max || data.size() > max - offset) {
    return absl::ResourceExhaustedError(absl::StrCat(
        name_, ": no space left for a write at ", offset, " (size limit ", max,
        ")"));
  }
  std::lock_guard<std::mutex> lock(store_->mu);
  auto& bytes = store_->bytes;
  if (offset + data.size() > bytes.size()) bytes.resize(offset + data.size());
  if (!data.empty()) std::memcpy(bytes.data() + offset, data.data(), data.size());
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> MemoryFile::Size() {
  std::lock_guard<std::mutex> lock(store_->mu);
  return store_->bytes.size();
}

absl::Status MemoryFile::Truncate(uint64_t size) {
  if (auto s = CheckWritable(); !s.ok()) return s;
  if (size > store_->max_size) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name_, ": no space left to grow the file to ", size,
                     " (size limit ", store_->max_size, ")"));
  }
  std::lock_guard<std::mutex> lock(store_->mu);
  store_->bytes.resize(size);
  return absl::OkStatus();
}

absl::Status MemoryFile::Reserve(uint64_t offset, uint64_t len) {
  if (auto s = CheckWritable(); !s.ok()) return s;
  if (offset + len > store_->max_size) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name_, ": no space left to reserve up to ", offset + len,
                     " (size limit ", store_->max_size, ")"));
  }
  std::lock_guard<std::mutex> lock(store_->mu);
  // Only ever longer: a write past the old end may have landed meanwhile.
  if (store_->bytes.size() < offset + len) store_->bytes.resize(offset + len);
  return absl::OkStatus();
}

absl::Status MemoryFile::WriteZeroes(uint64_t offset, uint64_t len) {
  if (auto s = CheckWritable(); !s.ok()) return s;
  const uint64_t max = store_->max_size;
  if (offset > max || len > max - offset) {
    return absl::ResourceExhaustedError(absl::StrCat(
        name_, ": no space left to zero at ", offset, " (size limit ", max,
        ")"));
  }
  std::lock_guard<std::mutex> lock(store_->mu);
  auto& bytes = store_->bytes;
  if (offset + len > bytes.size()) bytes.resize(offset + len);
  std::memset(bytes.data() + offset, 0, len);
  return absl::OkStatus();
}

std::shared_ptr<MemoryStore> MemoryFileSystem::Store(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = files_[path];
  if (!slot) slot = std::make_shared<MemoryStore>();
  return slot;
}

bool MemoryFileSystem::Exists(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  return files_.count(path) != 0;
}

absl::StatusOr<std::unique_ptr<File>> MemoryFileSystem::Open(
    const std::string& path, const FileOptions& opts) {
  std::shared_ptr<MemoryStore> store;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(path);
    if (it == files_.end()) {
      if (!opts.create) {
        return absl::NotFoundError(
            absl::StrCat("cannot open ", path, ": No such file or directory"));
      }
      it = files_.emplace(path, std::make_shared<MemoryStore>()).first;
    } else if (opts.create && opts.exclusive) {
      return absl::AlreadyExistsError(
          absl::StrCat("cannot create ", path, ": File exists"));
    }
    store = it->second;
  }
  return std::unique_ptr<File>(
      new MemoryFile(path, std::move(store), opts.read_only));
}

}  // namespace qcow2::internal
