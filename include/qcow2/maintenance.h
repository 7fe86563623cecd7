// SPDX-License-Identifier: Apache-2.0
// Offline maintenance of qcow2 images, as qemu-img's verbs do it: check and
// repair, measure, the chain's lifecycle (rebase, commit, stream), what
// `qemu-img map` learns below the format layer, and cluster compression
// for tools that classify clusters before they write them. Persistent
// bitmaps and internal snapshots are calls of an open Image (qcow2/image.h).
//
//   qcow2::CheckReport r;
//   ASSIGN_OR_RETURN(r, qcow2::CheckImage("disk.qcow2", {}));
//   if (r.verdict() != qcow2::CheckVerdict::kClean) ...
//
// None of these may run while another process writes the images: they
// take QEMU's image locks (unless told not to).
#ifndef QCOW2_MAINTENANCE_H_
#define QCOW2_MAINTENANCE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "qcow2/export.h"
#include "qcow2/file.h"
#include "qcow2/image.h"
#include "qcow2/live.h"
#include "qcow2/options.h"
#include "qcow2/types.h"

namespace qcow2 {

// --- Check and repair (qemu-img check [-r leaks|all]), the report and
// verdict in types.h. What is checked and how a repair proceeds:
// docs/embedding.md, "Check and repair".

struct CheckOptions {
  RepairMode repair = RepairMode::kNone;
  // Check an image another process has open (read-only check only, as
  // `qemu-img check -U`); kInvalidArgument with a repair.
  bool force_share = false;
  // Opens the file; nullptr means DefaultFileOpener(). Not owned.
  FileOpener* opener = nullptr;
};

// Checks the qcow2 image at `path` and, with a repair mode, repairs it
// (the file is then opened read-write). Returns an error only when the
// image cannot be checked at all: the file cannot be opened (the OS's
// code, the message naming the path), it is not qcow2 (kInvalidArgument),
// its header or table pointers are invalid (kDataLoss), it uses features
// the checker does not support (kUnimplemented), or it has more than 2^28
// clusters (kResourceExhausted). Problems found in the image are in the
// report.
QCOW2_EXPORT absl::StatusOr<CheckReport> CheckImage(const std::string& path,
                                                    const CheckOptions& opts);
// As above over an open file (writable for a repair). Nothing else may use
// the file meanwhile.
QCOW2_EXPORT absl::StatusOr<CheckReport> CheckFile(File* file,
                                                   RepairMode repair);

// --- Measure (qemu-img measure): the bytes a new image needs, by QEMU's
// formulas, to the byte. kInvalidArgument when the size needs an L1 table
// over QEMU's 32 MiB.
QCOW2_EXPORT absl::StatusOr<MeasureReport> Measure(
    const MeasureTarget& target, const MeasureSource* source);

// The target a CreateOptions describes (format, cluster size, version,
// refcount width, preallocation, backing file; size as given).
QCOW2_EXPORT MeasureTarget MeasureTargetFor(const CreateOptions& opts);

// The source part of an open image: its size, the bytes of data its
// chain holds (ranges that read as zeros cost nothing), and the top's
// persistent bitmaps.
QCOW2_EXPORT absl::StatusOr<MeasureSource> MeasureSourceOf(
    Image& image, const MeasureTarget& target);

// --- The overlay chain's lifecycle, offline: rebase, commit and stream,
// as `qemu-img rebase` and `qemu-img commit` do them (and QEMU's
// block-stream job with no guest running). Each opens the images it needs
// by path, moves the data with many requests in flight on Queues, and
// leaves every image consistent after a power cut at any instant: the top
// keeps reading the same guest-visible data throughout
// (docs/crash-consistency.md, "Chain operations"). Cancelled through
// `control`: kCancelled, with what was copied so far kept (the top still
// reads the same; a commit's base may hold part of the top's data) and no
// backing name changed.

// How the operations open images and move data.
struct ChainOpOptions {
  // Used for every image opened: opener, lock, backing_root, cache sizes,
  // direct_io. read_write and format are set per image; force_share
  // applies to the images only read (never to one written).
  OpenOptions open;
  // Chunks in flight at once. Default: 16.
  int depth = 16;
  // Bytes per chunk (a multiple of 512). Default: 1 MiB.
  uint64_t chunk = 1 << 20;
  // Called with the fraction done (0..1) as the operation goes, on the
  // calling thread; may be empty.
  std::function<void(double)> progress;
  // Cancellation from any thread (checked before each chunk); may be null.
  LiveJobControl* control = nullptr;
};

// qemu-img rebase.
struct RebaseSpec {
  std::string image;         // the top image (path)
  std::string format;        // its format: "qcow2", "raw", or "" to probe
  std::string backing;       // the new backing file name, "" for none
  std::string backing_format;  // the new backing's format ("" only with
                               // no backing)
  // Only rewrite the name (qemu-img rebase -u): the data is not looked at
  // and the old backing file need not exist.
  bool unsafe = false;
};

// Safe mode: every range the top does not allocate and where the old
// backing chain and the new backing file (`backing`, relative to the top's
// directory; nothing with an empty name) read differently is written into
// the top with the old chain's data (zeros written as zeros), compared in
// chunks by 512-byte sectors; then the header takes the new name and
// format (Image::ChangeBackingFile). Ranges that both chains read from the
// same file are skipped without reading. The visible disk is unchanged.
// Errors (messages as qemu-img's): kInvalidArgument "backing format must
// be specified" for a name with no format; "Could not open new backing
// file 'NAME': ..." when it cannot be opened; "Could not change the
// backing file to 'NAME': ..." when the header cannot take it.
QCOW2_EXPORT absl::Status Rebase(const RebaseSpec& spec,
                                 const ChainOpOptions& opts);

// qemu-img commit.
struct CommitSpec {
  std::string image;   // the top image (path)
  std::string format;  // its format, or "" to probe
  // The image to commit into, found in the chain by the name stored in
  // the image above it or by path (relative to that image's directory, or
  // to the working directory); "" for the top's backing file.
  std::string base;
  // Leave the top as it is (qemu-img commit -d). A `base` implies it, as
  // in qemu-img 7.2 (its -b implies -d).
  bool keep_top = false;
};

struct CommitResult {
  bool emptied = false;  // the top was emptied (reads as the base now)
};

// Writes every range that a layer above the base allocates (data, or
// zeros) into the base, reading it from the layer that holds it, then
// flushes the base; then, unless keep_top or a base was named, empties
// the top (every L2 entry cleared, as QEMU's make_empty: the top reads
// through to its backing file, now holding the same data). The
// intermediate layers and every backing name stay as they were. A base
// smaller than the top is grown first. Errors: kFailedPrecondition
// "Image does not have a backing file"; kNotFound "Did not find 'BASE' in
// the backing chain of 'TOP'"; kUnimplemented, before anything is
// written, when the top would be emptied and has internal snapshots.
QCOW2_EXPORT absl::StatusOr<CommitResult> Commit(const CommitSpec& spec,
                                                 const ChainOpOptions& opts);

// Offline block-stream.
struct StreamSpec {
  std::string image;   // the top image (path)
  std::string format;  // its format, or "" to probe
  // The layer to keep as the new backing file, found as CommitSpec::base
  // finds it; "" pulls the whole chain into the top (no backing left).
  std::string base;
};

// Pulls into the top every range that a layer between the top and the
// base allocates (and the top does not), then points the top's backing
// name at the base (its name as stored above it when the top shares that
// directory, else its absolute path) with the base's format: a safe
// rebase onto a layer of the chain, reading only what lies above it.
QCOW2_EXPORT absl::Status StreamChain(const StreamSpec& spec,
                                      const ChainOpOptions& opts);

// The index in `chain` (top first, as Image::GetChainInfo) of the layer
// below the top that `name` names: the name stored in the layer above
// it, or the same file as `name` taken relative to that layer's
// directory or to the working directory. kNotFound (qemu-img's message)
// if none.
QCOW2_EXPORT absl::StatusOr<int> FindInChain(
    const std::vector<LayerInfo>& chain, const std::string& name);

// --- Below the format layer (what `qemu-img map` reports besides
// Image::GetBlockStatus: the file of a range is GetChainInfo()[depth],
// its host offset and compression are in BlockStatus).

// QEMU's metadata-preallocation heuristic for the qcow2 file at `path`
// (qcow2_detect_metadata_preallocation, which decides whether qemu-img
// map digs into the host file's holes): true when the clusters with a
// non-zero refcount reach max(n * 10 / 9, n + 2), n being the file's
// allocated bytes (st_blocks) over the cluster size. kDataLoss for a file
// that is not qcow2 or whose refcount structures cannot be read (QEMU
// then answers false). Read-only; takes no lock.
QCOW2_EXPORT absl::StatusOr<bool> DetectMetadataPreallocation(
    const std::string& path);

// --- Compression, as Image::WriteCompressed does it: compresses the
// cluster `in` into `out` with `type` (zlib: raw deflate; zstd) and returns
// the stream's length, or 0 when it does not fit in `out` (the cluster is
// then stored as it is: pass out.size() == in.size() - 1 to learn whether
// a write would store it compressed). kInvalidArgument for an unknown type
// or an oversized input; kResourceExhausted when no context can be
// allocated.
QCOW2_EXPORT absl::StatusOr<size_t> CompressCluster(
    CompressionType type, absl::Span<const uint8_t> in,
    absl::Span<uint8_t> out);

}  // namespace qcow2

#endif  // QCOW2_MAINTENANCE_H_
