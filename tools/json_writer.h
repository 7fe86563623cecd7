// SPDX-License-Identifier: Apache-2.0
// The project's one JSON writer: a small document builder and the printer
// behind qcowtool's --output=json, `qcowtool bench`'s results and the
// tests' JSON text (tests/util/json_lite.h parses; it writes through here).
//
//   Json info = Json::Object();
//   info.Set("virtual-size", Json::Uint(1 << 20));
//   info.Set("filename", Json::String("disk.qcow2"));
//   std::string text = ToJson(info, JsonStyle::kQemuPretty);
//
// The users differ only in layout, and a JsonFormat names it:
// QemuPretty() reproduces `qemu-img info --output=json` byte for byte (a
// 4-space indent, `"key": value`, and object members in the order QEMU's
// QDict iterates them, by key hash bucket, which is neither insertion nor
// alphabetical order); Compact() is one line with `, ` and `: `; Tight()
// one line without spaces. Other layouts (bench's one row per line) set
// the fields themselves.
//
// Strings are UTF-8; control characters, DEL and every non-ASCII code point
// are written as \uXXXX escapes (surrogate pairs above U+FFFF), and invalid
// UTF-8 becomes U+FFFD, as QEMU does. Numbers are 64-bit integers (signed
// or unsigned) or finite doubles; JSON has no NaN, so Double() of a
// non-finite value is null.
//
// Not thread-safe; values are plain copyable data.
#ifndef QCOW2_TOOLS_JSON_WRITER_H_
#define QCOW2_TOOLS_JSON_WRITER_H_

#include <climits>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qcow2::tool {

class Json {
 public:
  enum class Kind {
    kNull,
    kBool,
    kInt,
    kUint,
    kDouble,
    kString,
    kArray,
    kObject,
  };

  Json() = default;  // null
  static Json Null() { return Json(); }
  static Json Object() { return Json(Kind::kObject); }
  static Json Array() { return Json(Kind::kArray); }
  static Json String(std::string_view s);
  static Json Uint(uint64_t v);
  static Json Int(int64_t v);
  static Json Double(double v);  // null when not finite
  static Json Bool(bool v);

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }

  // Adds a member to an object (keys are not deduplicated: callers set
  // each key once). REQUIRES: kind() == kObject. Returns *this.
  Json& Set(std::string_view key, Json value);
  // Appends an element. REQUIRES: kind() == kArray. Returns *this.
  Json& Append(Json value);

  const std::vector<std::pair<std::string, Json>>& members() const {
    return members_;
  }
  const std::vector<Json>& elements() const { return elements_; }
  const std::string& string_value() const { return string_; }
  uint64_t uint_value() const { return uint_; }
  int64_t int_value() const { return int_; }
  double double_value() const { return double_; }
  bool bool_value() const { return bool_; }
  // A number of any kind as a double; 0 for the other kinds.
  double number() const;

 private:
  explicit Json(Kind kind) : kind_(kind) {}

  Kind kind_ = Kind::kNull;
  std::string string_;
  uint64_t uint_ = 0;
  int64_t int_ = 0;
  double double_ = 0;
  bool bool_ = false;
  std::vector<std::pair<std::string, Json>> members_;  // kObject
  std::vector<Json> elements_;                         // kArray
};

// How ToJson lays a document out. Containers nested less deep than
// `expand_objects` / `expand_arrays` (the document itself is depth 0) put
// each member on a line of its own, indented by `indent` spaces a level;
// deeper ones stay on one line, members parted by `comma`.
struct JsonFormat {
  enum class Doubles {
    kRoundTrip,  // %.17g, always with a point or an exponent (reads back
                 // as a double)
    kShort,      // %.6g, for people
  };

  int expand_objects = 0;
  int expand_arrays = 0;
  int indent = 0;
  std::string_view comma = ", ";
  std::string_view colon = ": ";
  Doubles doubles = Doubles::kRoundTrip;
  // QEMU's printer: object members in QDict order, and an empty expanded
  // container still breaks the line before its closing bracket.
  bool qemu = false;
  // What opens an object: "{", or "{ " as in qemu-img map's entries.
  std::string_view open_object = "{";

  // `qemu-img ... --output=json`.
  static constexpr JsonFormat QemuPretty() {
    return {INT_MAX, INT_MAX, 4, ", ", ": ", Doubles::kRoundTrip, true};
  }
  // One line, insertion order, `, ` and `: `.
  static constexpr JsonFormat Compact() { return {}; }
  // One line, insertion order, no spaces.
  static constexpr JsonFormat Tight() {
    return {0, 0, 0, ",", ":", Doubles::kRoundTrip, false};
  }
  // One line as qemu-img map --output=json prints an entry (its
  // dump_map_entry()): "{ " but "}", insertion order.
  static constexpr JsonFormat MapEntry() {
    return {0, 0, 0, ", ", ": ", Doubles::kRoundTrip, false, "{ "};
  }
};

enum class JsonStyle {
  kQemuPretty,  // JsonFormat::QemuPretty()
  kCompact,     // JsonFormat::Compact()
};

// Serialises `value` (no trailing newline).
std::string ToJson(const Json& value, const JsonFormat& format);
std::string ToJson(const Json& value, JsonStyle style);

// `s` as a quoted JSON string literal, escaped as described above.
std::string JsonQuote(std::string_view s);

// The QDict bucket QEMU files `key` under (its iteration order); exposed
// for tests and for human output that follows the same order.
unsigned QemuKeyBucket(std::string_view key);

// The members of an object in QEMU's QDict iteration order: ascending
// bucket, and within a bucket the most recently inserted first.
std::vector<const std::pair<std::string, Json>*> QemuMemberOrder(
    const Json& object);

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_JSON_WRITER_H_
