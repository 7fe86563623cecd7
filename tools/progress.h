// SPDX-License-Identifier: Apache-2.0
// qemu-img's -p progress line: "    (12.34/100%)\r" on stdout, printed
// when the percentage moved by more than a step since the last print (and
// at 0 and 100), with a newline at the end.
#ifndef QCOW2_TOOLS_PROGRESS_H_
#define QCOW2_TOOLS_PROGRESS_H_

namespace qcow2::tool {

class Progress {
 public:
  // Prints nothing unless `enabled`. `min_step`: percentage points.
  Progress(bool enabled, float min_step);
  ~Progress();  // ends the line when enabled

  // Adds `percent` points (capped at 100).
  void Advance(float percent);

 private:
  void Print();

  bool enabled_;
  float min_step_;
  float current_ = 0;
  float last_print_ = 0;
};

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_PROGRESS_H_
