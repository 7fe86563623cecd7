// SPDX-License-Identifier: Apache-2.0
#include "lib/crypto/luks_keys.h"

#include <nettle/memops.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

namespace {

constexpr uint32_t kMinIterations = 1000;  // QEMU's floor for both counts
constexpr uint32_t kHeaderSectors = kLuksKeySlotOffset / kLuksSectorSize;

// The AF diffusion: each digest-sized piece i of `block` becomes
// hash(be32(i) || piece), truncated to the piece's length.
void Diffuse(const HashAlg& hash, absl::Span<uint8_t> block) {
  const size_t dl = hash.digest_len();
  uint8_t digest[64];
  for (size_t i = 0, pos = 0; pos < block.size(); ++i, pos += dl) {
    size_t n = std::min(dl, block.size() - pos);
    uint8_t be[4] = {uint8_t(i >> 24), uint8_t(i >> 16), uint8_t(i >> 8),
                     uint8_t(i)};
    HashParts(hash, {absl::MakeConstSpan(be, 4), block.subspan(pos, n)},
              absl::MakeSpan(digest, dl));
    memcpy(block.data() + pos, digest, n);
  }
  explicit_bzero(digest, sizeof(digest));
}

void XorInto(absl::Span<uint8_t> dst, absl::Span<const uint8_t> src) {
  for (size_t i = 0; i < dst.size(); ++i) dst[i] ^= src[i];
}

// Thread CPU time in milliseconds, as QEMU measures PBKDF2's speed.
absl::StatusOr<uint64_t> ThreadCpuMs() {
  struct rusage ru;
  if (getrusage(RUSAGE_THREAD, &ru) != 0) {
    return absl::ErrnoToStatus(errno, "getrusage");
  }
  return uint64_t(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
         uint64_t(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
}

// PBKDF2 iterations per second of thread CPU on these inputs: QEMU's
// method (start at 2^15, grow until one run takes over half a second).
absl::StatusOr<uint64_t> IterationsPerSecond(const HashAlg& hash,
                                             absl::Span<const uint8_t> secret,
                                             absl::Span<const uint8_t> salt,
                                             size_t out_len) {
  SecureBuffer out(out_len);
  uint64_t iterations = 1 << 15;
  while (true) {
    if (iterations > UINT32_MAX) {
      return absl::InternalError("PBKDF2 speed measurement overflowed");
    }
    ASSIGN_OR_RETURN(uint64_t start, ThreadCpuMs());
    Pbkdf2(hash, secret, salt, static_cast<uint32_t>(iterations), out.span());
    ASSIGN_OR_RETURN(uint64_t end, ThreadCpuMs());
    uint64_t delta = end - start;
    if (delta > 500) return iterations * 1000 / delta;
    // Under 1 ms of CPU (QEMU fails there with "Unable to get accurate CPU
    // usage"): grow as for a short run instead.
    iterations = delta < 100 ? iterations * 10 : iterations * 1000 / delta;
  }
}

absl::StatusOr<uint32_t> ScaledIterations(uint64_t per_second,
                                          uint32_t iter_time_ms,
                                          uint32_t divisor) {
  uint64_t iters = per_second * iter_time_ms / 1000 / divisor;
  if (iters > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PBKDF2 iterations ", iters, " exceed 2^32-1 (lower iter-time)"));
  }
  return std::max<uint32_t>(static_cast<uint32_t>(iters), kMinIterations);
}

// One slot's attempt: the candidate master key if `secret` opens it.
absl::StatusOr<bool> TrySlot(const LuksHeader& h, const LuksKeySlot& s,
                             absl::Span<const uint8_t> area,
                             absl::Span<const uint8_t> secret,
                             SecureBuffer* key) {
  SecureBuffer slot_key(h.key_bytes);
  Pbkdf2(*h.hash, secret, s.salt, s.iterations, slot_key.span());
  const uint64_t off = uint64_t{s.key_offset} * kLuksSectorSize;
  SecureBuffer material(area.subspan(off, SlotMaterialBytes(h, s)));
  ASSIGN_OR_RETURN(auto cipher, SectorCipher::Create(h.spec, slot_key.span()));
  RETURN_IF_ERROR(cipher->Decrypt(0, material.span()));
  AfMerge(*h.hash, material.span(), s.stripes, key->span());
  uint8_t digest[kLuksDigestLen];
  Pbkdf2(*h.hash, key->span(), h.mk_digest_salt, h.mk_digest_iterations,
         absl::MakeSpan(digest));
  bool match = memeql_sec(digest, h.mk_digest.data(), kLuksDigestLen) != 0;
  explicit_bzero(digest, sizeof(digest));
  return match;
}

// Enables slot `i` of `h` for `secret`: a new salt, iterations (fixed,
// or measured for iter_time_ms), and the AF-split master key encrypted
// with the secret's PBKDF2 key, written at the slot's key_offset in
// `area`. The caller re-encodes the header.
absl::Status FillSlot(LuksHeader& h, size_t i,
                      absl::Span<const uint8_t> master_key,
                      absl::Span<const uint8_t> secret, uint32_t iterations,
                      uint32_t iter_time_ms, absl::Span<uint8_t> area) {
  LuksKeySlot& s = h.slots[i];
  const uint64_t off = uint64_t{s.key_offset} * kLuksSectorSize;
  if (off + SlotMaterialBytes(h, s) > area.size()) {
    return absl::DataLossError(absl::StrCat(
        "LUKS key slot ", i, " material lies past the area"));
  }
  RETURN_IF_ERROR(RandomBytes(absl::MakeSpan(s.salt)));
  if (iterations != 0) {
    s.iterations = iterations;
  } else {
    ASSIGN_OR_RETURN(uint64_t rate,
                     IterationsPerSecond(*h.hash, secret, s.salt, h.key_bytes));
    ASSIGN_OR_RETURN(s.iterations, ScaledIterations(rate, iter_time_ms, 1));
  }
  SecureBuffer slot_key(h.key_bytes);
  Pbkdf2(*h.hash, secret, s.salt, s.iterations, slot_key.span());
  SecureBuffer split(SlotMaterialBytes(h, s));
  RETURN_IF_ERROR(AfSplit(*h.hash, master_key, s.stripes, split.span()));
  ASSIGN_OR_RETURN(auto cipher, SectorCipher::Create(h.spec, slot_key.span()));
  RETURN_IF_ERROR(cipher->Encrypt(0, split.span()));
  std::copy_n(split.data(), split.size(), area.begin() + off);
  s.active = kLuksSlotEnabled;
  return absl::OkStatus();
}

std::string NewUuid(const uint8_t r[16]) {
  uint8_t u[16];
  memcpy(u, r, 16);
  u[6] = (u[6] & 0x0f) | 0x40;  // version 4
  u[8] = (u[8] & 0x3f) | 0x80;  // RFC 4122 variant
  return absl::StrFormat(
      "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
      u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
      u[11], u[12], u[13], u[14], u[15]);
}

}  // namespace

absl::Status AfSplit(const HashAlg& hash, absl::Span<const uint8_t> key,
                     uint32_t stripes, absl::Span<uint8_t> split) {
  const size_t n = key.size();
  SecureBuffer block(n);
  RETURN_IF_ERROR(RandomBytes(split.first(n * (stripes - 1))));
  for (uint32_t i = 0; i + 1 < stripes; ++i) {
    XorInto(block.span(), split.subspan(i * n, n));
    Diffuse(hash, block.span());
  }
  absl::Span<uint8_t> last = split.subspan(n * (stripes - 1), n);
  memcpy(last.data(), block.data(), n);
  XorInto(last, key);
  return absl::OkStatus();
}

void AfMerge(const HashAlg& hash, absl::Span<const uint8_t> split,
             uint32_t stripes, absl::Span<uint8_t> key) {
  const size_t n = key.size();
  SecureBuffer block(n);
  for (uint32_t i = 0; i + 1 < stripes; ++i) {
    XorInto(block.span(), split.subspan(i * n, n));
    Diffuse(hash, block.span());
  }
  memcpy(key.data(), block.data(), n);
  XorInto(key, split.subspan(n * (stripes - 1), n));
}

absl::StatusOr<SecureBuffer> UnlockLuks(const LuksHeader& h,
                                        absl::Span<const uint8_t> area,
                                        absl::Span<const uint8_t> secret,
                                        const std::string& where) {
  SecureBuffer key(h.key_bytes);
  std::vector<size_t> tried;
  for (size_t i = 0; i < kLuksNumSlots; ++i) {
    const LuksKeySlot& s = h.slots[i];
    if (!s.enabled()) continue;
    // DecodeLuksHeader checked the material lies inside `area`; check
    // again so a caller's own header cannot read past it.
    if (uint64_t{s.key_offset} * kLuksSectorSize + SlotMaterialBytes(h, s) >
        area.size()) {
      return absl::DataLossError(absl::StrCat(
          where, ": LUKS key slot ", i, " material lies past the area"));
    }
    tried.push_back(i);
    ASSIGN_OR_RETURN(bool ok, TrySlot(h, s, area, secret, &key));
    if (ok) return key;
  }
  if (tried.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": no LUKS key slot is enabled"));
  }
  return absl::PermissionDeniedError(
      absl::StrCat(where, ": Invalid password, cannot unlock any keyslot "
                          "(LUKS key slots tried: ",
                   absl::StrJoin(tried, ", "), ")"));
}

absl::StatusOr<bool> SlotOpens(const LuksHeader& h,
                               absl::Span<const uint8_t> area, size_t slot,
                               absl::Span<const uint8_t> secret) {
  if (slot >= kLuksNumSlots || !h.slots[slot].enabled()) return false;
  const LuksKeySlot& s = h.slots[slot];
  if (uint64_t{s.key_offset} * kLuksSectorSize + SlotMaterialBytes(h, s) >
      area.size()) {
    return absl::DataLossError(absl::StrCat(
        "LUKS key slot ", slot, " material lies past the area"));
  }
  SecureBuffer key(h.key_bytes);
  return TrySlot(h, s, area, secret, &key);
}

absl::StatusOr<CipherSpec> CipherSpecFromOptions(const LuksCreateOptions& o) {
  CipherSpec spec;
  spec.cipher = FindCipher(o.cipher_alg);
  if (spec.cipher == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown encrypt.cipher-alg '", o.cipher_alg, "'"));
  }
  ASSIGN_OR_RETURN(spec.mode, ParseCipherMode(o.cipher_mode));
  ASSIGN_OR_RETURN(spec.ivgen, ParseIvGen(o.ivgen_alg));
  if (spec.ivgen == IvGen::kEssiv || !o.ivgen_hash_alg.empty()) {
    spec.ivgen_hash =
        FindHash(o.ivgen_hash_alg.empty() ? "sha256" : o.ivgen_hash_alg);
    if (spec.ivgen_hash == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown encrypt.ivgen-hash-alg '", o.ivgen_hash_alg, "'"));
    }
  }
  RETURN_IF_ERROR(ValidateCipherSpec(spec));
  // QEMU 7.2 aborts (an assertion on the key material's sector alignment)
  // when the split key is not a whole number of sectors: 24-byte keys
  // outside xts (24 * 4000 = 187.5 sectors). Refuse what it cannot open.
  if ((spec.key_len() * kLuksStripes) % kLuksSectorSize != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "encrypt.cipher-alg ", o.cipher_alg, " in ", o.cipher_mode,
        " mode: its key material is not a whole number of sectors, which "
        "QEMU 7.2 cannot create or open (it aborts)"));
  }
  return spec;
}

absl::StatusOr<LuksArea> CreateLuks(const LuksCreateOptions& o,
                                    absl::Span<const uint8_t> secret) {
  LuksArea a;
  LuksHeader& h = a.header;
  ASSIGN_OR_RETURN(h.spec, CipherSpecFromOptions(o));
  h.hash = FindHash(o.hash_alg);
  if (h.hash == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown encrypt.hash-alg '", o.hash_alg, "'"));
  }
  h.cipher_name = h.spec.cipher->luks_name;
  h.cipher_mode = h.spec.LuksModeString();
  h.hash_spec = h.hash->name;
  h.key_bytes = static_cast<uint32_t>(h.spec.key_len());

  // Layout: slot i's material at 8 + i * S sectors.
  const uint32_t material_sectors = static_cast<uint32_t>(
      (uint64_t{h.key_bytes} * kLuksStripes + kLuksSectorSize - 1) /
      kLuksSectorSize);
  const uint32_t slot_sectors =
      (material_sectors + kHeaderSectors - 1) / kHeaderSectors * kHeaderSectors;
  for (uint32_t i = 0; i < kLuksNumSlots; ++i) {
    h.slots[i].key_offset = kHeaderSectors + i * slot_sectors;
    h.slots[i].stripes = kLuksStripes;
  }
  h.payload_offset = kHeaderSectors + kLuksNumSlots * slot_sectors;

  uint8_t uuid_bytes[16];
  RETURN_IF_ERROR(RandomBytes(absl::MakeSpan(uuid_bytes)));
  h.uuid = NewUuid(uuid_bytes);
  a.master_key = SecureBuffer(h.key_bytes);
  RETURN_IF_ERROR(RandomBytes(a.master_key.span()));
  RETURN_IF_ERROR(RandomBytes(absl::MakeSpan(h.mk_digest_salt)));

  // The master key's digest: iterations for iter-time / 8, as QEMU.
  if (o.digest_iterations != 0) {
    h.mk_digest_iterations = o.digest_iterations;
  } else {
    ASSIGN_OR_RETURN(uint64_t rate,
                     IterationsPerSecond(*h.hash, a.master_key.span(),
                                         h.mk_digest_salt, kLuksDigestLen));
    ASSIGN_OR_RETURN(h.mk_digest_iterations,
                     ScaledIterations(rate, o.iter_time_ms, 8));
  }
  Pbkdf2(*h.hash, a.master_key.span(), h.mk_digest_salt,
         h.mk_digest_iterations, absl::MakeSpan(h.mk_digest));

  a.bytes.assign(uint64_t{h.payload_offset} * kLuksSectorSize, 0);
  RETURN_IF_ERROR(FillSlot(h, 0, a.master_key.span(), secret,
                           o.slot_iterations, o.iter_time_ms,
                           absl::MakeSpan(a.bytes)));
  std::vector<uint8_t> hdr = EncodeLuksHeader(h);
  std::copy(hdr.begin(), hdr.end(), a.bytes.begin());
  return a;
}

absl::StatusOr<size_t> AddKeySlot(LuksHeader& h, absl::Span<uint8_t> area,
                                  absl::Span<const uint8_t> master_key,
                                  absl::Span<const uint8_t> secret,
                                  std::optional<size_t> slot,
                                  uint32_t iter_time_ms, uint32_t iterations) {
  if (master_key.size() != h.key_bytes) {
    return absl::InvalidArgumentError("master key has the wrong length");
  }
  size_t i = 0;
  if (slot) {
    if (*slot >= kLuksNumSlots) {
      return absl::InvalidArgumentError(
          absl::StrCat("key slot ", *slot, " does not exist (0..7)"));
    }
    if (h.slots[*slot].enabled()) {
      return absl::FailedPreconditionError(
          absl::StrCat("key slot ", *slot, " is already in use"));
    }
    i = *slot;
  } else {
    while (i < kLuksNumSlots && h.slots[i].enabled()) ++i;
    if (i == kLuksNumSlots) {
      return absl::ResourceExhaustedError("all 8 LUKS key slots are in use");
    }
  }
  RETURN_IF_ERROR(
      FillSlot(h, i, master_key, secret, iterations, iter_time_ms, area));
  std::vector<uint8_t> hdr = EncodeLuksHeader(h);
  std::copy(hdr.begin(), hdr.end(), area.begin());
  return i;
}

absl::Status EraseKeySlot(LuksHeader& h, absl::Span<uint8_t> area,
                          size_t slot, bool allow_last) {
  if (slot >= kLuksNumSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("key slot ", slot, " does not exist (0..7)"));
  }
  size_t enabled = 0;
  for (const LuksKeySlot& s : h.slots) enabled += s.enabled();
  if (h.slots[slot].enabled() && enabled == 1 && !allow_last) {
    return absl::FailedPreconditionError(
        "refusing to erase the last enabled LUKS key slot (the image would "
        "be unreadable)");
  }
  LuksKeySlot& s = h.slots[slot];
  // Overwrite the material with random bytes, so the old secret no longer
  // yields the master key even from a copy of this area.
  const uint64_t off = uint64_t{s.key_offset} * kLuksSectorSize;
  const uint64_t len = SlotMaterialBytes(h, s);
  if (off + len > area.size()) {
    return absl::DataLossError(absl::StrCat(
        "LUKS key slot ", slot, " material lies past the area"));
  }
  RETURN_IF_ERROR(RandomBytes(area.subspan(off, len)));
  s.active = kLuksSlotDisabled;
  s.iterations = 0;
  s.salt.fill(0);
  std::vector<uint8_t> hdr = EncodeLuksHeader(h);
  std::copy(hdr.begin(), hdr.end(), area.begin());
  return absl::OkStatus();
}

}  // namespace qcow2::internal
