// SPDX-License-Identifier: Apache-2.0
// A File that holds one chosen operation until the test lets it go, to
// show what other requests can do meanwhile.
#ifndef QCOW2_TESTING_GATE_FILE_H_
#define QCOW2_TESTING_GATE_FILE_H_

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "qcow2/file.h"
#include "testing/forwarding_file.h"

namespace qcow2::testing {

// Which operations the gate holds: reads of exactly `read_size` bytes (0:
// none), flushes, discards, growth (Reserve and Extend). Reserve fails
// with `reserve_error` when it is not kOk, after the hold.
struct GateSpec {
  size_t read_size = 0;
  bool flush = false;
  bool discard = false;
  bool grow = false;
  absl::StatusCode reserve_error = absl::StatusCode::kOk;
};

// Once armed, the first matching operation waits for Release(); every
// other operation, and matching ones after that first, go straight to the
// file beneath (until the gate is armed again).
class GateFile : public ForwardingFile {
 public:
  GateFile(std::unique_ptr<File> inner, GateSpec spec)
      : ForwardingFile(std::move(inner)), spec_(spec) {}

  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) override {
    if (spec_.read_size != 0 && buf.size() == spec_.read_size) Hold();
    return ForwardingFile::ReadAt(offset, buf);
  }
  // Vectored reads go through ReadAt, segment by segment, so the gate
  // sees each.
  absl::Status ReadvAt(uint64_t offset, absl::Span<const iovec> iov) override {
    return File::ReadvAt(offset, iov);
  }
  absl::Status Flush() override {
    if (spec_.flush) Hold();
    return ForwardingFile::Flush();
  }
  absl::Status Extend(uint64_t old_size, uint64_t new_size) override {
    if (spec_.grow) Hold();
    return ForwardingFile::Extend(old_size, new_size);
  }
  absl::Status Reserve(uint64_t offset, uint64_t len) override {
    if (spec_.grow) Hold();
    if (spec_.reserve_error != absl::StatusCode::kOk) {
      return absl::Status(spec_.reserve_error, "reserve refused by the test");
    }
    return ForwardingFile::Reserve(offset, len);
  }
  absl::Status Discard(uint64_t offset, uint64_t len) override {
    if (spec_.discard) Hold();
    return ForwardingFile::Discard(offset, len);
  }

  void Arm();
  void Release();
  bool released();
  // Waits until an operation is held; false after 30 s.
  bool WaitBlocked();

 private:
  void Hold();

  const GateSpec spec_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;
  bool released_ = false;
  int blocked_ = 0;
};

// Opens POSIX files behind a GateFile; last() is the most recent.
class GateOpener : public FileOpener {
 public:
  explicit GateOpener(GateSpec spec) : spec_(spec) {}
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const FileOptions& opts) override;
  GateFile* last() const { return last_; }

 private:
  const GateSpec spec_;
  GateFile* last_ = nullptr;
};

// With an operation of thread `held` held at `gate`, runs `others` on a
// thread of its own; then lets the held operation go and joins `held`.
// Fails the test if `others` did not finish within 30 s while the
// operation was held (`what` says what it waited for), or failed.
void ExpectGoesOnWhileHeld(GateFile* gate, std::thread& held,
                           std::function<absl::Status()> others,
                           const char* what);
// The whole pattern: arms `gate`, runs `held` on a thread of its own until
// an operation of it is held there (a failure if none is within 30 s),
// then ExpectGoesOnWhileHeld.
void HoldAndExpectGoesOn(GateFile* gate, std::function<void()> held,
                         std::function<absl::Status()> others,
                         const char* what);

}  // namespace qcow2::testing

#endif  // QCOW2_TESTING_GATE_FILE_H_
