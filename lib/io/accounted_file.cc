// SPDX-License-Identifier: Apache-2.0
#include "lib/io/accounted_file.h"

#include <utility>

#include "lib/base/io_context.h"

namespace qcow2::internal {

AccountedFile::AccountedFile(std::unique_ptr<File> base)
    : ForwardingFile(std::move(base)) {}

std::unique_ptr<File> AccountedFile::Wrap(std::unique_ptr<File> file) {
  if (file == nullptr || dynamic_cast<AccountedFile*>(file.get()) != nullptr) {
    return file;
  }
  return std::make_unique<AccountedFile>(std::move(file));
}

// Each method counts one host call, even where the file beneath splits it
// into several (a vectored write looping over WriteAt, Extend falling back
// to Truncate): what holds up the lock is the one call made under it.

absl::Status AccountedFile::ReadAt(uint64_t offset, absl::Span<uint8_t> buf) {
  NoteHostCall();
  return inner()->ReadAt(offset, buf);
}

absl::Status AccountedFile::WriteAt(uint64_t offset,
                                    absl::Span<const uint8_t> data) {
  NoteHostCall();
  return inner()->WriteAt(offset, data);
}

absl::Status AccountedFile::ReadvAt(uint64_t offset,
                                    absl::Span<const iovec> iov) {
  NoteHostCall();
  return inner()->ReadvAt(offset, iov);
}

absl::Status AccountedFile::WritevAt(uint64_t offset,
                                     absl::Span<const iovec> iov) {
  NoteHostCall();
  return inner()->WritevAt(offset, iov);
}

absl::Status AccountedFile::Flush() {
  NoteHostCall();
  return inner()->Flush();
}

absl::Status AccountedFile::Truncate(uint64_t size) {
  NoteHostCall();
  return inner()->Truncate(size);
}

absl::Status AccountedFile::Extend(uint64_t old_size, uint64_t new_size) {
  NoteHostCall();
  return inner()->Extend(old_size, new_size);
}

absl::Status AccountedFile::Reserve(uint64_t offset, uint64_t len) {
  NoteHostCall();
  return inner()->Reserve(offset, len);
}

absl::Status AccountedFile::Allocate(uint64_t offset, uint64_t len) {
  NoteHostCall();
  return inner()->Allocate(offset, len);
}

absl::Status AccountedFile::WriteZeroes(uint64_t offset, uint64_t len) {
  NoteHostCall();
  return inner()->WriteZeroes(offset, len);
}

absl::Status AccountedFile::Discard(uint64_t offset, uint64_t len) {
  NoteHostCall();
  return inner()->Discard(offset, len);
}

absl::StatusOr<bool> AccountedFile::DataRun(uint64_t offset, uint64_t max_len,
                                            uint64_t* len) {
  // Two lseek calls. A raw layer asks only for block status and for the
  // copy-on-write decision whether the layers below read as zeros, and
  // caches a backing file's answers; those made under the lock count.
  NoteHostCall();
  return inner()->DataRun(offset, max_len, len);
}

File* Unwrapped(File* f) {
  while (auto* a = dynamic_cast<AccountedFile*>(f)) f = a->base();
  return f;
}

}  // namespace qcow2::internal
