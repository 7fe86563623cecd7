// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/bench_svg.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace qcow2::tool::bench {
namespace {

// Geometry of one panel, in SVG user units.
constexpr double kWidth = 860;
constexpr double kTitleHeight = 40;
constexpr double kPanelHeight = 330;
constexpr double kLeft = 90;  // room for tick labels and the y title
constexpr double kPlotWidth = 560;
constexpr double kTop = 40;  // panel title above the plot area
constexpr double kPlotHeight = 220;
constexpr double kLegendX = kLeft + kPlotWidth + 20;

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                    "#9467bd", "#8c564b", "#e377c2", "#17becf"};

const char* Colour(size_t i) {
  return kPalette[i % (sizeof kPalette / sizeof kPalette[0])];
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A tick step of 1, 2 or 5 times a power of ten giving about five ticks.
double NiceStep(double max) {
  const double raw = max / 5;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  if (norm <= 1) return mag;
  if (norm <= 2) return 2 * mag;
  if (norm <= 5) return 5 * mag;
  return 10 * mag;
}

std::string TickLabel(double v) {
  if (v >= 1e6) return absl::StrFormat("%gM", v / 1e6);
  if (v >= 1e4) return absl::StrFormat("%gk", v / 1e3);
  return absl::StrFormat("%g", v);
}

std::string Text(double x, double y, const std::string& s, const char* anchor,
                 int size, const char* extra = "") {
  return absl::StrFormat(
      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%d\"%s>"
      "%s</text>\n",
      x, y, anchor, size, extra, Escape(s));
}

class PanelWriter {
 public:
  PanelWriter(const Panel& p, double y0) : p_(p), y0_(y0) {
    for (const Series& s : p.series) {
      for (const auto& v : s.values) {
        if (v) {
          max_ = std::max(max_, *v);
          any_ = true;
        }
      }
    }
    if (max_ <= 0) max_ = 1;
    step_ = NiceStep(max_);
    top_ = std::ceil(max_ / step_) * step_;
  }

  std::string Render() {
    std::string out = Text(kLeft + kPlotWidth / 2, y0_ + 24, p_.title, "middle",
                           15, " font-weight=\"bold\"");
    Axes(&out);
    if (!any_) {
      out += Text(kLeft + kPlotWidth / 2, PlotY(top_ / 2), p_.empty_note,
                  "middle", 13, " fill=\"#666\"");
    }
    for (size_t s = 0; s < p_.series.size(); ++s) {
      if (p_.bars) {
        Bars(s, &out);
      } else {
        Line(s, &out);
      }
      Legend(s, &out);
    }
    return out;
  }

 private:
  double PlotY(double v) const {
    return y0_ + kTop + kPlotHeight - v / top_ * kPlotHeight;
  }
  double SlotWidth() const {
    return kPlotWidth / std::max<size_t>(1, p_.categories.size());
  }
  double CategoryX(size_t i) const { return kLeft + (i + 0.5) * SlotWidth(); }

  void Axes(std::string* out) const {
    const double bottom = PlotY(0);
    for (double v = 0; v <= top_ * 1.0001; v += step_) {
      const double y = PlotY(v);
      absl::StrAppendFormat(out,
                            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
                            "y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                            kLeft, y, kLeft + kPlotWidth, y);
      *out += Text(kLeft - 6, y + 4, TickLabel(v), "end", 11);
    }
    absl::StrAppendFormat(out,
                          "<path d=\"M%.1f %.1f V%.1f H%.1f\" fill=\"none\" "
                          "stroke=\"#000\"/>\n",
                          kLeft, y0_ + kTop, bottom, kLeft + kPlotWidth);
    size_t lines = 1;
    for (size_t i = 0; i < p_.categories.size(); ++i) {
      const std::vector<std::string> parts =
          absl::StrSplit(p_.categories[i], '\n');
      lines = std::max(lines, parts.size());
      for (size_t l = 0; l < parts.size(); ++l) {
        *out +=
            Text(CategoryX(i), bottom + 16 + 13 * l, parts[l], "middle", 11);
      }
    }
    *out += Text(kLeft + kPlotWidth / 2, bottom + 23 + 13 * lines, p_.x_label,
                 "middle", 12);
    const double ymid = y0_ + kTop + kPlotHeight / 2;
    *out += Text(
        22, ymid, p_.y_label, "middle", 12,
        absl::StrFormat(" transform=\"rotate(-90 22 %.1f)\"", ymid).c_str());
  }

  void Line(size_t s, std::string* out) const {
    const Series& series = p_.series[s];
    std::string path;
    bool pen_down = false;
    for (size_t i = 0; i < series.values.size(); ++i) {
      if (!series.values[i]) {
        pen_down = false;
        continue;
      }
      absl::StrAppendFormat(&path, "%s%.1f %.1f ", pen_down ? "L" : "M",
                            CategoryX(i), PlotY(*series.values[i]));
      pen_down = true;
      absl::StrAppendFormat(out,
                            "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" "
                            "fill=\"%s\"><title>%s: %g</title></circle>\n",
                            CategoryX(i), PlotY(*series.values[i]), Colour(s),
                            Escape(series.name), *series.values[i]);
    }
    if (!path.empty()) {
      absl::StrAppendFormat(out,
                            "<path d=\"%s\" fill=\"none\" stroke=\"%s\" "
                            "stroke-width=\"2\"/>\n",
                            path, Colour(s));
    }
  }

  void Bars(size_t s, std::string* out) const {
    const Series& series = p_.series[s];
    const double group = SlotWidth() * 0.8;
    const double w = group / std::max<size_t>(1, p_.series.size());
    for (size_t i = 0; i < series.values.size(); ++i) {
      if (!series.values[i]) continue;
      const double x = CategoryX(i) - group / 2 + s * w;
      const double y = PlotY(*series.values[i]);
      absl::StrAppendFormat(out,
                            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                            "height=\"%.1f\" fill=\"%s\"><title>%s: %g"
                            "</title></rect>\n",
                            x, y, w * 0.95, PlotY(0) - y, Colour(s),
                            Escape(series.name), *series.values[i]);
    }
  }

  void Legend(size_t s, std::string* out) const {
    const double y = y0_ + kTop + 8 + 20 * s;
    absl::StrAppendFormat(out,
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" "
                          "height=\"10\" fill=\"%s\"/>\n",
                          kLegendX, y - 9, Colour(s));
    *out += Text(kLegendX + 20, y, p_.series[s].name, "start", 12);
  }

  const Panel& p_;
  const double y0_;
  double max_ = 0;
  bool any_ = false;
  double step_ = 1;
  double top_ = 1;
};

}  // namespace

std::string RenderSvg(const std::string& title,
                      const std::vector<Panel>& panels) {
  const double height = kTitleHeight + kPanelHeight * panels.size();
  std::string out = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
      "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "font-family=\"sans-serif\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
      kWidth, height, kWidth, height);
  out += Text(kWidth / 2, 26, title, "middle", 17, " font-weight=\"bold\"");
  for (size_t i = 0; i < panels.size(); ++i) {
    out += PanelWriter(panels[i], kTitleHeight + kPanelHeight * i).Render();
  }
  return out + "</svg>\n";
}

absl::Status WriteSvg(const std::string& path, const std::string& title,
                      const std::vector<Panel>& panels) {
  const std::string svg = RenderSvg(title, panels);
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", path));
  }
  const bool written = std::fwrite(svg.data(), 1, svg.size(), f) == svg.size();
  if (std::fclose(f) != 0 || !written) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace qcow2::tool::bench
