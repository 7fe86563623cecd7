// SPDX-License-Identifier: Apache-2.0
// qcowtool serve: exports an image (and its backing chain) over NBD with
// the project's own server (serve/nbd/: io_uring event loops on the public
// API), or, with --nbdkit, by running nbdkit with libqcow2's plugin
// (nbd/qcow2_plugin.cc).
//
// Own server: the image is opened here, the sockets listen, and the server
// runs until SIGTERM or SIGINT; then it stops accepting, finishes the
// requests in flight, flushes and closes the image. With --fork the child
// does all that and the parent returns once it listens (and wrote the pid
// file, if asked).
//
// --nbdkit: the image is opened once here with the same options, so a missing file,
// a malformed image or a lock held by another writer is reported the
// qcowtool way (exit 2) before nbdkit starts; then qcowtool execs nbdkit,
// whose process opens, serves and locks the image until it exits. With
// --fork and --pid-file, nbdkit runs as a child instead, and qcowtool
// returns once the pid file is written: nbdkit's first process exits as
// soon as its daemon is forked, before the daemon writes the file.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "qcow2/image.h"
#include "serve/nbd/server.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/serve_cli.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool serve [--socket PATH | [--bind ADDR] --port N] [-f FMT]\n"
    "                      [-r] [-U] [--export-name NAME] [--shared N]\n"
    "                      [--threads N] [--fork] [--pid-file FILE]\n"
    "                      [--direct] [--backing-root DIR] [-v]\n"
    "                      [--tls-creds DIR] [--tls-psk FILE] [--tls=MODE]\n"
    "                      [--bitmap NAME]...\n"
    "                      [--nbdkit [--sync|--queue]] IMAGE\n"
    "\n"
    "Exports IMAGE and its backing chain over NBD. Clients: qemu-img and\n"
    "qemu-io with 'nbd+unix:///?socket=PATH' (or nbd://HOST:PORT), nbdinfo,\n"
    "nbdcopy, nbdsh, fio --ioengine=nbd, nbdfuse, a VMM (docs/serving.md).\n"
    "Every connection shares one open image, so multi-conn is offered;\n"
    "writes are durable after an NBD flush or a FUA write. Meta contexts:\n"
    "base:allocation, qemu:allocation-depth and qemu:dirty-bitmap:NAME\n"
    "for each --bitmap NAME. Runs in the foreground\n"
    "until SIGINT or SIGTERM (which stop accepting, finish the requests in\n"
    "flight, flush and close the image cleanly) unless --fork is given.\n"
    "The image stays locked against other writers while it is served.\n"
    "\n"
    "  --socket PATH   listen on a Unix domain socket\n"
    "  --port N        listen on TCP port N (default: 10809 when no\n"
    "                  --socket is given)\n"
    "  --bind ADDR     the TCP address to listen on (numeric IPv4 or IPv6;\n"
    "                  default: 127.0.0.1 only, said on stderr)\n"
    "  -f FMT          format of IMAGE: qcow2 or raw (default: probe)\n"
    "  -r, --read-only export read-only (the image is opened read-only)\n"
    "  --export-name NAME\n"
    "                  the export's name; clients asking for another are\n"
    "                  refused (default: any name is accepted)\n"
    "  --shared N      at most N clients connected at once (default: no\n"
    "                  limit; qemu-nbd's default is 1)\n"
    "  --threads N     event loops (default: one per CPU, at most 8); with\n"
    "                  --nbdkit, nbdkit's worker threads (default: 16)\n"
    "  --fork          go to the background once the socket listens\n"
    "  --pid-file FILE write the server's process id to FILE\n"
    "  --direct        O_DIRECT for every file of the chain (bypass the\n"
    "                  host page cache, like qemu-nbd --cache=none)\n"
    "  -v, --verbose   log connections (with --nbdkit: nbdkit's debug\n"
    "                  messages)\n"
    "  --bitmap NAME   export the image's persistent dirty bitmap NAME as\n"
    "                  the meta context qemu:dirty-bitmap:NAME (repeatable;\n"
    "                  as qemu-nbd -B), for incremental backup\n"
    "  --tls-creds DIR x509 credentials: DIR/ca-cert.pem, server-cert.pem,\n"
    "                  server-key.pem (as QEMU's tls-creds-x509)\n"
    "  --tls-psk FILE  pre-shared keys, psktool's format (as QEMU's\n"
    "                  tls-creds-psk keys.psk)\n"
    "  --tls=MODE      off, on (STARTTLS offered) or require (clients\n"
    "                  without TLS refused); default: require with\n"
    "                  credentials, else off\n"
    "  --nbdkit        serve through nbdkit and the libqcow2 plugin instead\n"
    "  --sync          (--nbdkit) synchronous library calls in nbdkit's\n"
    "                  worker threads (the default without --direct)\n"
    "  --queue         (--nbdkit) one io_uring queue per worker thread (the\n"
    "                  default with --direct)\n";

constexpr char kHelpTail[] =
    "  -h, --help      show this help\n"
    "\n"
    "Environment (--nbdkit): QCOWTOOL_NBDKIT names the nbdkit binary (default: nbdkit\n"
    "on PATH); QCOWTOOL_NBDKIT_PLUGIN the plugin (default: the\n"
    "nbdkit-libqcow2-plugin.so next to qcowtool, else the installed one).\n"
    "\n";

std::string Usage() {
  return std::string(kUsage) + kForceShareHelp + kBackingRootHelp +
         kSecretHelp + kHelpTail + kExitStatusHelp;
}

struct ServeArgs {
  std::string socket;
  std::string port;
  std::string bind;
  bool nbdkit = false;
  std::string tls_creds;
  std::string tls_psk;
  std::string tls;  // off, on, require; empty: from the credentials
  std::vector<std::string> bitmaps;
  std::string format;
  bool read_only = false;
  bool force_share = false;
  std::string export_name;
  std::string shared;
  std::string threads;
  bool fork = false;
  std::string pid_file;
  bool sync = false;
  bool queue = false;
  bool direct = false;
  bool verbose = false;
  std::string backing_root;
  std::string image;
  OpenPolicy secrets;  // --object, --image-opts
};

// --bitmap NAME, each name once.
int TakeBitmap(const OptionParser& parser, const char* name,
               ServeArgs* args) {
  if (std::find(args->bitmaps.begin(), args->bitmaps.end(), name) !=
      args->bitmaps.end()) {
    return parser.Error(absl::StrCat("--bitmap ", name, " given twice"));
  }
  args->bitmaps.push_back(name);
  return kGoOn;
}

// --tls=off|on|require.
int TakeTls(const OptionParser& parser, const char* mode, ServeArgs* args) {
  const std::string_view m = mode;
  if (m != "off" && m != "on" && m != "require") {
    return parser.Error(
        absl::StrCat("--tls='", mode, "': expected off, on or require"));
  }
  args->tls = mode;
  return kGoOn;
}

// Returns -1 when parsed, else the exit status to return.
int ParseArgs(int argc, char** argv, ServeArgs* args) {
  using Arg = OptionParser::Arg;
  OptionParser parser(Usage());
  auto text = [](std::string* out) {
    return [out](const char* v, int) { *out = v; };
  };
  parser.Text("socket", 0, &args->socket)
      .Add("port", 0, Arg::kRequired,
           CountOption(parser, "--port", 1, 65535, "1 to 65535",
                       text(&args->port)))
      .Text("bind", 0, &args->bind)
      .Flag("nbdkit", 0, &args->nbdkit)
      .Text("tls-creds", 0, &args->tls_creds)
      .Text("tls-psk", 0, &args->tls_psk)
      .Add("tls", 0, Arg::kRequired,
           [&parser, args](const char* v) { return TakeTls(parser, v, args); })
      .Add("bitmap", 0, Arg::kRequired,
           [&parser, args](const char* v) {
             return TakeBitmap(parser, v, args);
           })
      .Text("export-name", 0, &args->export_name)
      .Add("shared", 0, Arg::kRequired,
           CountOption(parser, "--shared", 1, 1 << 20, "a count >= 1",
                       text(&args->shared)))
      .Add("threads", 0, Arg::kRequired,
           CountOption(parser, "--threads", 1, 1024, "1 to 1024",
                       text(&args->threads)))
      .Flag("sync", 0, &args->sync)
      .Flag("queue", 0, &args->queue)
      .Flag("verbose", 'v', &args->verbose)
      .Flag("force-share", 'U', &args->force_share)
      .Text("backing-root", 0, &args->backing_root);
  const ServeCommonArgs common = {&args->format, &args->read_only,
                                  &args->direct,  &args->fork,
                                  &args->pid_file, &args->secrets};
  AddServeCommonOptions(&parser, common);
  std::vector<std::string> operands;
  if (int rc = parser.Parse(argc, argv, &operands); rc != kGoOn) return rc;
  if (int rc = ExpectServedImage(parser, operands, common, &args->image);
      rc != kGoOn) {
    return rc;
  }
  if (!args->socket.empty() && !args->port.empty()) {
    return UsageError(Usage(), "--socket and --port exclude each other");
  }
  if (!args->bind.empty() && !args->socket.empty()) {
    return UsageError(Usage(), "--bind is for TCP; it excludes --socket");
  }
  if (!args->nbdkit && (args->sync || args->queue)) {
    return UsageError(Usage(), "--sync and --queue choose how nbdkit's "
                               "threads call the library: they need --nbdkit");
  }
  const bool creds = !args->tls_creds.empty() || !args->tls_psk.empty();
  if (args->nbdkit && (!args->bind.empty() || creds || !args->tls.empty() ||
                       !args->bitmaps.empty())) {
    return UsageError(Usage(), "--bind, --bitmap and TLS are not available "
                               "with --nbdkit");
  }
  if (args->tls.empty()) args->tls = creds ? "require" : "off";
  if (args->tls != "off" && !creds) {
    return UsageError(Usage(), "--tls=" + args->tls +
                                   " needs --tls-creds or --tls-psk");
  }
  if (args->tls == "off" && creds) {
    return UsageError(Usage(), "TLS credentials given with --tls=off");
  }
  if (args->sync && args->queue) {
    return UsageError(Usage(), "--sync and --queue exclude each other");
  }
  if (args->force_share && !args->read_only) {
    return UsageError(Usage(), "-U (--force-share) needs -r (--read-only)");
  }
  return -1;
}

// The plugin: $QCOWTOOL_NBDKIT_PLUGIN, the one next to this binary (build
// tree), the installed one, else nbdkit's own lookup by name.
std::string PluginPath() {
  if (const char* env = std::getenv("QCOWTOOL_NBDKIT_PLUGIN");
      env != nullptr && *env != '\0') {
    return env;
  }
  std::string self(4096, '\0');
  ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (n > 0) {
    self.resize(n);
    std::string beside =
        self.substr(0, self.rfind('/') + 1) + "nbdkit-libqcow2-plugin.so";
    if (::access(beside.c_str(), R_OK) == 0) return beside;
  }
#ifdef QCOW2_NBDKIT_PLUGIN_INSTALLED
  if (::access(QCOW2_NBDKIT_PLUGIN_INSTALLED, R_OK) == 0) {
    return QCOW2_NBDKIT_PLUGIN_INSTALLED;
  }
#endif
  return "libqcow2";
}

// A memfd holding `secret` for nbdkit to inherit (the plugin's
// key-secret-fd=): the secret stays off the command line. Not
// close-on-exec, on purpose.
absl::StatusOr<int> SecretFd(const std::string& secret) {
  const int fd = ::memfd_create("qcowtool-key-secret", 0);
  if (fd < 0) return absl::ErrnoToStatus(errno, "memfd_create");
  size_t done = 0;
  while (done < secret.size()) {
    const ssize_t n = ::write(fd, secret.data() + done, secret.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return absl::ErrnoToStatus(err, "writing the key secret to a memfd");
    }
    done += static_cast<size_t>(n);
  }
  if (::lseek(fd, 0, SEEK_SET) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ErrnoToStatus(err, "lseek");
  }
  return fd;
}

// The plugin's key-secret-fd= parameters for the secrets of --image-opts.
absl::StatusOr<std::vector<std::string>> NbdkitSecretArgs(const ServeArgs& a) {
  std::vector<std::string> out;
  auto add = [&](const std::string& key, const std::string& secret) {
    if (secret.empty()) return absl::OkStatus();
    absl::StatusOr<int> fd = SecretFd(secret);
    if (!fd.ok()) return fd.status();
    out.push_back(absl::StrCat(key, "=", *fd));
    return absl::OkStatus();
  };
  if (absl::Status s = add("key-secret-fd", a.secrets.key_secret); !s.ok()) {
    return s;
  }
  std::string prefix;
  for (const std::string& secret : a.secrets.backing_key_secrets) {
    prefix += "backing.";
    if (absl::Status s = add(prefix + "key-secret-fd", secret); !s.ok()) {
      return s;
    }
  }
  return out;
}

std::vector<std::string> NbdkitArgv(const ServeArgs& a) {
  const char* env = std::getenv("QCOWTOOL_NBDKIT");
  std::vector<std::string> argv = {env != nullptr && *env ? env : "nbdkit"};
  if (!a.fork) argv.push_back("--foreground");
  if (!a.pid_file.empty()) argv.insert(argv.end(), {"--pidfile", a.pid_file});
  if (!a.socket.empty()) argv.insert(argv.end(), {"--unix", a.socket});
  if (!a.port.empty()) argv.insert(argv.end(), {"--port", a.port});
  if (!a.threads.empty()) argv.insert(argv.end(), {"--threads", a.threads});
  if (a.read_only) argv.push_back("--readonly");
  if (a.verbose) argv.push_back("--verbose");
  if (!a.export_name.empty()) {
    argv.insert(argv.end(), {"--exportname", a.export_name});
  }
  if (!a.shared.empty()) argv.push_back("--filter=limit");
  argv.push_back(PluginPath());
  argv.push_back("file=" + a.image);
  if (!a.format.empty()) argv.push_back("format=" + a.format);
  if (a.read_only) argv.push_back("readonly=true");
  if (a.force_share) argv.push_back("force-share=true");
  if (a.sync) argv.push_back("queue=false");
  if (a.queue) argv.push_back("queue=true");
  if (a.direct) argv.push_back("direct=true");
  if (!a.backing_root.empty()) argv.push_back("backing-root=" + a.backing_root);
  if (!a.export_name.empty()) argv.push_back("export=" + a.export_name);
  if (!a.shared.empty()) argv.push_back("limit=" + a.shared);
  return argv;
}

// The image as both servers open it.
OpenOptions ServeOpenOptions(const ServeArgs& a) {
  OpenOptions opts;
  opts.read_write = !a.read_only;
  opts.format = a.format;
  opts.direct_io = a.direct;
  opts.force_share = a.force_share;
  opts.backing_root = a.backing_root;
  opts.key_secret = a.secrets.key_secret;
  opts.backing_key_secrets = a.secrets.backing_key_secrets;
  return opts;
}

// Opens (and closes) the image as the plugin will, for an early error.
absl::Status CheckOpens(const ServeArgs& a) {
  auto image = Image::Open(a.image, ServeOpenOptions(a));
  if (!image.ok()) return image.status();
  return (*image)->Close();
}

// Whether `path` holds a whole pid line (nbdkit writes "PID\n" after
// truncating the file).
bool PidFileWritten(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line) || in.eof()) return false;
  int pid = 0;
  return absl::SimpleAtoi(line, &pid) && pid > 0;
}

// --fork --pid-file: runs nbdkit as a child, waits for it (its first
// process exits once the daemon is forked), then for the daemon's pid
// file. Returns the exit code.
int ForkAndWaitForPidFile(const ServeArgs& a, char** argv) {
  // A stale file from an earlier server must not be taken for this one's.
  if (::unlink(a.pid_file.c_str()) != 0 && errno != ENOENT) {
    return ReportError(absl::ErrnoToStatus(
        errno, absl::StrCat("cannot remove the old pid file ", a.pid_file)));
  }
  const pid_t child = ::fork();
  if (child < 0) {
    return ReportError(absl::ErrnoToStatus(errno, "fork"));
  }
  if (child == 0) {
    ::execvp(argv[0], argv);
    std::fprintf(stderr, "qcowtool: running %s: %s (install nbdkit, or name "
                 "it in QCOWTOOL_NBDKIT)\n", argv[0], std::strerror(errno));
    ::_exit(kExitImageError);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) {
      return ReportError(absl::ErrnoToStatus(errno, "waiting for nbdkit"));
    }
  }
  if (!WIFEXITED(status)) return kExitImageError;
  if (WEXITSTATUS(status) != 0) return WEXITSTATUS(status);
  // The daemon has bound its socket already; the file follows at once.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!PidFileWritten(a.pid_file)) {
    if (std::chrono::steady_clock::now() > deadline) {
      return ReportError(absl::DeadlineExceededError(absl::StrCat(
          "nbdkit did not write its pid file ", a.pid_file,
          " within 30 seconds")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return kExitOk;
}


// --- the project's own server (serve/nbd/) ----------------------------------

std::atomic<nbd::Server*> g_server{nullptr};

void OnStopSignal(int) {
  if (nbd::Server* server = g_server.load()) server->Stop();
}

nbd::ExportConfig ExportFor(const ServeArgs& a, Image& image) {
  nbd::ExportConfig cfg;
  cfg.name = a.export_name;
  cfg.size = image.size();
  cfg.read_only = a.read_only;
  cfg.bitmaps = a.bitmaps;
  // The preferred block size stays 4 KiB, as qemu-nbd's: smaller writes
  // cost a read-modify-write in the host, larger ones nothing more here.
  const LayerInfo top = image.GetChainInfo().front();
  if (top.format == ImageFormat::kQcow2) {
    // Version 3 clusters (subclusters with extended L2) carry a zero
    // flag: zeroing whole ones only changes metadata.
    cfg.fast_zero = top.version >= 3;
    cfg.zero_align = std::max<uint32_t>(
        top.extended_l2 ? top.cluster_size / 32 : top.cluster_size, 512);
  }
  return cfg;
}

// Every --bitmap names a bitmap of the image that can be trusted.
absl::Status CheckBitmaps(const ServeArgs& a, const Image& image) {
  if (a.bitmaps.empty()) return absl::OkStatus();
  auto list = image.ListBitmaps();
  if (!list.ok()) return list.status();
  for (const std::string& name : a.bitmaps) {
    auto it = std::find_if(list->begin(), list->end(),
                           [&](const BitmapInfo& b) { return b.name == name; });
    if (it == list->end()) {
      return absl::NotFoundError(absl::StrCat(
          "--bitmap ", name, ": ", a.image, " has no bitmap of that name "
          "(qemu-img bitmap --add makes one)"));
    }
    if (it->in_use) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--bitmap ", name, ": the bitmap is in use in ", a.image,
          " (not closed cleanly), its bits cannot be trusted"));
    }
  }
  return absl::OkStatus();
}

// The listening socket: the Unix socket, or TCP on --bind (default:
// localhost only, said on stderr).
absl::StatusOr<int> Listen(const ServeArgs& a) {
  if (!a.socket.empty()) return nbd::ListenUnix(a.socket);
  const int port = a.port.empty() ? 10809 : std::atoi(a.port.c_str());
  std::string addr = a.bind;
  if (addr.empty()) {
    addr = "127.0.0.1";
    std::fprintf(stderr,
                 "qcowtool serve: listening on 127.0.0.1 port %d only "
                 "(--bind ADDR for another address)\n", port);
  }
  return nbd::ListenTcp(addr, port);
}

absl::Status WritePidFile(const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << ::getpid() << "\n";
    if (!out.flush()) {
      return absl::ErrnoToStatus(errno, "writing the pid file " + path);
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, "writing the pid file " + path);
  }
  return absl::OkStatus();
}

// Opens, listens and serves until a stop signal; then flushes and closes
// the image. `ready` (a pipe's write end, or -1) gets one byte once the
// socket listens.
absl::Status ServeOwn(const ServeArgs& a, int ready) {
  auto image = Image::Open(a.image, ServeOpenOptions(a));
  if (!image.ok()) return image.status();
  if (absl::Status s = CheckBitmaps(a, **image); !s.ok()) return s;
  auto fd = Listen(a);
  if (!fd.ok()) return fd.status();
  nbd::ServerOptions opts;
  opts.export_config = ExportFor(a, **image);
  opts.listen_fds = {*fd};
  if (!a.threads.empty()) opts.loops = std::atoi(a.threads.c_str());
  if (!a.shared.empty()) opts.max_connections = std::atoi(a.shared.c_str());
  opts.verbose = a.verbose;
  if (a.tls != "off") {
    auto tls = nbd::Tls::Load(a.tls_creds, a.tls_psk);
    if (!tls.ok()) return tls.status();
    opts.tls = *tls;
    opts.export_config.tls =
        a.tls == "on" ? nbd::TlsMode::kOn : nbd::TlsMode::kRequire;
  }
  auto server = nbd::Server::Create(image->get(), std::move(opts));
  if (!server.ok()) return server.status();
  if (a.verbose) {
    std::fprintf(stderr,
                 "qcowtool serve: %s, %d event loop(s) with an io_uring "
                 "queue each, %s\n", a.image.c_str(),
                 (*server)->options().loops,
                 a.direct ? "O_DIRECT" : "through the page cache");
  }
  if (!a.pid_file.empty()) {
    if (absl::Status s = WritePidFile(a.pid_file); !s.ok()) return s;
  }
  g_server.store(server->get());
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  ::sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  if (ready >= 0) {
    // A daemon keeps no terminal or pipe of its parent open (whoever ran
    // `serve --fork` would wait for their end), as nbdkit's daemon.
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
      for (int fd = 0; fd < 3; ++fd) ::dup2(null, fd);
      ::close(null);
    }
    const char byte = 0;
    [[maybe_unused]] ssize_t n = ::write(ready, &byte, 1);
    ::close(ready);
  }
  absl::Status run = (*server)->Run();
  g_server.store(nullptr);
  server->reset();  // its queues go before the image closes
  ::close(*fd);
  if (!a.socket.empty()) ::unlink(a.socket.c_str());
  absl::Status close = (*image)->Close();
  if (!run.ok()) return run;
  return close;
}

// --fork: the child serves; the parent returns once it listens, or with
// its error.
int ForkOwn(const ServeArgs& a) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return ReportError(absl::ErrnoToStatus(errno, "pipe"));
  }
  const pid_t child = ::fork();
  if (child < 0) return ReportError(absl::ErrnoToStatus(errno, "fork"));
  if (child == 0) {
    ::close(fds[0]);
    ::setsid();
    absl::Status s = ServeOwn(a, fds[1]);
    ::_exit(s.ok() ? kExitOk : ReportError(s));
  }
  ::close(fds[1]);
  char byte;
  ssize_t n;
  while ((n = ::read(fds[0], &byte, 1)) < 0 && errno == EINTR) {
  }
  ::close(fds[0]);
  if (n == 1) return kExitOk;
  int status = 0;  // the child failed and said why on stderr
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) != 0 ? WEXITSTATUS(status)
                                                        : kExitImageError;
}

}  // namespace

int RunServe(int argc, char** argv) {
  if (IsVhostUserBlkServe(argc, argv)) {
    return RunServeVhostUserBlk(argc, argv);  // tools/cmd_serve_vhost.cc
  }
  ServeArgs args;
  if (int rc = ParseArgs(argc, argv, &args); rc >= 0) return rc;
  if (!args.nbdkit) {
    if (args.fork) return ForkOwn(args);
    absl::Status s = ServeOwn(args, -1);
    return s.ok() ? kExitOk : ReportError(s);
  }
  if (absl::Status s = CheckOpens(args); !s.ok()) return ReportError(s);
  std::vector<std::string> nbdkit = NbdkitArgv(args);
  absl::StatusOr<std::vector<std::string>> secret_args = NbdkitSecretArgs(args);
  if (!secret_args.ok()) return ReportError(secret_args.status());
  nbdkit.insert(nbdkit.end(), secret_args->begin(), secret_args->end());
  std::vector<char*> cargv;
  for (std::string& arg : nbdkit) cargv.push_back(arg.data());
  cargv.push_back(nullptr);
  if (args.fork && !args.pid_file.empty()) {
    return ForkAndWaitForPidFile(args, cargv.data());
  }
  ::execvp(cargv[0], cargv.data());
  const int err = errno;
  return ReportError(absl::ErrnoToStatus(
      err, absl::StrCat("running ", nbdkit[0],
                        " (install nbdkit, or name it in QCOWTOOL_NBDKIT)")));
}

}  // namespace qcow2::tool
