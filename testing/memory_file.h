// SPDX-License-Identifier: Apache-2.0
// In-memory files for tests, fuzzers and embedders that keep images in RAM.
#ifndef QCOW2_TESTING_MEMORY_FILE_H_
#define QCOW2_TESTING_MEMORY_FILE_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "qcow2/file.h"

namespace qcow2::internal {

// The bytes of one in-memory file; shared by every File opened on it so a
// test can close and reopen an image.
struct MemoryStore {
  std::mutex mu;
  std::vector<uint8_t> bytes;
  bool read_only = false;  // writes fail with kPermissionDenied
  // Writes, zeroing or truncation past this fail with kResourceExhausted,
  // as on a full disk (the bytes are held densely in memory).
  uint64_t max_size = uint64_t{1} << 34;
};

class MemoryFile : public File {
 public:
  MemoryFile(std::string name, std::shared_ptr<MemoryStore> store,
             bool read_only);

  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) override;
  absl::Status WriteAt(uint64_t offset,
                       absl::Span<const uint8_t> data) override;
  absl::Status Flush() override { return absl::OkStatus(); }
  absl::StatusOr<uint64_t> Size() override;
  absl::Status Truncate(uint64_t size) override;
  absl::Status Reserve(uint64_t offset, uint64_t len) override;
  absl::Status WriteZeroes(uint64_t offset, uint64_t len) override;
  const std::string& name() const override { return name_; }

 private:
  absl::Status CheckWritable() const;

  const std::string name_;
  const std::shared_ptr<MemoryStore> store_;
  const bool read_only_;
};

// A FileOpener over named in-memory files. Thread-safe.
class MemoryFileSystem : public FileOpener {
 public:
  // Returns the store for `path`, creating an empty one if needed.
  std::shared_ptr<MemoryStore> Store(const std::string& path);
  bool Exists(const std::string& path);

  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const FileOptions& opts) override;

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<MemoryStore>> files_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_TESTING_MEMORY_FILE_H_
