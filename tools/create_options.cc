// SPDX-License-Identifier: Apache-2.0
#include "tools/create_options.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "tools/cli_util.h"

namespace qcow2::tool {
namespace {

// Debian's Abseil has its own string_view type.
absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }

struct OptionSpec {
  const char* name;
  const char* type;
  const char* help;
  bool raw;  // also valid for raw images (all are valid for qcow2)
};

constexpr OptionSpec kOptionSpecs[] = {
    {"backing_file", "<str>", "File name of a base image", false},
    {"backing_fmt", "<str>", "Image format of the base image (qcow2, raw)",
     false},
    {"cluster_size", "<size>",
     "qcow2 cluster size (a power of two from 512 to 2M; default 64k)", false},
    {"compat", "<str>", "Compatibility level (v2 [0.10] or v3 [1.1])", false},
    {"compression_type", "<str>",
     "Compression method used for image cluster compression (zlib, zstd)",
     false},
    {"data_file", "<str>", "File name of an external data file", false},
    {"data_file_raw", "<bool (on/off)>",
     "The external data file must stay valid as a raw image", false},
    {"encrypt.cipher-alg", "<str>",
     "Name of encryption cipher algorithm (aes-256 by default)", false},
    {"encrypt.cipher-mode", "<str>",
     "Name of encryption cipher mode (xts by default)", false},
    {"encrypt.format", "<str>", "Encrypt the image, format choices: 'luks'",
     false},
    {"encrypt.hash-alg", "<str>",
     "Name of encryption hash algorithm (sha256 by default)", false},
    {"encrypt.iter-time", "<num>",
     "Time to spend in PBKDF in milliseconds (2000 by default)", false},
    {"encrypt.ivgen-alg", "<str>",
     "Name of IV generator algorithm (plain64 by default)", false},
    {"encrypt.ivgen-hash-alg", "<str>",
     "Name of IV generator hash algorithm", false},
    {"encrypt.key-secret", "<str>",
     "ID of secret providing qcow2 AES key or LUKS passphrase", false},
    {"extended_l2", "<bool (on/off)>", "Extended L2 tables", false},
    {"lazy_refcounts", "<bool (on/off)>", "Postpone refcount updates", false},
    {"preallocation", "<str>",
     "Preallocation mode (allowed values: off, metadata, falloc, full)", true},
    {"refcount_bits", "<num>",
     "Width of a reference count entry in bits (1, 2, 4, ... 64)", false},
    {"size", "<size>", "Virtual disk size", true},
};

const OptionSpec* FindOption(std::string_view name) {
  for (const OptionSpec& o : kOptionSpecs) {
    if (name == o.name) return &o;
  }
  return nullptr;
}

// qemu-img options that qcowtool recognises but does not implement.
bool IsUnsupportedQemuOption(std::string_view name) {
  return name == "encryption" || name.substr(0, 8) == "encrypt.";  // others
}

// Splits "a=1,b=x,,y" into {"a=1", "b=x,y"} (",," is a literal comma, as
// in QEMU's option strings).
std::vector<std::string> SplitOptionList(std::string_view list) {
  std::vector<std::string> items(1);
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] != ',') {
      items.back().push_back(list[i]);
    } else if (i + 1 < list.size() && list[i + 1] == ',') {
      items.back().push_back(',');
      ++i;
    } else {
      items.emplace_back();
    }
  }
  return items;
}

absl::StatusOr<bool> ParseBool(std::string_view key, std::string_view v) {
  if (v == "on" || v == "yes" || v == "true" || v == "y") return true;
  if (v == "off" || v == "no" || v == "false" || v == "n") return false;
  return absl::InvalidArgumentError(absl::StrCat(
      "option '", AV(key), "' expects 'on' or 'off', not '", AV(v), "'"));
}

absl::StatusOr<uint64_t> ParseDecimal(std::string_view key,
                                      std::string_view v) {
  uint64_t n = 0;
  if (v.empty() || v.size() > 18) n = UINT64_MAX;
  for (char c : v) {
    if (c < '0' || c > '9') {
      n = UINT64_MAX;
      break;
    }
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  if (n == UINT64_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option '", AV(key), "' expects a number, not '", AV(v), "'"));
  }
  return n;
}

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

absl::Status ApplyPreallocation(std::string_view v, ImageFormat format,
                                CreateOptions* o) {
  if (v == "off") {
    o->preallocation = Preallocation::kOff;
  } else if (v == "metadata" && format == ImageFormat::kQcow2) {
    o->preallocation = Preallocation::kMetadata;
  } else if (v == "falloc") {
    o->preallocation = Preallocation::kFalloc;
  } else if (v == "full") {
    o->preallocation = Preallocation::kFull;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "preallocation '", AV(v), "' is not one of off, ",
        format == ImageFormat::kQcow2 ? "metadata, " : "", "falloc, full"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string OptionHelp(ImageFormat format) {
  const bool raw = format == ImageFormat::kRaw;
  std::string out =
      absl::StrCat("Supported ", raw ? "raw" : "qcow2", " options:\n");
  for (const OptionSpec& o : kOptionSpecs) {
    if (raw && !o.raw) continue;
    std::string head = absl::StrCat(o.name, "=", o.type);
    char line[256];
    std::snprintf(line, sizeof line, "  %-22s - %s\n", head.c_str(),
                  raw && std::string_view(o.name) == "preallocation"
                      ? "Preallocation mode (allowed values: off, falloc, "
                        "full)"
                      : o.help);
    out += line;
  }
  return out;
}

bool IsHelpList(std::string_view list) { return list == "help" || list == "?"; }

// Parses every -o list into key -> value (the last value of a key wins).
absl::Status ParseOptionLists(const std::vector<std::string>& lists,
                              ImageFormat format,
                              std::map<std::string, std::string>* values) {
  for (const std::string& list : lists) {
    for (const std::string& item : SplitOptionList(list)) {
      if (item.empty()) continue;  // "a=1,,"-style trailing commas
      size_t eq = item.find('=');
      std::string key = item.substr(0, eq);
      const OptionSpec* spec = FindOption(key);
      if (spec == nullptr) {
        if (IsUnsupportedQemuOption(key)) {
          return absl::InvalidArgumentError(
              absl::StrCat("option '", key, "' is not supported by qcowtool"));
        }
        return absl::InvalidArgumentError(
            absl::StrCat("unknown option '", key, "' (see -o help)"));
      }
      if (format == ImageFormat::kRaw && !spec->raw) {
        return absl::InvalidArgumentError(
            absl::StrCat("option '", key, "' is not valid for raw images"));
      }
      if (eq == std::string::npos) {
        // QEMU's shorthand: a bare boolean name means "on".
        if (std::string_view(spec->type).find("bool") ==
            std::string_view::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat("option '", key, "' needs a value"));
        }
        (*values)[key] = "on";
      } else {
        (*values)[key] = item.substr(eq + 1);
      }
    }
  }
  return absl::OkStatus();
}

// Applies one parsed -o value. Sizes and numbers are range-checked here;
// combinations in CheckCombinations().
absl::Status ApplyOption(const std::string& key, const std::string& v,
                         CreateRequest* req) {
  CreateOptions& o = req->opts;
  if (key == "size") {
    auto size = ParseSize(v);
    if (!size.ok()) return size.status();
    req->size = *size;
  } else if (key == "backing_file") {
    o.backing_file = v;
  } else if (key == "backing_fmt") {
    o.backing_format = v;
  } else if (key == "cluster_size") {
    auto cs = ParseSize(v);
    if (!cs.ok()) return cs.status();
    if (*cs < 512 || *cs > (2u << 20) || !IsPowerOfTwo(*cs)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster size ", AV(v),
                       " must be a power of two between 512 and 2M"));
    }
    o.cluster_size = static_cast<uint32_t>(*cs);
  } else if (key == "compat") {
    if (v != "0.10" && v != "1.1" && v != "v2" && v != "v3") {
      return absl::InvalidArgumentError(
          absl::StrCat("compat '", v, "' is not one of 0.10, 1.1 (or v2, v3)"));
    }
    o.compat = v;
    req->compat = v;
  } else if (key == "compression_type") {
    if (v == "zlib") {
      o.compression_type = CompressionType::kZlib;
    } else if (v == "zstd") {
      o.compression_type = CompressionType::kZstd;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("compression_type '", v, "' is not one of zlib, zstd"));
    }
  } else if (key == "data_file") {
    o.data_file = v;
  } else if (key == "data_file_raw") {
    auto b = ParseBool(key, v);
    if (!b.ok()) return b.status();
    o.data_file_raw = *b;
  } else if (key == "extended_l2") {
    auto b = ParseBool(key, v);
    if (!b.ok()) return b.status();
    o.extended_l2 = *b;
  } else if (key == "lazy_refcounts") {
    auto b = ParseBool(key, v);
    if (!b.ok()) return b.status();
    o.lazy_refcounts = *b;
  } else if (key == "preallocation") {
    if (auto s = ApplyPreallocation(v, o.format, &o); !s.ok()) return s;
    req->preallocation = v;
  } else if (key == "encrypt.format") {
    o.encrypt.format = v;
  } else if (key == "encrypt.key-secret") {
    req->key_secret_id = v;
  } else if (key == "encrypt.cipher-alg") {
    o.encrypt.cipher_alg = v;
  } else if (key == "encrypt.cipher-mode") {
    o.encrypt.cipher_mode = v;
  } else if (key == "encrypt.ivgen-alg") {
    o.encrypt.ivgen_alg = v;
  } else if (key == "encrypt.ivgen-hash-alg") {
    o.encrypt.ivgen_hash_alg = v;
  } else if (key == "encrypt.hash-alg") {
    o.encrypt.hash_alg = v;
  } else if (key == "encrypt.iter-time") {
    auto n = ParseDecimal(key, v);
    if (!n.ok()) return n.status();
    o.encrypt.iter_time_ms = static_cast<uint32_t>(*n);
  } else if (key == "refcount_bits") {
    auto n = ParseDecimal(key, v);
    if (!n.ok()) return n.status();
    if (*n > 64 || !IsPowerOfTwo(*n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "refcount_bits ", v, " must be a power of two up to 64"));
    }
    o.refcount_bits = static_cast<uint32_t>(*n);
  }
  return absl::OkStatus();
}

absl::Status ResolveCreateSecret(
    const std::map<std::string, std::string>& secrets, CreateRequest* req) {
  if (req->key_secret_id.empty()) return absl::OkStatus();
  auto it = secrets.find(req->key_secret_id);
  if (it == secrets.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("No secret with id '", req->key_secret_id, "'"));
  }
  req->opts.encrypt.key_secret = it->second;
  return absl::OkStatus();
}

// The checks qemu-img makes on option combinations (qcow2 only).
absl::Status CheckCombinations(const CreateOptions& o) {
  if (o.format == ImageFormat::kRaw) return absl::OkStatus();
  const bool v2 = o.compat == "0.10" || o.compat == "v2";
  const std::string need_v3 = " require compat=1.1";
  if (v2 && o.extended_l2) {
    return absl::InvalidArgumentError(
        absl::StrCat("extended L2 entries (extended_l2=on)", need_v3));
  }
  if (v2 && o.compression_type != CompressionType::kZlib) {
    return absl::InvalidArgumentError(
        "compression_type=zstd requires compat=1.1");
  }
  if (v2 && o.lazy_refcounts) {
    return absl::InvalidArgumentError(
        absl::StrCat("lazy refcounts (lazy_refcounts=on)", need_v3));
  }
  if (v2 && o.refcount_bits != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("refcount widths other than 16 bits", need_v3));
  }
  if (o.extended_l2 && o.cluster_size < 16384) {
    return absl::InvalidArgumentError(
        "extended L2 entries (extended_l2=on) need a cluster size of at "
        "least 16k");
  }
  if (!o.backing_file.empty() && o.preallocation != Preallocation::kOff &&
      !o.extended_l2) {
    return absl::InvalidArgumentError(
        "a backing file and preallocation can only be used together with "
        "extended_l2=on");
  }
  if (!o.backing_format.empty() && o.backing_format != "qcow2" &&
      o.backing_format != "raw") {
    return absl::InvalidArgumentError(absl::StrCat(
        "backing format '", o.backing_format, "' is not one of qcow2, raw"));
  }
  return absl::OkStatus();
}

}  // namespace qcow2::tool
