// SPDX-License-Identifier: Apache-2.0
// Persistent dirty bitmaps of a writable qcow2 layer (the bitmaps
// extension; codec in lib/format/bitmaps.h, rules in docs/security.md):
//  - on a read-write open, every bitmap is loaded and validated, and the
//    ones not already in use are marked in use on disk (a new directory,
//    durable, then one header write) before any guest write can reach the
//    file;
//  - every guest write, write-zeroes and discard sets, in memory, the bits
//    of the enabled (auto) bitmaps for the granules it touches (Mark);
//  - a clean close (Store) writes the changed bitmaps' data and tables
//    into newly allocated clusters, makes them durable, writes a new
//    directory without the in-use flags, switches the header to it in one
//    write, and only then frees the old directory, tables and data. A cut
//    at any point leaves the old directory (bitmaps in use) or the new one
//    (bitmaps stored), and at most leaked clusters.
// Bitmaps found in use at open (a crash, or another writer) are kept as
// they are, still in use, as QEMU does; they can only be removed.
//
// Not thread-safe: used under the image's metadata lock, as the layer is.
#ifndef QCOW2_LIB_DRIVER_BITMAPS_H_
#define QCOW2_LIB_DRIVER_BITMAPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/driver/header_writer.h"
#include "lib/driver/qcow2_state.h"
#include "lib/format/bitmaps.h"
#include "qcow2/file.h"
#include "qcow2/types.h"

namespace qcow2::internal {

// The bitmaps listed in the image in `file` (header `h`, file size
// `file_size`), read-only: empty when it has none or the extension is
// marked inconsistent (autoclear bit clear). kDataLoss if the extension or
// the directory is malformed.
absl::StatusOr<std::vector<BitmapInfo>> ListBitmaps(File* file,
                                                    const Header& h,
                                                    uint64_t file_size);

class PendingClusters;

class DirtyBitmaps {
 public:
  // The parts are the layer's and outlive this. `pending` flushes the
  // layer (PendingClusters::SettleAndFlush).
  DirtyBitmaps(Qcow2State* s, HeaderWriter* header_writer,
               PendingClusters* pending)
      : s_(s), header_writer_(header_writer), pending_(pending) {}

  // For a read-write open, after the refcounts are set up: loads the
  // bitmaps and marks the consistent ones in use on disk. kDataLoss for a
  // malformed extension, directory or table; kUnimplemented for bitmaps we
  // cannot maintain (BitmapUnsupported), naming them: such an image can
  // only be opened read-only. An extension whose autoclear bit is clear
  // (written by a program without bitmap support) is left alone and not
  // maintained. Tells the header writer to keep the autoclear bit.
  absl::Status OpenForWriting();

  // For a read-only layer, on request (read-only opens do not touch
  // bitmaps): loads the bitmaps and their bits, for Bits(), Status() and
  // List(). Once: later calls (and any call on a writable layer, whose
  // bitmaps OpenForWriting loaded) do nothing. On failure nothing is
  // kept, and the next call tries again.
  absl::Status LoadReadOnly();

  // True when the image's bitmaps extension is maintained by this layer.
  bool maintained() const { return maintained_; }

  // Sets the bits of every enabled, consistent bitmap for the granules
  // that guest range [offset, offset + len) touches.
  void Mark(uint64_t offset, uint64_t len);

  // For a clean close, after a flush: stores the bitmaps (see the file
  // comment). Nothing to do when none is maintained. On failure the old
  // directory stays in force (bitmaps in use) and new clusters may leak.
  absl::Status Store();

  // --- Edits, as `qemu-img bitmap` makes them (written by Store()).
  // kInvalidArgument / kNotFound / kFailedPrecondition with QEMU's words.
  absl::Status Add(const std::string& name, uint64_t granularity,
                   bool enabled);
  absl::Status Remove(const std::string& name);
  absl::Status Clear(const std::string& name);
  absl::Status SetEnabled(const std::string& name, bool enabled);
  // Sets in `dst` every bit set in `bits` (a bitmap of granularity
  // `granularity_bits` over the same disk), as QEMU's merge does.
  absl::Status MergeInto(const std::string& dst,
                         const std::vector<uint8_t>& bits,
                         uint32_t granularity_bits);
  // The bits of consistent bitmap `name`, for a merge.
  absl::StatusOr<std::pair<std::vector<uint8_t>, uint32_t>> Bits(
      const std::string& name) const;

  std::vector<BitmapInfo> List() const;

  // The dirty state of bitmap `name` from guest `offset` for as long as
  // it stays the same, at most `max_len` bytes and never past the disk.
  // kNotFound naming the bitmap; kFailedPrecondition for one in use
  // (inconsistent); kOutOfRange for an offset past the disk.
  absl::StatusOr<BitmapStatus> Status(const std::string& name,
                                      uint64_t offset, uint64_t max_len) const;

 private:
  struct Bitmap {
    BitmapDirEntry entry;      // as the directory in force says
    bool consistent = false;   // not in use when opened: bits are loaded
    bool changed = false;      // bits or flags differ from entry's table
    bool enabled = false;      // the auto flag, in memory
    std::vector<uint8_t> bits; // the data, byte k = bits 8k..8k+7, LSB first
    std::vector<uint64_t> data_clusters;  // of entry's table, to free
  };

  // Reads and validates the directory and every table; loads the bits of
  // the consistent bitmaps.
  absl::Status Load();
  // Reads and checks the table of `b.entry`, filling data_clusters and,
  // with `load`, bits.
  absl::Status LoadTable(Bitmap* b, bool load);
  // Writes the data and table of a changed bitmap into new clusters.
  absl::Status WriteData(Bitmap* b, uint64_t* table_offset,
                         uint32_t* table_size,
                         std::vector<uint64_t>* clusters);
  // Allocates `bytes` (rounded up to clusters) of metadata space.
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes);
  // Writes `entries` as a new directory, makes everything durable, switches
  // the header to it (or drops the extension when empty), then frees the
  // old directory.
  absl::Status SwitchDirectory(const std::vector<BitmapDirEntry>& entries);
  absl::Status Free(uint64_t offset, uint64_t bytes);
  absl::Status FreeTable(const BitmapDirEntry& e,
                         const std::vector<uint64_t>& data_clusters);
  Bitmap* Find(const std::string& name);
  const Bitmap* Find(const std::string& name) const;
  absl::StatusOr<Bitmap*> FindUsable(const std::string& name);
  absl::StatusOr<const Bitmap*> FindUsable(const std::string& name) const;
  void Resize(Bitmap* b);

  Qcow2State* const s_;
  HeaderWriter* const header_writer_;
  PendingClusters* const pending_;
  bool maintained_ = false;
  bool loaded_ = false;  // LoadReadOnly() succeeded
  bool edited_ = false;  // bitmaps added or removed since the last store
  std::vector<Bitmap> bitmaps_;
  // Removed since the last store: their tables and data, freed by Store.
  std::vector<Bitmap> removed_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_BITMAPS_H_
