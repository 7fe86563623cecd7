// SPDX-License-Identifier: Apache-2.0
// One image file of a backing chain, as the chain sees it: a virtual disk
// whose ranges are either stored here (data, zero, compressed) or left to
// the layer below (unallocated).
#ifndef QCOW2_LIB_LAYER_LAYER_H_
#define QCOW2_LIB_LAYER_LAYER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/container/btree_map.h"
#include "absl/types/span.h"
#include "lib/base/mutex.h"
#include "qcow2/file.h"
#include "qcow2/types.h"

namespace qcow2::internal {

class Qcow2Layer;

// A run of guest bytes with one status in one layer.
struct Extent {
  enum Kind {
    kUnallocated,  // read from the layer below (zeros at the bottom)
    kZero,         // reads as zeros
    kData,         // stored at host_offset
    kCompressed,   // inside a compressed cluster (descriptor in `entry`)
  };
  Kind kind = kUnallocated;
  uint64_t length = 0;
  uint64_t host_offset = 0;  // kData: host offset of the first byte
  uint64_t entry = 0;        // kCompressed: the L2 entry
  bool has_host_cluster = false;  // kZero/kUnallocated with preallocation
};

class Layer {
 public:
  virtual ~Layer() = default;

  virtual uint64_t size() const = 0;
  virtual File* file() = 0;
  // The file that the host offsets of kData extents are in: file(), or a
  // qcow2 image's external data file.
  virtual File* data_file() { return file(); }
  virtual const std::string& filename() const = 0;

  // Where to read the run starting at `offset`, at most `max_len` bytes:
  // what a read plans with, on every request, so it must not cost a
  // syscall. A raw layer answers kData for all of its file (a hole reads
  // as zeros anyway).
  // REQUIRES: offset < size(), max_len > 0.
  virtual absl::StatusOr<Extent> Map(uint64_t offset, uint64_t max_len) = 0;

  // Like Map, but what is stored there: a raw layer tells holes (kZero)
  // from data. For block status, `map`, and the copy-on-write decision
  // whether the layers below read as zeros. Default: Map.
  virtual absl::StatusOr<Extent> MapStatus(uint64_t offset, uint64_t max_len) {
    return Map(offset, max_len);
  }

  // Reads bytes of an extent Map() returned: `offset` is the guest offset,
  // inside the extent that started at `extent_start`.
  virtual absl::Status ReadExtent(const Extent& e, uint64_t extent_start,
                                  uint64_t offset, absl::Span<uint8_t> buf);

  virtual LayerInfo Info() const = 0;

  // The stored backing file name and format ("" when none).
  virtual std::string backing_file() const { return ""; }
  virtual std::string backing_format() const { return ""; }

  // Flushes caches and the file (no-op for read-only layers).
  virtual absl::Status Flush() { return absl::OkStatus(); }
  // Flushes, marks clean, and stops accepting writes.
  virtual absl::Status Close() { return absl::OkStatus(); }

  // This layer if it is a qcow2 image, else null (cheaper than a
  // dynamic_cast on every request).
  virtual Qcow2Layer* AsQcow2() { return nullptr; }
};

// Raw image: the file is the disk.
class RawLayer : public Layer {
 public:
  // `read_only`: nothing writes the file while it is open (a backing
  // layer), so what SEEK_DATA said of a range stays true: it is asked at
  // open, for the whole file (up to kMaxCachedRuns runs), and cached.
  static absl::StatusOr<std::unique_ptr<RawLayer>> Open(
      std::unique_ptr<File> file, bool read_only = false);

  uint64_t size() const override { return size_; }
  File* file() override { return file_.get(); }
  const std::string& filename() const override { return file_->name(); }
  absl::StatusOr<Extent> Map(uint64_t offset, uint64_t max_len) override;
  absl::StatusOr<Extent> MapStatus(uint64_t offset, uint64_t max_len) override;
  LayerInfo Info() const override;
  absl::Status Flush() override { return file_->Flush(); }

 private:
  RawLayer(std::unique_ptr<File> file, uint64_t file_size, bool read_only)
      : file_(std::move(file)),
        file_size_(file_size),
        size_((file_size + 511) & ~uint64_t{511}),
        cache_status_(read_only) {}
  // The zeros that round the size up to a sector.
  Extent Tail(uint64_t offset, uint64_t max_len) const;
  // Fills the cache of runs from the start of the file (at open).
  void PrimeStatus();

  // A run of the file that is all data or all hole, as the file said.
  struct Run {
    uint64_t end;
    bool data;
  };
  static constexpr size_t kMaxCachedRuns = 4096;

  std::unique_ptr<File> file_;
  uint64_t file_size_;
  uint64_t size_;  // rounded up to 512 bytes, as QEMU presents raw files
  const bool cache_status_;
  Mutex mu_;
  absl::btree_map<uint64_t, Run> runs_ ABSL_GUARDED_BY(mu_);  // by start
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_LAYER_LAYER_H_
