// SPDX-License-Identifier: Apache-2.0
// libqcow2's main entry point: an opened image together with its backing
// chain.
//
//   qcow2::OpenOptions opts;
//   auto image = qcow2::Image::Open("disk.qcow2", opts);
//   if (!image.ok()) { ... image.status() says what and where ... }
//   std::vector<uint8_t> buf(4096);
//   absl::Status s = (*image)->Read(0, absl::MakeSpan(buf));
//
// Threading: every method may be called from several threads at once.
// Requests to different guest clusters run in parallel; overlapping ones
// are ordered (see qcow2/queue.h for the full contract, which the
// synchronous calls share: each is a request on a per-thread queue that
// runs its I/O synchronously). Close(), Resize() and CreateOverlay() must
// not race with requests in flight on any Queue; CreateSnapshot(),
// ApplySnapshot() and DeleteSnapshot() need every Queue destroyed.
#ifndef QCOW2_IMAGE_H_
#define QCOW2_IMAGE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "qcow2/export.h"
#include "qcow2/file.h"
#include "qcow2/live.h"
#include "qcow2/options.h"
#include "qcow2/queue.h"
#include "qcow2/stats.h"
#include "qcow2/types.h"

namespace qcow2 {

namespace internal {
class Engine;
}

class QCOW2_EXPORT Image {
 public:
  // Opens `path` and its backing chain.
  // Errors: kNotFound / kPermissionDenied from the OS; kDataLoss for a
  // malformed image (the message names the field and file);
  // kUnimplemented for features the library does not support (naming them);
  // kFailedPrecondition when writing is asked of an image that may not be
  // written (corrupt bit set, read-only file).
  static absl::StatusOr<std::unique_ptr<Image>> Open(const std::string& path,
                                                     const OpenOptions& opts);

  // As above, over an already opened top file. Backing files are found
  // relative to the directory part of `top->name()` through `opts.opener`.
  static absl::StatusOr<std::unique_ptr<Image>> Open(
      std::unique_ptr<File> top, const OpenOptions& opts);

  Image(const Image&) = delete;
  Image& operator=(const Image&) = delete;

  // Flushes (when writable) and closes; errors are lost: call Close() first
  // to see them.
  ~Image();

  // Virtual disk size in bytes.
  uint64_t size() const;

  // Number of files in the chain (1 with no backing file).
  int chain_length() const;

  bool writable() const;

  // Reads `buf.size()` bytes at `offset`, through the backing chain.
  // REQUIRES: offset + buf.size() <= size(), else kOutOfRange.
  absl::Status Read(uint64_t offset, absl::Span<uint8_t> buf);

  // Writes `data` at `offset`. Data is durable after the next Flush().
  // REQUIRES: writable(); offset + data.size() <= size().
  absl::Status Write(uint64_t offset, absl::Span<const uint8_t> data);

  // Writes one guest cluster stored compressed, as `qemu-io -c 'write -c'`
  // and `qemu-img convert -c` do: `offset` is cluster-aligned and `data`
  // one whole cluster, or what is left of the disk's last cluster (then
  // compressed padded with zeros). The cluster is compressed with the
  // image's compression type (zlib or zstd) on the calling thread, with no
  // lock held; it is stored compressed when the stream is shorter than a
  // cluster, else written as Write() would. Compressed clusters are packed
  // several to a host cluster, as QEMU packs them. An allocated cluster is
  // replaced (its old host cluster let go of once the new entry is in
  // place), where QEMU refuses with EIO. Durable after the next Flush().
  // Errors: kUnimplemented for a raw image; kInvalidArgument for a range
  // that is not one whole cluster; as Write() otherwise.
  // REQUIRES: writable(); offset + data.size() <= size().
  absl::Status WriteCompressed(uint64_t offset, absl::Span<const uint8_t> data);

  // Makes the range read as zeros (never exposing backing data). With
  // `unmap`, host clusters may be released.
  absl::Status WriteZeroes(uint64_t offset, uint64_t len, bool unmap = false);

  // Discards the range: afterwards it reads as zeros (never as backing
  // data), and the host clusters of fully covered clusters are released.
  absl::Status Discard(uint64_t offset, uint64_t len);

  // Grows the virtual disk to `new_size` bytes (rounded up to 512); the new
  // range reads as zeros (or as the backing file where it reaches). The
  // qcow2 L1 table is reallocated when it no longer covers the disk.
  // Shrinking (qcow2 only) drops the data past the new end: the L2 entries
  // there are cleared and their host clusters freed (entries durable
  // first), then the header takes the new size; the emptied L2 tables
  // stay allocated. A power cut leaves the old size (the dropped range
  // reading as before or as zeros) or the new one. kUnimplemented for raw
  // images and for qcow2 images with internal snapshots or persistent
  // bitmaps. REQUIRES: writable().
  absl::Status Resize(uint64_t new_size);

  // Grows as above, then preallocates the new range as `qemu-img resize
  // --preallocation` does: kMetadata gives every cluster of it a data
  // cluster (reading as zeros), kFalloc also reserves their host space,
  // kFull also writes the zeros; kOff is Resize(new_size). Errors:
  // kInvalidArgument unless the disk grows; kUnimplemented for raw images
  // and images with a backing file. A power cut part way leaves the image
  // grown, with part of the range preallocated at most.
  // REQUIRES: writable(); no requests in flight (as Resize).
  absl::Status Resize(uint64_t new_size, Preallocation prealloc);

  // Makes every write completed before the call durable, metadata included.
  absl::Status Flush();

  // Flushes, marks the image clean and stops accepting requests; the files
  // are closed when the Image is destroyed. Later calls fail with
  // kFailedPrecondition.
  absl::Status Close();

  // The status of the range starting at `offset`, as long as it stays
  // uniform but at most `max_len` bytes (and never past size()). Safe
  // beside requests in flight on any queue; a table it must read is read
  // without holding up their planning.
  absl::StatusOr<BlockStatus> GetBlockStatus(uint64_t offset,
                                             uint64_t max_len);

  // Live external snapshot: creates a qcow2 overlay at `path` whose backing
  // file is the current top image, and sends every later write to it. The
  // old top is flushed, marked clean and becomes a read-only backing file.
  // `opts` chooses the overlay's own cluster size, extended L2, compression
  // type and so on; its size (0 = the current size), backing_file and
  // backing_format are filled in. Fails with kAlreadyExists if `path`
  // exists; on failure the chain is unchanged.
  // REQUIRES: writable().
  absl::Status CreateOverlay(const std::string& path,
                             const CreateOptions& opts);

  // Facts about each file of the chain, top first.
  std::vector<LayerInfo> GetChainInfo() const;

  // --- Internal snapshots of the top image (qcow2 only), as `qemu-img
  // snapshot` makes them. Create, apply and delete flush the image first
  // and leave it flushed; their on-disk updates are ordered so that a
  // power cut leaks clusters at most (docs/snapshots.md).
  // REQUIRES (create, apply, delete): writable(), and no Queue open on the
  // image (kFailedPrecondition otherwise) nor a synchronous call running.

  // The snapshot table, in table order. kDataLoss for a malformed table;
  // kUnimplemented when the top image is raw.
  absl::StatusOr<std::vector<SnapshotInfo>> ListSnapshots() const;

  // Takes a snapshot of the disk as it is now, named `name` (names may
  // repeat, as in QEMU), with id `id` or, when empty, one more than the
  // largest numeric id. Records the current time, a VM clock of 0 and an
  // icount of 0, as qemu-img does. kAlreadyExists if `id` is in use;
  // kOutOfRange past 65536 snapshots.
  absl::StatusOr<SnapshotInfo> CreateSnapshot(const std::string& name,
                                              const std::string& id = "");

  // Reverts the disk to the snapshot whose id is `name_or_id`, else to the
  // first whose name is (QEMU's lookup). The disk size becomes the
  // snapshot's. kNotFound if none matches.
  absl::Status ApplySnapshot(const std::string& name_or_id);

  // Deletes the snapshot whose id is `name_or_id`, else the first whose
  // name is, and frees what only it used. kNotFound if none matches.
  absl::Status DeleteSnapshot(const std::string& name_or_id);

  // --- Persistent dirty bitmaps of the top image (qcow2 only), as
  // `qemu-img bitmap` edits them and QEMU's dirty-bitmap block jobs use
  // them. On an image open read-write, every enabled bitmap records each
  // guest write, write-zeroes and discard (in memory, as it is planned);
  // the bitmaps are written back to the file by Close() (a bitmap found in
  // use at open is left as it is, see BitmapInfo::in_use). On a read-only
  // image they are read from the file on first use. The listing and the
  // status are safe beside requests in flight on any queue and reflect
  // every write submitted before the call; the edits need writable()
  // (kFailedPrecondition otherwise) and run beside requests too.

  // The bitmaps, in directory order (empty for a raw image or a qcow2
  // image without any). kDataLoss for a malformed bitmap directory;
  // kUnimplemented for a bitmap type the library cannot read.
  absl::StatusOr<std::vector<BitmapInfo>> ListBitmaps() const;

  // The dirty state of bitmap `name` from `offset`, as long as it stays
  // uniform, at most `max_len` bytes (clipped to the disk; the range ends
  // on a granule boundary, or the disk's end). kNotFound naming the
  // bitmap if it does not exist; kFailedPrecondition for one in use;
  // kOutOfRange for an offset at or past size(); kInvalidArgument for a
  // max_len of 0.
  absl::StatusOr<BitmapStatus> GetBitmapStatus(const std::string& name,
                                               uint64_t offset,
                                               uint64_t max_len) const;

  // Creates bitmap `name`, all clean, recording writes from now on if
  // `enabled`. `granularity` is a power of two from 512 bytes to 2 GiB; 0
  // takes qemu-img's default (the cluster size, at least 4 KiB). Errors as
  // `qemu-img bitmap --add`: kAlreadyExists, kInvalidArgument for a bad
  // name or granularity, kFailedPrecondition for a version 2 image,
  // kResourceExhausted past 65535 bitmaps.
  absl::Status AddBitmap(const std::string& name, uint64_t granularity = 0,
                         bool enabled = true);
  // Deletes bitmap `name` (in use or not); its clusters are freed when the
  // bitmaps are next written. kNotFound if it does not exist.
  absl::Status RemoveBitmap(const std::string& name);
  // Marks every granule of bitmap `name` clean.
  absl::Status ClearBitmap(const std::string& name);
  // Starts or stops bitmap `name` recording writes (the auto flag).
  absl::Status EnableBitmap(const std::string& name);
  absl::Status DisableBitmap(const std::string& name);
  // Marks dirty in bitmap `target` every granule that bitmap `source` of
  // `source_image` (this image when null; it may be open read-only) has
  // dirty, as `qemu-img bitmap --merge` does; granularities may differ.
  // kNotFound for either bitmap; kFailedPrecondition for one in use.
  absl::Status MergeBitmap(const std::string& target,
                           const std::string& source,
                           const Image* source_image = nullptr);

  // A new asynchronous queue on this image (see qcow2/queue.h). Fails on a
  // closed image.
  absl::StatusOr<std::unique_ptr<Queue>> CreateQueue(
      const QueueOptions& opts = {});

  // Counters summed over every queue ever created on this image and the
  // synchronous calls, since Open.
  IoStats GetStats() const;

  // Rewrites the top image's backing file name and format in its header,
  // as `qemu-img rebase -u` and `amend -o backing_file=` do: `name` is
  // stored as given (a relative name is relative to the top image's
  // directory), `format` ("qcow2", "raw", ...) goes into the backing
  // format extension; an empty `name` (and `format`) leaves the image
  // with no backing file. Everything written before the call is flushed
  // first; then cluster 0 is rewritten in one write, so a power cut
  // leaves the old name or the new one, never a mix. The data is not
  // touched: what the image reads as may change (see `qcowtool rebase`
  // for the safe form). The chain already open keeps reading through the
  // backing files it opened; reopen the image to read through the new
  // one. Errors: kUnimplemented for a raw top; kInvalidArgument for a
  // name over 1023 bytes, with a NUL byte, a format without a name, or a
  // name that does not fit in the first cluster after the header
  // extensions (nothing is written then).
  // REQUIRES: writable(); no requests in flight (as Resize).
  absl::Status ChangeBackingFile(const std::string& name,
                                 const std::string& format);

  // --- Live chain operations (qcow2/live.h): they run beside requests in
  // flight on any Queue and synchronous calls on other threads, block the
  // calling thread until done, and end by switching the open chain (and
  // the top's backing name on disk) to the shorter one. `base` is a depth
  // in GetChainInfo(). One job at a time per image; while it runs,
  // CreateOverlay, Resize, ChangeBackingFile and ApplySnapshot fail with
  // kFailedPrecondition. Cancelled (LiveJobOptions::control): kCancelled,
  // the chain as it was. Errors: kUnimplemented for a raw top;
  // kInvalidArgument for a base not in the chain or bad options;
  // kFailedPrecondition for a read-only or closed image, or another job.
  // Guest writes are never lost nor reordered: see docs/embedding.md.

  // QEMU's block-stream: copies into the top every range that the top
  // does not allocate and a layer at depth 1..base-1 does (a chunk at a
  // time, its clusters held against guest requests meanwhile, so a guest
  // write either lands first and is kept, or after and wins), then makes
  // the layer at depth `base` the top's backing file (its name as the
  // layer above stored it when the top shares that directory, else its
  // absolute path), or none when base == chain_length(); layers 1..base-1
  // leave the chain (their files stay open, unlocked, until the Image is
  // destroyed). base == 1 changes nothing.
  absl::Status LiveStream(int base, const LiveJobOptions& opts = {});

  // QEMU's block-commit of the layers under the active top: copies every
  // range that a layer at depth 1..base-1 allocates into the layer at
  // depth `base` (write-locked meanwhile; 2 <= base < chain_length()),
  // reading through the chain (the top's own writes stay in the top),
  // then flushes the base, makes it the top's backing file and drops
  // layers 1..base-1 from the chain. base 1 (the top itself) is
  // LiveActiveCommit(1, opts). kUnimplemented for a base smaller than the
  // disk.
  absl::Status LiveCommit(int base, const LiveJobOptions& opts = {});

  // QEMU's active block-commit followed by its pivot (`virsh blockcommit
  // --active --pivot`): copies every range that a layer at depth
  // 0..base-1 (the top included) allocates into the layer at depth `base`
  // (1 <= base < chain_length(); write-locked meanwhile), logging the
  // guest's writes, write-zeroes and discards as it goes and copying again
  // what they touched, a pass at a time, until little is left; then, with
  // guest requests held, copies the rest, flushes the base, and makes it
  // the top: the guest's writes land in it from then on, and layers
  // 0..base-1 leave the chain (flushed, marked clean, unlocked; their
  // files stay open until the Image is destroyed, and on disk they still
  // name the chain they had). A guest flush waits for the switch.
  // `progress`' total grows by what each pass copies again. Cancelled (or
  // failed) before the switch: the chain as it was, the base holding only
  // what the chain above it reads. kUnimplemented for a base whose size
  // is not the disk's.
  absl::Status LiveActiveCommit(int base, const LiveJobOptions& opts = {});

 private:
  explicit Image(std::unique_ptr<internal::Engine> engine);
  std::unique_ptr<internal::Engine> engine_;
};

// Creates a new image file at `path` (fails with kAlreadyExists if it
// exists). qcow2 images are created with qemu-img's defaults and layout.
QCOW2_EXPORT absl::Status CreateImage(const std::string& path,
                                      const CreateOptions& opts);

}  // namespace qcow2

#endif  // QCOW2_IMAGE_H_
