// SPDX-License-Identifier: Apache-2.0
// Writes a qcow2 layer's header: its fixed fields, the flag changes of the
// first write (autoclear bits, lazy refcounts' dirty bit) and of a clean
// close, and the corrupt bit when the metadata turns out inconsistent.
#ifndef QCOW2_LIB_DRIVER_HEADER_WRITER_H_
#define QCOW2_LIB_DRIVER_HEADER_WRITER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "lib/driver/qcow2_state.h"

namespace qcow2::internal {

class HeaderWriter {
 public:
  explicit HeaderWriter(Qcow2State* s) : s_(s) {}

  // Rewrites the fixed header fields (not the extensions) from the state's
  // header, and flushes.
  absl::Status WriteHeaderFields();
  // Rewrites cluster 0: the header, its extensions and the backing file
  // name, zero padded (one write), and flushes.
  absl::Status WriteWholeHeader();

  // Gives the image a new backing file name and format ("" for either:
  // none; a format needs a name) in one write of cluster 0, as QEMU's
  // qcow2_change_backing_file does: a power cut leaves the old name or
  // the new one. kInvalidArgument for a name over 1023 bytes, with a NUL
  // byte, or that does not fit in the first cluster after the header
  // extensions; kFailedPrecondition unless writable and open. The
  // header in memory is kept as it was on failure.
  // REQUIRES: the layer is flushed (nothing may reach the disk after the
  // header that the new chain must see first).
  absl::Status ChangeBackingFile(const std::string& name,
                                 const std::string& format);

  // Autoclear bits PrepareWrite keeps because the layer maintains what
  // they stand for (kAutoclearBitmaps, DirtyBitmaps). Default: none.
  void set_kept_autoclear(uint64_t bits) { kept_autoclear_ = bits; }

  // Before the first change to the image: kFailedPrecondition unless it is
  // writable and open; clears the autoclear bits and sets the dirty bit
  // (lazy refcounts) once, recorded for the planned request's executor
  // when one is being planned (see UnwrittenHeaderTicket).
  absl::Status PrepareWrite();

  // The write-back ticket of the first write's header update (autoclear
  // bits, lazy refcounts' dirty bit) while it is recorded and not yet
  // written, else 0. No guest write may reach the disk before it: a write
  // planned meanwhile waits for the ticket, as its recorder does.
  uint64_t UnwrittenHeaderTicket();

  // Marks the image corrupt on kDataLoss (in the header, and stops
  // writing) and returns `s`.
  absl::Status Fail(absl::Status s);

  // For Close: clears the dirty bit (lazy refcounts) of a writable image
  // and writes the header; on failure the bit stays set.
  // REQUIRES: everything else is flushed.
  absl::Status MarkClean();

 private:
  Qcow2State* const s_;         // the layer's; outlives this
  bool prepared_ = false;       // PrepareWrite's header update is done
  uint64_t header_ticket_ = 0;  // see UnwrittenHeaderTicket()
  uint64_t kept_autoclear_ = 0;  // see set_kept_autoclear()
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_HEADER_WRITER_H_
