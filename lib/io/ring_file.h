// SPDX-License-Identifier: Apache-2.0
// What a File offers the io_uring ring (File::ring_file()): the
// descriptor its bytes are read and written through, and how the ring
// treats it. A File offers it only when its reads, writes and flushes are
// nothing but that I/O on that descriptor, so that the ring may do them
// in its place (PosixFile; AccountedFile passes its file's on, the ring
// counts what it does itself). Test doubles and other wrappers offer none
// and are called synchronously.
#ifndef QCOW2_LIB_IO_RING_FILE_H_
#define QCOW2_LIB_IO_RING_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace qcow2::internal {

class RingFile {
 public:
  virtual ~RingFile() = default;

  // The descriptor for reads, writes, fdatasync and zero-range.
  virtual int ring_fd() const = 0;
  // Offsets, lengths and buffers must be aligned to this (O_DIRECT).
  virtual uint32_t ring_alignment() const = 0;
  // Flushes make nothing durable: the ring skips them.
  virtual bool ring_skips_flush() const = 0;
  // The error of a ring operation on this file that failed with `err`
  // (`what`: "write at 4096"), worded as the file's own calls word it.
  virtual absl::Status RingError(int err, const std::string& what) const = 0;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_IO_RING_FILE_H_
