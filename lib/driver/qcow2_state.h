// SPDX-License-Identifier: Apache-2.0
// The state every part of a qcow2 layer shares: the image file, its header,
// its tables and refcounts, and whether it may be written. Qcow2Layer owns
// it; each part (ExtentReader, WritePlanner, PendingClusters, Zeroer,
// FlushSequencer, HostSpace, HeaderWriter, MetadataGuard) holds a pointer.
#ifndef QCOW2_LIB_DRIVER_QCOW2_STATE_H_
#define QCOW2_LIB_DRIVER_QCOW2_STATE_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "lib/format/header.h"
#include "lib/meta/cluster_map.h"
#include "lib/meta/metadata_set.h"
#include "lib/meta/refcounts.h"
#include "lib/meta/write_back_file.h"
#include "qcow2/file.h"

namespace qcow2::internal {

// Plain shared data: no part owns any of it alone, and none of it has an
// invariant that one part could keep by itself. The order of the fields is
// their destruction order (last first): the refcounts and the map go before
// the metadata set they track, all of them before the files they write.
struct Qcow2State {
  // REQUIRES: `file_in` is not null; `header_in` was read from it and
  // validated.
  Qcow2State(std::unique_ptr<File> file_in, Header header_in,
             uint64_t file_size_in)
      : file(std::move(file_in)),
        meta(std::make_unique<WriteBackFile>(file.get())),
        header(std::move(header_in)),
        file_size(file_size_in) {}

  // REQUIRES: `map` is set (Qcow2Layer::Open sets it before anything else).
  const Geometry& geometry() const { return map->geometry(); }

  std::unique_ptr<File> file;  // the image file; metadata goes here
  // The external data file (incompatible bit 2), or null: guest data
  // clusters then live there, each at its guest offset (QEMU allocates no
  // refcount for them), and nothing else does.
  std::unique_ptr<File> data_file;
  // Where data clusters are read and written: the data file, or the image.
  File* data() const { return data_file ? data_file.get() : file.get(); }
  bool has_data_file() const { return data_file != nullptr; }
  // The data file is a valid raw image of the disk (autoclear bit 1):
  // zeroes and discards are written into it too.
  bool data_file_raw() const {
    return data_file != nullptr &&
           (header.autoclear_features & kAutoclearDataFileRaw) != 0;
  }
  // Over `file`, for every metadata write and file flush of the layer's
  // own (see FlushSequencer::BeginFlush).
  std::unique_ptr<WriteBackFile> meta;
  Header header;       // as in memory; the disk's copy may lag behind
  uint64_t file_size;  // the file's size at open time
  // Metadata clusters (writable layers only); map and refcounts keep it up
  // to date.
  std::unique_ptr<MetadataSet> metadata;
  std::unique_ptr<ClusterMap> map;       // L1 table and L2 cache
  std::unique_ptr<Refcounts> refcounts;  // writable layers only
  bool writable = false;                 // opened read-write, not corrupt
  bool lazy_refcounts = false;           // the compatible feature bit
  // LUKS-encrypted (its data goes through a cipher, lib/io/data_cipher.h):
  // zeros in the file do not read as zeros, so a never-written cluster's
  // padding must be written too.
  bool encrypted = false;
  // Encrypted and opened without its key (OpenOptions::metadata_only):
  // no data of it is read (compressed clusters included) or written.
  bool locked = false;
  bool closed = false;                   // Close() succeeded
  bool marked_corrupt = false;  // by HeaderWriter::Fail; caches abandoned
  // The next free byte of the host cluster that compressed clusters are
  // being packed into (WritePlanner::PlanWriteCompressed); 0: none. Reset
  // when that cluster's refcount drops to 0 (the free hook), so a freed
  // and reused cluster is never packed into.
  uint64_t compressed_next = 0;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_QCOW2_STATE_H_
