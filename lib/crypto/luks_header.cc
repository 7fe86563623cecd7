// SPDX-License-Identifier: Apache-2.0
#include "lib/crypto/luks_header.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "lib/base/endian.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

namespace {

constexpr uint8_t kMagic[6] = {'L', 'U', 'K', 'S', 0xba, 0xbe};
constexpr size_t kSlotsOff = 208;
constexpr size_t kSlotSize = 48;
constexpr size_t kHeaderSectors = kLuksKeySlotOffset / kLuksSectorSize;

// Byte offsets of the fields.
enum : size_t {
  kOffVersion = 6,
  kOffCipherName = 8,
  kOffCipherMode = 40,
  kOffHashSpec = 72,
  kOffPayload = 104,
  kOffKeyBytes = 108,
  kOffDigest = 112,
  kOffDigestSalt = 132,
  kOffDigestIter = 164,
  kOffUuid = 168,
};

absl::Status Bad(const std::string& where, const std::string& what) {
  return absl::DataLossError(
      absl::StrCat(where, ": malformed LUKS header: ", what));
}

// A NUL-terminated string in a fixed field; error if it fills the field.
absl::StatusOr<std::string> FieldString(const uint8_t* p, size_t len,
                                        const char* field,
                                        const std::string& where) {
  const void* nul = memchr(p, 0, len);
  if (nul == nullptr) {
    return Bad(where, absl::StrCat(field, " is not NUL-terminated within ",
                                   len, " bytes"));
  }
  return std::string(reinterpret_cast<const char*>(p),
                     static_cast<const uint8_t*>(nul) - p);
}

void PutString(uint8_t* p, const std::string& s, size_t len) {
  memcpy(p, s.data(), std::min(s.size(), len - 1));
}

// Resolves cipher_name, cipher_mode ("MODE-IVGEN[:HASH]"), key_bytes and
// hash_spec into algorithms.
absl::Status ResolveAlgorithms(LuksHeader* h, const std::string& where) {
  h->hash = FindHash(h->hash_spec);
  if (h->hash == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        where, ": LUKS hash_spec '", h->hash_spec, "' is not supported"));
  }
  size_t dash = h->cipher_mode.find('-');
  if (dash == std::string::npos) {
    return Bad(where, absl::StrCat("cipher_mode '", h->cipher_mode,
                                   "' is not MODE-IVGEN"));
  }
  std::string mode = h->cipher_mode.substr(0, dash);
  std::string ivgen = h->cipher_mode.substr(dash + 1);
  std::string ivhash;
  if (size_t colon = ivgen.find(':'); colon != std::string::npos) {
    ivhash = ivgen.substr(colon + 1);
    ivgen.resize(colon);
  }
  auto m = ParseCipherMode(mode);
  auto iv = ParseIvGen(ivgen);
  if (!m.ok() || !iv.ok()) {
    return absl::UnimplementedError(
        absl::StrCat(where, ": LUKS cipher_mode '", h->cipher_mode,
                     "' is not supported: ",
                     (!m.ok() ? m.status() : iv.status()).message()));
  }
  h->spec.mode = *m;
  h->spec.ivgen = *iv;
  if (*iv == IvGen::kEssiv || !ivhash.empty()) {
    h->spec.ivgen_hash = FindHash(ivhash);
    if (h->spec.ivgen_hash == nullptr && *iv == IvGen::kEssiv) {
      return absl::UnimplementedError(
          absl::StrCat(where, ": LUKS cipher_mode '", h->cipher_mode,
                       "': unknown essiv hash '", ivhash, "'"));
    }
  }
  // Other IV generators ignore their hash, known or not, as QEMU and
  // dm-crypt do.
  size_t per_key = h->spec.mode == CipherMode::kXts ? 2 : 1;
  if (h->key_bytes == 0 || h->key_bytes % per_key != 0) {
    return Bad(where, absl::StrCat("key_bytes ", h->key_bytes,
                                   " does not fit cipher mode ", mode));
  }
  h->spec.cipher = FindCipherByLuksName(h->cipher_name, h->key_bytes / per_key);
  if (h->spec.cipher == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        where, ": LUKS cipher '", h->cipher_name, "' with key_bytes ",
        h->key_bytes, " in ", mode, " mode is not supported"));
  }
  absl::Status st = ValidateCipherSpec(h->spec);
  if (!st.ok()) {
    return absl::UnimplementedError(
        absl::StrCat(where, ": LUKS cipher ", h->cipher_name, " ",
                     h->cipher_mode, ": ", st.message()));
  }
  return absl::OkStatus();
}

// Sectors a slot's material covers, rounded as QEMU rounds them (to the
// header's 8 sectors) for the overlap checks.
uint64_t SlotSectors(const LuksHeader& h, const LuksKeySlot& s) {
  uint64_t sectors =
      (SlotMaterialBytes(h, s) + kLuksSectorSize - 1) / kLuksSectorSize;
  return (sectors + kHeaderSectors - 1) / kHeaderSectors * kHeaderSectors;
}

absl::Status ValidateSlots(const LuksHeader& h, uint64_t area_size,
                           const std::string& where) {
  for (size_t i = 0; i < kLuksNumSlots; ++i) {
    const LuksKeySlot& s = h.slots[i];
    std::string slot = absl::StrCat("key slot ", i, " ");
    if (s.active != kLuksSlotEnabled && s.active != kLuksSlotDisabled) {
      return Bad(where, absl::StrCat(slot, "active flag 0x", absl::Hex(s.active),
                                     " is neither enabled nor disabled"));
    }
    if (s.stripes != kLuksStripes) {
      return Bad(where, absl::StrCat(slot, "stripes ", s.stripes,
                                     " (QEMU uses and accepts only 4000)"));
    }
    if (s.enabled() && s.iterations == 0) {
      return Bad(where, absl::StrCat(slot, "iterations is 0"));
    }
    if (s.key_offset < kHeaderSectors) {
      return Bad(where, absl::StrCat(slot, "key_offset sector ", s.key_offset,
                                     " overlaps the LUKS header"));
    }
    uint64_t end_sector = uint64_t{s.key_offset} + SlotSectors(h, s);
    if (h.payload_offset != 0 && end_sector > h.payload_offset) {
      return Bad(where, absl::StrCat(slot, "key material (sectors ",
                                     s.key_offset, "..", end_sector,
                                     ") overlaps the payload at sector ",
                                     h.payload_offset));
    }
    uint64_t end_byte =
        uint64_t{s.key_offset} * kLuksSectorSize + SlotMaterialBytes(h, s);
    if (s.enabled() && end_byte > area_size) {
      return Bad(where, absl::StrCat(slot, "key material ends at byte ",
                                     end_byte, ", past the encryption area (",
                                     area_size, " bytes)"));
    }
    for (size_t j = i + 1; j < kLuksNumSlots; ++j) {
      const LuksKeySlot& t = h.slots[j];
      uint64_t t_end = uint64_t{t.key_offset} + SlotSectors(h, t);
      if (s.key_offset < t_end && t.key_offset < end_sector) {
        return Bad(where, absl::StrCat("key slots ", i, " and ", j,
                                       " overlap"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t SlotMaterialBytes(const LuksHeader& h, const LuksKeySlot& s) {
  return uint64_t{h.key_bytes} * s.stripes;
}

absl::StatusOr<LuksHeader> DecodeLuksHeader(absl::Span<const uint8_t> area,
                                            const std::string& where) {
  if (area.size() < kLuksHeaderSize) {
    return Bad(where, absl::StrCat("encryption area of ", area.size(),
                                   " bytes is smaller than a LUKS header (592)"));
  }
  const uint8_t* p = area.data();
  if (memcmp(p, kMagic, sizeof(kMagic)) != 0) {
    return Bad(where, "bad magic (not a LUKS header)");
  }
  LuksHeader h;
  h.version = LoadBE16(p + kOffVersion);
  if (h.version != 1) {
    return absl::UnimplementedError(absl::StrCat(
        where, ": LUKS version ", h.version, " is not supported (only 1)"));
  }
  ASSIGN_OR_RETURN(h.cipher_name, FieldString(p + kOffCipherName, kLuksNameLen,
                                              "cipher_name", where));
  ASSIGN_OR_RETURN(h.cipher_mode, FieldString(p + kOffCipherMode, kLuksNameLen,
                                              "cipher_mode", where));
  ASSIGN_OR_RETURN(h.hash_spec, FieldString(p + kOffHashSpec, kLuksNameLen,
                                            "hash_spec", where));
  h.payload_offset = LoadBE32(p + kOffPayload);
  h.key_bytes = LoadBE32(p + kOffKeyBytes);
  memcpy(h.mk_digest.data(), p + kOffDigest, kLuksDigestLen);
  memcpy(h.mk_digest_salt.data(), p + kOffDigestSalt, kLuksSaltLen);
  h.mk_digest_iterations = LoadBE32(p + kOffDigestIter);
  h.uuid.assign(reinterpret_cast<const char*>(p + kOffUuid),
                strnlen(reinterpret_cast<const char*>(p + kOffUuid),
                        kLuksUuidLen));
  for (size_t i = 0; i < kLuksNumSlots; ++i) {
    const uint8_t* s = p + kSlotsOff + i * kSlotSize;
    LuksKeySlot& slot = h.slots[i];
    slot.active = LoadBE32(s);
    slot.iterations = LoadBE32(s + 4);
    memcpy(slot.salt.data(), s + 8, kLuksSaltLen);
    slot.key_offset = LoadBE32(s + 40);
    slot.stripes = LoadBE32(s + 44);
  }
  if (h.mk_digest_iterations == 0) {
    return Bad(where, "master key digest iterations is 0");
  }
  RETURN_IF_ERROR(ResolveAlgorithms(&h, where));
  RETURN_IF_ERROR(ValidateSlots(h, area.size(), where));
  return h;
}

std::vector<uint8_t> EncodeLuksHeader(const LuksHeader& h) {
  std::vector<uint8_t> out(kLuksHeaderSize, 0);
  uint8_t* p = out.data();
  memcpy(p, kMagic, sizeof(kMagic));
  StoreBE16(p + kOffVersion, h.version);
  PutString(p + kOffCipherName, h.cipher_name, kLuksNameLen);
  PutString(p + kOffCipherMode, h.cipher_mode, kLuksNameLen);
  PutString(p + kOffHashSpec, h.hash_spec, kLuksNameLen);
  StoreBE32(p + kOffPayload, h.payload_offset);
  StoreBE32(p + kOffKeyBytes, h.key_bytes);
  memcpy(p + kOffDigest, h.mk_digest.data(), kLuksDigestLen);
  memcpy(p + kOffDigestSalt, h.mk_digest_salt.data(), kLuksSaltLen);
  StoreBE32(p + kOffDigestIter, h.mk_digest_iterations);
  PutString(p + kOffUuid, h.uuid, kLuksUuidLen);
  for (size_t i = 0; i < kLuksNumSlots; ++i) {
    uint8_t* s = p + kSlotsOff + i * kSlotSize;
    const LuksKeySlot& slot = h.slots[i];
    StoreBE32(s, slot.active);
    StoreBE32(s + 4, slot.iterations);
    memcpy(s + 8, slot.salt.data(), kLuksSaltLen);
    StoreBE32(s + 40, slot.key_offset);
    StoreBE32(s + 44, slot.stripes);
  }
  return out;
}

}  // namespace qcow2::internal
