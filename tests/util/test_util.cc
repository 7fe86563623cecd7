// SPDX-License-Identifier: Apache-2.0
#include "tests/util/test_util.h"

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace qcow2::testing {

TempDir::TempDir() {
  const char* base = getenv("TMPDIR");
  std::string tmpl = absl::StrCat(base && *base ? base : "/tmp",
                                  "/qcow2-test-XXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    perror("mkdtemp");
    abort();
  }
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

namespace {

std::string Drain(int fd) {
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) out.append(buf, n);
  }
  close(fd);
  return out;
}

}  // namespace

CommandResult Run(const std::vector<std::string>& argv) {
  CommandResult r;
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    r.err = "pipe failed";
    return r;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(out[0]);
    close(err[0]);
    r.err = absl::StrCat("cannot run ", argv[0], ": ", strerror(rc));
    return r;
  }
  std::thread t([&] { r.err = Drain(err[0]); });
  r.out = Drain(out[0]);
  t.join();
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

CommandResult RetryQemuKeyTiming(const std::function<CommandResult()>& run) {
  CommandResult r = run();
  for (int i = 1; i < 9 && r.exit_code != 0 &&
                  r.err.find("Unable to get accurate CPU usage") !=
                      std::string::npos;
       ++i) {
    r = run();
  }
  return r;
}

CommandResult RunShell(const std::string& command) {
  return Run({"/bin/sh", "-c", command});
}

bool HaveQemu() {
  static const bool have =
      Run({"qemu-img", "--version"}).exit_code == 0 &&
      Run({"qemu-io", "--version"}).exit_code == 0;
  return have;
}

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

absl::Status WriteFileBytes(const std::string& path,
                            const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> QemuCheckedReadAll(
    const std::string& image) {
  CommandResult check = QemuCheck(image);
  if (check.exit_code != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("qemu-img check ", image, " exited ", check.exit_code,
                     ": ", check.out, check.err));
  }
  return QemuReadAll(image);
}

absl::StatusOr<std::vector<uint8_t>> QemuReadAll(const std::string& image) {
  std::string raw = image + ".oracle.raw";
  CommandResult r =
      Run({"qemu-img", "convert", "-U", "-O", "raw", image, raw});
  if (r.exit_code != 0) {
    return absl::InternalError(
        absl::StrCat("qemu-img convert ", image, " failed: ", r.err));
  }
  auto bytes = ReadFileBytes(raw);
  unlink(raw.c_str());
  return bytes;
}

absl::StatusOr<std::vector<uint8_t>> QemuReadSnapshot(const std::string& image,
                                                      const std::string& id) {
  const std::string raw = image + ".snapshot.raw";
  CommandResult r =
      Run({"qemu-img", "convert", "-U", "-l", absl::StrCat("snapshot.id=", id),
           "-O", "raw", image, raw});
  if (r.exit_code != 0) {
    return absl::InternalError(absl::StrCat("qemu-img convert -l snapshot.id=",
                                            id, " ", image, " failed: ",
                                            r.err));
  }
  auto bytes = ReadFileBytes(raw);
  unlink(raw.c_str());
  return bytes;
}

CommandResult QemuCheck(const std::string& image) {
  return Run({"qemu-img", "check", "-U", "--output=json", image});
}

std::string QcowtoolPath() {
#ifdef QCOWTOOL_BIN
  return QCOWTOOL_BIN;
#else
  return "qcowtool";
#endif
}

bool OtherHoldsByte(int fd, int byte) {
  struct flock fl;
  std::memset(&fl, 0, sizeof(fl));
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  fl.l_type = F_WRLCK;
  return ::fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

bool ByteLocked(const std::string& path, int byte) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool taken = OtherHoldsByte(fd, byte);
  ::close(fd);
  return taken;
}

}  // namespace qcow2::testing
