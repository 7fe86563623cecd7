// SPDX-License-Identifier: Apache-2.0
#include "tests/util/json_lite.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/json_writer.h"

namespace qcow2::testing::json {

namespace {

const Value& NullValue() {
  static const Value* const kNull = new Value();
  return *kNull;
}
const std::string& EmptyString() {
  static const std::string* const kEmpty = new std::string();
  return *kEmpty;
}
const Value::Array& EmptyArray() {
  static const Value::Array* const kEmpty = new Value::Array();
  return *kEmpty;
}
const Value::Object& EmptyObject() {
  static const Value::Object* const kEmpty = new Value::Object();
  return *kEmpty;
}

constexpr int kMaxDepth = 256;

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  absl::StatusOr<Value> ParseDocument() {
    SkipSpace();
    Value v;
    if (!ParseValue(0, &v)) return Error();
    SkipSpace();
    if (pos_ != s_.size()) {
      Fail("trailing characters after the JSON value");
      return Error();
    }
    return v;
  }

 private:
  absl::Status Error() const {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON: ", error_, " at byte ", error_pos_));
  }
  bool Fail(const std::string& why) {
    if (error_.empty()) {
      error_ = why;
      error_pos_ = pos_;
    }
    return false;
  }

  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' ||
                                s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) {
      return Fail(absl::StrCat("expected '", std::string(word), "'"));
    }
    pos_ += word.size();
    return true;
  }

  bool ParseValue(int depth, Value* out) {
    if (depth > kMaxDepth) return Fail("nesting too deep");
    if (pos_ >= s_.size()) return Fail("unexpected end of input");
    char c = s_[pos_];
    switch (c) {
      case '{':
        return ParseObject(depth, out);
      case '[':
        return ParseArray(depth, out);
      case '"': {
        std::string str;
        if (!ParseString(&str)) return false;
        *out = Value::String(std::move(str));
        return true;
      }
      case 't':
        if (!Literal("true")) return false;
        *out = Value::Bool(true);
        return true;
      case 'f':
        if (!Literal("false")) return false;
        *out = Value::Bool(false);
        return true;
      case 'n':
        if (!Literal("null")) return false;
        *out = Value::Null();
        return true;
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
        return Fail(absl::StrFormat("unexpected character 0x%02x",
                                    static_cast<unsigned char>(c)));
    }
  }

  bool ParseObject(int depth, Value* out) {
    ++pos_;  // '{'
    Value::Object members;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      *out = Value::MakeObject(std::move(members));
      return true;
    }
    for (;;) {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') {
        return Fail("expected a string key");
      }
      std::string key;
      if (!ParseString(&key)) return false;
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Fail("expected ':'");
      ++pos_;
      SkipSpace();
      Value v;
      if (!ParseValue(depth + 1, &v)) return false;
      members.emplace_back(std::move(key), std::move(v));
      SkipSpace();
      if (pos_ >= s_.size()) return Fail("unterminated object");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == '}') {
        ++pos_;
        *out = Value::MakeObject(std::move(members));
        return true;
      }
      return Fail("expected ',' or '}'");
    }
  }

  bool ParseArray(int depth, Value* out) {
    ++pos_;  // '['
    Value::Array elems;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      *out = Value::MakeArray(std::move(elems));
      return true;
    }
    for (;;) {
      SkipSpace();
      Value v;
      if (!ParseValue(depth + 1, &v)) return false;
      elems.push_back(std::move(v));
      SkipSpace();
      if (pos_ >= s_.size()) return Fail("unterminated array");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == ']') {
        ++pos_;
        *out = Value::MakeArray(std::move(elems));
        return true;
      }
      return Fail("expected ',' or ']'");
    }
  }

  bool Hex4(uint32_t* out) {
    if (pos_ + 4 > s_.size()) return Fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_ + i];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        return Fail("bad hex digit in \\u escape");
      }
    }
    pos_ += 4;
    *out = v;
    return true;
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  bool ParseString(std::string* out) {
    ++pos_;  // '"'
    for (;;) {
      if (pos_ >= s_.size()) return Fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) {
        --pos_;
        return Fail("control character in string");
      }
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) return Fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xd800 && cp < 0xdc00) {
            uint32_t lo;
            if (s_.substr(pos_, 2) != "\\u") {
              return Fail("high surrogate without a low surrogate");
            }
            pos_ += 2;
            if (!Hex4(&lo)) return false;
            if (lo < 0xdc00 || lo >= 0xe000) {
              return Fail("high surrogate without a low surrogate");
            }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            return Fail("lone low surrogate");
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          --pos_;
          return Fail("unknown escape");
      }
    }
  }

  bool ParseNumber(Value* out) {
    size_t start = pos_;
    bool negative = false;
    if (s_[pos_] == '-') {
      negative = true;
      ++pos_;
    }
    if (pos_ >= s_.size() || !(s_[pos_] >= '0' && s_[pos_] <= '9')) {
      return Fail("bad number");
    }
    if (s_[pos_] == '0' && pos_ + 1 < s_.size() && s_[pos_ + 1] >= '0' &&
        s_[pos_ + 1] <= '9') {
      return Fail("leading zero in number");
    }
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    bool integral = true;
    if (pos_ < s_.size() && s_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (pos_ >= s_.size() || !(s_[pos_] >= '0' && s_[pos_] <= '9')) {
        return Fail("bad fraction");
      }
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (pos_ >= s_.size() || !(s_[pos_] >= '0' && s_[pos_] <= '9')) {
        return Fail("bad exponent");
      }
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    }
    std::string text(s_.substr(start, pos_ - start));
    if (integral) {
      // Accumulate the magnitude with overflow checks.
      uint64_t mag = 0;
      bool overflow = false;
      for (size_t i = negative ? 1 : 0; i < text.size(); ++i) {
        uint64_t d = text[i] - '0';
        if (mag > (std::numeric_limits<uint64_t>::max() - d) / 10) {
          overflow = true;
          break;
        }
        mag = mag * 10 + d;
      }
      if (!overflow) {
        if (!negative) {
          *out = Value::Uint(mag);
          return true;
        }
        if (mag <= uint64_t{1} << 63) {
          *out = Value::Int(mag == uint64_t{1} << 63
                                ? std::numeric_limits<int64_t>::min()
                                : -static_cast<int64_t>(mag));
          return true;
        }
      }
      // Out of integer range: fall through to double.
    }
    errno = 0;
    double d = strtod(text.c_str(), nullptr);
    *out = Value::Double(d);
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string error_;
  size_t error_pos_ = 0;
};

// The value as the project's JSON writer holds it.
tool::Json ToWriterJson(const Value& v) {
  switch (v.type()) {
    case Value::Type::kNull: return tool::Json::Null();
    case Value::Type::kBool: return tool::Json::Bool(v.as_bool());
    case Value::Type::kInt: return tool::Json::Int(v.as_int64());
    case Value::Type::kUint: return tool::Json::Uint(v.as_uint64());
    case Value::Type::kDouble: return tool::Json::Double(v.as_double());
    case Value::Type::kString: return tool::Json::String(v.as_string());
    case Value::Type::kArray: {
      tool::Json out = tool::Json::Array();
      for (const Value& e : v.array()) out.Append(ToWriterJson(e));
      return out;
    }
    case Value::Type::kObject: {
      tool::Json out = tool::Json::Object();
      for (const auto& [k, e] : v.object()) out.Set(k, ToWriterJson(e));
      return out;
    }
  }
  return tool::Json::Null();
}

}  // namespace

Value Value::Bool(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.type_ = Type::kInt;
  v.int_ = i;
  return v;
}
Value Value::Uint(uint64_t u) {
  if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Int(static_cast<int64_t>(u));
  }
  Value v;
  v.type_ = Type::kUint;
  v.uint_ = u;
  return v;
}
Value Value::Double(double d) {
  Value v;
  v.type_ = Type::kDouble;
  v.double_ = d;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.type_ = Type::kString;
  v.string_ = std::move(s);
  return v;
}
Value Value::MakeArray(Array a) {
  Value v;
  v.type_ = Type::kArray;
  v.array_ = std::move(a);
  return v;
}
Value Value::MakeObject(Object o) {
  Value v;
  v.type_ = Type::kObject;
  v.object_ = std::move(o);
  return v;
}

int64_t Value::as_int64() const {
  switch (type_) {
    case Type::kInt: return int_;
    case Type::kUint: return 0;  // does not fit
    case Type::kDouble:
      if (double_ >= -9.2233720368547758e18 && double_ < 9.2233720368547758e18) {
        return static_cast<int64_t>(double_);
      }
      return 0;
    default: return 0;
  }
}

uint64_t Value::as_uint64() const {
  switch (type_) {
    case Type::kInt: return int_ >= 0 ? static_cast<uint64_t>(int_) : 0;
    case Type::kUint: return uint_;
    case Type::kDouble:
      if (double_ >= 0 && double_ < 1.8446744073709552e19) {
        return static_cast<uint64_t>(double_);
      }
      return 0;
    default: return 0;
  }
}

double Value::as_double() const {
  switch (type_) {
    case Type::kInt: return static_cast<double>(int_);
    case Type::kUint: return static_cast<double>(uint_);
    case Type::kDouble: return double_;
    default: return 0;
  }
}

const std::string& Value::as_string() const {
  return type_ == Type::kString ? string_ : EmptyString();
}
const Value::Array& Value::array() const {
  return type_ == Type::kArray ? array_ : EmptyArray();
}
const Value::Object& Value::object() const {
  return type_ == Type::kObject ? object_ : EmptyObject();
}

const Value* Value::Find(std::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& [k, v] : object_) {
    if (k == key) return &v;
  }
  return nullptr;
}

const Value& Value::operator[](std::string_view key) const {
  const Value* v = Find(key);
  return v ? *v : NullValue();
}

const Value& Value::operator[](size_t i) const {
  if (type_ != Type::kArray || i >= array_.size()) return NullValue();
  return array_[i];
}

size_t Value::size() const {
  if (type_ == Type::kArray) return array_.size();
  if (type_ == Type::kObject) return object_.size();
  return 0;
}

std::string Value::ToString() const {
  return tool::ToJson(ToWriterJson(*this), tool::JsonFormat::Tight());
}

bool operator==(const Value& a, const Value& b) {
  if (a.is_integer() && b.is_integer()) {
    if (a.type_ != b.type_) return false;  // kUint never fits in kInt
    return a.type_ == Value::Type::kInt ? a.int_ == b.int_ : a.uint_ == b.uint_;
  }
  if (a.type_ != b.type_) return false;
  switch (a.type_) {
    case Value::Type::kNull: return true;
    case Value::Type::kBool: return a.bool_ == b.bool_;
    case Value::Type::kDouble: return a.double_ == b.double_;
    case Value::Type::kString: return a.string_ == b.string_;
    case Value::Type::kArray: return a.array_ == b.array_;
    case Value::Type::kObject: return a.object_ == b.object_;
    default: return false;
  }
}

absl::StatusOr<Value> Parse(std::string_view text) {
  return Parser(text).ParseDocument();
}

std::string Quote(std::string_view s) { return tool::JsonQuote(s); }

}  // namespace qcow2::testing::json
