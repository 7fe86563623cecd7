// SPDX-License-Identifier: Apache-2.0
// Image locking against real QEMU processes: libqcow2 and qcowtool take the
// same open file description locks as QEMU's file-posix driver, so a
// writer excludes other writers both ways, readers share, and -U (force
// share) lets a reader in beside a writer.
//
// A holder is a `qemu-io` process reading commands from a pipe that stays
// open: it keeps the image open (and locked) until the pipe is closed.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "qcow2/image.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::ByteLocked;
using testing::CommandResult;
using testing::TempDir;

// A qemu-io process holding `path` open until destroyed.
class QemuIoHolder {
 public:
  QemuIoHolder(const std::string& path, const std::vector<std::string>& flags)
      : path_(path) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[0], 0);
      int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      std::vector<std::string> argv = {"qemu-io"};
      argv.insert(argv.end(), flags.begin(), flags.end());
      argv.push_back(path);
      std::vector<char*> cargv;
      for (std::string& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      ::execvp("qemu-io", cargv.data());
      ::_exit(127);
    }
    ::close(fds[0]);
    stdin_ = fds[1];
  }
  ~QemuIoHolder() {
    if (stdin_ >= 0) ::close(stdin_);  // EOF: qemu-io quits
    if (pid_ > 0) {
      int status;
      for (int i = 0; i < 500; ++i) {
        if (::waitpid(pid_, &status, WNOHANG) == pid_) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
    }
  }
  // Waits until qemu-io holds the image (its "consistent read" byte, which
  // every opener takes, is locked). False after 10 s or if it died.
  bool WaitLocked() {
    for (int i = 0; i < 1000; ++i) {
      if (ByteLocked(path_, 100)) return true;
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

 private:
  std::string path_;
  pid_t pid_ = -1;
  int stdin_ = -1;
};

class LockingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_QEMU();
    image_ = dir_.File("disk.qcow2");
    CommandResult r = testing::Run(
        {"qemu-img", "create", "-q", "-f", "qcow2", image_, "4M"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  absl::StatusOr<std::unique_ptr<Image>> Open(bool rw, bool share = false) {
    OpenOptions o;
    o.read_write = rw;
    o.force_share = share;
    return Image::Open(image_, o);
  }

  CommandResult Qcowtool(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {testing::QcowtoolPath()};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::Run(argv);
  }

  TempDir dir_;
  std::string image_;
};

TEST_F(LockingTest, OurWriteIsRefusedWhileQemuIoHoldsTheImage) {
  QemuIoHolder qemu(image_, {});
  ASSERT_TRUE(qemu.WaitLocked());
  auto img = Open(/*rw=*/true);
  ASSERT_FALSE(img.ok());
  EXPECT_EQ(img.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(img.status().message()),
              HasSubstr(image_ + ": image is locked by another process "
                                 "(failed to get \"write\" lock)"));
  CommandResult r = Qcowtool({"io", image_, "-c", "write 0 4k"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("locked by another process"));
  // A reader that cannot stand a writer is refused too; -U gets in.
  auto ro = Open(/*rw=*/false);
  ASSERT_FALSE(ro.ok());
  EXPECT_THAT(std::string(ro.status().message()),
              HasSubstr("failed to get shared \"write\" lock"));
  auto shared = Open(/*rw=*/false, /*share=*/true);
  ASSERT_TRUE(shared.ok()) << shared.status();
  uint8_t buf[512];
  EXPECT_OK((*shared)->Read(0, absl::MakeSpan(buf)));
  for (const char* cmd : {"info", "map", "check"}) {
    EXPECT_NE(Qcowtool({cmd, image_}).exit_code, 0) << cmd;
    CommandResult u = Qcowtool({cmd, "-U", image_});
    EXPECT_EQ(u.exit_code, 0) << cmd << ": " << u.err;
  }
  CommandResult conv =
      Qcowtool({"convert", "-U", image_, dir_.File("copy.raw")});
  EXPECT_EQ(conv.exit_code, 0) << conv.err;
  CommandResult io_u = Qcowtool({"io", "-r", "-U", image_, "-c", "read 0 4k"});
  EXPECT_EQ(io_u.exit_code, 0) << io_u.err;
  // bench reading, as qemu-img bench -U; writing with -U is refused.
  const std::vector<std::string> bench = {"bench", "pattern", "-c", "64",
                                          "-q", image_};
  EXPECT_NE(Qcowtool(bench).exit_code, 0);
  std::vector<std::string> bench_u = bench;
  bench_u.insert(bench_u.begin() + 2, "-U");
  CommandResult b = Qcowtool(bench_u);
  EXPECT_EQ(b.exit_code, 0) << b.err;
  bench_u.insert(bench_u.begin() + 2, "-w");
  CommandResult bw = Qcowtool(bench_u);
  EXPECT_EQ(bw.exit_code, 1);
  EXPECT_THAT(bw.err, HasSubstr("force-share=on can only be used with "
                                "read-only images"));
}

TEST_F(LockingTest, QemuIsRefusedWhileWeHoldTheImageReadWrite) {
  ASSERT_OK_AND_ASSIGN(auto img, Open(/*rw=*/true));
  ASSERT_OK(img->Write(0, std::vector<uint8_t>(4096, 0x5a)));
  CommandResult io =
      testing::Run({"qemu-io", "-c", "write 0 4k", image_});
  EXPECT_NE(io.exit_code, 0);
  EXPECT_THAT(io.err, HasSubstr("Failed to get \"write\" lock"));
  CommandResult info = testing::Run({"qemu-img", "info", image_});
  EXPECT_NE(info.exit_code, 0);
  EXPECT_THAT(info.err, HasSubstr("Failed to get shared \"write\" lock"));
  // qemu-img -U and qemu-io -r -U read beside us.
  CommandResult info_u = testing::Run({"qemu-img", "info", "-U", image_});
  EXPECT_EQ(info_u.exit_code, 0) << info_u.err;
  CommandResult read_u =
      testing::Run({"qemu-io", "-r", "-U", "-c", "read 0 4k", image_});
  EXPECT_EQ(read_u.exit_code, 0) << read_u.err;
  // A second writer in this very process is refused as well.
  auto second = Open(/*rw=*/true);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  // Closing releases the locks (the Image object may live on).
  ASSERT_OK(img->Close());
  CommandResult after = testing::Run({"qemu-io", "-c", "read -P 0x5a 0 4k",
                                      image_});
  EXPECT_EQ(after.exit_code, 0) << after.err;
  EXPECT_THAT(after.out, Not(HasSubstr("Pattern verification failed")));
}

TEST_F(LockingTest, SharedReadersAreAllowedBothWays) {
  {
    QemuIoHolder qemu(image_, {"-r"});
    ASSERT_TRUE(qemu.WaitLocked());
    ASSERT_OK_AND_ASSIGN(auto ro, Open(/*rw=*/false));
    CommandResult info = Qcowtool({"info", image_});
    EXPECT_EQ(info.exit_code, 0) << info.err;
    // But a writer is not: qemu-io -r forbids writes.
    EXPECT_FALSE(Open(/*rw=*/true).ok());
  }
  ASSERT_OK_AND_ASSIGN(auto ro, Open(/*rw=*/false));
  CommandResult read = testing::Run({"qemu-io", "-r", "-c", "read 0 4k", image_});
  EXPECT_EQ(read.exit_code, 0) << read.err;
  CommandResult info = testing::Run({"qemu-img", "info", image_});
  EXPECT_EQ(info.exit_code, 0) << info.err;
  CommandResult write = testing::Run({"qemu-io", "-c", "write 0 4k", image_});
  EXPECT_NE(write.exit_code, 0);
  EXPECT_THAT(write.err, HasSubstr("Failed to get \"write\" lock"));
}

TEST_F(LockingTest, BackingFilesAreLockedAsQemuLocksThem) {
  const std::string top = dir_.File("top.qcow2");
  CommandResult r = testing::Run({"qemu-img", "create", "-q", "-f", "qcow2",
                                  "-b", image_, "-F", "qcow2", top});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  OpenOptions o;
  o.read_write = true;
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(top, o));
  // The backing file is read-only and shared with readers, never writers.
  CommandResult info = testing::Run({"qemu-img", "info", image_});
  EXPECT_EQ(info.exit_code, 0) << info.err;
  CommandResult write = testing::Run({"qemu-io", "-c", "write 0 4k", image_});
  EXPECT_NE(write.exit_code, 0);
  EXPECT_THAT(write.err, HasSubstr("Failed to get \"write\" lock"));
  // What QEMU holds on it is what we hold: read only, write and resize
  // forbidden.
  EXPECT_TRUE(ByteLocked(image_, 100));
  EXPECT_FALSE(ByteLocked(image_, 101));
  EXPECT_TRUE(ByteLocked(image_, 201));
  EXPECT_TRUE(ByteLocked(image_, 203));
  EXPECT_TRUE(ByteLocked(top, 101));
  EXPECT_TRUE(ByteLocked(top, 103));
}

TEST_F(LockingTest, LiveSnapshotLeavesTheOldTopLockedAsABackingFile) {
  OpenOptions o;
  o.read_write = true;
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(image_, o));
  const std::string top = dir_.File("snap.qcow2");
  ASSERT_OK(img->CreateOverlay(top, CreateOptions{}));
  // The old top is now read by us only: readers may join, writers not.
  CommandResult info = testing::Run({"qemu-img", "info", image_});
  EXPECT_EQ(info.exit_code, 0) << info.err;
  CommandResult write = testing::Run({"qemu-io", "-c", "write 0 4k", image_});
  EXPECT_THAT(write.err, HasSubstr("Failed to get \"write\" lock"));
  CommandResult top_info = testing::Run({"qemu-img", "info", top});
  EXPECT_THAT(top_info.err, HasSubstr("Failed to get shared \"write\" lock"));
  EXPECT_FALSE(ByteLocked(image_, 101));
  EXPECT_TRUE(ByteLocked(top, 101));
}

TEST_F(LockingTest, ForceShareNeedsReadOnlyAndLockingCanBeTurnedOff) {
  auto both = Open(/*rw=*/true, /*share=*/true);
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  CommandResult io = Qcowtool({"io", "-U", image_, "-c", "read 0 4k"});
  EXPECT_EQ(io.exit_code, 1) << io.err;
  CommandResult check = Qcowtool({"check", "-U", "-r", "leaks", image_});
  EXPECT_NE(check.exit_code, 0);
  EXPECT_THAT(check.err, HasSubstr("force-share"));

  QemuIoHolder qemu(image_, {});
  ASSERT_TRUE(qemu.WaitLocked());
  OpenOptions o;
  o.lock = false;
  auto unlocked = Image::Open(image_, o);
  EXPECT_TRUE(unlocked.ok()) << unlocked.status();
}

}  // namespace
}  // namespace qcow2
