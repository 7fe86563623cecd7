// SPDX-License-Identifier: Apache-2.0
// `qcowtool serve` (the project's own NBD server, serve/nbd/, and with
// --nbdkit nbdkit with the libqcow2 plugin) driven by real NBD clients:
// qemu-img and qemu-io (nbd+unix://), nbdinfo, nbdcopy and fio's nbd
// engine. Every test serves a chain (a base and an overlay built by
// qemu-img/qemu-io), and every served image must pass `qemu-img check`
// once the server has stopped. The --nbdkit cases skip without nbdkit.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "tests/util/json_lite.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using ::testing::HasSubstr;
using testing::CommandResult;
using testing::QemuCheck;
// testing::Run (inside a TEST_F, plain Run names gtest's Test::Run).
CommandResult Cmd(const std::vector<std::string>& argv) {
  return testing::Run(argv);
}
using testing::TempDir;

constexpr uint64_t kSize = 16ull << 20;
constexpr uint32_t kCluster = 65536;

bool Have(const std::string& tool) {
  return Cmd({"sh", "-c", "command -v " + tool}).exit_code == 0;
}

#define SKIP_WITHOUT(tool)                                              \
  do {                                                                  \
    if (!Have(tool)) GTEST_SKIP() << tool << " is not installed";       \
  } while (0)

// Whether a client can connect to the Unix socket `path` now.
bool CanConnect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok =
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

std::string Uri(const std::string& socket) {
  return "nbd+unix:///?socket=" + socket;
}

// Starts `argv` (searched on PATH) as a child with stdout and stderr to
// `out_path`; returns its pid.
pid_t Spawn(std::vector<std::string> argv, const std::string& out_path) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execvp(cargv[0], cargv.data());
    ::_exit(127);
  }
  return pid;
}

// `qcowtool serve --socket SOCKET [flags] IMAGE` in the foreground, as a
// child of the test; stopped with SIGTERM (the way a user stops it).
class Server {
 public:
  Server(const TempDir& dir, const std::string& image,
         std::vector<std::string> flags = {})
      : socket_(dir.File("nbd" + std::to_string(count_++) + ".sock")),
        log_(socket_ + ".log") {
    std::vector<std::string> argv = {testing::QcowtoolPath(), "serve",
                                     "--socket", socket_};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(image);
    pid_ = Spawn(argv, log_);
    // Up to a minute on a loaded machine; not a timing assertion.
    for (int i = 0; i < 6000 && !CanConnect(socket_); ++i) {
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~Server() { Stop(); }

  bool running() const { return pid_ > 0 && CanConnect(socket_); }
  const std::string& socket() const { return socket_; }
  std::string uri() const { return Uri(socket_); }
  std::string Log() const {
    auto bytes = testing::ReadFileBytes(log_);
    return bytes.ok() ? std::string(bytes->begin(), bytes->end()) : "";
  }

  // SIGTERM and wait; the exit status (128 + signal when killed).
  int Stop() {
    if (pid_ <= 0) return exit_;
    ::kill(pid_, SIGTERM);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    exit_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return exit_;
  }

 private:
  static inline int count_ = 0;
  std::string socket_;
  std::string log_;
  pid_t pid_ = -1;
  int exit_ = -1;
};

// base.qcow2 <- top.qcow2 in `dir`: data in both layers, zero clusters and
// never-written ranges, so the export has data, holes and zeros.
std::string BuildChain(const TempDir& dir) {
  using testing::QemuOp;
  std::vector<testing::QemuLayerSpec> layers(2);
  layers[0].image.size = kSize;
  layers[0].ops = {QemuOp::Write(0, 3 * kCluster, 0x11),
                   QemuOp::Write(4 << 20, 1 << 20, 0x22),
                   QemuOp::Write(9 << 20, 12345, 0x33)};
  layers[1].ops = {QemuOp::Write(kCluster, 7000, 0x44),
                   QemuOp::Zero(4 << 20, 256 << 10),
                   QemuOp::Write(12 << 20, 2 * kCluster, 0x55)};
  auto paths = testing::QemuBuildChain(dir.path(), layers);
  EXPECT_TRUE(paths.ok()) << paths.status();
  return paths.ok() ? paths->back() : "";
}

// (start, length, data, zero) runs, adjacent equal runs merged.
using Run4 = std::tuple<uint64_t, uint64_t, bool, bool>;

void Append(std::vector<Run4>* runs, uint64_t start, uint64_t len, bool data,
            bool zero) {
  if (!runs->empty()) {
    auto& [s, l, d, z] = runs->back();
    if (d == data && z == zero && s + l == start) {
      l += len;
      return;
    }
  }
  runs->emplace_back(start, len, data, zero);
}

std::vector<Run4> RunsFromQemuMap(const std::string& path,
                                  const std::string& format,
                                  const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {"qemu-img", "map", "--output=json", "-f",
                                   format};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(path);
  CommandResult r = Cmd(argv);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto v = testing::json::Parse(r.out);
  EXPECT_TRUE(v.ok()) << r.out;
  std::vector<Run4> runs;
  if (!v.ok()) return runs;
  for (const auto& e : v->array()) {
    Append(&runs, e["start"].as_uint64(), e["length"].as_uint64(),
           e["data"].as_bool(), e["zero"].as_bool());
  }
  return runs;
}

// nbdinfo --map lines: "OFFSET LENGTH TYPE DESCRIPTION", TYPE bit 0 hole,
// bit 1 zero.
std::vector<Run4> RunsFromNbdinfo(const std::string& text) {
  std::vector<Run4> runs;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t start, len;
    int type;
    if (f.size() < 3 || !absl::SimpleAtoi(f[0], &start) ||
        !absl::SimpleAtoi(f[1], &len) || !absl::SimpleAtoi(f[2], &type)) {
      ADD_FAILURE() << "unexpected nbdinfo --map line: " << line;
      continue;
    }
    Append(&runs, start, len, (type & 1) == 0, (type & 2) != 0);
  }
  return runs;
}

std::string Describe(const std::vector<Run4>& runs) {
  std::string s;
  for (const auto& [start, len, data, zero] : runs) {
    absl::StrAppend(&s, start, "+", len, data ? " data" : "",
                    zero ? " zero" : "", "\n");
  }
  return s;
}

void ExpectClean(const std::string& image) {
  CommandResult r = QemuCheck(image);
  EXPECT_EQ(r.exit_code, 0) << "qemu-img check " << image << ":\n"
                            << r.out << r.err;
}

class NbdTest : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT("qemu-img"); }
};

// The export reads as the chain does (qemu-img compare, also against the
// file itself under -U while the server holds its lock), and qemu-img map
// and nbdinfo see the same data, holes and zeros as qemu-img map of the
// file.
TEST_F(NbdTest, ServedChainEqualsImageAndMapsAlike) {
  TempDir dir;
  const std::string top = BuildChain(dir);
  const std::vector<Run4> file_map = RunsFromQemuMap(top, "qcow2");
  Server server(dir, top);
  ASSERT_TRUE(server.running()) << server.Log();

  CommandResult cmp = Cmd({"qemu-img", "compare", "-U", "-f", "qcow2", "-F",
                           "raw", top, server.uri()});
  EXPECT_EQ(cmp.exit_code, 0) << cmp.out << cmp.err;

  EXPECT_EQ(RunsFromQemuMap(server.uri(), "raw"), file_map)
      << "export:\n" << Describe(RunsFromQemuMap(server.uri(), "raw"))
      << "file:\n" << Describe(file_map);

  if (Have("nbdinfo")) {
    CommandResult size = Cmd({"nbdinfo", "--size", server.uri()});
    EXPECT_EQ(size.out, absl::StrCat(kSize, "\n")) << size.err;
    CommandResult map = Cmd({"nbdinfo", "--map", server.uri()});
    ASSERT_EQ(map.exit_code, 0) << map.err;
    EXPECT_EQ(RunsFromNbdinfo(map.out), file_map)
        << "nbdinfo:\n" << map.out << "file:\n" << Describe(file_map);
    CommandResult can = Cmd({"nbdinfo", "--can", "multi-conn", server.uri()});
    EXPECT_EQ(can.exit_code, 0) << "multi-conn not offered";
  }
  EXPECT_EQ(server.Stop(), 0) << server.Log();
  ExpectClean(top);
}

// The image stays locked while it is served: qemu-io cannot open it for
// writing, a second server cannot serve it, and a missing image is an
// error naming it (exit 2) before nbdkit starts.
TEST_F(NbdTest, ServedImageIsLocked) {
  TempDir dir;
  const std::string top = BuildChain(dir);
  Server server(dir, top);
  ASSERT_TRUE(server.running()) << server.Log();
  CommandResult w = Cmd({"qemu-io", "-f", "qcow2", "-c", "write 0 512", top});
  EXPECT_NE(w.exit_code, 0);
  EXPECT_THAT(w.out + w.err, HasSubstr("lock"));
  CommandResult second =
      Cmd({"timeout", "60", testing::QcowtoolPath(), "serve", "--socket",
           dir.File("second.sock"), top});  // a bound, should it serve
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_THAT(second.err, HasSubstr("lock"));
  EXPECT_EQ(server.Stop(), 0) << server.Log();

  CommandResult missing = Cmd({testing::QcowtoolPath(), "serve", "--socket",
                               dir.File("x.sock"), dir.File("nope.qcow2")});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("nope.qcow2"));
}

// -r: the export refuses writes and the image is not changed.
TEST_F(NbdTest, ReadOnlyExportRefusesWrites) {
  TempDir dir;
  const std::string top = BuildChain(dir);
  auto before = testing::ReadFileBytes(top);
  ASSERT_TRUE(before.ok());
  Server server(dir, top, {"-r"});
  ASSERT_TRUE(server.running()) << server.Log();
  CommandResult w =
      Cmd({"qemu-io", "-f", "raw", "-c", "write -P 7 0 4096", server.uri()});
  EXPECT_NE(w.exit_code, 0) << w.out << w.err;
  // Another reader may open the image beside a read-only server.
  CommandResult r = Cmd({"qemu-img", "info", top});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(server.Stop(), 0) << server.Log();
  EXPECT_EQ(*testing::ReadFileBytes(top), *before);
}

// qemu-io's random writes, zero writes (with and without unmap) and
// cluster-aligned discards through the export leave the chain equal to
// the same commands run by qemu-io on a copy of it.
// The own server through the page cache and over O_DIRECT files
// (--direct); the nbdkit plugin's three ways of running requests:
// synchronous calls (the default through the page cache), a queue per
// nbdkit thread (--queue), and queues over O_DIRECT files (--direct).
void QemuIoThroughExport(const std::vector<std::string>& flags,
                         const char* mode) {
  TempDir dir;
  TempDir copy_dir;
  const std::string top = BuildChain(dir);
  for (const char* f : {"layer0.qcow2", "layer1.qcow2"}) {
    ASSERT_EQ(Cmd({"cp", dir.File(f), copy_dir.File(f)}).exit_code, 0);
  }
  const std::string copy = copy_dir.File("layer1.qcow2");
  testing::RandomOpsConfig cfg;
  cfg.seed = 27;
  cfg.size = kSize;
  cfg.writes = 60;
  cfg.zero_writes = 10;
  cfg.zero_unmap_every = 2;
  cfg.compressed_writes = 0;  // not through NBD
  cfg.discards = 0;           // unaligned discards may differ (NBD: undefined)
  std::vector<testing::QemuOp> ops = testing::RandomQemuOps(cfg);
  ops.push_back(testing::QemuOp::Discard(kCluster, 2 * kCluster));
  ops.push_back(testing::QemuOp::Discard(12 << 20, kCluster));
  ops.push_back(testing::QemuOp::Write(12 << 20, 100, 0x66));
  const std::vector<std::string> commands = testing::ToQemuIoCommands(ops);

  std::vector<std::string> verbose = flags;
  verbose.push_back("-v");  // the first log lines name the mode
  Server server(dir, top, verbose);
  ASSERT_TRUE(server.running()) << server.Log();
  ASSERT_OK(testing::QemuIo(server.uri(), commands, "raw"));
  ASSERT_OK(testing::QemuIo(copy, commands, "qcow2"));
  CommandResult flush = Cmd({"qemu-io", "-f", "raw", "-c", "flush",
                             server.uri()});
  EXPECT_EQ(flush.exit_code, 0) << flush.err;
  EXPECT_EQ(server.Stop(), 0) << server.Log();
  EXPECT_THAT(server.Log(), HasSubstr(mode));

  ExpectClean(top);
  CommandResult cmp = Cmd({"qemu-img", "compare", top, copy});
  EXPECT_EQ(cmp.exit_code, 0) << cmp.out << cmp.err;
}

TEST_F(NbdTest, QemuIoThroughExportEqualsQemuIoOnCopy) {
  QemuIoThroughExport({}, "through the page cache");
}
TEST_F(NbdTest, QemuIoThroughExportEqualsQemuIoOnCopyDirect) {
  QemuIoThroughExport({"--direct"}, "O_DIRECT");
}
TEST_F(NbdTest, QemuIoThroughExportEqualsQemuIoOnCopyNbdkit) {
  SKIP_WITHOUT("nbdkit");
  QemuIoThroughExport({"--nbdkit"}, "synchronous");
}
TEST_F(NbdTest, QemuIoThroughExportEqualsQemuIoOnCopyNbdkitQueues) {
  SKIP_WITHOUT("nbdkit");
  QemuIoThroughExport({"--nbdkit", "--queue"}, "one queue per thread");
}
TEST_F(NbdTest, QemuIoThroughExportEqualsQemuIoOnCopyNbdkitDirect) {
  SKIP_WITHOUT("nbdkit");
  QemuIoThroughExport({"--nbdkit", "--direct"}, "one queue per thread");
}

// nbdcopy (4 connections, multi-conn) out to a raw file equals the chain;
// nbdcopy back into a fresh
// served image gives an image equal to it, holes kept as holes.
TEST_F(NbdTest, NbdcopyOutAndBack) {
  SKIP_WITHOUT("nbdcopy");
  TempDir dir;
  const std::string top = BuildChain(dir);
  const std::string raw = dir.File("out.raw");
  {
    Server server(dir, top, {"-r"});
    ASSERT_TRUE(server.running()) << server.Log();
    CommandResult out = Cmd({"nbdcopy", "--connections=4", server.uri(), raw});
    ASSERT_EQ(out.exit_code, 0) << out.err;
    EXPECT_EQ(server.Stop(), 0) << server.Log();
  }
  CommandResult cmp = Cmd({"qemu-img", "compare", "-F", "raw", top, raw});
  EXPECT_EQ(cmp.exit_code, 0) << cmp.out << cmp.err;

  const std::string fresh = dir.File("fresh.qcow2");
  ASSERT_EQ(Cmd({"qemu-img", "create", "-f", "qcow2", fresh,
                 std::to_string(kSize)})
                .exit_code,
            0);
  {
    Server server(dir, fresh);
    ASSERT_TRUE(server.running()) << server.Log();
    CommandResult back = Cmd({"nbdcopy", "--connections=4", raw, server.uri()});
    ASSERT_EQ(back.exit_code, 0) << back.err;
    EXPECT_EQ(server.Stop(), 0) << server.Log();
  }
  ExpectClean(fresh);
  cmp = Cmd({"qemu-img", "compare", "-F", "raw", fresh, raw});
  EXPECT_EQ(cmp.exit_code, 0) << cmp.out << cmp.err;
  // The never-written 16 MiB - ~2.5 MiB stayed unallocated.
  auto info = Cmd({"qemu-img", "info", "--output=json", fresh});
  auto v = testing::json::Parse(info.out);
  ASSERT_TRUE(v.ok()) << info.out;
  EXPECT_LT((*v)["actual-size"].as_uint64(), kSize / 2) << info.out;
}

// fio's nbd engine, 16 jobs of random 4 KiB writes on their own ranges,
// each verified with crc32c after it is written.
void Fio16JobsVerify(const std::vector<std::string>& flags) {
  TempDir dir;
  const std::string top = BuildChain(dir);
  Server server(dir, top, flags);
  ASSERT_TRUE(server.running()) << server.Log();
  CommandResult fio = Cmd(
      {"fio", "--name=verify", "--ioengine=nbd", "--uri=" + server.uri(),
       "--rw=randwrite", "--bs=4k", "--iodepth=4", "--numjobs=16",
       "--size=" + std::to_string(kSize / 16),
       "--offset_increment=" + std::to_string(kSize / 16),
       "--verify=crc32c", "--do_verify=1", "--verify_fatal=1",
       "--group_reporting", "--output-format=terse"});
  EXPECT_EQ(fio.exit_code, 0) << fio.out << fio.err;
  EXPECT_THAT(fio.err, ::testing::Not(HasSubstr("verify")));
  EXPECT_EQ(server.Stop(), 0) << server.Log();
  ExpectClean(top);
}

bool HaveFioNbd() {
  return Cmd({"sh", "-c", "fio --enghelp | grep -qw nbd"}).exit_code == 0;
}

TEST_F(NbdTest, Fio16JobsVerifyCrc32c) {
  SKIP_WITHOUT("fio");
  if (!HaveFioNbd()) GTEST_SKIP() << "this fio has no nbd engine";
  Fio16JobsVerify({});
}
TEST_F(NbdTest, Fio16JobsVerifyCrc32cNbdkitQueues) {
  SKIP_WITHOUT("fio");
  SKIP_WITHOUT("nbdkit");
  if (!HaveFioNbd()) GTEST_SKIP() << "this fio has no nbd engine";
  Fio16JobsVerify({"--nbdkit", "--queue"});
}
TEST_F(NbdTest, Fio16JobsVerifyCrc32cDirect) {
  SKIP_WITHOUT("fio");
  if (!HaveFioNbd()) GTEST_SKIP() << "this fio has no nbd engine";
  Fio16JobsVerify({"--direct"});
}

// A client killed with SIGKILL in the middle of its writes leaves the
// server serving and, once it stops, an image qemu-img check finds clean.
TEST_F(NbdTest, ClientKilledMidWriteLeavesImageConsistent) {
  TempDir dir;
  const std::string top = BuildChain(dir);
  Server server(dir, top);
  ASSERT_TRUE(server.running()) << server.Log();
  // qemu-io with many queued writes (1 MiB each, all over the disk).
  std::vector<std::string> argv = {"qemu-io", "-f", "raw"};
  for (int i = 0; i < 400; ++i) {
    argv.push_back("-c");
    argv.push_back(absl::StrCat("aio_write -P ", i % 250, " ",
                                (i * 37 % 15) << 20, " 1M"));
  }
  argv.push_back(server.uri());
  pid_t pid = Spawn(argv, "/dev/null");
  // Let it get going, then kill it wherever it is.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pid, SIGKILL);
  int status;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(server.running()) << server.Log();
  CommandResult size = Cmd({"qemu-img", "info", server.uri()});
  EXPECT_EQ(size.exit_code, 0) << size.err;
  EXPECT_EQ(server.Stop(), 0) << server.Log();
  ExpectClean(top);
}

// --fork --pid-file: the command returns once the socket listens and the
// pid file names the server (the own server's child writes it before it
// listens; nbdkit's daemon writes it after its first process has exited:
// the command waits for it, and a stale file from an earlier server is
// not taken for it), which SIGTERM stops.
void ForkWithPidFile(const std::vector<std::string>& flags,
                     const std::string& comm_name) {
  TempDir dir;
  const std::string top = BuildChain(dir);
  const std::string sock = dir.File("fork.sock");
  const std::string pid_file = dir.File("serve.pid");
  ASSERT_OK(testing::WriteFileBytes(pid_file, {'1', '\n'}));
  std::vector<std::string> argv = {testing::QcowtoolPath(), "serve"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(),
              {"--fork", "--pid-file", pid_file, "--socket", sock, top});
  CommandResult r = Cmd(argv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(CanConnect(sock));
  auto bytes = testing::ReadFileBytes(pid_file);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  int pid = 0;
  ASSERT_TRUE(absl::SimpleAtoi(
      absl::StripAsciiWhitespace(std::string(bytes->begin(), bytes->end())),
      &pid));
  auto comm = testing::ReadFileBytes(absl::StrCat("/proc/", pid, "/comm"));
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ(std::string(comm->begin(), comm->end()), comm_name + "\n");
  CommandResult w = Cmd({"qemu-io", "-f", "raw", "-c", "write -P 9 0 64k",
                         Uri(sock)});
  EXPECT_EQ(w.exit_code, 0) << w.err;
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  // Gone once the socket is removed and the pid no longer runs (it may
  // stay a zombie of whoever adopted it).
  for (int i = 0; i < 6000; ++i) {
    std::string stat;
    auto st = testing::ReadFileBytes(absl::StrCat("/proc/", pid, "/stat"));
    if (!st.ok()) break;
    stat.assign(st->begin(), st->end());
    if (stat.find(") Z") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ExpectClean(top);
  CommandResult read = Cmd({"qemu-io", "-f", "qcow2", "-c",
                            "read -P 9 0 64k", top});
  EXPECT_EQ(read.exit_code, 0) << read.out << read.err;
  EXPECT_THAT(read.out, ::testing::Not(HasSubstr("fail")));
}

TEST_F(NbdTest, ForkWithPidFile) { ForkWithPidFile({}, "qcowtool"); }
TEST_F(NbdTest, ForkWithPidFileNbdkit) {
  SKIP_WITHOUT("nbdkit");
  ForkWithPidFile({"--nbdkit"}, "nbdkit");
}

}  // namespace
}  // namespace qcow2
