// SPDX-License-Identifier: Apache-2.0
// The overlay chain's lifecycle, offline: rebase, commit and stream, as
// `qemu-img rebase` and `qemu-img commit` do them (and QEMU's block-stream
// job, done with no guest running). Each opens the images it needs by
// path through the public API (qcow2/image.h), moves the data with many
// requests in flight on Queues, and leaves every image consistent after a
// power cut at any instant: the top keeps reading the same guest-visible
// data throughout (docs/crash-consistency.md, "Chain operations").
//
//   qcow2::ops::RebaseSpec spec;
//   spec.image = "top.qcow2";
//   spec.backing = "base.qcow2";
//   spec.backing_format = "qcow2";
//   absl::Status s = qcow2::ops::Rebase(spec, {});
//
// None of them may run while another process writes the images (they take
// QEMU's image locks, unless OpenOptions::lock is off).
#ifndef QCOW2_LIB_OPS_LIFECYCLE_H_
#define QCOW2_LIB_OPS_LIFECYCLE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "qcow2/image.h"
#include "qcow2/options.h"

namespace qcow2::ops {

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
  // Called with the fraction done (0..1) as the operation goes; may be
  // empty.
  std::function<void(double)> progress;
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
absl::Status Rebase(const RebaseSpec& spec, const ChainOpOptions& opts);

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
absl::StatusOr<CommitResult> Commit(const CommitSpec& spec,
                                    const ChainOpOptions& opts);

// Offline block-stream (qcowtool only).
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
absl::Status StreamChain(const StreamSpec& spec, const ChainOpOptions& opts);

// The index in `chain` (top first, as Image::GetChainInfo) of the layer
// below the top that `name` names: the name stored in the layer above
// it, or the same file as `name` taken relative to that layer's
// directory or to the working directory. kNotFound (qemu-img's message)
// if none.
absl::StatusOr<int> FindInChain(const std::vector<LayerInfo>& chain,
                                const std::string& name);

}  // namespace qcow2::ops

#endif  // QCOW2_LIB_OPS_LIFECYCLE_H_
