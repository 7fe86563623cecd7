// SPDX-License-Identifier: Apache-2.0
#include "lib/driver/luks_open.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/crypto/algorithms.h"

namespace qcow2::internal {

namespace {

// The data cipher of an encrypted image opened without its key: every
// data-cluster read or write fails, and a read's buffer (ciphertext by
// then) is zeroed so that no caller ever sees it.
class LockedCipher final : public DataCipher {
 public:
  absl::Status Encrypt(uint64_t, absl::Span<uint8_t>) const override {
    return Refused();
  }
  absl::Status Decrypt(uint64_t, absl::Span<uint8_t> data) const override {
    std::memset(data.data(), 0, data.size());
    return Refused();
  }

 private:
  static absl::Status Refused() {
    return absl::FailedPreconditionError(
        "the image is encrypted (LUKS) and was opened for its metadata only, "
        "without its key secret: its data cannot be read or written");
  }
};

const LockedCipher kLocked;

}  // namespace

const DataCipher* OpenedLuks::cipher() const {
  if (volume != nullptr) return volume.get();
  return &kLocked;
}

absl::StatusOr<OpenedLuks> OpenLuks(File* file, const Header& h,
                                    uint64_t file_size,
                                    const std::string& secret,
                                    bool metadata_only,
                                    const std::string& name) {
  ASSIGN_OR_RETURN(std::optional<CryptoExtension> ext,
                   DecodeCryptoExtension(h, file_size, name));
  if (!ext.has_value()) {
    return absl::DataLossError(
        absl::StrCat(name, ": crypt_method 2 without a crypto header extension"));
  }
  if (secret.empty() && !metadata_only) {
    return absl::PermissionDeniedError(absl::StrCat(
        name, ": Parameter 'encrypt.key-secret' is required for cipher: "
              "the image is encrypted (LUKS): its key secret is needed "
              "(OpenOptions::key_secret; qcowtool: --object secret,id=ID,... "
              "with encrypt.key-secret=ID)"));
  }
  std::vector<uint8_t> area(ext->length);
  absl::Status s = file->ReadAt(ext->offset, absl::MakeSpan(area));
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(name, ": reading the LUKS area: ",
                                               s.message()));
  }
  OpenedLuks out;
  out.ext = *ext;
  if (secret.empty()) {
    ASSIGN_OR_RETURN(out.header, DecodeLuksHeader(area, name));
    return out;
  }
  ASSIGN_OR_RETURN(
      out.volume,
      LuksVolume::Open(area,
                       absl::MakeConstSpan(
                           reinterpret_cast<const uint8_t*>(secret.data()),
                           secret.size()),
                       name));
  out.header = out.volume->header();
  return out;
}

EncryptionInfo LuksInfo(const LuksHeader& h) {
  EncryptionInfo info;
  info.format = "luks";
  info.cipher_alg = h.spec.cipher != nullptr ? h.spec.cipher->name : "";
  info.cipher_mode = CipherModeName(h.spec.mode);
  info.ivgen_alg = IvGenName(h.spec.ivgen);
  // QEMU reports the IV hash of essiv only.
  if (h.spec.ivgen == IvGen::kEssiv && h.spec.ivgen_hash != nullptr) {
    info.ivgen_hash_alg = h.spec.ivgen_hash->name;
  }
  info.hash_alg = h.hash != nullptr ? h.hash->name : "";
  info.payload_offset = uint64_t{h.payload_offset} * kLuksSectorSize;
  info.master_key_iters = h.mk_digest_iterations;
  info.uuid = h.uuid;
  for (const LuksKeySlot& slot : h.slots) {
    LuksSlotInfo si;
    si.active = slot.enabled();
    if (si.active) {
      si.iterations = slot.iterations;
      si.stripes = slot.stripes;
    }
    si.key_offset = uint64_t{slot.key_offset} * kLuksSectorSize;
    info.slots.push_back(si);
  }
  return info;
}

}  // namespace qcow2::internal
