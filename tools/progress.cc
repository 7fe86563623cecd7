// SPDX-License-Identifier: Apache-2.0
#include "tools/progress.h"

#include <algorithm>
#include <cstdio>

namespace qcow2::tool {

Progress::Progress(bool enabled, float min_step)
    : enabled_(enabled), min_step_(min_step) {}

Progress::~Progress() {
  if (enabled_) std::printf("\n");
}

void Progress::Advance(float percent) {
  current_ = std::min(current_ + percent, 100.0f);
  if (current_ > last_print_ + min_step_ || current_ < last_print_ - min_step_ ||
      current_ == 0 || current_ == 100) {
    last_print_ = current_;
    Print();
  }
}

void Progress::Print() {
  if (!enabled_) return;
  std::printf("    (%3.2f/100%%)\r", current_);
  std::fflush(stdout);
}

}  // namespace qcow2::tool
