// SPDX-License-Identifier: Apache-2.0
#include "tests/util/qemu_images.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tests/util/test_util.h"

namespace qcow2::testing {

namespace {

bool NeedsQuoting(const std::string& s) {
  if (s.empty()) return true;
  for (char c : s) {
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
                 c == '/' || c == '=' || c == ',' || c == ':' || c == '+';
    if (!plain) return true;
  }
  return false;
}

std::string ShellQuote(const std::string& s) {
  if (!NeedsQuoting(s)) return s;
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  out += "'";
  return out;
}

absl::Status RunChecked(const std::vector<std::string>& argv, CommandLog* log,
                        std::string* out = nullptr) {
  if (log != nullptr) log->push_back(FormatCommand(argv));
  CommandResult r = Run(argv);
  if (r.exit_code != 0) {
    return absl::InternalError(absl::StrCat(
        FormatCommand(argv), " exited with ", r.exit_code, ": ", r.err,
        r.out.size() > 2000 ? r.out.substr(0, 2000) : r.out));
  }
  if (out != nullptr) *out = std::move(r.out);
  return absl::OkStatus();
}

std::string BaseName(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string SizeToken(uint64_t v) {
  if (v >= (1u << 20) && v % (1u << 20) == 0) return absl::StrCat(v >> 20, "m");
  if (v >= 1024 && v % 1024 == 0) return absl::StrCat(v >> 10, "k");
  return absl::StrCat(v);
}

// Log-uniform length in [1, max_len].
uint64_t RandomLength(TestRng& rng, uint64_t max_len) {
  if (max_len <= 1) return 1;
  int bits = 64 - __builtin_clzll(max_len);  // max_len < 2^bits
  int e = static_cast<int>(rng.Uniform(bits));
  uint64_t lo = uint64_t{1} << e;
  uint64_t hi = std::min(max_len, (uint64_t{1} << (e + 1)) - 1);
  if (lo > hi) lo = hi;
  return rng.Range(lo, hi);
}

}  // namespace

std::string FormatCommand(const std::vector<std::string>& argv) {
  std::vector<std::string> quoted;
  quoted.reserve(argv.size());
  for (const std::string& a : argv) quoted.push_back(ShellQuote(a));
  return absl::StrJoin(quoted, " ");
}

bool QemuImageSpec::Valid() const {
  if (format == "raw") return true;
  if (format != "qcow2") return false;
  if (cluster_size < 512 || cluster_size > (2u << 20) ||
      (cluster_size & (cluster_size - 1)) != 0) {
    return false;
  }
  if (refcount_bits == 0 || refcount_bits > 64 ||
      (refcount_bits & (refcount_bits - 1)) != 0) {
    return false;
  }
  bool v3 = compat == "1.1";
  if (!v3 && compat != "0.10") return false;
  if (!v3 && (refcount_bits != 16 || extended_l2 ||
              compression_type != "zlib" || lazy_refcounts)) {
    return false;
  }
  if (extended_l2 && cluster_size < 16384) return false;
  return compression_type == "zlib" || compression_type == "zstd";
}

void PrintTo(const QemuImageSpec& spec, std::ostream* os) {
  *os << spec.Token();
}

QemuImageSpec Qcow2Spec(const std::string& compat, uint32_t cluster_size,
                        bool extended_l2) {
  QemuImageSpec spec;
  spec.compat = compat;
  spec.cluster_size = cluster_size;
  spec.extended_l2 = extended_l2;
  return spec;
}

std::string QemuImageSpec::Token() const {
  if (format != "qcow2") return format;
  std::string t = absl::StrCat("c", SizeToken(cluster_size), "_rb",
                               refcount_bits, "_",
                               compat == "0.10" ? "v2" : "v3", "_",
                               compression_type);
  if (extended_l2) t += "_xl2";
  if (lazy_refcounts) t += "_lazy";
  if (!preallocation.empty() && preallocation != "off") {
    t += "_" + preallocation;
  }
  return t;
}

std::vector<std::string> QemuCreateArgv(const std::string& path,
                                        const QemuImageSpec& spec) {
  std::vector<std::string> argv = {"qemu-img", "create", "-q", "-f",
                                   spec.format};
  std::vector<std::string> opts;
  if (spec.format == "qcow2") {
    opts.push_back("compat=" + spec.compat);
    opts.push_back(absl::StrCat("cluster_size=", spec.cluster_size));
    opts.push_back(absl::StrCat("refcount_bits=", spec.refcount_bits));
    if (spec.compat != "0.10") {
      opts.push_back(absl::StrCat("extended_l2=",
                                  spec.extended_l2 ? "on" : "off"));
      opts.push_back("compression_type=" + spec.compression_type);
      opts.push_back(absl::StrCat("lazy_refcounts=",
                                  spec.lazy_refcounts ? "on" : "off"));
    }
  }
  if (!spec.preallocation.empty()) {
    opts.push_back("preallocation=" + spec.preallocation);
  }
  for (const std::string& o : spec.extra_options) opts.push_back(o);
  if (!opts.empty()) {
    argv.push_back("-o");
    argv.push_back(absl::StrJoin(opts, ","));
  }
  if (!spec.backing_file.empty()) {
    argv.push_back("-b");
    argv.push_back(spec.backing_file);
    if (!spec.backing_format.empty()) {
      argv.push_back("-F");
      argv.push_back(spec.backing_format);
    }
  }
  argv.push_back(path);
  if (spec.size != 0) argv.push_back(absl::StrCat(spec.size));
  return argv;
}

absl::Status QemuCreate(const std::string& path, const QemuImageSpec& spec,
                        CommandLog* log) {
  if (!spec.Valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("qemu would refuse the image spec ", spec.Token()));
  }
  return RunChecked(QemuCreateArgv(path, spec), log);
}

absl::Status QemuIo(const std::string& path,
                    const std::vector<std::string>& commands,
                    const std::string& format, CommandLog* log) {
  if (commands.empty()) return absl::OkStatus();
  std::vector<std::string> argv = {"qemu-io"};
  if (!format.empty()) {
    argv.push_back("-f");
    argv.push_back(format);
  }
  for (const std::string& c : commands) {
    argv.push_back("-c");
    argv.push_back(c);
  }
  argv.push_back(path);
  return RunChecked(argv, log);
}

absl::Status QemuConvert(const std::string& src, const std::string& dst,
                         const std::string& out_format,
                         const std::vector<std::string>& extra_args,
                         CommandLog* log) {
  std::vector<std::string> argv = {"qemu-img", "convert"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  argv.push_back("-O");
  argv.push_back(out_format);
  argv.push_back(src);
  argv.push_back(dst);
  return RunChecked(argv, log);
}

absl::StatusOr<std::string> QemuMapJsonText(const std::string& path,
                                            const std::string& format,
                                            CommandLog* log) {
  std::vector<std::string> argv = {"qemu-img", "map", "--output=json"};
  if (!format.empty()) {
    argv.push_back("-f");
    argv.push_back(format);
  }
  argv.push_back(path);
  std::string out;
  absl::Status s = RunChecked(argv, log, &out);
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<json::Value> QemuMapJson(const std::string& path,
                                        const std::string& format,
                                        CommandLog* log) {
  absl::StatusOr<std::string> text = QemuMapJsonText(path, format, log);
  if (!text.ok()) return text.status();
  return json::Parse(*text);
}

absl::StatusOr<json::Value> QemuInfoChainJson(const std::string& path,
                                              CommandLog* log) {
  std::string out;
  absl::Status s = RunChecked(
      {"qemu-img", "info", "--backing-chain", "--output=json", path}, log,
      &out);
  if (!s.ok()) return s;
  return json::Parse(out);
}

QemuOp QemuOp::Write(uint64_t off, uint64_t len, uint8_t pattern) {
  QemuOp op;
  op.kind = Kind::kWrite;
  op.offset = off;
  op.length = len;
  op.pattern = pattern;
  return op;
}

QemuOp QemuOp::WriteFile(uint64_t off, uint64_t len, std::string file) {
  QemuOp op;
  op.kind = Kind::kWriteFile;
  op.offset = off;
  op.length = len;
  op.pattern_file = std::move(file);
  return op;
}

QemuOp QemuOp::Zero(uint64_t off, uint64_t len, bool unmap) {
  QemuOp op;
  op.kind = unmap ? Kind::kZeroUnmap : Kind::kZero;
  op.offset = off;
  op.length = len;
  return op;
}

QemuOp QemuOp::Compressed(uint64_t off, uint64_t len, uint8_t pattern) {
  QemuOp op;
  op.kind = Kind::kCompressed;
  op.offset = off;
  op.length = len;
  op.pattern = pattern;
  return op;
}

QemuOp QemuOp::CompressedFile(uint64_t off, uint64_t len, std::string file) {
  QemuOp op = Compressed(off, len, 0);
  op.pattern_file = std::move(file);
  return op;
}

QemuOp QemuOp::Discard(uint64_t off, uint64_t len) {
  QemuOp op;
  op.kind = Kind::kDiscard;
  op.offset = off;
  op.length = len;
  return op;
}

std::string QemuOp::ToCommand() const {
  std::string range = absl::StrCat(offset, " ", length);
  switch (kind) {
    case Kind::kWrite:
      return absl::StrFormat("write -P 0x%02x %s", pattern, range);
    case Kind::kWriteFile:
      return absl::StrCat("write -s ", pattern_file, " ", range);
    case Kind::kZero:
      return absl::StrCat("write -z ", range);
    case Kind::kZeroUnmap:
      return absl::StrCat("write -z -u ", range);
    case Kind::kCompressed:
      if (!pattern_file.empty()) {
        return absl::StrCat("write -c -s ", pattern_file, " ", range);
      }
      return absl::StrFormat("write -c -P 0x%02x %s", pattern, range);
    case Kind::kDiscard:
      return absl::StrCat("discard ", range);
  }
  return "";
}

std::vector<std::string> ToQemuIoCommands(const std::vector<QemuOp>& ops) {
  std::vector<std::string> out;
  out.reserve(ops.size());
  for (const QemuOp& op : ops) out.push_back(op.ToCommand());
  return out;
}

bool ApplyQemuOpToModel(const QemuOp& op, std::vector<uint8_t>* disk,
                        const std::vector<uint8_t>& pattern_bytes) {
  if (op.offset > disk->size() || op.length > disk->size() - op.offset) {
    return false;
  }
  uint8_t* p = disk->data() + op.offset;
  bool from_file = op.kind == QemuOp::Kind::kWriteFile ||
                   (op.kind == QemuOp::Kind::kCompressed &&
                    !op.pattern_file.empty());
  switch (op.kind) {
    case QemuOp::Kind::kWrite:
    case QemuOp::Kind::kWriteFile:
    case QemuOp::Kind::kCompressed:
      if (from_file) {
        if (pattern_bytes.empty()) return false;
        for (uint64_t i = 0; i < op.length; ++i) {
          p[i] = pattern_bytes[i % pattern_bytes.size()];
        }
      } else {
        std::fill(p, p + op.length, op.pattern);
      }
      return true;
    case QemuOp::Kind::kZero:
    case QemuOp::Kind::kZeroUnmap:
      std::fill(p, p + op.length, 0);
      return true;
    case QemuOp::Kind::kDiscard:
      return false;
  }
  return false;
}

std::vector<QemuOp> RandomQemuOps(const RandomOpsConfig& config) {
  std::vector<QemuOp> ops;
  if (config.size == 0) return ops;
  TestRng rng(config.seed);
  const uint64_t cs = config.cluster_size;
  uint64_t max_len = config.max_length;
  if (max_len == 0) max_len = std::max<uint64_t>(2 * cs + cs / 3, 65536);
  max_len = std::min(max_len, config.size);
  bool use_file = !config.pattern_file.empty();
  auto pattern = [&] { return static_cast<uint8_t>(rng.Range(1, 255)); };

  // Compressed writes first, on distinct whole clusters inside the disk.
  const uint64_t full_clusters = config.size / cs;
  std::set<uint64_t> used;
  for (int i = 0; i < config.compressed_writes && full_clusters > 0; ++i) {
    uint64_t c = 0;
    bool found = false;
    for (int attempt = 0; attempt < 16 && !found; ++attempt) {
      c = rng.Uniform(full_clusters);
      found = !used.count(c);
    }
    if (!found) break;
    uint64_t n = 1;
    if (c + 1 < full_clusters && !used.count(c + 1) && rng.OneIn(2)) n = 2;
    for (uint64_t k = 0; k < n; ++k) used.insert(c + k);
    if (use_file && i % 2 == 0) {
      ops.push_back(QemuOp::CompressedFile(c * cs, n * cs, config.pattern_file));
    } else {
      ops.push_back(QemuOp::Compressed(c * cs, n * cs, pattern()));
    }
  }

  // Then plain writes, zero writes and discards in a shuffled order.
  std::vector<QemuOp::Kind> kinds;
  for (int i = 0; i < config.writes; ++i) {
    kinds.push_back(use_file && i % 2 == 1 ? QemuOp::Kind::kWriteFile
                                           : QemuOp::Kind::kWrite);
  }
  for (int i = 0; i < config.zero_writes; ++i) {
    bool unmap = config.zero_unmap_every > 0 &&
                 (i + 1) % config.zero_unmap_every == 0;
    kinds.push_back(unmap ? QemuOp::Kind::kZeroUnmap : QemuOp::Kind::kZero);
  }
  for (int i = 0; i < config.discards; ++i) {
    kinds.push_back(QemuOp::Kind::kDiscard);
  }
  for (size_t i = kinds.size(); i > 1; --i) {
    std::swap(kinds[i - 1], kinds[rng.Uniform(i)]);
  }
  for (QemuOp::Kind kind : kinds) {
    uint64_t off = rng.Uniform(config.size);
    uint64_t len = std::min(RandomLength(rng, max_len), config.size - off);
    QemuOp op;
    op.kind = kind;
    op.offset = off;
    op.length = len;
    if (kind == QemuOp::Kind::kWrite) op.pattern = pattern();
    if (kind == QemuOp::Kind::kWriteFile) op.pattern_file = config.pattern_file;
    ops.push_back(std::move(op));
  }
  return ops;
}

std::vector<uint8_t> CompressibleBytes(uint64_t seed, size_t size) {
  TestRng rng(seed ^ 0x5a17c0de5eedull);
  uint8_t alphabet[16];
  for (uint8_t& a : alphabet) a = static_cast<uint8_t>(rng.Range(1, 255));
  std::vector<uint8_t> out;
  out.reserve(size);
  while (out.size() < size) {
    uint64_t r = rng.Next();
    uint8_t sym = alphabet[r & 15];
    size_t run = 1 + ((r >> 4) & 7);
    for (size_t i = 0; i < run && out.size() < size; ++i) out.push_back(sym);
  }
  return out;
}

absl::Status WritePatternFile(const std::string& path, uint64_t seed,
                              size_t size) {
  return WriteFileBytes(path, CompressibleBytes(seed, size));
}

absl::Status FillHoles(const std::string& path) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  }
  std::vector<uint8_t> buf(1 << 20);
  off_t pos = 0;
  absl::Status status;
  for (;;) {
    ssize_t n = pread(fd, buf.data(), buf.size(), pos);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = absl::InternalError(
          absl::StrCat("cannot read ", path, ": ", strerror(errno)));
      break;
    }
    if (n == 0) break;
    for (ssize_t done = 0; done < n;) {
      ssize_t w = pwrite(fd, buf.data() + done, n - done, pos + done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        status = absl::InternalError(
            absl::StrCat("cannot write ", path, ": ", strerror(errno)));
        break;
      }
      done += w;
    }
    if (!status.ok()) break;
    pos += n;
  }
  close(fd);
  return status;
}

absl::StatusOr<std::vector<std::string>> QemuBuildChain(
    const std::string& dir, const std::vector<QemuLayerSpec>& layers,
    CommandLog* log) {
  std::vector<std::string> paths;
  for (size_t i = 0; i < layers.size(); ++i) {
    const QemuLayerSpec& layer = layers[i];
    QemuImageSpec spec = layer.image;
    const bool raw = spec.format == "raw";
    std::string path =
        absl::StrCat(dir, "/layer", i, raw ? ".raw" : ".qcow2");
    if (i > 0) {
      spec.backing_file = BaseName(paths.back());
      spec.backing_format = layers[i - 1].image.format;
    }
    if (raw && i > 0) {
      return absl::InvalidArgumentError("a raw layer cannot have a backing file");
    }
    if (layer.convert_from_seed.has_value()) {
      if (raw || i > 0) {
        return absl::InvalidArgumentError(
            "convert_from_seed is for a qcow2 bottom layer only");
      }
      std::string src = absl::StrCat(dir, "/layer", i, ".src.raw");
      if (log != nullptr) {
        log->push_back(absl::StrCat("# write ", spec.size,
                                    " bytes CompressibleBytes(seed ",
                                    *layer.convert_from_seed, ") to ", src));
      }
      absl::Status s = WriteFileBytes(
          src, CompressibleBytes(*layer.convert_from_seed, spec.size));
      if (!s.ok()) return s;
      std::vector<std::string> create = QemuCreateArgv(path, spec);
      // Reuse the create options ("-o ...") for the conversion.
      std::vector<std::string> args = {"-c"};
      for (size_t a = 0; a + 1 < create.size(); ++a) {
        if (create[a] == "-o") {
          args.push_back("-o");
          args.push_back(create[a + 1]);
        }
      }
      s = QemuConvert(src, path, "qcow2", args, log);
      unlink(src.c_str());
      if (!s.ok()) return s;
    } else if (raw && layer.raw_fill_seed.has_value()) {
      uint64_t n = layer.raw_file_size ? layer.raw_file_size : spec.size;
      if (log != nullptr) {
        log->push_back(absl::StrCat("# write ", n,
                                    " bytes CompressibleBytes(seed ",
                                    *layer.raw_fill_seed, ") to ", path));
      }
      absl::Status s =
          WriteFileBytes(path, CompressibleBytes(*layer.raw_fill_seed, n));
      if (!s.ok()) return s;
    } else {
      absl::Status s = QemuCreate(path, spec, log);
      if (!s.ok()) return s;
    }
    absl::Status s = QemuIo(path, ToQemuIoCommands(layer.ops), spec.format, log);
    if (!s.ok()) return s;
    if (layer.fill_holes) {
      if (log != nullptr) {
        log->push_back(absl::StrCat("# fill the holes of ", path,
                                    " (rewrite every byte in place)"));
      }
      s = FillHoles(path);
      if (!s.ok()) return s;
    }
    paths.push_back(path);
  }
  return paths;
}

}  // namespace qcow2::testing
