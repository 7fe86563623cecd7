// SPDX-License-Identifier: Apache-2.0
// An NBD server over io_uring on libqcow2's public API.
//
//   qcow2::nbd::ServerOptions opts;   // export, listeners, loops ...
//   auto server = qcow2::nbd::Server::Create(image.get(), opts);
//   (*server)->Run();                 // until Stop() (signal-safe)
//
// A few event loops (threads), each with its own io_uring that carries the
// loop's sockets (accept, recv, send) and the readiness of the loop's own
// qcow2::Queue (its eventfd polled on the same ring). A connection lives on
// the loop that accepted it: its requests are parsed, submitted to that
// loop's Queue, and answered from the Queue's callbacks on the same thread,
// with no hand-off. Requests are pipelined; replies are gathered into one
// sendmsg (headers and payload buffers as iovecs); READ payloads are read
// by the Queue straight into the buffer that is sent, and WRITE payloads are
// received straight into the buffer the Queue writes from.
#ifndef QCOW2_SERVE_NBD_SERVER_H_
#define QCOW2_SERVE_NBD_SERVER_H_

#include <atomic>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "qcow2/image.h"
#include "serve/nbd/codec.h"
#include "serve/nbd/tls.h"

namespace qcow2::nbd {


struct ServerOptions {
  ExportConfig export_config;
  // Listening sockets (bound, listening, owned by the caller).
  std::vector<int> listen_fds;
  // Event loops. Default: one per CPU, at most 8.
  int loops = 0;
  // At most this many clients connected at once (0: no limit); others
  // are closed as soon as they connect.
  int max_connections = 0;
  // Requests in flight per loop's Queue.
  int queue_depth = 512;
  // TLS credentials (nullptr: STARTTLS is refused).
  std::shared_ptr<Tls> tls;
  // Log connection events and client errors on stderr.
  bool verbose = false;
};

class Loop;

class Server {
 public:
  // REQUIRES: `image` outlives the server.
  static absl::StatusOr<std::unique_ptr<Server>> Create(Image* image,
                                                        ServerOptions opts);
  ~Server();

  // Serves until Stop(); then stops accepting, lets requests in flight
  // finish and their replies go out (for at most a few seconds to a client
  // that does not read), closes every connection and returns. The image is
  // left to the caller to flush and close.
  absl::Status Run();

  // Async-signal-safe; any thread.
  void Stop();

  const ServerOptions& options() const { return opts_; }
  std::atomic<int>& connections() { return connections_; }
  // CACHE's copy-on-read submits a read and the write of what it read
  // back to back, so that no write of another loop's connection lands
  // between them (it would be overwritten with the older data). Writes
  // take it shared, CACHE exclusive, when more than one loop runs.
  std::shared_mutex& cor_mutex() { return cor_mu_; }
  bool many_loops() const { return loops_.size() > 1; }

 private:
  Server(Image* image, ServerOptions opts);
  Image* image_;
  ServerOptions opts_;
  std::vector<std::unique_ptr<Loop>> loops_;
  std::atomic<int> connections_{0};
  std::shared_mutex cor_mu_;
};

// Listening sockets for `qcowtool serve`.
absl::StatusOr<int> ListenUnix(const std::string& path);
// `addr` is a numeric IPv4 or IPv6 address ("127.0.0.1", "::1", "::").
absl::StatusOr<int> ListenTcp(const std::string& addr, int port);

}  // namespace qcow2::nbd

#endif  // QCOW2_SERVE_NBD_SERVER_H_
