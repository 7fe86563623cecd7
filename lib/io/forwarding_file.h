// SPDX-License-Identifier: Apache-2.0
// A File that passes every call to the File it wraps, owned or borrowed.
// Wrappers derive from it and override only the calls they watch or
// change (AccountedFile; test doubles in testing/; a borrowed file in
// lib/ops/amend_image.cc).
#ifndef QCOW2_LIB_IO_FORWARDING_FILE_H_
#define QCOW2_LIB_IO_FORWARDING_FILE_H_

#include <memory>
#include <string>
#include <utility>

#include "qcow2/file.h"

namespace qcow2::internal {

class ForwardingFile : public File {
 public:
  // Owns `inner`.
  explicit ForwardingFile(std::unique_ptr<File> inner)
      : owned_(std::move(inner)), inner_(owned_.get()) {}
  // Borrows `inner`, which must outlive this.
  explicit ForwardingFile(File* inner) : inner_(inner) {}

  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) override {
    return inner_->ReadAt(offset, buf);
  }
  absl::Status WriteAt(uint64_t offset,
                       absl::Span<const uint8_t> data) override {
    return inner_->WriteAt(offset, data);
  }
  absl::Status ReadvAt(uint64_t offset, absl::Span<const iovec> iov) override {
    return inner_->ReadvAt(offset, iov);
  }
  absl::Status WritevAt(uint64_t offset,
                        absl::Span<const iovec> iov) override {
    return inner_->WritevAt(offset, iov);
  }
  absl::Status Flush() override { return inner_->Flush(); }
  absl::StatusOr<uint64_t> Size() override { return inner_->Size(); }
  absl::Status Truncate(uint64_t size) override {
    return inner_->Truncate(size);
  }
  absl::Status Extend(uint64_t old_size, uint64_t new_size) override {
    return inner_->Extend(old_size, new_size);
  }
  absl::Status Reserve(uint64_t offset, uint64_t len) override {
    return inner_->Reserve(offset, len);
  }
  absl::Status Allocate(uint64_t offset, uint64_t len) override {
    return inner_->Allocate(offset, len);
  }
  absl::Status WriteZeroes(uint64_t offset, uint64_t len) override {
    return inner_->WriteZeroes(offset, len);
  }
  absl::Status Discard(uint64_t offset, uint64_t len) override {
    return inner_->Discard(offset, len);
  }
  absl::StatusOr<bool> DataRun(uint64_t offset, uint64_t max_len,
                               uint64_t* len) override {
    return inner_->DataRun(offset, max_len, len);
  }
  const std::string& name() const override { return inner_->name(); }
  uint32_t alignment() const override { return inner_->alignment(); }

 protected:
  File* inner() const { return inner_; }

 private:
  std::unique_ptr<File> owned_;  // null when borrowed
  File* const inner_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_IO_FORWARDING_FILE_H_
