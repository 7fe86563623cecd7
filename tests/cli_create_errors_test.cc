// SPDX-License-Identifier: Apache-2.0
// A create that fails leaves nothing it made behind, never removes what was
// there before, and names the real cause.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
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
using testing::CommandResult;
using testing::TempDir;

CommandResult Qcowtool(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::QcowtoolPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::Run(argv);
}

TEST(CreateErrorsTest, TooLargeLeavesNoFile) {
  TempDir dir;
  const std::string path = dir.File("x.qcow2");
  CommandResult r = Qcowtool({"create", "-q", path, "1000000T"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("too large for cluster size"));
  EXPECT_FALSE(std::filesystem::exists(path)) << "a failed create left "
                                              << path;
  // The library alone, too: it made the file, so it removes it.
  CreateOptions o;
  o.size = 1000000ull << 40;
  absl::Status s = CreateImage(path, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(CreateErrorsTest, FailureAfterTheFileIsMadeRemovesIt) {
  TempDir dir;
  const std::string path = dir.File("x.qcow2");
  // The create fails after opening the new file: a full preallocation of
  // an image far larger than any disk here.
  CreateOptions o;
  o.format = ImageFormat::kRaw;
  o.size = 1ull << 62;
  o.preallocation = Preallocation::kFalloc;
  absl::Status s = CreateImage(path, o);
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(std::filesystem::exists(path)) << s;
}

TEST(CreateErrorsTest, ExistingFileIsKeptWhenTheCreateCannotWork) {
  TempDir dir;
  const std::string path = dir.File("keep.qcow2");
  ASSERT_OK(testing::WriteFileBytes(path, std::vector<uint8_t>(4096, 7)));
  CommandResult r = Qcowtool({"create", "-q", path, "1000000T"});
  EXPECT_EQ(r.exit_code, 1);
  ASSERT_OK_AND_ASSIGN(auto bytes, testing::ReadFileBytes(path));
  EXPECT_EQ(bytes, std::vector<uint8_t>(4096, 7));
  // The library never replaces a file.
  CreateOptions o;
  o.size = 1 << 20;
  absl::Status s = CreateImage(path, o);
  EXPECT_FALSE(s.ok());
  ASSERT_OK_AND_ASSIGN(bytes, testing::ReadFileBytes(path));
  EXPECT_EQ(bytes, std::vector<uint8_t>(4096, 7));
}

TEST(CreateErrorsTest, DirectoryIsNamedAsSuch) {
  TempDir dir;
  const std::string sub = dir.File("sub");
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
  CommandResult r = Qcowtool({"create", "-q", sub, "1M"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(sub + ": is a directory"));
  EXPECT_TRUE(std::filesystem::is_directory(sub));
  CreateOptions o;
  o.size = 1 << 20;
  absl::Status s = CreateImage(sub, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("is a directory"));
}

TEST(CreateErrorsTest, ImageHeldByQemuIsNotReplaced) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string path = dir.File("held.qcow2");
  ASSERT_EQ(Qcowtool({"create", "-q", path, "1M"}).exit_code, 0);
  ASSERT_EQ(Qcowtool({"io", path, "-c", "write -P 0x61 0 4k"}).exit_code, 0);
  {
    OpenOptions o;
    o.read_write = true;
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(path, o));
    CommandResult r = Qcowtool({"create", "-q", path, "2M"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr("locked by another process"));
  }
  CommandResult read =
      testing::Run({"qemu-io", "-c", "read -P 0x61 0 4k", path});
  EXPECT_EQ(read.exit_code, 0) << read.out << read.err;
  EXPECT_THAT(read.out, ::testing::Not(HasSubstr("verification failed")));
}

}  // namespace
}  // namespace qcow2
