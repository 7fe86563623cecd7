// SPDX-License-Identifier: Apache-2.0
// A backing chain: the top image and the files under it, opened with the
// safety rules for untrusted backing names.
#ifndef QCOW2_LIB_CHAIN_CHAIN_H_
#define QCOW2_LIB_CHAIN_CHAIN_H_

#include <memory>
#include <string>
#include <vector>

#include "lib/chain/backing_map.h"
#include "lib/io/io_plan.h"
#include "lib/layer/layer.h"
#include "qcow2/types.h"

namespace qcow2::internal {

class Qcow2Layer;
class WriteBackFile;

// Resolves a backing file name stored in an image against the directory of
// the image that names it. Refuses protocol prefixes (json:, nbd:, ...).
absl::StatusOr<std::string> ResolveBackingName(const std::string& image_name,
                                               const std::string& backing);

// The descriptor that holds an image file's locks (a PosixFile's, under the
// library's own wrappers), or -1: an embedder's File holds none of ours.
int LockFd(File* file);

// Opens one file as a layer of the given format ("qcow2", "raw", or ""
// to probe).
// The FileOptions of a chain's top (and its data file) under `opts`.
FileOptions TopFileOptions(const OpenOptions& opts);

// Opens the external data file that image `image` names `stored`: the
// path opts.data_file if set, else `stored` checked as a backing name is
// (ResolveBackingName: no protocol, no NUL) and kept inside
// opts.backing_root, but opened as it is (a relative name from the
// working directory, as QEMU opens it); read-write with
// the image, with its locks (QEMU's), direct I/O and no-flush settings.
absl::StatusOr<std::unique_ptr<File>> OpenDataFile(const std::string& image,
                                                  const std::string& stored,
                                                  const OpenOptions& opts);

absl::StatusOr<std::unique_ptr<Layer>> OpenLayer(std::unique_ptr<File> file,
                                                 const std::string& format,
                                                 const OpenOptions& opts);

// The files of one virtual disk, top first, and what can be worked out
// from their metadata: where guest bytes come from (PlanRead), whether a
// range reads as zeros, block status. Not thread-safe: its owner (the
// request engine, lib/engine/engine.h) calls it under the image's
// metadata lock.
class Chain {
 public:
  static absl::StatusOr<std::unique_ptr<Chain>> Open(std::unique_ptr<File> top,
                                                     const OpenOptions& opts);
  ~Chain();

  uint64_t size() const { return layers_[0]->size(); }
  int length() const { return static_cast<int>(layers_.size()); }
  Layer* layer(int depth) { return layers_[depth].get(); }
  const std::string& filename() const { return layers_[0]->filename(); }
  bool writable() const { return writable_; }
  bool closed() const { return closed_; }
  const OpenOptions& options() const { return opts_; }
  // The top layer if it is qcow2, else null.
  Qcow2Layer* top_qcow2() { return layers_[0]->AsQcow2(); }
  // The top's metadata write-back file, if it is a writable qcow2 layer.
  WriteBackFile* TopWriteBack();

  // "image is closed" (kFailedPrecondition), naming the image.
  absl::Status ClosedError() const;
  // Checks that the chain is open and writable, and that [offset, +len)
  // lies inside the disk.
  absl::Status CheckWritable() const;
  absl::Status CheckRange(uint64_t offset, uint64_t len) const;

  // Plans reading guest bytes through the chain starting at `depth` into
  // `dest`. Bytes past the end of a layer read as zeros.
  absl::Status PlanRead(int depth, uint64_t offset, uint8_t* dest,
                        uint64_t len, IoPlan* plan, IoCategory category);
  // Whether guest bytes [offset, +len) read as zeros through the chain
  // from `depth` down, judged from metadata alone (no data is read: data
  // that happens to be zero counts as data).
  absl::StatusOr<bool> ReadsAsZero(int depth, uint64_t offset, uint64_t len);
  // One uniform run from `offset`, walking down the layers (as qemu-img
  // map reports it). Misses may be deferred (MissDeferral).
  absl::StatusOr<BlockStatus> BlockStatusAt(uint64_t offset,
                                            uint64_t max_len);
  std::vector<LayerInfo> GetChainInfo() const;

  // Grows the disk (the top's L1 table is reallocated when needed).
  absl::Status Resize(uint64_t new_size);
  // Flushes and closes every layer; the chain takes no request after. The
  // image locks stay until DropImageLocksAfterClose.
  absl::Status Close();
  // After Close, once no request of ours can still write the files: gives
  // up every image lock, so that others may open the image at once rather
  // than when the files are closed. Does nothing before Close, or twice.
  void DropImageLocksAfterClose();
  // A live external snapshot: a new qcow2 overlay at `path`, made by
  // `create` (the public CreateImage, handed down by the facade above:
  // image creation lives in lib/api), becomes the top; the old top is
  // flushed, marked clean and kept read-only below.
  using ImageCreator = absl::Status (*)(const std::string& path,
                                        const CreateOptions& opts);
  absl::Status CreateOverlay(const std::string& path,
                             const CreateOptions& opts, ImageCreator create);

  // --- Live stream and commit (chain_live.cc; lib/engine/engine_live.cc).
  // Whether a layer at depth 1 .. below-1 allocates guest bytes at
  // `offset` (data or zeros; a range past a layer's end counts, as it
  // reads as zeros): sets *allocated and returns how far from `offset`
  // (at most max_len) that answer holds.
  // `from` 0 asks the top too (an active commit's).
  absl::StatusOr<uint64_t> AllocatedAbove(int below, uint64_t offset,
                                          uint64_t max_len, bool* allocated,
                                          int from = 1);
  // Layer `depth` (below the top) is about to be written by a writer of
  // its own (a live commit's, over a descriptor that takes no locks): its
  // descriptor here takes QEMU's write lock, as a read-write open would
  // (none when OpenOptions::lock is off or the file is not ours). On
  // failure the read locks are taken back.
  absl::Status LockForWrite(int depth);
  // Lowers the locks LockForWrite took back to a backing file's.
  void UnlockForWrite(int depth);
  // Layer `depth` opened afresh, read-only, by the path it was opened by,
  // after its file's locks are lowered back to a backing file's.
  absl::StatusOr<std::unique_ptr<Layer>> Reopen(int depth);
  // The name the top should store for layer `depth` as its backing file
  // ("" past the bottom), and that layer's format.
  std::string BackingNameFor(int depth) const;
  std::string FormatOf(int depth);
  // The switch: layers 1..last leave the chain (`replacement`, if any,
  // takes their place: layer `last` opened afresh), the backing map is
  // dropped and the top reads the new layers for copy-on-write. The layers
  // that leave lose their image locks but stay open until the chain is
  // destroyed: I/O planned against them may still be in flight (a flush's
  // fill, a block-status read), and it reads what it would read now.
  void DropLayers(int last, std::unique_ptr<Layer> replacement);
  // An active commit's switch: layer `base`, opened afresh read-write
  // (its file's locks moved from the chain's descriptor to the new one),
  // becomes the top; the layers above it are flushed, marked clean and
  // retired as DropLayers retires them. On failure the chain is as it
  // was, `base` still write-locked for the commit's writer.
  absl::Status PivotTo(int base);

 private:
  Chain() = default;
  // Lets the top layer read the layers below for copy-on-write.
  void ConnectBacking();

  // Below the top of a chain of three or more, reads and what reads as
  // zeros are looked up in backing_map_ (one cached lookup instead of a
  // walk down the layers).
  bool ThroughBackingMap(int depth) const {
    return depth == 1 && length() > 2;
  }
  // PlanRead below the top through backing_map_ (deep chains).
  absl::Status PlanBackingRead(uint64_t offset, uint8_t* dest, uint64_t len,
                               IoPlan* plan, IoCategory category);
  // The piece of backing_map_ holding `offset`; if the map does not hold
  // it yet, resolves what it lacks of the aligned resolve_window_ around
  // `offset` first.
  absl::StatusOr<BackingMap::Piece> BackingPieceAt(uint64_t offset);
  // 1 MiB, or less when an L2 slice of a layer below maps less (clusters
  // under 2 KiB, or small slices), but never under one granule.
  static constexpr uint64_t kMaxResolveWindow = 1 << 20;
  uint64_t resolve_window_ = kMaxResolveWindow;

  std::vector<std::unique_ptr<Layer>> layers_;  // [0] is the top
  // Layers a live stream or commit took out of the chain (DropLayers).
  std::vector<std::unique_ptr<Layer>> retired_;
  std::vector<std::string> resolved_backing_;   // per layer, "" if none
  // Resolutions of layers_[1..]: used once there are two or more of them.
  BackingMap backing_map_;
  OpenOptions opts_;
  bool writable_ = false;
  bool closed_ = false;
  bool locks_dropped_ = false;  // DropImageLocksAfterClose ran
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CHAIN_CHAIN_H_
