// SPDX-License-Identifier: Apache-2.0
// The seam through which data-cluster I/O is transformed: a cipher keyed
// by host offset (LUKS's payload cipher, lib/crypto) attached to a layer's
// AccountedFile. Every IoOp on that file that is not metadata
// (IoCategory::kMetadata: deferred cache misses) is data-cluster I/O:
// its writes are encrypted from a copy (never the caller's buffer), its
// reads decrypted in place once complete. Metadata never passes through
// IoOps otherwise (caches write through WriteBackFile, header and tables
// with direct File calls), so it is never transformed. Both executors
// (RunOp, QueueImpl) ask CipherOf(op) and nothing else.
#ifndef QCOW2_LIB_IO_DATA_CIPHER_H_
#define QCOW2_LIB_IO_DATA_CIPHER_H_

#include <sys/uio.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace qcow2::internal {

struct IoOp;

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

// The cipher of op's data, or null: metadata ops, plain ops (compressed
// clusters), files with none. Costs
// nothing (no cast) while no file in the process has a cipher.
const DataCipher* CipherOf(const IoOp& op);

// Decrypts, in place, the bytes `iov` holds from `host_offset`: iovec by
// iovec when each is whole sectors, else through a copy (wiped after).
absl::Status DecryptIov(const DataCipher& c, uint64_t host_offset,
                        absl::Span<const iovec> iov);

// Copies op's bytes (op.iov; zeros for a zero-range op) into `out`
// (op.bytes long) and encrypts them there for op.offset.
absl::Status EncryptOpInto(const DataCipher& c, const IoOp& op, uint8_t* out);

// Registered while a file has a cipher attached (AccountedFile), so that
// CipherOf can skip the lookup while none has.
void NoteCipherAttached(int delta);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_IO_DATA_CIPHER_H_
