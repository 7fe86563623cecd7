// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the tests: temporary directories, running qemu-img and
// friends, status assertions.
#ifndef QCOW2_TESTS_UTIL_TEST_UTIL_H_
#define QCOW2_TESTS_UTIL_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

#define ASSERT_OK(expr)                                      \
  do {                                                       \
    const ::absl::Status qcow2_test_s_ = (expr);             \
    ASSERT_TRUE(qcow2_test_s_.ok()) << qcow2_test_s_;        \
  } while (0)
#define EXPECT_OK(expr)                                      \
  do {                                                       \
    const ::absl::Status qcow2_test_s_ = (expr);             \
    EXPECT_TRUE(qcow2_test_s_.ok()) << qcow2_test_s_;        \
  } while (0)
// Unwraps a StatusOr into `lhs`, failing the test on error.
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr)                                   \
  ASSERT_OK_AND_ASSIGN_IMPL_(QCOW2_TEST_CONCAT_(sor_, __LINE__), lhs, rexpr)
#define QCOW2_TEST_CONCAT_INNER_(a, b) a##b
#define QCOW2_TEST_CONCAT_(a, b) QCOW2_TEST_CONCAT_INNER_(a, b)
#define ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  ASSERT_TRUE(tmp.ok()) << tmp.status();            \
  lhs = std::move(tmp).value()

namespace qcow2::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents when
// the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `argv` (no shell) and captures its output.
CommandResult Run(const std::vector<std::string>& argv);

// Runs through /bin/sh -c (for pipelines in tests that need them).
CommandResult RunShell(const std::string& command);

// Runs `run`, a QEMU command that makes a LUKS key slot (qemu-img create or
// amend), until it succeeds or fails for another reason (9 tries at most).
// Debian 12's QEMU times PBKDF2 on the thread's CPU clock and gives up
// ("Unable to get accurate CPU usage") when its short first run reads 0 ms,
// as the clock only moves at a scheduler tick: QEMU's measurement, not the
// image (fixed upstream in 2025).
CommandResult RetryQemuKeyTiming(const std::function<CommandResult()>& run);

// True when qemu-img and qemu-io are on PATH.
bool HaveQemu();

// Skips the current test when qemu-img is missing.
#define SKIP_WITHOUT_QEMU()                                       \
  do {                                                            \
    if (!::qcow2::testing::HaveQemu()) GTEST_SKIP() << "no qemu-img"; \
  } while (0)

// Reads a whole host file.
absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path);
absl::Status WriteFileBytes(const std::string& path,
                            const std::vector<uint8_t>& bytes);

// Converts `image` to raw with `qemu-img convert -O raw` and returns the
// bytes (the oracle for every read test). With -U (force-share): many
// tests look at an image their process still holds open read-write,
// after a flush; the tests of locking run qemu-img without it.
absl::StatusOr<std::vector<uint8_t>> QemuReadAll(const std::string& image);

// The disk as internal snapshot `id` of `image` holds it, through
// `qemu-img convert -U -l snapshot.id=ID -O raw` (QEMU's reader as the
// judge of the snapshots we write).
absl::StatusOr<std::vector<uint8_t>> QemuReadSnapshot(const std::string& image,
                                                      const std::string& id);

// Runs `qemu-img check -U --output=json` (see QemuReadAll on -U) and
// returns its exit code (0 clean, 2 corruptions, 3 leaks) with the output.
CommandResult QemuCheck(const std::string& image);

// QemuReadAll, once `qemu-img check` has found `image` clean: an error
// carrying check's output otherwise.
absl::StatusOr<std::vector<uint8_t>> QemuCheckedReadAll(
    const std::string& image);

// Path of the qcowtool binary under test.
std::string QcowtoolPath();

// Whether an open file description other than `fd`'s holds byte `byte` of
// its file (an OFD lock test as a writer would make it: our own locks
// never conflict).
bool OtherHoldsByte(int fd, int byte);

// Whether anyone holds byte `byte` of `path` (QEMU's image lock bytes),
// as a fresh opener sees it. False if `path` cannot be opened.
bool ByteLocked(const std::string& path, int byte);

}  // namespace qcow2::testing

#endif  // QCOW2_TESTS_UTIL_TEST_UTIL_H_
