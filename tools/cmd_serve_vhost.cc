// SPDX-License-Identifier: Apache-2.0
// qcowtool serve --vhost-user-blk: exports an image (and its backing
// chain) to a VMM as a vhost-user-blk device (serve/vhost/). Unlike the
// NBD export it runs in this process: the image is opened here, locked
// against other writers while served, and closed cleanly on SIGINT or
// SIGTERM.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "qcow2/image.h"
#include "serve/vhost/server.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/serve_cli.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool serve --vhost-user-blk SOCKET [--num-queues N] [-r]\n"
    "                      [-f FMT] [--direct] [--fork] [--pid-file FILE]\n"
    "                      IMAGE\n"
    "\n"
    "Exports IMAGE and its backing chain to a VMM as a vhost-user-blk device\n"
    "(QEMU's vhost-user-blk-pci, cloud-hypervisor, crosvm, Firecracker:\n"
    "docs/vhost-user-blk.md). Listens on SOCKET and serves one VMM at a\n"
    "time; when it goes away (restarted, killed) the next one is served.\n"
    "Runs until SIGINT or SIGTERM, which close the image cleanly. The image\n"
    "stays locked against other writers while it is served.\n"
    "\n"
    "  --vhost-user-blk SOCKET\n"
    "                  the Unix socket to listen on\n"
    "  --num-queues N  virtqueues offered (1 to 64, default 1); one event\n"
    "                  loop per queue, at most one per CPU\n"
    "  -f FMT          format of IMAGE: qcow2 or raw. Required unless IMAGE\n"
    "                  is qcow2: a guest-facing export never probes\n"
    "  -r, --read-only export read-only (the guest sees a read-only disk)\n"
    "  --direct        O_DIRECT for every file of the chain\n"
    "  --fork          go to the background once the socket listens\n"
    "  --pid-file FILE write the server's process id to FILE once the\n"
    "                  socket listens\n"
    "  -h, --help      show this help\n"
    "\n";

struct VhostArgs {
  std::string socket;
  int num_queues = 1;
  std::string format;
  bool read_only = false;
  bool direct = false;
  bool fork = false;
  std::string pid_file;
  std::string image;
  OpenPolicy secrets;  // --object, --image-opts
};

std::string Usage() {
  return std::string(kUsage) + kSecretHelp + kExitStatusHelp;
}

// Returns -1 when parsed, else the exit status to return.
int ParseArgs(int argc, char** argv, VhostArgs* a) {
  OptionParser parser(Usage());
  parser.Text("vhost-user-blk", 0, &a->socket)
      .Add("num-queues", 0, OptionParser::Arg::kRequired,
           CountOption(parser, "--num-queues", 1, 64, "1 to 64",
                       [a](const char*, int n) { a->num_queues = n; }));
  const ServeCommonArgs common = {&a->format, &a->read_only, &a->direct,
                                  &a->fork,    &a->pid_file,  &a->secrets};
  AddServeCommonOptions(&parser, common);
  std::vector<std::string> operands;
  if (int rc = parser.Parse(argc, argv, &operands); rc != kGoOn) return rc;
  if (int rc = ExpectServedImage(parser, operands, common, &a->image);
      rc != kGoOn) {
    return rc;
  }
  if (a->socket.empty()) return UsageError(Usage(), "no SOCKET given");
  return -1;
}

absl::Status WritePidFile(const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  out << ::getpid() << "\n";
  out.close();
  if (!out) {
    return absl::ErrnoToStatus(errno, absl::StrCat("writing the pid file ",
                                                   path));
  }
  return absl::OkStatus();
}

// Opens the image and serves it; `ready_fd` (--fork) gets one byte once
// the socket listens.
int OpenAndServe(const VhostArgs& a, int ready_fd) {
  OpenOptions opts;
  opts.read_write = !a.read_only;
  // No probing for a guest-facing export: without -f the image must be
  // qcow2 (a raw file whose guest wrote a qcow2 header would otherwise
  // be served as that qcow2 image on the next start).
  opts.format = a.format.empty() ? "qcow2" : a.format;
  opts.direct_io = a.direct;
  opts.key_secret = a.secrets.key_secret;
  opts.backing_key_secrets = a.secrets.backing_key_secrets;
  auto image = Image::Open(a.image, opts);
  if (!image.ok()) {
    if (a.format.empty() && absl::IsDataLoss(image.status())) {
      return ReportError(absl::InvalidArgumentError(absl::StrCat(
          image.status().message(),
          " (without -f the image must be qcow2; name a raw image with -f raw)")));
    }
    return ReportError(image.status());
  }
  vhost::ServerOptions so;
  so.socket_path = a.socket;
  so.num_queues = a.num_queues;
  so.read_only = a.read_only;
  so.serial = "qcowtool";
  absl::Status pid_status;
  absl::Status s = vhost::Serve(image->get(), so, [&] {
    if (!a.pid_file.empty()) pid_status = WritePidFile(a.pid_file);
    if (ready_fd >= 0) {
      const char ok = pid_status.ok() ? 'y' : 'n';
      (void)!::write(ready_fd, &ok, 1);
      ::close(ready_fd);
    }
  });
  if (!pid_status.ok()) ReportError(pid_status);
  absl::Status closed = (*image)->Close();
  if (!s.ok()) return ReportError(s);
  if (!closed.ok()) return ReportError(closed);
  return kExitOk;
}

// --fork: the child serves; the parent returns once the socket listens
// (exit 0) or the child failed (its error is on stderr already).
int ForkAndServe(const VhostArgs& a) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return ReportError(absl::ErrnoToStatus(errno, "pipe"));
  }
  const pid_t child = ::fork();
  if (child < 0) return ReportError(absl::ErrnoToStatus(errno, "fork"));
  if (child == 0) {
    ::close(pipe_fds[0]);
    ::setsid();
    if (int null = ::open("/dev/null", O_RDWR); null >= 0) {
      ::dup2(null, STDIN_FILENO);
      ::dup2(null, STDOUT_FILENO);
      ::close(null);
    }
    ::_exit(OpenAndServe(a, pipe_fds[1]));
  }
  ::close(pipe_fds[1]);
  char ok = 0;
  ssize_t n;
  do {
    n = ::read(pipe_fds[0], &ok, 1);
  } while (n < 0 && errno == EINTR);
  ::close(pipe_fds[0]);
  return n == 1 && ok == 'y' ? kExitOk : kExitImageError;
}

}  // namespace

bool IsVhostUserBlkServe(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") return false;
    if (arg == "--vhost-user-blk" || arg.starts_with("--vhost-user-blk=")) {
      return true;
    }
  }
  return false;
}

int RunServeVhostUserBlk(int argc, char** argv) {
  VhostArgs args;
  if (int rc = ParseArgs(argc, argv, &args); rc >= 0) return rc;
  return args.fork ? ForkAndServe(args) : OpenAndServe(args, -1);
}

}  // namespace qcow2::tool
