// SPDX-License-Identifier: Apache-2.0
// Results of `qcowtool bench`: records of named values, printed as an
// aligned table (--output=human) or as one JSON document (--output=json):
//
//   {"workload": "overlay", "params": {...}, "rows": [{...}, ...]}
//
// Values are the project's JSON values (tools/json_writer.h) with the
// builders the workloads use; the document is printed by its one writer.
#ifndef QCOW2_TOOLS_BENCH_OUTPUT_H_
#define QCOW2_TOOLS_BENCH_OUTPUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tools/bench/bench_svg.h"
#include "tools/json_writer.h"

namespace qcow2::tool::bench {

// One result value: null, a string, an unsigned integer, a number, a
// boolean or a list of values.
class Value : public Json {
 public:
  Value() = default;  // null
  static Value Str(std::string_view s) { return Value(Json::String(s)); }
  static Value Uint(uint64_t v) { return Value(Json::Uint(v)); }
  // Null when not finite.
  static Value Num(double v) { return Value(Json::Double(v)); }
  static Value Bool(bool v) { return Value(Json::Bool(v)); }
  template <typename T>
  static Value UintList(const std::vector<T>& v) {
    Json out = Json::Array();
    for (const T& e : v) out.Append(Json::Uint(static_cast<uint64_t>(e)));
    return Value(std::move(out));
  }
  static Value NumList(const std::vector<double>& v) {
    Json out = Json::Array();
    for (double e : v) out.Append(Json::Double(e));
    return Value(std::move(out));
  }
  static Value Ratio(std::optional<double> v) {  // null when absent
    return v ? Num(*v) : Value();
  }

  const std::string& str() const { return string_value(); }

  // JSON text: null, "quoted", 123, 1.5 (6 significant digits), true,
  // [1, 2].
  std::string ToJson() const;

 private:
  explicit Value(Json j) : Json(std::move(j)) {}
};

// Named values in insertion order (keys are set once each).
class Record {
 public:
  Record& Set(std::string_view key, Value v);
  // The value of `key`, or nullptr.
  const Value* Find(std::string_view key) const;
  const std::vector<std::pair<std::string, Value>>& members() const {
    return members_;
  }
  Json AsJson() const;  // an object, members in insertion order

 private:
  std::vector<std::pair<std::string, Value>> members_;
};

// A column of the human table: `key` of each row, formatted with
// `decimals` digits after the point (numbers), right-aligned unless `left`.
struct Column {
  std::string header;
  std::string key;
  int decimals = 0;
  bool left = false;
};

// What a workload produces.
struct Report {
  std::string workload;
  Record params;
  std::vector<Record> rows;
  // Further top-level JSON members after "rows" (e.g. a recommendation).
  std::vector<std::pair<std::string, Record>> extra;

  // Human output: `head` text, then the table of `columns` over
  // `human_rows` (or `rows` when that is empty), then `tail` text.
  std::string head;
  std::vector<Column> columns;
  std::vector<Record> human_rows;
  std::string tail;

  // Panels for --plot (empty: the workload has no chart).
  std::string plot_title;
  std::vector<Panel> plot;
};

// The JSON document, with a trailing newline.
std::string ReportJson(const Report& report);
// The human text (head, table, tail).
std::string ReportHuman(const Report& report);

// A value for a table cell: "-" for null, numbers with `decimals` digits.
std::string FormatCell(const Value& v, int decimals);

// "4k", "64k", "1M", "1536" (block sizes as qemu-img's options spell them).
std::string FormatBlockSize(uint64_t bytes);

}  // namespace qcow2::tool::bench

#endif  // QCOW2_TOOLS_BENCH_OUTPUT_H_
