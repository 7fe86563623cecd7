// SPDX-License-Identifier: Apache-2.0
// A File decorator that counts host calls for the I/O context
// (lib/base/io_context.h), whatever File it decorates.
//
// Host-call accounting used to live inside the library's own Files
// (PosixFile, the test doubles), so a File an embedder supplied was never
// counted in IoStats::host_calls_under_lock. Every layer's file is wrapped
// in an AccountedFile where the chain opens it, so the count no longer
// depends on who implemented the store.
#ifndef QCOW2_LIB_IO_ACCOUNTED_FILE_H_
#define QCOW2_LIB_IO_ACCOUNTED_FILE_H_

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/io/data_cipher.h"
#include "lib/io/forwarding_file.h"
#include "qcow2/file.h"

namespace qcow2::internal {

// Forwards every File method to the file it owns (ForwardingFile),
// calling NoteHostCall() once before each call that moves or changes bytes,
// or asks where data is: reads, writes, flushes, size changes,
// reservations, zeroing, discards and DataRun (SEEK_DATA; the calls
// IoStats::host_calls_under_lock documents). Size() is forwarded uncounted
// (one fstat, asked when a layer opens and when its file grows, not per
// request). name() and alignment() never reach the store. Thread-safe as
// far as the file beneath is.
class AccountedFile final : public ForwardingFile {
 public:
  explicit AccountedFile(std::unique_ptr<File> base);
  ~AccountedFile() override { set_cipher(nullptr); }

  AccountedFile(const AccountedFile&) = delete;
  AccountedFile& operator=(const AccountedFile&) = delete;

  // `file` wrapped in an AccountedFile, or `file` itself when it already
  // is one (so a call is never counted twice) or is null.
  static std::unique_ptr<File> Wrap(std::unique_ptr<File> file);

  // The file beneath. Never null.
  File* base() const { return inner(); }

  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) override;
  absl::Status WriteAt(uint64_t offset,
                       absl::Span<const uint8_t> data) override;
  absl::Status ReadvAt(uint64_t offset, absl::Span<const iovec> iov) override;
  absl::Status WritevAt(uint64_t offset, absl::Span<const iovec> iov) override;
  absl::Status Flush() override;
  absl::Status Truncate(uint64_t size) override;
  absl::Status Extend(uint64_t old_size, uint64_t new_size) override;
  absl::Status Reserve(uint64_t offset, uint64_t len) override;
  absl::Status Allocate(uint64_t offset, uint64_t len) override;
  absl::Status WriteZeroes(uint64_t offset, uint64_t len) override;
  absl::Status Discard(uint64_t offset, uint64_t len) override;
  absl::StatusOr<bool> DataRun(uint64_t offset, uint64_t max_len,
                               uint64_t* len) override;
  // The file beneath's: the ring's I/O is counted by the ring itself.
  RingFile* ring_file() override { return inner()->ring_file(); }

  // The cipher of this file's data clusters (data_cipher.h), or null. Not
  // owned; set once when an encrypted layer opens, before any I/O, and
  // cleared (null) before the cipher dies.
  void set_cipher(const DataCipher* c) {
    if ((cipher_ == nullptr) != (c == nullptr)) {
      NoteCipherAttached(c != nullptr ? 1 : -1);
    }
    cipher_ = c;
  }
  const DataCipher* cipher() const { return cipher_; }

 private:
  const DataCipher* cipher_ = nullptr;
};

// The innermost file under any AccountedFile wrappers: code that needs the
// concrete type (a writable chain looks for a PosixFile's lock descriptor)
// casts this, not the wrapper. Null for null.
File* Unwrapped(File* f);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_IO_ACCOUNTED_FILE_H_
