// SPDX-License-Identifier: Apache-2.0
#include "lib/crypto/algorithms.h"

#include <errno.h>
#include <string.h>
#include <nettle/hmac.h>
#include <nettle/nettle-meta.h>
#include <nettle/pbkdf2.h>
#include <nettle/ripemd160.h>
#include <sys/random.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qcow2::internal {

namespace {

const CipherAlg kCiphers[] = {
    {"aes-128", "aes", 16, &nettle_aes128},
    {"aes-192", "aes", 24, &nettle_aes192},
    {"aes-256", "aes", 32, &nettle_aes256},
    {"cast5-128", "cast5", 16, &nettle_cast128},
    {"serpent-128", "serpent", 16, &nettle_serpent128},
    {"serpent-192", "serpent", 24, &nettle_serpent192},
    {"serpent-256", "serpent", 32, &nettle_serpent256},
    {"twofish-128", "twofish", 16, &nettle_twofish128},
    {"twofish-192", "twofish", 24, &nettle_twofish192},
    {"twofish-256", "twofish", 32, &nettle_twofish256},
};

const HashAlg kHashes[] = {
    {"md5", &nettle_md5},           {"sha1", &nettle_sha1},
    {"sha224", &nettle_sha224},     {"sha256", &nettle_sha256},
    {"sha384", &nettle_sha384},     {"sha512", &nettle_sha512},
    {"ripemd160", &nettle_ripemd160},
};

// nettle's generic HMAC keeps three hash contexts; pbkdf2() drives it
// through an update and a digest callback on one opaque pointer.
struct HmacState {
  const nettle_hash* hash;
  std::unique_ptr<uint8_t[]> outer, inner, state;
  size_t ctx_size;

  explicit HmacState(const nettle_hash* h)
      : hash(h),
        outer(new uint8_t[h->context_size]),
        inner(new uint8_t[h->context_size]),
        state(new uint8_t[h->context_size]),
        ctx_size(h->context_size) {}
  ~HmacState() {
    // The contexts hold the keyed pads: wipe them.
    explicit_bzero(outer.get(), ctx_size);
    explicit_bzero(inner.get(), ctx_size);
    explicit_bzero(state.get(), ctx_size);
  }
  static void Update(void* p, size_t len, const uint8_t* data) {
    auto* s = static_cast<HmacState*>(p);
    hmac_update(s->state.get(), s->hash, len, data);
  }
  static void Digest(void* p, size_t len, uint8_t* out) {
    auto* s = static_cast<HmacState*>(p);
    hmac_digest(s->outer.get(), s->inner.get(), s->state.get(), s->hash, len,
                out);
  }
};

}  // namespace

size_t CipherAlg::block_size() const { return impl->block_size; }
size_t HashAlg::digest_len() const { return impl->digest_size; }

const CipherAlg* FindCipher(std::string_view name) {
  for (const CipherAlg& c : kCiphers) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

const CipherAlg* FindCipherByLuksName(std::string_view luks_name,
                                      size_t key_len) {
  for (const CipherAlg& c : kCiphers) {
    if (luks_name == c.luks_name && key_len == c.key_len) return &c;
  }
  return nullptr;
}

const HashAlg* FindHash(std::string_view name) {
  for (const HashAlg& h : kHashes) {
    if (name == h.name) return &h;
  }
  return nullptr;
}

absl::StatusOr<CipherMode> ParseCipherMode(std::string_view name) {
  if (name == "ecb") return CipherMode::kEcb;
  if (name == "cbc") return CipherMode::kCbc;
  if (name == "xts") return CipherMode::kXts;
  if (name == "ctr") return CipherMode::kCtr;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown cipher mode '", std::string(name), "' (ecb, cbc, xts, ctr)"));
}

absl::StatusOr<IvGen> ParseIvGen(std::string_view name) {
  if (name == "plain") return IvGen::kPlain;
  if (name == "plain64") return IvGen::kPlain64;
  if (name == "essiv") return IvGen::kEssiv;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown IV generator '", std::string(name), "' (plain, plain64, essiv)"));
}

const char* CipherModeName(CipherMode mode) {
  switch (mode) {
    case CipherMode::kEcb: return "ecb";
    case CipherMode::kCbc: return "cbc";
    case CipherMode::kXts: return "xts";
    case CipherMode::kCtr: return "ctr";
  }
  return "?";
}

const char* IvGenName(IvGen ivgen) {
  switch (ivgen) {
    case IvGen::kPlain: return "plain";
    case IvGen::kPlain64: return "plain64";
    case IvGen::kEssiv: return "essiv";
  }
  return "?";
}

absl::StatusOr<const CipherAlg*> EssivCipher(const CipherAlg& cipher,
                                             const HashAlg& hash) {
  if (cipher.key_len == hash.digest_len()) return &cipher;
  const CipherAlg* member =
      FindCipherByLuksName(cipher.luks_name, hash.digest_len());
  // cast5 has one key size: only a hash of that length (md5) fits it.
  if (member == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "essiv with hash ", hash.name, " needs a ", cipher.luks_name,
        " cipher with a ", hash.digest_len(), "-byte key; there is none"));
  }
  return member;
}

void HashParts(const HashAlg& hash,
               std::initializer_list<absl::Span<const uint8_t>> parts,
               absl::Span<uint8_t> out) {
  const nettle_hash* h = hash.impl;
  std::unique_ptr<uint8_t[]> ctx(new uint8_t[h->context_size]);
  h->init(ctx.get());
  for (absl::Span<const uint8_t> p : parts) h->update(ctx.get(), p.size(), p.data());
  h->digest(ctx.get(), out.size(), out.data());
  explicit_bzero(ctx.get(), h->context_size);
}

void Pbkdf2(const HashAlg& hash, absl::Span<const uint8_t> secret,
            absl::Span<const uint8_t> salt, uint32_t iterations,
            absl::Span<uint8_t> out) {
  HmacState s(hash.impl);
  hmac_set_key(s.outer.get(), s.inner.get(), s.state.get(), hash.impl,
               secret.size(), secret.data());
  pbkdf2(&s, &HmacState::Update, &HmacState::Digest, hash.digest_len(),
         iterations, salt.size(), salt.data(), out.size(), out.data());
}

absl::Status RandomBytes(absl::Span<uint8_t> out) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = getrandom(out.data() + done, out.size() - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, "getrandom");
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace qcow2::internal
