// SPDX-License-Identifier: Apache-2.0
// Charts for `qcowtool bench --plot FILE.svg`: a standalone SVG document
// (no scripts, no external fonts or styles) with one or more panels stacked
// vertically, each with axes, tick labels, axis titles and a legend.
#ifndef QCOW2_TOOLS_BENCH_SVG_H_
#define QCOW2_TOOLS_BENCH_SVG_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace qcow2::tool::bench {

// One line (or one bar colour): a value per category; nullopt leaves a
// gap.
struct Series {
  std::string name;
  std::vector<std::optional<double>> values;
};

struct Panel {
  std::string title;
  std::string x_label;
  std::string y_label;
  // Evenly spaced along x; '\n' breaks a label into lines (at most 3).
  std::vector<std::string> categories;
  std::vector<Series> series;
  bool bars = false;  // grouped bars instead of lines with markers
  // Shown in the plot area when no series has any value.
  std::string empty_note = "no data";
};

// The SVG document: `title` on top, then the panels.
std::string RenderSvg(const std::string& title,
                      const std::vector<Panel>& panels);

// Writes RenderSvg() to `path`. Errors name the path.
absl::Status WriteSvg(const std::string& path, const std::string& title,
                      const std::vector<Panel>& panels);

}  // namespace qcow2::tool::bench

#endif  // QCOW2_TOOLS_BENCH_SVG_H_
