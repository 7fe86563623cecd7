// SPDX-License-Identifier: Apache-2.0
#include "testing/gate_file.h"

#include <chrono>
#include <future>
#include <utility>

#include "gtest/gtest.h"

namespace qcow2::testing {

void GateFile::Arm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = true;
}

void GateFile::Release() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
  released_ = true;
  blocked_ = 0;  // armed again, it holds the next matching operation
  cv_.notify_all();
}

bool GateFile::released() {
  std::lock_guard<std::mutex> lock(mu_);
  return released_;
}

bool GateFile::WaitBlocked() {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::seconds(30),
                      [this] { return blocked_ > 0; });
}

void GateFile::Hold() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!armed_ || blocked_ > 0) return;
  ++blocked_;
  cv_.notify_all();
  cv_.wait(lock, [this] { return !armed_; });
}

absl::StatusOr<std::unique_ptr<File>> GateOpener::Open(
    const std::string& path, const FileOptions& opts) {
  auto f = OpenPosixFile(path, opts);
  if (!f.ok()) return f.status();
  auto g = std::make_unique<GateFile>(std::move(*f), spec_);
  last_ = g.get();
  return std::unique_ptr<File>(std::move(g));
}

void ExpectGoesOnWhileHeld(GateFile* gate, std::thread& held,
                           std::function<absl::Status()> others,
                           const char* what) {
  auto done = std::async(std::launch::async, std::move(others));
  const bool went_on =
      done.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  gate->Release();
  held.join();
  EXPECT_TRUE(went_on) << "a request waited for " << what;
  absl::Status s = done.get();
  EXPECT_TRUE(s.ok()) << s;
}

void HoldAndExpectGoesOn(GateFile* gate, std::function<void()> held,
                         std::function<absl::Status()> others,
                         const char* what) {
  gate->Arm();
  std::thread t(std::move(held));
  if (!gate->WaitBlocked()) {
    ADD_FAILURE() << "nothing was held at the gate before " << what;
    gate->Release();
    t.join();
    return;
  }
  ExpectGoesOnWhileHeld(gate, t, std::move(others), what);
}

}  // namespace qcow2::testing
