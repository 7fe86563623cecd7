// SPDX-License-Identifier: Apache-2.0
// Results of `qcowtool bench`: records of named values, printed as an
// aligned table (--output=human) or as one JSON document (--output=json):
//
//   {"workload": "overlay", "params": {...}, "rows": [{...}, ...]}
//
// tools/json_writer.h holds only unsigned integers, so results (which need
// fractions and null) have this small value type of their own; strings are
// still quoted by JsonQuote().
#ifndef QCOW2_TOOLS_BENCH_OUTPUT_H_
#define QCOW2_TOOLS_BENCH_OUTPUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tools/bench/bench_svg.h"

namespace qcow2::tool::bench {

// One result value: null, a string, an unsigned integer, a number, a
// boolean or a list of values.
class Value {
 public:
  enum class Kind { kNull, kString, kUint, kDouble, kBool, kList };

  Value() = default;  // null
  static Value Str(std::string_view s);
  static Value Uint(uint64_t v);
  static Value Num(double v);  // null when not finite
  static Value Bool(bool v);
  template <typename T>
  static Value UintList(const std::vector<T>& v) {
    Value out;
    out.kind_ = Kind::kList;
    for (const T& e : v) out.list_.push_back(Uint(static_cast<uint64_t>(e)));
    return out;
  }
  static Value NumList(const std::vector<double>& v) {
    Value out;
    out.kind_ = Kind::kList;
    for (double e : v) out.list_.push_back(Num(e));
    return out;
  }
  static Value Ratio(std::optional<double> v) {  // null when absent
    return v ? Num(*v) : Value();
  }

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }
  const std::string& str() const { return str_; }
  double number() const;  // kUint and kDouble; 0 otherwise

  // JSON text: null, "quoted", 123, 1.5 (6 significant digits), true,
  // [1, 2].
  std::string ToJson() const;

 private:
  Kind kind_ = Kind::kNull;
  std::string str_;
  uint64_t uint_ = 0;
  double double_ = 0;
  bool bool_ = false;
  std::vector<Value> list_;
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
  std::string ToJson() const;  // one line

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
