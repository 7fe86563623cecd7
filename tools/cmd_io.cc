// SPDX-License-Identifier: Apache-2.0
// qcowtool io: scriptable reads and writes in the spirit of qemu-io, with
// qemu-io's command syntax and result lines.
//
// Unlike qemu-io, every -c command is parsed (and its range checked against
// the image size) before the first one runs, the run stops at the first
// failing command, and the exit status says what failed.

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "qcow2/image.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/option_parser.h"

namespace qcow2::tool {
namespace {

constexpr char kUsage[] =
    "usage: qcowtool io [-f FMT] [-r [-U]] [--backing-root=DIR] IMAGE\n"
    "                   -c CMD [-c CMD ...]\n"
    "\n"
    "Opens IMAGE (read-write unless -r) and runs each CMD in order, as\n"
    "qemu-io does. Every CMD is checked before the first one runs; the run\n"
    "stops at the first CMD that fails.\n"
    "\n"
    "  -c CMD      a command (below); may be repeated\n"
    "  -f FMT      format of IMAGE: qcow2 or raw (default: probe)\n"
    "  -r          open IMAGE read-only (write and discard are refused)\n"
    "  -U, --force-share  with -r: open IMAGE even while another process\n"
    "              writes it (only the shared read lock is taken)\n"
    "  --backing-root=DIR  refuse backing files that resolve outside DIR\n"
    "  -h, --help  show this help\n"
    "\n"
    "Commands (OFF and LEN: 4096, 4k, 16M, 0x1000; PAT: a byte, decimal or\n"
    "0x hex):\n"
    "  write [-q] [-P PAT] OFF LEN  write LEN bytes of PAT (default 0xcd)\n"
    "  write [-q] -z [-u] OFF LEN   write zeroes; -u may free clusters\n"
    "  write [-q] -c [-P PAT] OFF LEN\n"
    "                               write compressed, cluster by cluster\n"
    "                               (OFF and LEN whole clusters, or up to\n"
    "                               the end of the disk)\n"
    "  read [-q] [-v] [-P PAT] OFF LEN\n"
    "                               read; -P checks every byte is PAT and\n"
    "                               fails at the first one that is not;\n"
    "                               -v dumps the bytes in hex\n"
    "  discard [-q] OFF LEN         discard the range (libqcow2's\n"
    "                               Image::Discard); whole clusters may be\n"
    "                               freed\n"
    "  flush                        make every write durable\n"
    "  map                          allocation in IMAGE itself (not its\n"
    "                               backing files), as qemu-io's map prints\n"
    "                               it: 'N (0xN) bytes     allocated at\n"
    "                               offset X (0xX)' / 'not allocated'\n"
    "  info                         format facts, as qemu-io's info\n"
    "  length                       the virtual size\n"
    "  (-q: no result and timing lines.)\n"
    "\n"
    "Read, write and discard print qemu-io's lines:\n"
    "  wrote 4096/4096 bytes at offset 0\n"
    "  4 KiB, 1 ops; 00.00 sec (12.5 MiB/sec and 3200.0000 ops/sec)\n"
    "\n"
    "Exit status: 0 when every command succeeded, 1 for wrong arguments\n"
    "(including a malformed CMD or a range past the end of IMAGE; nothing\n"
    "has run then), 2 when IMAGE cannot be opened or a command fails (the\n"
    "commands before it have run), 3 when a read -P finds another byte.\n"
    "qemu-io, by contrast, runs every command and exits 1 if any failed.\n";

std::string Usage() { return kUsage; }

// What argument errors print: the synopsis, not the whole help.
constexpr char kShortUsage[] =
    "usage: qcowtool io [-f FMT] [-r [-U]] [--backing-root=DIR] IMAGE\n"
    "                   -c CMD [-c CMD ...]\n"
    "('qcowtool io --help' describes the commands and exit status)\n";

constexpr int kExitVerifyFailed = 3;
constexpr uint8_t kDefaultPattern = 0xcd;  // qemu-io's
constexpr uint64_t kChunkBytes = 1 << 20;  // bytes per library call

absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }

struct IoCommand {
  enum Kind { kRead, kWrite, kDiscard, kFlush, kMap, kInfo, kLength };
  Kind kind = kFlush;
  std::string text;  // as given, for messages
  uint64_t offset = 0;
  uint64_t length = 0;
  std::optional<uint8_t> pattern;
  bool zero = false;     // write -z
  bool unmap = false;    // write -z -u
  bool compressed = false;  // write -c
  bool verbose = false;  // read -v
  bool quiet = false;    // -q
  bool has_range() const {
    return kind == kRead || kind == kWrite || kind == kDiscard;
  }
};

// ---------------------------------------------------------------------------
// Parsing.

std::vector<std::string> SplitWords(std::string_view text) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i])))
      ++i;
    size_t start = i;
    while (i < text.size() &&
           !std::isspace(static_cast<unsigned char>(text[i])))
      ++i;
    if (i > start) words.emplace_back(text.substr(start, i - start));
  }
  return words;
}

absl::Status Bad(const IoCommand& cmd, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("'", cmd.text, "': ", AV(what)));
}

absl::StatusOr<uint8_t> ParsePattern(const IoCommand& cmd,
                                     std::string_view text) {
  uint64_t v = 0;
  bool ok = !text.empty();
  std::string_view digits = text;
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    digits = text.substr(2);
    base = 16;
  }
  for (char c : digits) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (base == 16 && c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (base == 16 && c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (d < 0) ok = false;
    if (!ok) break;
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    if (v > 255) ok = false;
  }
  if (!ok) {
    return Bad(cmd, absl::StrCat(AV(text),
                                 " is not a valid pattern byte "
                                 "(0 to 255, or 0x00 to 0xff)"));
  }
  return static_cast<uint8_t>(v);
}

// A getopt for one command's words: `flags` lists the letters allowed,
// letters followed by ':' take a value ("-P 0xab" or "-P0xab"). Fills
// `positional` with the rest.
absl::Status ParseFlags(
    const IoCommand& cmd, const std::vector<std::string>& words,
    std::string_view flags, std::vector<std::string>* positional,
    const std::function<absl::Status(char, std::string_view)>& on_flag) {
  bool options_done = false;
  for (size_t i = 1; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (options_done || w.size() < 2 || w[0] != '-') {
      positional->push_back(w);
      continue;
    }
    if (w == "--") {
      options_done = true;
      continue;
    }
    for (size_t j = 1; j < w.size(); ++j) {
      const char f = w[j];
      const size_t at = flags.find(f);
      if (at == std::string_view::npos || f == ':') {
        return Bad(cmd, absl::StrCat("unknown option -", std::string(1, f)));
      }
      const bool takes_value = at + 1 < flags.size() && flags[at + 1] == ':';
      if (!takes_value) {
        if (auto s = on_flag(f, ""); !s.ok()) return s;
        continue;
      }
      std::string value = w.substr(j + 1);
      if (value.empty()) {
        if (i + 1 >= words.size()) {
          return Bad(cmd, absl::StrCat("option -", std::string(1, f),
                                       " needs a value"));
        }
        value = words[++i];
      }
      if (auto s = on_flag(f, value); !s.ok()) return s;
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status ParseRange(IoCommand& cmd,
                        const std::vector<std::string>& positional) {
  if (positional.size() != 2) {
    return Bad(cmd, "expecting an offset and a length");
  }
  auto off = ParseSize(positional[0]);
  if (!off.ok()) return Bad(cmd, std::string(off.status().message()));
  auto len = ParseSize(positional[1]);
  if (!len.ok()) return Bad(cmd, std::string(len.status().message()));
  cmd.offset = *off;
  cmd.length = *len;
  return absl::OkStatus();
}

absl::StatusOr<IoCommand> ParseCommand(std::string_view text) {
  IoCommand cmd;
  cmd.text = std::string(text);
  const std::vector<std::string> words = SplitWords(text);
  if (words.empty()) return Bad(cmd, "empty command");
  const std::string& name = words[0];
  std::vector<std::string> positional;
  auto common = [&](char f) {
    if (f == 'q') cmd.quiet = true;
    return absl::OkStatus();
  };
  absl::Status s;
  if (name == "write") {
    cmd.kind = IoCommand::kWrite;
    s = ParseFlags(cmd, words, "P:zucq", &positional,
                   [&](char f, std::string_view v) -> absl::Status {
                     if (f == 'P') {
                       auto p = ParsePattern(cmd, v);
                       if (!p.ok()) return p.status();
                       cmd.pattern = *p;
                     }
                     if (f == 'z') cmd.zero = true;
                     if (f == 'u') cmd.unmap = true;
                     if (f == 'c') cmd.compressed = true;
                     return common(f);
                   });
    if (s.ok() && cmd.zero && cmd.pattern) {
      s = Bad(cmd, "-z and -P cannot be used together");
    }
    if (s.ok() && cmd.unmap && !cmd.zero) s = Bad(cmd, "-u requires -z");
    if (s.ok() && cmd.zero && cmd.compressed) {
      s = Bad(cmd, "-c and -z cannot be used together");
    }
    if (s.ok()) s = ParseRange(cmd, positional);
  } else if (name == "read") {
    cmd.kind = IoCommand::kRead;
    s = ParseFlags(cmd, words, "P:vq", &positional,
                   [&](char f, std::string_view v) -> absl::Status {
                     if (f == 'P') {
                       auto p = ParsePattern(cmd, v);
                       if (!p.ok()) return p.status();
                       cmd.pattern = *p;
                     }
                     if (f == 'v') cmd.verbose = true;
                     return common(f);
                   });
    if (s.ok()) s = ParseRange(cmd, positional);
  } else if (name == "discard") {
    cmd.kind = IoCommand::kDiscard;
    s = ParseFlags(cmd, words, "q", &positional,
                   [&](char f, std::string_view) { return common(f); });
    if (s.ok()) s = ParseRange(cmd, positional);
  } else if (name == "flush" || name == "map" || name == "info" ||
             name == "length") {
    cmd.kind = name == "flush"  ? IoCommand::kFlush
               : name == "map"  ? IoCommand::kMap
               : name == "info" ? IoCommand::kInfo
                                : IoCommand::kLength;
    if (words.size() > 1) {
      s = Bad(cmd, absl::StrCat(name, " takes no arguments"));
    }
  } else {
    s = Bad(cmd, absl::StrCat("unknown command '", name,
                              "' (read, write, discard, flush, map, info, "
                              "length)"));
  }
  if (!s.ok()) return s;
  return cmd;
}

// ---------------------------------------------------------------------------
// Output in qemu-io's formats.

// qemu's cvtstr(): three decimals and a binary unit, ".000" dropped.
std::string CvtStr(double value) {
  static const char* const kUnits[] = {" EiB", " PiB", " TiB",
                                       " GiB", " MiB", " KiB"};
  char buf[64];
  const char* suffix = " bytes";
  int shift = 60;
  for (const char* unit : kUnits) {
    if (value >= static_cast<double>(1ull << shift)) {
      std::snprintf(buf, sizeof buf, "%.3f",
                    value / static_cast<double>(1ull << shift));
      suffix = unit;
      break;
    }
    shift -= 10;
  }
  if (shift == 0) std::snprintf(buf, sizeof buf, "%f", value);
  std::string s = buf;
  size_t trim = s.find(".000");
  if (trim != std::string::npos) s.resize(trim);
  return s + suffix;
}

void PrintReport(const char* op, const IoCommand& cmd, double seconds) {
  if (cmd.quiet) return;
  const double t = seconds > 0 ? seconds : 1e-9;
  std::printf("%s %llu/%llu bytes at offset %llu\n", op,
              static_cast<unsigned long long>(cmd.length),
              static_cast<unsigned long long>(cmd.length),
              static_cast<unsigned long long>(cmd.offset));
  std::printf("%s, 1 ops; %05.2f sec (%s/sec and %.4f ops/sec)\n",
              CvtStr(static_cast<double>(cmd.length)).c_str(), seconds,
              CvtStr(static_cast<double>(cmd.length) / t).c_str(), 1.0 / t);
}

// qemu-io's dump_buffer() (read -v).
void DumpBuffer(const uint8_t* p, uint64_t offset, size_t len) {
  for (size_t i = 0; i < len; i += 16) {
    const size_t n = std::min<size_t>(16, len - i);
    std::printf("%08llx:  ", static_cast<unsigned long long>(offset + i));
    for (size_t j = 0; j < n; ++j) std::printf("%02x ", p[i + j]);
    std::printf(" ");
    for (size_t j = 0; j < n; ++j) {
      std::putchar(std::isalnum(p[i + j]) ? p[i + j] : '.');
    }
    std::printf("\n");
  }
}

// ---------------------------------------------------------------------------
// Running.

class Runner {
 public:
  explicit Runner(Image& image) : image_(image) {}

  // Returns the exit status of `cmd` (kExitOk when it succeeded).
  int Run(const IoCommand& cmd) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status s;
    switch (cmd.kind) {
      case IoCommand::kWrite:
        s = DoWrite(cmd);
        break;
      case IoCommand::kRead:
        s = DoRead(cmd);
        break;
      case IoCommand::kDiscard:
        s = image_.Discard(cmd.offset, cmd.length);
        break;
      case IoCommand::kFlush:
        s = image_.Flush();
        break;
      case IoCommand::kMap:
        s = DoMap();
        break;
      case IoCommand::kInfo:
        DoInfo();
        break;
      case IoCommand::kLength:
        std::printf("%s\n", CvtStr(static_cast<double>(image_.size())).c_str());
        break;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (verify_failed_) return kExitVerifyFailed;
    if (!s.ok()) {
      return ReportError(
          absl::Status(s.code(), absl::StrCat(cmd.text, ": ", s.message())));
    }
    if (cmd.kind == IoCommand::kWrite) PrintReport("wrote", cmd, seconds);
    if (cmd.kind == IoCommand::kRead) PrintReport("read", cmd, seconds);
    if (cmd.kind == IoCommand::kDiscard) PrintReport("discard", cmd, seconds);
    return kExitOk;
  }

 private:
  absl::Status DoWrite(const IoCommand& cmd) {
    if (cmd.zero) return image_.WriteZeroes(cmd.offset, cmd.length, cmd.unmap);
    // Compressed: one call per cluster (a raw image has none: one call,
    // which says why it cannot be done).
    uint64_t chunk = kChunkBytes;
    if (cmd.compressed) {
      chunk = image_.GetChainInfo()[0].cluster_size;
      if (chunk == 0) chunk = cmd.length;
    }
    std::vector<uint8_t> buf(std::min(chunk, cmd.length),
                             cmd.pattern.value_or(kDefaultPattern));
    for (uint64_t done = 0; done < cmd.length;) {
      const size_t n = static_cast<size_t>(
          std::min<uint64_t>(buf.size(), cmd.length - done));
      const auto data = absl::MakeConstSpan(buf.data(), n);
      auto s = cmd.compressed ? image_.WriteCompressed(cmd.offset + done, data)
                              : image_.Write(cmd.offset + done, data);
      if (!s.ok()) return s;
      done += n;
    }
    return absl::OkStatus();
  }

  absl::Status DoRead(const IoCommand& cmd) {
    std::vector<uint8_t> buf(std::min(kChunkBytes, cmd.length));
    for (uint64_t done = 0; done < cmd.length;) {
      const size_t n = static_cast<size_t>(
          std::min<uint64_t>(buf.size(), cmd.length - done));
      const uint64_t pos = cmd.offset + done;
      auto s = image_.Read(pos, absl::MakeSpan(buf.data(), n));
      if (!s.ok()) return s;
      if (cmd.verbose) DumpBuffer(buf.data(), pos, n);
      if (cmd.pattern && !Verify(cmd, pos, buf.data(), n)) break;
      done += n;
    }
    return absl::OkStatus();
  }

  // Reports the first byte that is not the pattern like qemu-io ("Pattern
  // verification failed at offset N, M bytes"), with N that byte's offset
  // and M the bytes from there to the end of the read.
  bool Verify(const IoCommand& cmd, uint64_t pos, const uint8_t* p, size_t n) {
    const uint8_t want = *cmd.pattern;
    for (size_t i = 0; i < n; ++i) {
      if (p[i] == want) continue;
      const uint64_t at = pos + i;
      std::fflush(stdout);
      std::fprintf(
          stderr,
          "qcowtool: %s: Pattern verification failed at offset "
          "%llu, %llu bytes (read 0x%02x, expected 0x%02x)\n",
          cmd.text.c_str(), static_cast<unsigned long long>(at),
          static_cast<unsigned long long>(cmd.offset + cmd.length - at), p[i],
          want);
      verify_failed_ = true;
      return false;
    }
    return true;
  }

  // qemu-io's map: runs allocated / not allocated in the top image.
  absl::Status DoMap() {
    const uint64_t size = image_.size();
    uint64_t offset = 0;
    while (offset < size) {
      bool allocated = false;
      uint64_t len = 0;
      while (offset + len < size) {
        auto bs = image_.GetBlockStatus(offset + len, size - offset - len);
        if (!bs.ok()) return bs.status();
        const bool here = bs->present && bs->depth == 0;
        if (len > 0 && here != allocated) break;
        allocated = here;
        len += bs->length;
      }
      std::printf("%s (0x%llx) bytes %s at offset %s (0x%llx)\n",
                  CvtStr(static_cast<double>(len)).c_str(),
                  static_cast<unsigned long long>(len),
                  allocated ? "    allocated" : "not allocated",
                  CvtStr(static_cast<double>(offset)).c_str(),
                  static_cast<unsigned long long>(offset));
      offset += len;
    }
    return absl::OkStatus();
  }

  // qemu-io's info.
  void DoInfo() {
    const LayerInfo top = image_.GetChainInfo()[0];
    const bool qcow2 = top.format == ImageFormat::kQcow2;
    uint64_t vm_state = 0;
    if (qcow2 && top.cluster_size > 0) {
      // The guest offset just past the last L1 entry's span.
      const uint64_t l2_entries = top.cluster_size / (top.extended_l2 ? 16 : 8);
      const uint64_t span = l2_entries * top.cluster_size;
      vm_state = (top.virtual_size + span - 1) / span * span;
    }
    std::printf("format name: %s\n", qcow2 ? "qcow2" : "raw");
    std::printf("cluster size: %s\n",
                CvtStr(qcow2 ? top.cluster_size : 0).c_str());
    std::printf("vm state offset: %s\n", CvtStr(vm_state).c_str());
    if (!qcow2) return;
    const bool v3 = top.version >= 3;
    std::printf("Format specific information:\n");
    std::printf("    compat: %s\n", v3 ? "1.1" : "0.10");
    std::printf(
        "    compression type: %s\n",
        top.compression_type == CompressionType::kZstd ? "zstd" : "zlib");
    if (v3) {
      std::printf("    lazy refcounts: %s\n",
                  top.lazy_refcounts ? "true" : "false");
    }
    std::printf("    refcount bits: %u\n", top.refcount_bits);
    if (v3) {
      std::printf("    corrupt: %s\n", top.corrupt ? "true" : "false");
      std::printf("    extended l2: %s\n", top.extended_l2 ? "true" : "false");
    }
  }

  Image& image_;
  bool verify_failed_ = false;
};

struct IoArgs {
  std::string format;
  bool read_only = false;
  OpenPolicy policy;
  std::vector<std::string> commands;
  std::string image;
};

// Returns -1 when parsed, else the exit status to return.
int ParseArgs(int argc, char** argv, IoArgs* args) {
  OptionParser parser(kShortUsage);
  parser.Help(Usage())
      .List("cmd", 'c', &args->commands)
      .Format(&args->format)
      .Flag("read-only", 'r', &args->read_only)
      .Policy(&args->policy);
  std::vector<std::string> operands;
  if (int rc = parser.Parse(argc, argv, &operands); rc != kGoOn) return rc;
  std::string image;
  if (int rc = ExpectOneImage(parser, operands, &image); rc != kGoOn) {
    return rc;
  }
  if (args->policy.force_share && !args->read_only) {
    return UsageError(kShortUsage,
                      "-U (force-share) can only be used with -r (read-only)");
  }
  if (args->commands.empty()) {
    return UsageError(kShortUsage, "expecting at least one -c command");
  }
  args->image = image;
  return -1;
}

}  // namespace

int RunIo(int argc, char** argv) {
  IoArgs args;
  if (int rc = ParseArgs(argc, argv, &args); rc >= 0) return rc;

  std::vector<IoCommand> commands;
  for (const std::string& text : args.commands) {
    auto cmd = ParseCommand(text);
    if (!cmd.ok()) return UsageError(kShortUsage, cmd.status().message());
    if (args.read_only &&
        (cmd->kind == IoCommand::kWrite || cmd->kind == IoCommand::kDiscard)) {
      return UsageError(kShortUsage, absl::StrCat("'", text,
                                                  "' needs the image opened "
                                                  "read-write (drop -r)"));
    }
    commands.push_back(std::move(*cmd));
  }

  if (auto s = args.policy.ResolveImage(&args.image, &args.format); !s.ok()) {
    return ReportError(s);
  }
  OpenOptions opts;
  opts.format = args.format;
  opts.read_write = !args.read_only;
  args.policy.ApplyTo(&opts);
  auto image = Image::Open(args.image, opts);
  if (!image.ok()) return ReportError(image.status());
  const uint64_t size = (*image)->size();
  for (const IoCommand& cmd : commands) {
    if (cmd.has_range() &&
        (cmd.offset > size || cmd.length > size - cmd.offset)) {
      return UsageError(kShortUsage, absl::StrCat("'", cmd.text,
                                                  "': the range ends past the "
                                                  "end of the image (",
                                                  size, " bytes)"));
    }
  }

  Runner runner(**image);
  int rc = kExitOk;
  for (const IoCommand& cmd : commands) {
    rc = runner.Run(cmd);
    std::fflush(stdout);
    if (rc != kExitOk) break;
  }
  absl::Status closed = (*image)->Close();
  if (rc == kExitOk && !closed.ok()) return ReportError(closed);
  return rc;
}

}  // namespace qcow2::tool
