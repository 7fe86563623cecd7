// SPDX-License-Identifier: Apache-2.0
#include "tools/json_writer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace qcow2::tool {

namespace {

// QEMU's QDict has this many hash buckets (qobject/qdict.c).
constexpr unsigned kQdictBuckets = 512;

// Decodes one UTF-8 code point at s[*pos], advancing *pos. Returns -1 for
// an invalid or overlong sequence (after consuming one byte).
int32_t DecodeUtf8(std::string_view s, size_t* pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  uint8_t b0 = byte(*pos);
  if (b0 < 0x80) {
    ++*pos;
    return b0;
  }
  int extra;
  int32_t cp;
  int32_t min;
  if ((b0 & 0xe0) == 0xc0) {
    extra = 1, cp = b0 & 0x1f, min = 0x80;
  } else if ((b0 & 0xf0) == 0xe0) {
    extra = 2, cp = b0 & 0x0f, min = 0x800;
  } else if ((b0 & 0xf8) == 0xf0) {
    extra = 3, cp = b0 & 0x07, min = 0x10000;
  } else {
    ++*pos;
    return -1;
  }
  if (*pos + extra >= s.size()) {
    ++*pos;
    return -1;
  }
  for (int i = 1; i <= extra; ++i) {
    uint8_t b = byte(*pos + i);
    if ((b & 0xc0) != 0x80) {
      ++*pos;
      return -1;
    }
    cp = (cp << 6) | (b & 0x3f);
  }
  *pos += extra + 1;
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return -1;
  return cp;
}

void AppendEscape(std::string* out, unsigned unit) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\u%04X", unit);
  out->append(buf);
}

void Newline(std::string* out, const JsonFormat& format, int depth) {
  out->push_back('\n');
  out->append(static_cast<size_t>(depth) * format.indent, ' ');
}

void AppendDouble(double d, JsonFormat::Doubles doubles, std::string* out) {
  char buf[40];
  if (doubles == JsonFormat::Doubles::kShort) {
    std::snprintf(buf, sizeof buf, "%.6g", d);
    out->append(buf);
    return;
  }
  std::snprintf(buf, sizeof buf, "%.17g", d);
  out->append(buf);
  // "1000" would read back as an integer.
  if (std::string_view(buf).find_first_of(".eE") == std::string_view::npos) {
    out->append(".0");
  }
}

void Write(const Json& v, const JsonFormat& f, int depth, std::string* out);

// An array or object: `items` are its members (a key, or nullptr for an
// array element), in print order.
void WriteContainer(
    const std::vector<std::pair<const std::string*, const Json*>>& items,
    bool expand, std::string_view open, char close, const JsonFormat& f,
    int depth, std::string* out) {
  out->append(open);
  std::string_view sep;
  for (const auto& [key, value] : items) {
    out->append(sep);
    if (expand) Newline(out, f, depth + 1);
    if (key != nullptr) {
      out->append(JsonQuote(*key));
      out->append(f.colon);
    }
    Write(*value, f, depth + 1, out);
    sep = expand ? std::string_view(",") : f.comma;
  }
  if (expand && (f.qemu || !items.empty())) Newline(out, f, depth);
  out->push_back(close);
}

void Write(const Json& v, const JsonFormat& f, int depth, std::string* out) {
  std::vector<std::pair<const std::string*, const Json*>> items;
  switch (v.kind()) {
    case Json::Kind::kNull:
      out->append("null");
      return;
    case Json::Kind::kString:
      out->append(JsonQuote(v.string_value()));
      return;
    case Json::Kind::kUint:
      out->append(std::to_string(v.uint_value()));
      return;
    case Json::Kind::kInt:
      out->append(std::to_string(v.int_value()));
      return;
    case Json::Kind::kDouble:
      AppendDouble(v.double_value(), f.doubles, out);
      return;
    case Json::Kind::kBool:
      out->append(v.bool_value() ? "true" : "false");
      return;
    case Json::Kind::kArray:
      for (const Json& e : v.elements()) items.emplace_back(nullptr, &e);
      WriteContainer(items, depth < f.expand_arrays, "[", ']', f, depth, out);
      return;
    case Json::Kind::kObject:
      if (f.qemu) {
        for (const auto* m : QemuMemberOrder(v)) {
          items.emplace_back(&m->first, &m->second);
        }
      } else {
        for (const auto& m : v.members()) {
          items.emplace_back(&m.first, &m.second);
        }
      }
      WriteContainer(items, depth < f.expand_objects, f.open_object, '}', f, depth,
                     out);
      return;
  }
}

}  // namespace

Json Json::String(std::string_view s) {
  Json j(Kind::kString);
  j.string_ = std::string(s);
  return j;
}

Json Json::Uint(uint64_t v) {
  Json j(Kind::kUint);
  j.uint_ = v;
  return j;
}

Json Json::Int(int64_t v) {
  Json j(Kind::kInt);
  j.int_ = v;
  return j;
}

Json Json::Double(double v) {
  if (!std::isfinite(v)) return Json();
  Json j(Kind::kDouble);
  j.double_ = v;
  return j;
}

double Json::number() const {
  switch (kind_) {
    case Kind::kUint:
      return static_cast<double>(uint_);
    case Kind::kInt:
      return static_cast<double>(int_);
    case Kind::kDouble:
      return double_;
    default:
      return 0;
  }
}

Json Json::Bool(bool v) {
  Json j(Kind::kBool);
  j.bool_ = v;
  return j;
}

Json& Json::Set(std::string_view key, Json value) {
  members_.emplace_back(std::string(key), std::move(value));
  return *this;
}

Json& Json::Append(Json value) {
  elements_.push_back(std::move(value));
  return *this;
}

std::string JsonQuote(std::string_view s) {
  std::string out = "\"";
  size_t pos = 0;
  while (pos < s.size()) {
    int32_t cp = DecodeUtf8(s, &pos);
    switch (cp) {
      case '"':
        out.append("\\\"");
        continue;
      case '\\':
        out.append("\\\\");
        continue;
      case '\b':
        out.append("\\b");
        continue;
      case '\f':
        out.append("\\f");
        continue;
      case '\n':
        out.append("\\n");
        continue;
      case '\r':
        out.append("\\r");
        continue;
      case '\t':
        out.append("\\t");
        continue;
      default:
        break;
    }
    if (cp < 0) cp = 0xfffd;
    if (cp > 0xffff) {
      AppendEscape(&out, 0xd800 + ((cp - 0x10000) >> 10));
      AppendEscape(&out, 0xdc00 + ((cp - 0x10000) & 0x3ff));
    } else if (cp < 0x20 || cp >= 0x7f) {
      AppendEscape(&out, static_cast<unsigned>(cp));
    } else {
      out.push_back(static_cast<char>(cp));
    }
  }
  out.push_back('"');
  return out;
}

unsigned QemuKeyBucket(std::string_view key) {
  // tdb_hash() from qobject/qdict.c, in 32-bit unsigned arithmetic.
  uint32_t value = 0x238F13AFu * static_cast<uint32_t>(key.size());
  for (size_t i = 0; i < key.size(); ++i) {
    value += static_cast<uint32_t>(static_cast<uint8_t>(key[i]))
             << (i * 5 % 24);
  }
  return (1103515243u * value + 12345u) % kQdictBuckets;
}

std::vector<const std::pair<std::string, Json>*> QemuMemberOrder(
    const Json& object) {
  // Insertion index reversed, then a stable sort by bucket: later members
  // come first within a bucket (QDict inserts at the head of the list).
  std::vector<const std::pair<std::string, Json>*> order;
  for (auto it = object.members().rbegin(); it != object.members().rend();
       ++it) {
    order.push_back(&*it);
  }
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) {
    return QemuKeyBucket(a->first) < QemuKeyBucket(b->first);
  });
  return order;
}

std::string ToJson(const Json& value, const JsonFormat& format) {
  std::string out;
  Write(value, format, 0, &out);
  return out;
}

std::string ToJson(const Json& value, JsonStyle style) {
  return ToJson(value, style == JsonStyle::kQemuPretty
                           ? JsonFormat::QemuPretty()
                           : JsonFormat::Compact());
}

}  // namespace qcow2::tool
