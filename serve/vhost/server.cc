// SPDX-License-Identifier: Apache-2.0
#include "serve/vhost/server.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "serve/vhost/device.h"
#include "serve/vhost/socket_io.h"
#include "serve/vhost/worker.h"

namespace qcow2::vhost {
namespace {

void Log(const std::string& line) {
  std::fprintf(stderr, "qcowtool: vhost-user-blk: %s\n", line.c_str());
}

absl::StatusOr<int> Listen(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path ", path, " is longer than ",
                     sizeof addr.sun_path - 1, " bytes"));
  }
  path.copy(addr.sun_path, path.size());
  // A socket left by an earlier server that died is replaced; any other
  // file is not.
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    ::unlink(path.c_str());
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::ErrnoToStatus(errno, "socket");
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(fd, 4) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat("listening on ", path));
  }
  return fd;
}

enum class Ending { kClosed, kSignal };

// Serves one connection until the front-end leaves, breaks the protocol
// or a loop finds a broken ring; or a signal comes.
Ending ServeConnection(int conn, int error_fd, int signal_fd, Device* device) {
  pollfd fds[3] = {{conn, POLLIN, 0}, {error_fd, POLLIN, 0},
                   {signal_fd, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      Log(absl::StrCat("poll: ", std::strerror(errno)));
      return Ending::kClosed;
    }
    if (fds[2].revents) return Ending::kSignal;
    if (fds[1].revents) {
      uint64_t n;
      (void)!::read(error_fd, &n, sizeof n);
      return Ending::kClosed;  // the loop logged what was wrong
    }
    if (!fds[0].revents) continue;
    absl::StatusOr<RawMessage> raw = ReadMessage(conn);
    if (!raw.ok()) {
      if (absl::IsUnavailable(raw.status())) {
        Log("the front-end closed the connection");
      } else {
        Log(absl::StrCat(raw.status().message(), "; closing the connection"));
      }
      return Ending::kClosed;
    }
    absl::StatusOr<Message> m =
        DecodeMessage(raw->header, raw->payload, raw->fds);
    absl::StatusOr<std::vector<uint8_t>> reply =
        m.ok() ? device->Handle(&*m) : m.status();
    if (m.ok()) raw->fds = m->fds;  // -1 where the device kept one
    CloseAll(&raw->fds);
    if (!reply.ok()) {
      Log(absl::StrCat(reply.status().message(), "; closing the connection"));
      return Ending::kClosed;
    }
    if (!reply->empty()) {
      if (absl::Status s = WriteAll(conn, *reply); !s.ok()) {
        Log(absl::StrCat(s.message(), "; closing the connection"));
        return Ending::kClosed;
      }
    }
  }
}

}  // namespace

absl::Status Serve(Image* image, const ServerOptions& opts,
                   const std::function<void()>& listening) {
  if (opts.num_queues < 1 || opts.num_queues > kMaxQueues) {
    return absl::InvalidArgumentError(
        absl::StrCat("num-queues ", opts.num_queues, ": 1 to ", kMaxQueues));
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &sigs, nullptr);  // the loops inherit it
  ::signal(SIGPIPE, SIG_IGN);
  const int signal_fd = ::signalfd(-1, &sigs, SFD_CLOEXEC);
  if (signal_fd < 0) return absl::ErrnoToStatus(errno, "signalfd");
  absl::Cleanup close_signal = [&] { ::close(signal_fd); };

  DeviceShared shared;
  shared.geometry.capacity_bytes = image->size();
  shared.geometry.num_queues = static_cast<uint16_t>(opts.num_queues);
  shared.geometry.read_only = opts.read_only;
  shared.serial = opts.serial.substr(0, kIdBytes);
  if (std::vector<LayerInfo> chain = image->GetChainInfo();
      !chain.empty() && chain[0].cluster_size != 0) {
    shared.discard_granularity = chain[0].cluster_size;
  }
  shared.error_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (shared.error_fd < 0) return absl::ErrnoToStatus(errno, "eventfd");
  absl::Cleanup close_error = [&] { ::close(shared.error_fd); };

  int loops = opts.loops;
  if (loops <= 0) {
    loops = std::min<int>(opts.num_queues,
                          std::max(1u, std::thread::hardware_concurrency()));
  }
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<Worker*> raw_workers;
  for (int i = 0; i < loops; ++i) {
    workers.push_back(
        std::make_unique<Worker>(image, &shared, opts.queue_depth));
    if (absl::Status s = workers.back()->Start(); !s.ok()) return s;
    raw_workers.push_back(workers.back().get());
  }
  Device device(&shared, raw_workers);

  absl::StatusOr<int> listen_fd = Listen(opts.socket_path);
  if (!listen_fd.ok()) return listen_fd.status();
  absl::Cleanup close_listen = [&] {
    ::close(*listen_fd);
    ::unlink(opts.socket_path.c_str());
  };
  if (listening) listening();

  pollfd fds[2] = {{*listen_fd, POLLIN, 0}, {signal_fd, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, "poll");
    }
    if (fds[1].revents) break;
    if (!fds[0].revents) continue;
    const int conn = ::accept4(*listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return absl::ErrnoToStatus(errno, "accept");
    }
    Log("front-end connected");
    const Ending end = ServeConnection(conn, shared.error_fd, signal_fd, &device);
    // Everything taken from the guest completes before the memory goes.
    device.Reset();
    ::close(conn);
    if (end == Ending::kSignal) break;
  }
  device.Reset();
  return absl::OkStatus();
}

}  // namespace qcow2::vhost
