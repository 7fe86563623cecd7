// SPDX-License-Identifier: Apache-2.0
// A small JSON reader for the output of `qemu-img map/info/check
// --output=json` (and anything else a test needs to parse).
//
//   auto v = qcow2::testing::json::Parse(text);
//   if (!v.ok()) ...;
//   for (const json::Value& e : v->array()) {
//     uint64_t start = e["start"].as_uint64();
//     bool zero = e["zero"].as_bool();
//     if (const json::Value* off = e.Find("offset")) ...
//   }
//
// Supports objects (key order kept; duplicate keys kept, Find returns the
// first), arrays, strings (all escapes, \u with surrogate pairs to UTF-8),
// numbers (integers as int64 or, above INT64_MAX, uint64; everything else as
// double), true/false/null. Nesting is limited to 256 levels.
//
// This is the tests' one JSON parser; text is written by the project's one
// writer (tools/json_writer.h), which ToString() and Quote() call.
#ifndef QCOW2_TESTS_UTIL_JSON_LITE_H_
#define QCOW2_TESTS_UTIL_JSON_LITE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace qcow2::testing::json {

class Value {
 public:
  enum class Type { kNull, kBool, kInt, kUint, kDouble, kString, kArray, kObject };
  using Array = std::vector<Value>;
  using Object = std::vector<std::pair<std::string, Value>>;

  Value() = default;  // null
  static Value Null() { return Value(); }
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Uint(uint64_t u);  // stored as kInt when it fits
  static Value Double(double d);
  static Value String(std::string s);
  static Value MakeArray(Array a);
  static Value MakeObject(Object o);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  // kInt or kUint.
  bool is_integer() const { return type_ == Type::kInt || type_ == Type::kUint; }
  bool is_number() const { return is_integer() || type_ == Type::kDouble; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Accessors. Asking for the wrong type returns the zero value (false, 0,
  // "", empty); check the type first where it matters. as_int64/as_uint64
  // convert between the integer kinds when the value fits, and truncate
  // doubles.
  bool as_bool() const { return type_ == Type::kBool && bool_; }
  int64_t as_int64() const;
  uint64_t as_uint64() const;
  double as_double() const;
  const std::string& as_string() const;
  const Array& array() const;
  const Object& object() const;

  // Object member `key` (first one), or nullptr (also for non-objects).
  const Value* Find(std::string_view key) const;
  // Object member `key`, or a null value when absent.
  const Value& operator[](std::string_view key) const;
  // Array element `i`, or a null value when out of range.
  const Value& operator[](size_t i) const;
  // Elements of an array / members of an object; 0 otherwise.
  size_t size() const;

  // JSON text on one line without spaces (JsonFormat::Tight(); round-trips
  // through Parse).
  std::string ToString() const;

  friend bool operator==(const Value& a, const Value& b);
  friend bool operator!=(const Value& a, const Value& b) { return !(a == b); }

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  int64_t int_ = 0;
  uint64_t uint_ = 0;
  double double_ = 0;
  std::string string_;
  Array array_;
  Object object_;
};

// Parses a whole JSON document (surrounding whitespace allowed). Errors are
// kInvalidArgument naming the byte offset.
absl::StatusOr<Value> Parse(std::string_view text);

// Quotes `s` as a JSON string literal (tool::JsonQuote: non-ASCII as \u
// escapes, as QEMU writes them).
std::string Quote(std::string_view s);

}  // namespace qcow2::testing::json

#endif  // QCOW2_TESTS_UTIL_JSON_LITE_H_
