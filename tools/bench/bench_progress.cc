// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/bench_progress.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>

#include "absl/strings/str_format.h"

namespace qcow2::tool::bench {
namespace {

constexpr int64_t kUpdateIntervalNs = 250'000'000;

volatile std::sig_atomic_t g_stop = 0;

void OnSignal(int sig) {
  g_stop = 1;
  std::signal(sig, SIG_DFL);
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void InstallStopHandler() {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
}

bool StopRequested() { return g_stop != 0; }

Progress::Progress(bool enabled)
    : enabled_(enabled), tty_(enabled && isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() {
  if (line_open_) std::fputs("\r\033[K", stderr);
}

void Progress::Show(const std::string& line, bool final_line) {
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    line_open_ = true;
  } else if (final_line) {
    std::fprintf(stderr, "qcowtool bench: %s\n", line.c_str());
  }
  std::fflush(stderr);
}

void Progress::Step(const std::string& what) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  Show(what + " ...", true);
}

void Progress::BeginCell(const std::string& label) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  label_ = label;
  ops_ = 0;
  cell_start_ = std::chrono::steady_clock::now();
  next_update_ns_ = NowNs() + kUpdateIntervalNs;
  Show(label_, false);
}

void Progress::Add(uint64_t ops) {
  if (!tty_) return;
  const uint64_t total = ops_.fetch_add(ops) + ops;
  const int64_t now = NowNs();
  int64_t due = next_update_ns_.load();
  if (now < due ||
      !next_update_ns_.compare_exchange_strong(due, now + kUpdateIntervalNs)) {
    return;
  }
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  const double secs = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - cell_start_)
                          .count();
  Show(absl::StrFormat("%s: %u requests, %.0f IOPS", label_, total,
                       secs > 0 ? total / secs : 0.0),
       false);
}

void Progress::EndCell(const std::string& summary) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  Show(label_ + ": " + summary, true);
}

}  // namespace qcow2::tool::bench
