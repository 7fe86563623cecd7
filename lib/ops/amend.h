// SPDX-License-Identifier: Apache-2.0
// qemu-img amend on one qcow2 file (include/qcow2/amend.h has the
// contract): the checks made before anything is written, then the steps in
// QEMU's order (qcow2_amend_options): upgrade, refcount width, lazy
// refcounts, size, data file, downgrade. The steps work on the file directly, not through a
// Qcow2Layer: each is a short sequence of writes and flushes that ends in
// one header write (docs/crash-consistency.md, "Amend").
//
// Not thread-safe; the caller holds the file's write lock.
#ifndef QCOW2_LIB_OPS_AMEND_H_
#define QCOW2_LIB_OPS_AMEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "lib/crypto/luks_header.h"
#include "lib/crypto/luks_volume.h"
#include "lib/crypto/secure_buffer.h"
#include "lib/format/crypto_ext.h"
#include "lib/format/header.h"
#include "lib/meta/refcounts.h"
#include "qcow2/amend.h"
#include "qcow2/file.h"

namespace qcow2::internal {

// Sets the virtual size of the image in the file (the layer above the
// driver does it through an Image over the same file).
using AmendResizer = std::function<absl::Status(uint64_t new_size)>;

// Opens the external data file the image names `stored` (and closes it
// again): QEMU's amend opens the image with its data file, so one that
// does not open refuses the amend before anything is written.
using AmendDataFileCheck = std::function<absl::Status(const std::string&)>;

// Amends the qcow2 image in `file` (REQUIRES: opened read-write). A size
// in `opts` is set through `resize`; an image with a data file is first
// checked with `check_data_file` (if set).
absl::Status AmendQcow2(File* file, const AmendOptions& opts,
                        const AmendResizer& resize,
                        const AmendDataFileCheck& check_data_file = nullptr);

// The image being amended: its file and header as on disk.
struct AmendTarget {
  File* file = nullptr;
  Header h;
  uint64_t file_size = 0;
  std::function<void(uint64_t, uint64_t)> progress;  // may be empty
  // Encrypts what amend writes as guest data (the zeros of a downgrade)
  // on a LUKS-encrypted image; null otherwise. Not owned.
  const DataCipher* cipher = nullptr;

  // Reads and validates the header (again).
  absl::Status Load();
  // Writes the fixed header fields (the first header_length bytes, or 72
  // for version 2: one sector) and flushes.
  absl::Status WriteHeaderFields();
  // Writes cluster 0 whole (header, extensions, backing name, zero
  // padding) in one write and flushes.
  absl::Status WriteCluster0();
  // The L1 table at `offset` with `entries` entries.
  absl::StatusOr<std::vector<uint64_t>> ReadL1(uint64_t offset,
                                               uint32_t entries);
};

// The image's refcounts (lib/meta), for allocating and counting clusters;
// a grown refcount table is committed through t->WriteHeaderFields().
absl::StatusOr<std::unique_ptr<Refcounts>> OpenRefcounts(AmendTarget* t);

// Every refcount of the image, one per host cluster, up to the last cluster
// the refcount table covers that is in use (kDataLoss for a malformed
// table or block).
absl::StatusOr<std::vector<uint64_t>> ReadAllRefcounts(AmendTarget* t);

// The first cluster whose refcount exceeds `limit` (QEMU names it when a
// narrower width cannot hold it), if any.
std::optional<uint64_t> FirstRefcountAbove(const std::vector<uint64_t>& refs,
                                           uint64_t limit);

// Rewrites the refcount structure at width 2^`order` (see qcow2/amend.h).
// REQUIRES: version 3, the refcounts consistent (clean image), and every
// refcount fits the new width.
absl::Status ChangeRefcountOrder(AmendTarget* t, uint32_t order);

// Whether the active disk has compressed clusters (QEMU's check before a
// downgrade of a zstd image).
absl::StatusOr<bool> HasCompressedClusters(AmendTarget* t);

// Turns every zero cluster of the active disk and of each snapshot into
// what version 2 can express (QEMU's qcow2_expand_zero_clusters).
// REQUIRES: standard L2 entries, a clean image.
absl::Status ExpandZeroClusters(AmendTarget* t);

// The LUKS area of an encrypted image being amended (amend_luks.cc),
// unlocked with the caller's secret.
struct AmendLuks {
  CryptoExtension ext;
  std::vector<uint8_t> area;  // header and key material, as in the file
  LuksHeader header;
  SecureBuffer master_key;
  std::unique_ptr<LuksVolume> volume;  // the payload cipher
};

// For a LUKS-encrypted image (crypt_method 2): reads its area and unlocks
// it with `secret`, as qemu-img's open does (kPermissionDenied, QEMU's
// words, for a missing or wrong secret). nullptr for an unencrypted image.
// Reads only.
absl::StatusOr<std::unique_ptr<AmendLuks>> UnlockForAmend(
    AmendTarget* t, const std::string& secret);

// What a key-slot amendment does, decided before anything is written.
struct KeySlotPlan {
  std::vector<size_t> erase;    // slots to erase, in order
  std::optional<size_t> fill;   // the slot that gets the new secret
};

// QEMU 7.2's checks of a key-slot amendment (qcow2/amend.h), with its
// messages (kInvalidArgument). Tries old_secret on the slots: PBKDF2.
absl::StatusOr<KeySlotPlan> CheckKeySlots(const AmendLuks& l,
                                          const KeySlotAmendment& a,
                                          bool force);

// Applies `p`: each slot filled by writing its material, a flush, then
// the LUKS header and a flush; each slot erased by the header first, then
// its material overwritten. An active slot filled (force) is first backed
// by a free slot with the new secret, erased at the end.
absl::Status ApplyKeySlots(AmendTarget* t, AmendLuks* l, const KeySlotPlan& p,
                           const KeySlotAmendment& a);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_OPS_AMEND_H_
