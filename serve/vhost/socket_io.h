// SPDX-License-Identifier: Apache-2.0
// Reading vhost-user messages (bytes and SCM_RIGHTS descriptors) from a
// connected Unix socket, and writing replies.
#ifndef QCOW2_SERVE_VHOST_SOCKET_IO_H_
#define QCOW2_SERVE_VHOST_SOCKET_IO_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "serve/vhost/protocol.h"

namespace qcow2::vhost {

struct RawMessage {
  Header header;
  std::vector<uint8_t> payload;
  std::vector<int> fds;  // owned: close what is not kept
};

// One message. kUnavailable when the peer closed the connection between
// messages; kInvalidArgument for a torn or malformed header, or too many
// descriptors (any that came are closed).
absl::StatusOr<RawMessage> ReadMessage(int fd);

absl::Status WriteAll(int fd, const std::vector<uint8_t>& bytes);

void CloseAll(std::vector<int>* fds);

}  // namespace qcow2::vhost

#endif  // QCOW2_SERVE_VHOST_SOCKET_IO_H_
