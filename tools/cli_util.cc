// SPDX-License-Identifier: Apache-2.0
#include "tools/cli_util.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <limits>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace qcow2::tool {

namespace {

// Multiplier for a size suffix, or 0 when `c` is not one.
uint64_t SuffixMultiplier(char c) {
  switch (c) {
    case 'b':
    case 'B':
      return 1;
    case 'k':
    case 'K':
      return 1ull << 10;
    case 'm':
    case 'M':
      return 1ull << 20;
    case 'g':
    case 'G':
      return 1ull << 30;
    case 't':
    case 'T':
      return 1ull << 40;
    case 'p':
    case 'P':
      return 1ull << 50;
    case 'e':
    case 'E':
      return 1ull << 60;
    default:
      return 0;
  }
}

// Debian's Abseil has its own string_view type.
absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexValue(char c) {
  if (IsDigit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

constexpr uint64_t kMaxSize = std::numeric_limits<int64_t>::max();

absl::Status InvalidSize(std::string_view text) {
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid size '", AV(text),
      "': expected a number with an optional suffix (b, k, M, G, T, P, E) "
      "or a 0x hex number"));
}

absl::Status SizeTooLarge(std::string_view text) {
  return absl::InvalidArgumentError(absl::StrCat(
      "size '", AV(text), "' is too large (the maximum is 8 EiB - 1 byte)"));
}

absl::StatusOr<uint64_t> ParseHex(std::string_view text) {
  if (text.size() <= 2) return InvalidSize(text);
  uint64_t v = 0;
  for (char c : text.substr(2)) {
    int d = HexValue(c);
    if (d < 0) return InvalidSize(text);
    if (v > (kMaxSize >> 4)) return SizeTooLarge(text);
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  if (v > kMaxSize) return SizeTooLarge(text);
  return v;
}

}  // namespace

int UsageError(TextArg usage, TextArg message) {
  const std::string_view m = message.view(), u = usage.view();
  if (!m.empty()) {
    std::fprintf(stderr, "qcowtool: %.*s\n", static_cast<int>(m.size()),
                 m.data());
  }
  std::fwrite(u.data(), 1, u.size(), stderr);
  return kExitUsage;
}

int ReportError(const absl::Status& status) {
  std::string msg(status.message());
  if (msg.empty()) msg = status.ToString();
  std::fprintf(stderr, "qcowtool: %s\n", msg.c_str());
  return kExitImageError;
}

int ReportQemuImgError(const absl::Status& status) {
  ReportError(status);
  return kExitFailure;
}

int ReportFailure(TextArg message) {
  const std::string_view m = message.view();
  std::fprintf(stderr, "qcowtool: %.*s\n", static_cast<int>(m.size()),
               m.data());
  return 1;
}

int PrintHelp(TextArg usage) {
  const std::string_view u = usage.view();
  std::fwrite(u.data(), 1, u.size(), stdout);
  return kExitOk;
}

absl::StatusOr<uint64_t> ParseSize(std::string_view text) {
  if (text.empty()) return InvalidSize(text);
  if (text[0] == '0' && text.size() > 1 && (text[1] == 'x' || text[1] == 'X')) {
    return ParseHex(text);
  }
  size_t i = 0;
  uint64_t whole = 0;
  while (i < text.size() && IsDigit(text[i])) {
    uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (whole > (std::numeric_limits<uint64_t>::max() - d) / 10) {
      return SizeTooLarge(text);
    }
    whole = whole * 10 + d;
    ++i;
  }
  if (i == 0) return InvalidSize(text);
  // Fraction: up to 18 digits are significant (more cannot change the
  // result by a whole byte below 8 EiB).
  uint64_t frac = 0, frac_scale = 1;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && IsDigit(text[i])) {
      if (frac_scale < 1000000000000000000ull) {
        frac = frac * 10 + static_cast<uint64_t>(text[i] - '0');
        frac_scale *= 10;
      }
      ++i;
    }
  }
  uint64_t mul = 1;
  if (i < text.size()) {
    mul = SuffixMultiplier(text[i]);
    if (mul == 0) return InvalidSize(text);
    ++i;
  }
  if (i != text.size()) return InvalidSize(text);
  if (mul == 1 && frac != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid size '", AV(text),
        "': a fractional size needs a unit suffix (k, M, G, T, P, E)"));
  }
  using u128 = unsigned __int128;
  u128 value = static_cast<u128>(whole) * mul +
               (static_cast<u128>(frac) * mul + frac_scale / 2) / frac_scale;
  if (value > kMaxSize) return SizeTooLarge(text);
  return static_cast<uint64_t>(value);
}

std::string FormatSize(uint64_t bytes) {
  // QEMU's size_to_str(): the correction by 1000/1024 switches to the next
  // unit once the integer part would reach 1000.
  static const char* const kSuffixes[] = {"",   "Ki", "Mi", "Gi",
                                          "Ti", "Pi", "Ei"};
  int exp = 0;
  std::frexp(static_cast<double>(bytes) / (1000.0 / 1024.0), &exp);
  int unit = (exp - 1) / 10;
  if (unit < 0) unit = 0;
  if (unit > 6) unit = 6;
  double div = static_cast<double>(1ull << (unit * 10));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%0.3g %sB", static_cast<double>(bytes) / div,
                kSuffixes[unit]);
  return buf;
}

absl::StatusOr<OutputFormat> ParseOutputFormat(std::string_view text) {
  if (text == "human") return OutputFormat::kHuman;
  if (text == "json") return OutputFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("--output must be 'human' or 'json', not '", AV(text), "'"));
}

namespace {

// QEMU's option-string syntax: key=value pairs split at ',' (",," is a
// comma in a value); a first word without '=' is `implied`'s value.
absl::StatusOr<std::map<std::string, std::string>> ParseQemuOpts(
    std::string_view text, const char* implied) {
  std::map<std::string, std::string> out;
  std::string cur;
  std::vector<std::string> parts;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ',') {
      if (i + 1 < text.size() && text[i + 1] == ',') {
        cur += ',';
        ++i;
        continue;
      }
      parts.push_back(std::move(cur));
      cur.clear();
      continue;
    }
    cur += text[i];
  }
  parts.push_back(std::move(cur));
  for (size_t i = 0; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    if (eq == std::string::npos) {
      if (i == 0 && implied != nullptr) {
        out[implied] = parts[i];
        continue;
      }
      return absl::InvalidArgumentError(
          absl::StrCat("Invalid parameter '", parts[i], "'"));
    }
    out[parts[i].substr(0, eq)] = parts[i].substr(eq + 1);
  }
  return out;
}

}  // namespace

namespace {

// How many "backing." prefixes `key` has before `option`
// ("backing.backing.encrypt.key-secret": 2), npos when it is not
// `option` under them.
size_t BackingDepth(std::string_view key, std::string_view option) {
  size_t depth = 0;
  constexpr std::string_view kBacking = "backing.";
  while (key.substr(0, kBacking.size()) == kBacking) {
    key.remove_prefix(kBacking.size());
    ++depth;
  }
  return key == option ? depth : std::string::npos;
}

}  // namespace

absl::Status OpenPolicy::AddObject(std::string_view spec) {
  auto parsed = ParseQemuOpts(spec, "qom-type");
  if (!parsed.ok()) return parsed.status();
  auto& kv = *parsed;
  const std::string type = kv["qom-type"];
  if (type != "secret") {
    return absl::InvalidArgumentError(absl::StrCat(
        "Parameter 'qom-type' does not accept value '", type, "'"));
  }
  auto id = kv.find("id");
  if (id == kv.end() || id->second.empty()) {
    return absl::InvalidArgumentError("Parameter 'id' is missing");
  }
  std::string bytes;
  if (auto d = kv.find("data"); d != kv.end()) {
    bytes = d->second;
  } else if (auto f = kv.find("file"); f != kv.end()) {
    std::ifstream in(f->second, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Unable to read ", f->second, ": Failed to open file \u201c",
          f->second, "\u201d: ", std::strerror(errno)));
    }
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  } else {
    return absl::InvalidArgumentError(
        "Either 'file' or 'data' must be provided");
  }
  if (auto fmt = kv.find("format"); fmt != kv.end() && fmt->second != "raw") {
    std::string raw;
    if (fmt->second != "base64" || !absl::Base64Unescape(bytes, &raw)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Invalid secret format '", fmt->second, "'"));
    }
    bytes = std::move(raw);
  }
  for (const auto& [k, v] : kv) {
    if (k != "qom-type" && k != "id" && k != "data" && k != "file" &&
        k != "format") {
      return absl::InvalidArgumentError(
          absl::StrCat("Property 'secret.", k, "' not found"));
    }
  }
  secrets[id->second] = std::move(bytes);
  return absl::OkStatus();
}

absl::Status OpenPolicy::ResolveImage(std::string* image,
                                      std::string* format) {
  key_secret.clear();
  backing_key_secrets.clear();
  key_secret_id.clear();
  backing_keys.clear();
  image_spec = *image;
  if (!image_opts) return absl::OkStatus();
  auto parsed = ParseQemuOpts(*image, nullptr);
  if (!parsed.ok()) return parsed.status();
  auto& kv = *parsed;
  std::string path;
  for (const auto& [k, v] : kv) {
    if (k == "driver") {
      if (absl::Status st = CheckImageFormat(v); !st.ok()) return st;
      *format = v;
    } else if (k == "file.filename" || k == "file") {
      path = v;
    } else if (k == "file.driver") {
      if (v != "file") {
        return absl::InvalidArgumentError(absl::StrCat(
            "protocol driver '", v, "' is not supported (file is)"));
      }
    } else if (size_t depth = BackingDepth(k, "encrypt.key-secret");
               depth != std::string::npos) {
      auto s = secrets.find(v);
      if (s == secrets.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("No secret with id '", v, "'"));
      }
      if (depth == 0) {
        key_secret = s->second;
        key_secret_id = v;
      } else {
        backing_keys.push_back(k);
        if (backing_key_secrets.size() < depth) backing_key_secrets.resize(depth);
        backing_key_secrets[depth - 1] = s->second;
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "Block format '", kv.count("driver") ? kv["driver"] : "qcow2",
          "' does not support the option '", k, "'"));
    }
  }
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "A block device must be specified for \"file\"");
  }
  *image = path;
  return absl::OkStatus();
}

void OpenPolicy::ApplyTo(OpenOptions* opts) const {
  opts->force_share = force_share;
  opts->backing_root = backing_root;
  opts->key_secret = key_secret;
  opts->backing_key_secrets = backing_key_secrets;
}

std::string OpenPolicy::QemuImageName(const std::string& path,
                                      std::string_view format) const {
  if (key_secret_id.empty()) return path;
  // As QEMU's bdrv_refresh_filename: the driver, its options that are not
  // defaults, and the protocol child, printed as qobject_to_json prints a
  // QDict (members in hash-bucket order; JsonFormat::qemu). Inserted in
  // QEMU's order, which decides within a bucket.
  Json file = Json::Object();
  file.Set("driver", Json::String("file"));
  file.Set("filename", Json::String(path));
  Json opts = Json::Object();
  opts.Set("driver", Json::String(format));
  opts.Set("encrypt.key-secret", Json::String(key_secret_id));
  opts.Set("file", std::move(file));
  JsonFormat one_line = JsonFormat::Compact();
  one_line.qemu = true;
  return "json:" + ToJson(opts, one_line);
}

absl::Status CheckImageFormat(std::string_view text) {
  if (text == "qcow2" || text == "raw") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown image format '", AV(text), "' (qcow2 and raw are supported)"));
}

std::string QemuPathCombine(std::string_view image_name,
                            std::string_view backing) {
  if (!backing.empty() && backing[0] == '/') return std::string(backing);
  size_t slash = image_name.rfind('/');
  std::string_view dir =
      slash == std::string_view::npos ? "" : image_name.substr(0, slash + 1);
  return absl::StrCat(AV(dir), AV(backing));
}

std::vector<std::string> QemuChainNames(const std::string& top,
                                        const std::vector<LayerInfo>& chain) {
  std::vector<std::string> names;
  for (size_t i = 0; i < chain.size(); ++i) {
    names.push_back(
        i == 0 ? top
               : QemuPathCombine(names[i - 1], chain[i - 1].backing_file));
  }
  return names;
}

absl::StatusOr<uint64_t> AllocatedFileSize(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("stat ", path));
  }
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

namespace {

// cache=unsafe: files whose flushes make nothing durable (QEMU's
// cache.no-flush), opened by the library itself (FileOptions::no_flush),
// so that a Queue still sends their writes through io_uring. Writes reach
// the kernel in the library's order.
class NoFlushOpener final : public FileOpener {
 public:
  absl::StatusOr<std::unique_ptr<File>> Open(
      const std::string& path, const FileOptions& opts) override {
    FileOptions fo = opts;
    fo.no_flush = true;
    return DefaultFileOpener()->Open(path, fo);
  }
};

}  // namespace

absl::Status ApplyCacheMode(std::string_view mode, OpenOptions* opts) {
  static NoFlushOpener no_flush;
  opts->opener = nullptr;
  if (mode == "none" || mode == "directsync") {
    opts->direct_io = true;
  } else if (mode == "writeback" || mode == "writethrough") {
    opts->direct_io = false;
  } else if (mode == "unsafe") {
    opts->direct_io = false;
    opts->opener = &no_flush;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("Invalid cache option: ", std::string(mode)));
  }
  return absl::OkStatus();
}

}  // namespace qcow2::tool
