// SPDX-License-Identifier: Apache-2.0
// Changing the format options of an existing qcow2 image in place, as
// `qemu-img amend` does: the compatibility level (v2 "0.10" <-> v3 "1.1"),
// lazy refcounts, the refcount width, the virtual size, the external data
// file's name and raw flag, and the key slots of a LUKS-encrypted image
// (encrypt.state, encrypt.new-secret, ...).
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
// bytes of the file, except a compat change or a new data file name,
// which rewrite cluster 0 in one write as qemu-img does). A power cut leaves the image readable, with the same
// guest data, in its old state or the new one (or between steps of a
// multi-option amend), at most with leaked clusters. A key-slot change
// writes a slot's key material before the LUKS header that enables it,
// and disables a slot in the header before its material is overwritten:
// after a power cut every secret that opened the image before still
// opens it, except the secret of a slot being erased or overwritten.
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

// Key-slot changes of a LUKS-encrypted image, QEMU 7.2's `qemu-img amend
// -o encrypt.state=...,encrypt.new-secret=ID,...` (secrets here are the
// passphrase bytes, not ids). QEMU's rules, with its messages:
//  - state "active": new_secret required, old_secret refused; the secret
//    goes into `keyslot` (0..7) or the first free slot; an active slot is
//    overwritten only with AmendOptions::force;
//  - state "inactive": new_secret and iter_time refused; erases `keyslot`
//    (which must hold old_secret when that is given too), or every slot
//    that old_secret opens; erasing the last active slot(s), or an
//    inactive slot, only with force (the data is then lost for good).
// Overwriting an active slot (force) first puts the new secret into a
// free slot, so that a power cut never leaves the image without a slot
// that opens; that slot is erased again at the end.
struct KeySlotAmendment {
  std::string state;  // "active" or "inactive"
  std::optional<std::string> new_secret;
  std::optional<std::string> old_secret;
  std::optional<int64_t> keyslot;
  // PBKDF2 time for the new slot (encrypt.iter-time; QEMU's 2000 when not
  // given). Measuring costs at least half a second of CPU, as in QEMU.
  std::optional<uint64_t> iter_time_ms;
  // A fixed PBKDF2 iteration count (at least 1000) for the new slot instead
  // of measuring iter_time_ms (tests). 0: measure.
  uint32_t iterations = 0;
};

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

  // The name of the external data file the image stores (qemu-img's
  // data_file), for an image that has one (else kInvalidArgument, QEMU's
  // "data-file can only be set for images that use an external data
  // file"). Only the name changes: the data is not moved, and the new
  // name is not opened (the image's current data file must open, as
  // QEMU's open needs it). "" removes the name as QEMU 7.2 does: the
  // image keeps its data file bit, and QEMU then opens it only with the
  // data file named at open (`--image-opts ...,data-file.filename=`);
  // this library does not open such an image yet (kDataLoss), nor amend
  // it.
  std::optional<std::string> data_file;

  // data_file_raw: false clears the flag (the data file then need no
  // longer stay a raw image of the disk); true only where it is set
  // already (else kInvalidArgument, QEMU's "data-file-raw cannot be set
  // on existing images").
  std::optional<bool> data_file_raw;

  // The key slots of a LUKS-encrypted image (see KeySlotAmendment). On an
  // unencrypted image: kInvalidArgument, qemu-img's "Can't amend
  // encryption options - encryption not present".
  std::optional<KeySlotAmendment> encrypt;

  // The secret of a LUKS-encrypted image (QEMU's encrypt.key-secret). As
  // qemu-img opens the image with it before amending anything, an
  // encrypted image is amended only with a secret that opens one of its
  // key slots (kPermissionDenied otherwise, the file untouched); key-slot
  // changes take the master key from it.
  std::string key_secret;

  // qemu-img amend --force: lets encrypt overwrite an active key slot and
  // erase the last active ones.
  bool force = false;

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
