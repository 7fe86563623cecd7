// SPDX-License-Identifier: Apache-2.0
#include "serve/nbd/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "serve/nbd/conn.h"
#include "serve/nbd/protocol.h"

namespace qcow2::nbd {

Server::Server(Image* image, ServerOptions opts)
    : image_(image), opts_(std::move(opts)) {}

Server::~Server() = default;

absl::StatusOr<std::unique_ptr<Server>> Server::Create(Image* image,
                                                       ServerOptions opts) {
  if (opts.listen_fds.empty()) {
    return absl::InvalidArgumentError("the NBD server has no socket to listen on");
  }
  if (opts.loops <= 0) {
    opts.loops = std::clamp<int>(std::thread::hardware_concurrency(), 1, 8);
  }
  std::unique_ptr<Server> server(new Server(image, std::move(opts)));
  for (int i = 0; i < server->opts_.loops; ++i) {
    auto loop = Loop::Create(server.get(), image, i);
    if (!loop.ok()) return loop.status();
    server->loops_.push_back(std::move(loop).value());
  }
  return server;
}

absl::Status Server::Run() {
  std::vector<std::thread> threads;
  for (size_t i = 1; i < loops_.size(); ++i) {
    threads.emplace_back([this, i] { loops_[i]->Run(); });
  }
  loops_[0]->Run();
  for (std::thread& t : threads) t.join();
  absl::Status result;
  for (auto& loop : loops_) {
    absl::Status s = loop->Finish();
    if (result.ok()) result = s;
  }
  return result;
}

void Server::Stop() {
  for (auto& loop : loops_) loop->Stop();
}

namespace {

absl::Status SocketError(const std::string& what) {
  return absl::ErrnoToStatus(errno, what);
}

}  // namespace

absl::StatusOr<int> ListenUnix(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path ", path, " is longer than ",
                     sizeof(addr.sun_path) - 1, " bytes"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return SocketError("socket(AF_UNIX)");
  ::unlink(path.c_str());  // a stale socket of an earlier server
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(fd, 128) != 0) {
    absl::Status s = SocketError("listening on " + path);
    ::close(fd);
    return s;
  }
  return fd;
}

absl::StatusOr<int> ListenTcp(const std::string& addr, int port) {
  sockaddr_storage ss{};
  socklen_t len;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (::inet_pton(AF_INET, addr.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    len = sizeof *v4;
  } else if (::inet_pton(AF_INET6, addr.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    len = sizeof *v6;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bind '", addr, "': expected a numeric IPv4 or IPv6 address"));
  }
  int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return SocketError("socket(AF_INET)");
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 ||
      ::listen(fd, 128) != 0) {
    absl::Status s =
        SocketError(absl::StrCat("listening on ", addr, " port ", port));
    ::close(fd);
    return s;
  }
  return fd;
}

}  // namespace qcow2::nbd
