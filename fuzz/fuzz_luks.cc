// SPDX-License-Identifier: Apache-2.0
// fuzz_luks: the LUKS1 header parser and key-slot unlock (lib/crypto), and
// the qcow2 crypto header extension (lib/format/crypto_ext), on hostile
// bytes.
//
// Input: bytes 0..3 (big-endian) give the size of the encryption area
// (at most 2.5 MiB); the rest of the input is its start (a LUKS header and
// whatever follows), zero-padded to that size. Bytes 4..19, when present,
// are also fed as the 16-byte crypto header extension of a fixed header.
//
// Checked:
//  - no crash, no read outside the area (ASan);
//  - DecodeLuksHeader fails only with kDataLoss or kUnimplemented;
//  - a header that parses re-encodes to bytes that parse to the same
//    fields;
//  - when every PBKDF2 count is small (so the run stays fast), UnlockLuks
//    with a fixed passphrase returns a key of key_bytes or fails with
//    kPermissionDenied / kFailedPrecondition, never anything else;
//  - DecodeCryptoExtension fails only with kDataLoss.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "lib/base/endian.h"
#include "lib/crypto/luks_header.h"
#include "lib/crypto/luks_keys.h"
#include "lib/format/crypto_ext.h"
#include "lib/format/header.h"

namespace qcow2::fuzz {
namespace {

using namespace ::qcow2::internal;  // NOLINT

// QEMU's largest area (64-byte keys) is 2068480 bytes.
constexpr uint64_t kMaxArea = 5u << 19;
constexpr uint32_t kMaxFuzzIterations = 4;

bool Cheap(const LuksHeader& h) {
  if (h.mk_digest_iterations > kMaxFuzzIterations) return false;
  for (const LuksKeySlot& s : h.slots) {
    if (s.enabled() && s.iterations > kMaxFuzzIterations) return false;
  }
  return true;
}

void CheckSameFields(const LuksHeader& a, const LuksHeader& b) {
  if (a.cipher_name != b.cipher_name || a.cipher_mode != b.cipher_mode ||
      a.hash_spec != b.hash_spec || a.key_bytes != b.key_bytes ||
      a.payload_offset != b.payload_offset ||
      a.mk_digest != b.mk_digest ||
      a.mk_digest_iterations != b.mk_digest_iterations) {
    Die("LUKS header changed across encode/decode");
  }
  for (size_t i = 0; i < kLuksNumSlots; ++i) {
    const LuksKeySlot &x = a.slots[i], &y = b.slots[i];
    if (x.active != y.active || x.iterations != y.iterations ||
        x.salt != y.salt || x.key_offset != y.key_offset ||
        x.stripes != y.stripes) {
      Die("LUKS key slot %zu changed across encode/decode", i);
    }
  }
}

void FuzzLuks(const uint8_t* data, size_t size) {
  if (size < 4) return;
  uint64_t area_size = LoadBE32(data) % (kMaxArea + 1);
  std::vector<uint8_t> area(data + 4, data + size);
  if (area.size() < area_size) area.resize(area_size, 0);
  auto h = DecodeLuksHeader(area, "fuzz");
  if (!h.ok()) {
    auto c = h.status().code();
    if (c != absl::StatusCode::kDataLoss &&
        c != absl::StatusCode::kUnimplemented) {
      Die("DecodeLuksHeader: unexpected status %s",
          h.status().ToString().c_str());
    }
    return;
  }
  // Re-encode in place (the area can be megabytes: no copy of it).
  std::vector<uint8_t> original(area.begin(), area.begin() + kLuksHeaderSize);
  std::vector<uint8_t> hdr = EncodeLuksHeader(*h);
  std::copy(hdr.begin(), hdr.end(), area.begin());
  auto h2 = DecodeLuksHeader(area, "fuzz");
  if (!h2.ok()) Die("re-encoded header fails: %s", h2.status().ToString().c_str());
  CheckSameFields(*h, *h2);
  std::copy(original.begin(), original.end(), area.begin());
  if (!Cheap(*h)) return;
  const uint8_t pass[] = {'p', 'a', 's', 's'};
  auto key = UnlockLuks(*h, area, pass, "fuzz");
  if (key.ok()) {
    if (key->size() != h->key_bytes) Die("unlocked key has the wrong size");
  } else if (key.status().code() != absl::StatusCode::kPermissionDenied &&
             key.status().code() != absl::StatusCode::kFailedPrecondition) {
    Die("UnlockLuks: unexpected status %s", key.status().ToString().c_str());
  }
}

void FuzzExtension(const uint8_t* data, size_t size) {
  if (size < 4 + kCryptoExtSize) return;
  Header h;
  h.cluster_bits = 16;
  h.crypt_method = kCryptLuks;
  h.refcount_table_offset = 1 << 16;
  h.refcount_table_clusters = 1;
  h.l1_table_offset = 3 << 16;
  h.l1_size = 2;
  h.nb_snapshots = 1;
  h.snapshots_offset = 5 << 16;
  h.other_extensions.push_back(RawExtension{
      kExtCrypto, std::vector<uint8_t>(data + 4, data + 4 + kCryptoExtSize)});
  auto e = DecodeCryptoExtension(h, 64ull << 16, "fuzz");
  if (!e.ok() && e.status().code() != absl::StatusCode::kDataLoss) {
    Die("DecodeCryptoExtension: unexpected status %s",
        e.status().ToString().c_str());
  }
  if (e.ok() && (!*e || (*e)->offset % (1 << 16) != 0 ||
                 (*e)->offset + (*e)->length > (64ull << 16))) {
    Die("DecodeCryptoExtension accepted an area outside the file");
  }
}

}  // namespace
}  // namespace qcow2::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qcow2::fuzz::FuzzLuks(data, size);
  qcow2::fuzz::FuzzExtension(data, size);
  return 0;
}
