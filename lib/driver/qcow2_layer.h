// SPDX-License-Identifier: Apache-2.0
// A qcow2 image file as one layer of a chain: opens and validates it, and
// owns the parts that do the work, each with one job, each constructed
// once with the parts it calls, which come before it (none calls a part
// that comes after it):
//  - Qcow2State: what they all share (file, header, tables, refcounts);
//  - MetadataGuard: checks entries and write targets before use;
//  - HeaderWriter: header fields, dirty and corrupt bits;
//  - HostSpace: the file's length (grown ahead, given back on Close);
//  - FlushSequencer: crash-safe order of metadata writes, flushes, Grow;
//  - PendingIndex: the pending clusters (deferred copy-on-write), as the
//    reader sees them;
//  - ExtentReader: the read side (Map, compressed clusters);
//  - CowPlanner: what a copy-on-write reads (this layer, the chain below);
//  - PendingClusters: byte-range-locked writes, deferred copy-on-write
//    (makes and settles pending clusters), and the layer's flush;
//  - WritePlanner: plans writes (allocation, copy-on-write, L2 updates);
//  - Zeroer: write-zeroes and discard;
//  - DirtyBitmaps: persistent dirty bitmaps (in use, marked, stored).
#ifndef QCOW2_LIB_DRIVER_QCOW2_LAYER_H_
#define QCOW2_LIB_DRIVER_QCOW2_LAYER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/driver/bitmaps.h"
#include "lib/driver/cow_planner.h"
#include "lib/driver/extent_reader.h"
#include "lib/driver/flush_sequencer.h"
#include "lib/driver/header_writer.h"
#include "lib/driver/host_space.h"
#include "lib/driver/luks_open.h"
#include "lib/driver/metadata_guard.h"
#include "lib/driver/pending_clusters.h"
#include "lib/driver/pending_index.h"
#include "lib/driver/qcow2_state.h"
#include "lib/driver/write_planner.h"
#include "lib/driver/zeroer.h"
#include "lib/format/header.h"
#include "lib/io/io_plan.h"
#include "lib/layer/layer.h"
#include "lib/meta/cluster_map.h"
#include "lib/meta/refcounts.h"
#include "lib/meta/write_back_file.h"
#include "qcow2/options.h"

namespace qcow2::internal {

class Qcow2Layer : public Layer {
 public:
  // Reads and validates the header and loads the L1 table. With
  // `opts.read_write`, also refuses images that must not be written, and
  // rebuilds the refcounts of a dirty image (lazy refcounts) first.
  // An image with an external data file (incompatible bit 2) gets it from
  // `open_data`, called with the name the image stores before anything is
  // written; without one, such an image is refused (kUnimplemented).
  using DataFileOpener =
      std::function<absl::StatusOr<std::unique_ptr<File>>(const std::string&)>;
  static absl::StatusOr<std::unique_ptr<Qcow2Layer>> Open(
      std::unique_ptr<File> file, const OpenOptions& opts,
      const DataFileOpener& open_data = nullptr);

  // --- Layer.
  uint64_t size() const override { return state_.header.size; }
  File* file() override { return state_.file.get(); }
  File* data_file() override { return state_.data(); }
  bool has_data_file() const { return state_.has_data_file(); }
  bool data_file_raw() const { return state_.data_file_raw(); }
  const std::string& filename() const override { return state_.file->name(); }
  absl::StatusOr<Extent> Map(uint64_t offset, uint64_t max_len) override {
    return reader_.Map(offset, max_len);
  }
  absl::Status ReadExtent(const Extent& e, uint64_t extent_start,
                          uint64_t offset, absl::Span<uint8_t> buf) override;
  LayerInfo Info() const override;
  std::string backing_file() const override {
    return state_.header.backing_file;
  }
  std::string backing_format() const override {
    return state_.header.backing_format.value_or("");
  }
  // Fills and commits the pending clusters, then writes back every piece
  // of metadata and flushes the file (PendingClusters::SettleAndFlush).
  absl::Status Flush() override { return pending_.SettleAndFlush(); }
  // Flushes, gives back the room grown ahead, clears the dirty bit, and
  // stops accepting writes. On failure the layer stays open (and writable,
  // unless marked corrupt): the caller may retry, or keep using it.
  absl::Status Close() override;
  Qcow2Layer* AsQcow2() override { return this; }

  // --- The shared state.
  const Header& header() const { return state_.header; }
  // For the operations outside the parts that rewrite header fields
  // (internal snapshots, lib/driver/snapshots.cc); written through
  // header_writer().
  Header& mutable_header() { return state_.header; }
  ClusterMap& cluster_map() { return *state_.map; }
  // Null unless opened writable.
  Refcounts* refcounts() { return state_.refcounts.get(); }
  bool writable() const { return state_.writable; }
  // Every metadata write goes through this file (see
  // FlushSequencer::BeginFlush).
  WriteBackFile* meta_file() { return state_.meta.get(); }

  // --- The parts, each used under the image's metadata lock as the layer
  // is (see the file comment).
  ExtentReader& reader() { return reader_; }
  // The chain below, for copy-on-write: CowPlanner::set_backing.
  CowPlanner& cow() { return cow_; }
  WritePlanner& writer() { return writer_; }
  PendingClusters& pending() { return pending_; }
  Zeroer& zeroer() { return zeroer_; }
  FlushSequencer& flusher() { return flusher_; }
  HostSpace& host_space() { return host_space_; }
  HeaderWriter& header_writer() { return header_writer_; }
  const MetadataGuard& guard() const { return guard_; }
  DirtyBitmaps& bitmaps() { return bitmaps_; }
  // The LUKS layer of an encrypted image (crypt_method 2), or
  // null. Its cipher is attached to file(): data-cluster IoOps on it are
  // encrypted and decrypted by the executors (lib/io/data_cipher.h).
  // (Locked, without a volume, when opened metadata_only without a key.)
  const OpenedLuks* luks() const {
    return state_.encrypted ? &luks_ : nullptr;
  }

 private:
  Qcow2Layer(std::unique_ptr<File> file, Header header, uint64_t file_size)
      : state_(std::move(file), std::move(header), file_size),
        guard_(&state_),
        header_writer_(&state_),
        host_space_(&state_),
        flusher_(&state_, &header_writer_),
        reader_(&state_, &guard_, &pending_index_),
        cow_(&state_, &reader_),
        pending_(&state_, &guard_, &pending_index_, &cow_, &flusher_,
                 &host_space_, &header_writer_),
        writer_(&state_, &guard_, &header_writer_, &host_space_, &flusher_,
                &cow_, &pending_),
        zeroer_(&state_, &guard_, &header_writer_, &host_space_, &reader_,
                &cow_, &pending_, &writer_),
        bitmaps_(&state_, &header_writer_, &pending_) {}

  // Declared in construction order; each part keeps pointers to the state
  // and to parts declared before it, which it calls (the reader only
  // looks at the pending index). The parts go before the state on
  // destruction, so the L2 slices pending clusters pin are let go of
  // before the map.
  OpenedLuks luks_;             // outlives the file it is attached to
  Qcow2State state_;            // what the parts share
  MetadataGuard guard_;         // entry and write-target checks
  HeaderWriter header_writer_;  // header fields, dirty and corrupt bits
  HostSpace host_space_;        // the file's length
  FlushSequencer flusher_;      // metadata write order, flushes, Grow
  PendingIndex pending_index_;  // the pending clusters, as mapped
  ExtentReader reader_;         // Map, compressed reads
  CowPlanner cow_;              // copy-on-write reads, known zeros
  PendingClusters pending_;     // deferred copy-on-write, the flush
  WritePlanner writer_;         // write planning
  Zeroer zeroer_;               // write-zeroes, discard
  DirtyBitmaps bitmaps_;        // persistent dirty bitmaps
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_QCOW2_LAYER_H_
