// SPDX-License-Identifier: Apache-2.0
// A small JSON document builder and printer for qcowtool's --output=json.
//
//   Json info = Json::Object();
//   info.Set("virtual-size", Json::Uint(1 << 20));
//   info.Set("filename", Json::String("disk.qcow2"));
//   std::string text = ToJson(info, JsonStyle::kQemuPretty);
//
// kQemuPretty reproduces `qemu-img info --output=json` byte for byte: a
// 4-space indent, `"key": value`, and object members in the order QEMU's
// QDict iterates them (by key hash bucket), which is neither insertion nor
// alphabetical order. kCompact prints everything on one line with members
// in insertion order.
//
// Strings are UTF-8; control characters, DEL and every non-ASCII code point
// are written as \uXXXX escapes (surrogate pairs above U+FFFF), and invalid
// UTF-8 becomes U+FFFD, as QEMU does. Numbers are unsigned 64-bit integers.
//
// Not thread-safe; values are plain copyable data.
#ifndef QCOW2_TOOLS_JSON_WRITER_H_
#define QCOW2_TOOLS_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qcow2::tool {

class Json {
 public:
  enum class Kind { kObject, kArray, kString, kUint, kBool };

  static Json Object() { return Json(Kind::kObject); }
  static Json Array() { return Json(Kind::kArray); }
  static Json String(std::string_view s);
  static Json Uint(uint64_t v);
  static Json Bool(bool v);

  Kind kind() const { return kind_; }

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
  bool bool_value() const { return bool_; }

 private:
  explicit Json(Kind kind) : kind_(kind) {}

  Kind kind_;
  std::string string_;
  uint64_t uint_ = 0;
  bool bool_ = false;
  std::vector<std::pair<std::string, Json>> members_;  // kObject
  std::vector<Json> elements_;                         // kArray
};

enum class JsonStyle {
  kQemuPretty,  // qemu-img's layout and key order
  kCompact,     // one line, insertion order
};

// Serialises `value` (no trailing newline).
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
