// SPDX-License-Identifier: Apache-2.0
#include "serve/nbd/tls.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace qcow2::nbd {
namespace {

absl::Status GnutlsError(int rc, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": ", gnutls_strerror(rc)));
}

}  // namespace

absl::StatusOr<std::shared_ptr<Tls>> Tls::Load(const std::string& x509_dir,
                                               const std::string& psk_file) {
  std::shared_ptr<Tls> tls(new Tls());
  if (!x509_dir.empty()) {
    int rc = gnutls_certificate_allocate_credentials(&tls->x509_);
    if (rc < 0) return GnutlsError(rc, "TLS credentials");
    const std::string ca = x509_dir + "/ca-cert.pem";
    rc = gnutls_certificate_set_x509_trust_file(tls->x509_, ca.c_str(),
                                                GNUTLS_X509_FMT_PEM);
    if (rc < 0) return GnutlsError(rc, "--tls-creds: loading " + ca);
    const std::string cert = x509_dir + "/server-cert.pem";
    const std::string key = x509_dir + "/server-key.pem";
    rc = gnutls_certificate_set_x509_key_file(
        tls->x509_, cert.c_str(), key.c_str(), GNUTLS_X509_FMT_PEM);
    if (rc < 0) {
      return GnutlsError(rc, "--tls-creds: loading " + cert + " and " + key);
    }
  }
  if (!psk_file.empty()) {
    int rc = gnutls_psk_allocate_server_credentials(&tls->psk_);
    if (rc < 0) return GnutlsError(rc, "TLS PSK credentials");
    rc = gnutls_psk_set_server_credentials_file(tls->psk_, psk_file.c_str());
    if (rc < 0) return GnutlsError(rc, "--tls-psk: loading " + psk_file);
  }
  if (tls->x509_ == nullptr && tls->psk_ == nullptr) {
    return absl::InvalidArgumentError("TLS needs --tls-creds or --tls-psk");
  }
  return tls;
}

Tls::~Tls() {
  if (x509_ != nullptr) gnutls_certificate_free_credentials(x509_);
  if (psk_ != nullptr) gnutls_psk_free_server_credentials(psk_);
}

absl::StatusOr<std::unique_ptr<TlsSession>> Tls::NewSession() const {
  std::unique_ptr<TlsSession> s(new TlsSession());
  int rc = gnutls_init(&s->session_, GNUTLS_SERVER | GNUTLS_NONBLOCK);
  if (rc < 0) return GnutlsError(rc, "gnutls_init");
  // The PSK key exchanges are not in NORMAL; QEMU adds the same ones.
  rc = gnutls_priority_set_direct(
      s->session_,
      psk_ != nullptr ? "NORMAL:+ECDHE-PSK:+DHE-PSK:+PSK" : "NORMAL",
      nullptr);
  if (rc < 0) return GnutlsError(rc, "gnutls_priority_set_direct");
  if (x509_ != nullptr) {
    rc = gnutls_credentials_set(s->session_, GNUTLS_CRD_CERTIFICATE, x509_);
    if (rc < 0) return GnutlsError(rc, "x509 credentials");
  }
  if (psk_ != nullptr) {
    rc = gnutls_credentials_set(s->session_, GNUTLS_CRD_PSK, psk_);
    if (rc < 0) return GnutlsError(rc, "PSK credentials");
  }
  gnutls_transport_set_ptr(s->session_, s.get());
  gnutls_transport_set_pull_function(s->session_, &TlsSession::Pull);
  gnutls_transport_set_push_function(s->session_, &TlsSession::Push);
  gnutls_handshake_set_timeout(s->session_, 0);
  return s;
}

TlsSession::~TlsSession() {
  if (session_ != nullptr) gnutls_deinit(session_);
}

ssize_t TlsSession::Pull(gnutls_transport_ptr_t self, void* buf, size_t len) {
  auto* s = static_cast<TlsSession*>(self);
  const size_t n = std::min(len, s->in_.size() - s->in_pos_);
  if (n == 0) {
    gnutls_transport_set_errno(s->session_, EAGAIN);
    return -1;
  }
  std::memcpy(buf, s->in_.data() + s->in_pos_, n);
  s->in_pos_ += n;
  if (s->in_pos_ == s->in_.size()) {
    s->in_.clear();
    s->in_pos_ = 0;
  }
  return static_cast<ssize_t>(n);
}

ssize_t TlsSession::Push(gnutls_transport_ptr_t self, const void* buf,
                         size_t len) {
  auto* s = static_cast<TlsSession*>(self);
  s->out_.append(static_cast<const char*>(buf), len);
  return static_cast<ssize_t>(len);
}

void TlsSession::Feed(const uint8_t* data, size_t len) {
  in_.insert(in_.end(), data, data + len);
}

int TlsSession::Handshake(std::string* err) {
  const int rc = gnutls_handshake(session_);
  if (rc == GNUTLS_E_SUCCESS) return 1;
  if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED) return 0;
  if (!gnutls_error_is_fatal(rc)) return 0;
  *err = absl::StrCat("TLS handshake: ", gnutls_strerror(rc));
  return -1;
}

long TlsSession::Read(uint8_t* buf, size_t len, std::string* err) {
  const ssize_t rc = gnutls_record_recv(session_, buf, len);
  if (rc > 0) return rc;
  if (rc == 0) return -1;  // close_notify
  if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED) return 0;
  if (rc == GNUTLS_E_PREMATURE_TERMINATION) return -1;
  if (!gnutls_error_is_fatal(rc)) return 0;
  *err = absl::StrCat("TLS: ", gnutls_strerror(rc));
  return -1;
}

bool TlsSession::Write(const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    // Pushing into memory never blocks: AGAIN does not happen.
    const ssize_t rc = gnutls_record_send(session_, p, len);
    if (rc < 0) return false;
    p += rc;
    len -= rc;
  }
  return true;
}

std::string TlsSession::TakeOutput() {
  std::string out;
  out.swap(out_);
  return out;
}

}  // namespace qcow2::nbd
