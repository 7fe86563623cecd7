// SPDX-License-Identifier: Apache-2.0
// Changing the format options of an existing qcow2 image in place, as
// `qemu-img amend` does: the compatibility level (v2 "0.10" <-> v3 "1.1"),
// lazy refcounts, the refcount width and the virtual size.
//
//   qcow2::AmendOptions opts;
//   opts.refcount_bits = 64;
//   absl::Status s = qcow2::AmendImage("disk.qcow2", opts);
//
// Every option is checked against the image before anything is written: a
// refusal (kInvalidArgument or kFailedPrecondition, with qemu-img 7.2's
// message) leaves the file untouched. Where qemu-img applies some options
// and then refuses a later one, AmendImage refuses them all up front.
//
// Crash safety: each step ends in one header write (within the first 512
// bytes of the file, except a compat change, which rewrites cluster 0 as
// qemu-img does). A power cut leaves the image readable, with the same
// guest data, in its old state or the new one (or between steps of a
// multi-option amend), at most with leaked clusters.
#ifndef QCOW2_AMEND_H_
#define QCOW2_AMEND_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "qcow2/export.h"
#include "qcow2/file.h"

namespace qcow2 {

// What to change. Fields left empty keep the image's value.
struct AmendOptions {
  // "0.10" or "v2" (version 2), "1.1" or "v3" (version 3). Downgrading
  // refuses what version 2 cannot hold (extended L2 entries, zstd
  // compressed clusters, refcount widths other than 16, internal snapshots
  // of another disk size, persistent bitmaps) and turns zero clusters into
  // what version 2 can express: unallocated clusters where nothing lies
  // below, else allocated clusters of zeros.
  std::optional<std::string> compat;

  // Lazy refcounts (the compatible feature bit). On needs version 3.
  std::optional<bool> lazy_refcounts;

  // Refcount entry width: 1, 2, 4, ... 64 (version 3 unless 16). The
  // refcount table and blocks are rewritten at the new width, past the end
  // of the file, then one header write switches to them; the old
  // structure becomes free space. Fails if a refcount does not fit.
  std::optional<uint64_t> refcount_bits;

  // New virtual size in bytes (a multiple of 512; 0 = unchanged, as in
  // QEMU), set as Image::Resize sets it (growing, or shrinking: the data
  // past the new end is lost), after the options above and before a
  // downgrade. Refused for version 2 images with internal snapshots
  // (QEMU's rule); shrinking an image with internal snapshots or
  // persistent bitmaps is not supported yet (kUnimplemented).
  std::optional<uint64_t> size;

  // qemu-img amend accepts these only when they equal the image's own
  // backing file name and format (both must then be given, as QEMU
  // compares both); anything else is refused with qemu-img's message
  // ("Cannot amend the backing file"; `qcowtool rebase -u` changes them).
  std::optional<std::string> backing_file;
  std::optional<std::string> backing_format;

  // Progress, as qemu-img -p shows it: called with work done and total
  // work (arbitrary units, done <= total), at least once at the end.
  std::function<void(uint64_t done, uint64_t total)> progress;

  // Opens the file (read-write, with QEMU's image locks). nullptr means
  // DefaultFileOpener(). Not owned.
  FileOpener* opener = nullptr;
};

// Amends the qcow2 image at `path` (see above). The image must not be open
// elsewhere for writing (kUnavailable from the lock). A dirty image (lazy
// refcounts) has its refcounts rebuilt first, as QEMU's open does.
// Errors: kInvalidArgument / kFailedPrecondition for refused options (the
// message is qemu-img's), kUnimplemented for a raw image or features the
// library does not support, kDataLoss for a malformed image, I/O errors.
QCOW2_EXPORT absl::Status AmendImage(const std::string& path,
                                     const AmendOptions& opts);

}  // namespace qcow2

#endif  // QCOW2_AMEND_H_
