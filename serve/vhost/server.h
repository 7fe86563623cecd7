// SPDX-License-Identifier: Apache-2.0
// A vhost-user-blk back-end serving one open image: listens on a Unix
// socket, serves one front-end connection at a time, and goes back to
// listening when the front-end goes away (a VMM restarted or killed);
// the image, its Queues and the loops stay up all along. Every request
// the guest saw complete is in the image before the next connection is
// served (a closing connection's requests are drained first).
#ifndef QCOW2_SERVE_VHOST_SERVER_H_
#define QCOW2_SERVE_VHOST_SERVER_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "qcow2/image.h"

namespace qcow2::vhost {

struct ServerOptions {
  std::string socket_path;
  int num_queues = 1;       // virtqueues offered (1 to 64)
  int loops = 0;            // event loops; 0: min(num_queues, CPUs)
  int queue_depth = 256;    // requests in flight per loop
  bool read_only = false;
  std::string serial;       // GET_ID (20 bytes at most are sent)
};

// Serves until SIGINT or SIGTERM (blocked in every thread of the process
// from here on and taken through a signalfd), then stops the loops after
// draining them. `listening` is called once the socket accepts
// connections (for --fork). Errors: the socket cannot be bound, a loop
// cannot start.
absl::Status Serve(Image* image, const ServerOptions& opts,
                   const std::function<void()>& listening);

}  // namespace qcow2::vhost

#endif  // QCOW2_SERVE_VHOST_SERVER_H_
