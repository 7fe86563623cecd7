// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/bench_output.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

namespace qcow2::tool::bench {

namespace {

// The results document: one member a line, one row a line, and numbers
// to 6 significant digits.
constexpr JsonFormat kReportFormat = {
    .expand_objects = 1,
    .expand_arrays = 2,
    .indent = 2,
    .doubles = JsonFormat::Doubles::kShort,
};

// A value inside a row: on one line.
constexpr JsonFormat kInlineFormat = {.doubles = JsonFormat::Doubles::kShort};

}  // namespace

std::string Value::ToJson() const { return tool::ToJson(*this, kInlineFormat); }

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

Json Record::AsJson() const {
  Json out = Json::Object();
  for (const auto& [key, value] : members_) out.Set(key, value);
  return out;
}

std::string ReportJson(const Report& report) {
  Json rows = Json::Array();
  for (const Record& row : report.rows) rows.Append(row.AsJson());
  Json doc = Json::Object();
  doc.Set("workload", Json::String(report.workload))
      .Set("params", report.params.AsJson())
      .Set("rows", std::move(rows));
  for (const auto& [key, record] : report.extra) doc.Set(key, record.AsJson());
  return ToJson(doc, kReportFormat) + "\n";
}

std::string FormatCell(const Value& v, int decimals) {
  char buf[64];
  switch (v.kind()) {
    case Value::Kind::kNull:
      return "-";
    case Value::Kind::kString:
      return v.str();
    case Value::Kind::kBool:
    case Value::Kind::kArray:
    case Value::Kind::kObject:
      return v.ToJson();
    case Value::Kind::kUint:
    case Value::Kind::kInt:
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
