// SPDX-License-Identifier: Apache-2.0
// The seam through which data-cluster I/O is transformed: a cipher keyed
// by host offset (LUKS's payload cipher, lib/crypto) attached to a layer's
// AccountedFile. Every IoOp on that file that is not metadata
// (IoCategory::kMetadata: deferred cache misses) is data-cluster I/O:
// its writes are encrypted from a copy (never the caller's buffer), its
// reads decrypted in place once complete. Metadata never passes through
// IoOps otherwise (caches write through WriteBackFile, header and tables
// with direct File calls), so it is never transformed. Both executors
// (RunOp, QueueImpl) ask CipherOf(op) (lib/io/io_plan.h) and nothing
// else.
#ifndef QCOW2_LIB_IO_DATA_CIPHER_H_
#define QCOW2_LIB_IO_DATA_CIPHER_H_

#include <sys/uio.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace qcow2::internal {

class DataCipher {
 public:
  virtual ~DataCipher() = default;
  // In place; `host_offset` and the length are multiples of 512, else
  // kInvalidArgument. Thread-safe.
  virtual absl::Status Encrypt(uint64_t host_offset,
                               absl::Span<uint8_t> data) const = 0;
  virtual absl::Status Decrypt(uint64_t host_offset,
                               absl::Span<uint8_t> data) const = 0;
};

// Decrypts, in place, the bytes `iov` holds from `host_offset`: iovec by
// iovec when each is whole sectors, else through a copy (wiped after).
absl::Status DecryptIov(const DataCipher& c, uint64_t host_offset,
                        absl::Span<const iovec> iov);

// Registered while a file has a cipher attached (AccountedFile), so that
// CipherOf can skip the lookup while none has.
void NoteCipherAttached(int delta);
bool AnyCipherAttached();

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_IO_DATA_CIPHER_H_
