// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/bench_output.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "tools/json_writer.h"

namespace qcow2::tool::bench {

Value Value::Str(std::string_view s) {
  Value v;
  v.kind_ = Kind::kString;
  v.str_ = std::string(s);
  return v;
}

Value Value::Uint(uint64_t u) {
  Value v;
  v.kind_ = Kind::kUint;
  v.uint_ = u;
  return v;
}

Value Value::Num(double d) {
  Value v;
  if (!std::isfinite(d)) return v;
  v.kind_ = Kind::kDouble;
  v.double_ = d;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}

double Value::number() const {
  if (kind_ == Kind::kUint) return static_cast<double>(uint_);
  if (kind_ == Kind::kDouble) return double_;
  return 0;
}

std::string Value::ToJson() const {
  char buf[64];
  switch (kind_) {
    case Kind::kNull:
      return "null";
    case Kind::kString:
      return JsonQuote(str_);
    case Kind::kUint:
      std::snprintf(buf, sizeof buf, "%" PRIu64, uint_);
      return buf;
    case Kind::kDouble:
      std::snprintf(buf, sizeof buf, "%.6g", double_);
      return buf;
    case Kind::kBool:
      return bool_ ? "true" : "false";
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_.size(); ++i) {
        out += (i > 0 ? ", " : "") + list_[i].ToJson();
      }
      return out + "]";
    }
  }
  return "null";
}

Record& Record::Set(std::string_view key, Value v) {
  members_.emplace_back(std::string(key), std::move(v));
  return *this;
}

const Value* Record::Find(std::string_view key) const {
  for (const auto& [k, v] : members_) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string Record::ToJson() const {
  std::string out = "{";
  for (size_t i = 0; i < members_.size(); ++i) {
    if (i > 0) out += ", ";
    out += JsonQuote(members_[i].first);
    out += ": ";
    out += members_[i].second.ToJson();
  }
  return out + "}";
}

std::string ReportJson(const Report& report) {
  std::string out = "{\n  \"workload\": " + JsonQuote(report.workload) +
                    ",\n  \"params\": " + report.params.ToJson() +
                    ",\n  \"rows\": [";
  for (size_t i = 0; i < report.rows.size(); ++i) {
    out += i == 0 ? "\n    " : ",\n    ";
    out += report.rows[i].ToJson();
  }
  out += report.rows.empty() ? "]" : "\n  ]";
  for (const auto& [key, record] : report.extra) {
    out += ",\n  " + JsonQuote(key) + ": " + record.ToJson();
  }
  return out + "\n}\n";
}

std::string FormatCell(const Value& v, int decimals) {
  char buf[64];
  switch (v.kind()) {
    case Value::Kind::kNull:
      return "-";
    case Value::Kind::kString:
      return v.str();
    case Value::Kind::kBool:
    case Value::Kind::kList:
      return v.ToJson();
    case Value::Kind::kUint:
      std::snprintf(buf, sizeof buf, "%.0f", v.number());
      return buf;
    case Value::Kind::kDouble:
      std::snprintf(buf, sizeof buf, "%.*f", decimals, v.number());
      return buf;
  }
  return "-";
}

std::string FormatBlockSize(uint64_t bytes) {
  char buf[32];
  if (bytes != 0 && bytes % (1 << 20) == 0) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 "M", bytes >> 20);
  } else if (bytes != 0 && bytes % 1024 == 0) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 "k", bytes >> 10);
  } else {
    std::snprintf(buf, sizeof buf, "%" PRIu64, bytes);
  }
  return buf;
}

namespace {

// The table like qemu-img's listings: a header line, then one line per
// row; columns separated by two spaces, numbers right-aligned.
std::string RenderTable(const std::vector<Column>& columns,
                        const std::vector<Record>& rows) {
  std::vector<std::vector<std::string>> cells;
  std::vector<size_t> width;
  for (const Column& c : columns) width.push_back(c.header.size());
  for (const Record& r : rows) {
    std::vector<std::string> line;
    for (size_t i = 0; i < columns.size(); ++i) {
      const Value* v = r.Find(columns[i].key);
      line.push_back(v ? FormatCell(*v, columns[i].decimals) : "-");
      width[i] = std::max(width[i], line.back().size());
    }
    cells.push_back(std::move(line));
  }
  auto emit = [&](const std::vector<std::string>& line) {
    std::string out;
    for (size_t i = 0; i < line.size(); ++i) {
      const size_t pad = width[i] - line[i].size();
      if (i > 0) out += "  ";
      if (columns[i].left) {
        out += line[i];
        if (i + 1 < line.size()) out.append(pad, ' ');
      } else {
        out.append(pad, ' ');
        out += line[i];
      }
    }
    return out + "\n";
  };
  std::vector<std::string> header;
  for (const Column& c : columns) header.push_back(c.header);
  std::string out = emit(header);
  for (const auto& line : cells) out += emit(line);
  return out;
}

}  // namespace

std::string ReportHuman(const Report& report) {
  std::string out = report.head;
  if (!report.columns.empty()) {
    out += RenderTable(report.columns, report.human_rows.empty()
                                           ? report.rows
                                           : report.human_rows);
  }
  return out + report.tail;
}

}  // namespace qcow2::tool::bench
