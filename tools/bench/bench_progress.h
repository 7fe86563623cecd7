// SPDX-License-Identifier: Apache-2.0
// Progress reporting and interruption for `qcowtool bench`.
//
// On a terminal, one status line on stderr is rewritten in place (carriage
// return) while a cell runs and is cleared at the end; otherwise one line
// is printed per setup step and per finished cell, so logs stay readable.
#ifndef QCOW2_TOOLS_BENCH_PROGRESS_H_
#define QCOW2_TOOLS_BENCH_PROGRESS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace qcow2::tool::bench {

class Progress {
 public:
  // `enabled` false (--quiet) prints nothing.
  explicit Progress(bool enabled);
  ~Progress();  // clears the terminal line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // A setup step, e.g. "filling base.qcow2 (1 GiB)".
  void Step(const std::string& what);
  // Starts a measured cell, e.g. "[3/16] depth 1 read 4k qd32".
  void BeginCell(const std::string& label);
  // Counts finished requests of the current cell. Thread-safe.
  void Add(uint64_t ops);
  // Ends the cell with a one-line result summary.
  void EndCell(const std::string& summary);

 private:
  void Show(const std::string& line, bool final_line);

  const bool enabled_;
  const bool tty_;
  std::mutex mu_;
  std::string label_;
  std::chrono::steady_clock::time_point cell_start_;
  std::atomic<uint64_t> ops_{0};
  std::atomic<int64_t> next_update_ns_{0};
  bool line_open_ = false;
};

// Makes SIGINT and SIGTERM request a stop: running cells stop submitting,
// drain, and the run ends with kCancelled (scratch files are removed). A
// second signal kills the process as usual.
void InstallStopHandler();
bool StopRequested();

}  // namespace qcow2::tool::bench

#endif  // QCOW2_TOOLS_BENCH_PROGRESS_H_
