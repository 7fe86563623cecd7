// SPDX-License-Identifier: Apache-2.0
#include "serve/vhost/socket_io.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qcow2::vhost {
namespace {

// Reads exactly `len` bytes; false at end of file before any byte.
absl::StatusOr<bool> ReadFull(int fd, uint8_t* buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::recv(fd, buf + done, len - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, "reading the socket");
    if (n == 0) {
      if (done == 0) return false;
      return absl::InvalidArgumentError(
          absl::StrCat("connection closed inside a message (", done, " of ",
                       len, " bytes)"));
    }
    done += n;
  }
  return true;
}

}  // namespace

void CloseAll(std::vector<int>* fds) {
  for (int& fd : *fds) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  fds->clear();
}

absl::StatusOr<RawMessage> ReadMessage(int fd) {
  RawMessage m;
  uint8_t hdr[kHeaderSize];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  iovec iov{hdr, sizeof hdr};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return absl::ErrnoToStatus(errno, "reading the socket");
  if (n == 0) return absl::UnavailableError("the front-end closed the connection");
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int v;
      std::memcpy(&v, CMSG_DATA(c) + i * sizeof(int), sizeof v);
      m.fds.push_back(v);
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    CloseAll(&m.fds);
    return absl::InvalidArgumentError(
        absl::StrCat("message with more than ", kMaxFds, " descriptors"));
  }
  if (static_cast<size_t>(n) < sizeof hdr) {
    auto rest = ReadFull(fd, hdr + n, sizeof hdr - n);
    if (!rest.ok() || !*rest) {
      CloseAll(&m.fds);
      return absl::InvalidArgumentError("connection closed inside a header");
    }
  }
  auto h = DecodeHeader(absl::MakeConstSpan(hdr, sizeof hdr));
  if (!h.ok()) {
    CloseAll(&m.fds);
    return h.status();
  }
  m.header = *h;
  m.payload.resize(h->size);
  if (h->size > 0) {
    auto got = ReadFull(fd, m.payload.data(), h->size);
    if (!got.ok() || !*got) {
      CloseAll(&m.fds);
      return got.ok() ? absl::InvalidArgumentError(absl::StrCat(
                            RequestName(h->request), ": connection closed "
                            "before the payload"))
                      : got.status();
    }
  }
  return m;
}

absl::Status WriteAll(int fd, const std::vector<uint8_t>& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, "writing the socket");
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace qcow2::vhost
