// SPDX-License-Identifier: Apache-2.0
// TLS for the NBD server (GnuTLS), over memory buffers: the event loop
// moves the ciphertext between the socket and a session, so TLS costs no
// thread and no blocking call.
#ifndef QCOW2_SERVE_NBD_TLS_H_
#define QCOW2_SERVE_NBD_TLS_H_

#include <gnutls/gnutls.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace qcow2::nbd {

class TlsSession;

// Server credentials: x509 (a directory with ca-cert.pem, server-cert.pem
// and server-key.pem, as QEMU's tls-creds-x509) and/or PSK (a psktool
// file of "username:hexkey" lines, as QEMU's tls-creds-psk keys.psk).
class Tls {
 public:
  // Either may be empty, not both.
  static absl::StatusOr<std::shared_ptr<Tls>> Load(const std::string& x509_dir,
                                                   const std::string& psk_file);
  ~Tls();
  Tls(const Tls&) = delete;
  Tls& operator=(const Tls&) = delete;

  absl::StatusOr<std::unique_ptr<TlsSession>> NewSession() const;

 private:
  Tls() = default;
  gnutls_certificate_credentials_t x509_ = nullptr;
  gnutls_psk_server_credentials_t psk_ = nullptr;
};

// One connection's TLS session, fed with received ciphertext; whatever it
// has to send collects in an output buffer.
class TlsSession {
 public:
  ~TlsSession();

  void Feed(const uint8_t* data, size_t len);
  // Advances the handshake: 1 done, 0 needs more input, -1 failed (`err`).
  int Handshake(std::string* err);
  // Plaintext into `buf`: bytes read, 0 when more input is needed, -1 at
  // the end of the stream or an error (`err`, empty for a clean end).
  long Read(uint8_t* buf, size_t len, std::string* err);
  // Encrypts `len` bytes into the output buffer.
  bool Write(const void* data, size_t len);
  // The ciphertext to send, emptied.
  std::string TakeOutput();

 private:
  friend class Tls;
  TlsSession() = default;
  static ssize_t Pull(gnutls_transport_ptr_t self, void* buf, size_t len);
  static ssize_t Push(gnutls_transport_ptr_t self, const void* buf,
                      size_t len);

  gnutls_session_t session_ = nullptr;
  std::vector<uint8_t> in_;
  size_t in_pos_ = 0;
  std::string out_;
};

}  // namespace qcow2::nbd

#endif  // QCOW2_SERVE_NBD_TLS_H_
