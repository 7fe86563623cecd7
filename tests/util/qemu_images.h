// SPDX-License-Identifier: Apache-2.0
// Building test images with QEMU's own tools (qemu-img, qemu-io), so that the
// oracle, not our library, decides what is on disk.
//
//   QemuImageSpec spec;
//   spec.size = 4 << 20;
//   spec.cluster_size = 4096;
//   ASSERT_OK(QemuCreate(dir.File("a.qcow2"), spec));
//   ASSERT_OK(QemuIo(dir.File("a.qcow2"),
//                    {QemuOp::Write(12345, 777, 0xab).ToCommand(),
//                     QemuOp::Zero(70000, 9000).ToCommand()}));
//
// Whole chains with seeded pseudo-random workloads:
//
//   std::vector<QemuLayerSpec> layers(2);
//   layers[0].image.size = 3 << 20;            // bottom
//   layers[1].image.size = 4 << 20;            // top, backed by layer 0
//   RandomOpsConfig rc; rc.seed = 7; rc.size = 4 << 20; ...
//   layers[1].ops = RandomQemuOps(rc);
//   auto chain = QemuBuildChain(dir.path(), layers);   // paths, bottom first
//
// Every function can append the exact command lines it ran to a
// CommandLog, so a failing test can print how to rebuild its image.
#ifndef QCOW2_TESTS_UTIL_QEMU_IMAGES_H_
#define QCOW2_TESTS_UTIL_QEMU_IMAGES_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "testing/rng.h"
#include "tests/util/json_lite.h"

namespace qcow2::testing {

// Command lines run, one shell-quoted line each.
using CommandLog = std::vector<std::string>;

// Shell-quotes argv into one line ("qemu-img create -f qcow2 'a b' 1M").
std::string FormatCommand(const std::vector<std::string>& argv);

// `qemu-img create` parameters. Fields left at their defaults are passed
// anyway (except the empty strings and size 0), so the spec, not qemu-img's
// defaults, says what the image is.
struct QemuImageSpec {
  std::string format = "qcow2";  // "qcow2" or "raw"
  // Virtual size in bytes (qemu-img rounds it up to 512). 0: the backing
  // file's size (needs backing_file).
  uint64_t size = 0;
  // qcow2 only below.
  std::string compat = "1.1";  // "0.10" or "1.1"
  uint32_t cluster_size = 65536;
  uint32_t refcount_bits = 16;  // compat 0.10 allows only 16
  bool extended_l2 = false;     // compat 1.1 and cluster_size >= 16 KiB
  std::string compression_type = "zlib";  // "zlib" or "zstd" (compat 1.1)
  bool lazy_refcounts = false;
  std::string preallocation;  // "", "off", "metadata", "falloc", "full"
  std::string backing_file;   // as stored in the header
  std::string backing_format;  // "qcow2", "raw"; qemu-img 7.2 requires it
  // More `-o key=value` options, passed verbatim.
  std::vector<std::string> extra_options;

  // Whether qemu accepts the combination (extended L2 needs compat 1.1 and
  // >= 16 KiB clusters, zstd and refcount_bits != 16 need compat 1.1).
  bool Valid() const;
  // A short name usable in gtest names: "c64k_rb16_v3_zlib_xl2", "raw".
  std::string Token() const;
};

// gtest prints a spec parameter as its Token().
void PrintTo(const QemuImageSpec& spec, std::ostream* os);

// A qcow2 spec with the given compat ("0.10" or "1.1"), cluster size and
// extended L2 (size 0: the test sets it).
QemuImageSpec Qcow2Spec(const std::string& compat, uint32_t cluster_size,
                        bool extended_l2 = false);

// The argv of `qemu-img create` for `spec`.
std::vector<std::string> QemuCreateArgv(const std::string& path,
                                        const QemuImageSpec& spec);

// Runs `qemu-img create`. Fails (kInternal, with qemu's stderr) when
// qemu-img does.
absl::Status QemuCreate(const std::string& path, const QemuImageSpec& spec,
                        CommandLog* log = nullptr);

// Runs `qemu-io -f FORMAT -c CMD ... path` with every command in one
// process. `format` "" lets qemu-io probe (it warns for raw). qemu-io exits
// non-zero when any command fails; that is returned as kInternal with its
// output. An empty command list does nothing.
absl::Status QemuIo(const std::string& path,
                    const std::vector<std::string>& commands,
                    const std::string& format = "qcow2",
                    CommandLog* log = nullptr);

// Runs `qemu-img convert [extra_args...] -O out_format src dst`, for
// example extra_args {"-c", "-o", "compression_type=zstd,cluster_size=4k"}
// makes every cluster compressed.
absl::Status QemuConvert(const std::string& src, const std::string& dst,
                         const std::string& out_format,
                         const std::vector<std::string>& extra_args = {},
                         CommandLog* log = nullptr);

// `qemu-img map --output=json` of `path` (its text, and parsed).
absl::StatusOr<std::string> QemuMapJsonText(const std::string& path,
                                            const std::string& format = "qcow2",
                                            CommandLog* log = nullptr);
absl::StatusOr<json::Value> QemuMapJson(const std::string& path,
                                        const std::string& format = "qcow2",
                                        CommandLog* log = nullptr);

// `qemu-img info --backing-chain --output=json`: an array, top first.
absl::StatusOr<json::Value> QemuInfoChainJson(const std::string& path,
                                              CommandLog* log = nullptr);

// One qemu-io operation on the guest disk.
struct QemuOp {
  enum class Kind {
    kWrite,       // write -P pattern off len
    kWriteFile,   // write -s file off len (file repeated to fill len)
    kZero,        // write -z off len
    kZeroUnmap,   // write -z -u off len
    kCompressed,  // write -c -P pattern / -s file off len (cluster aligned)
    kDiscard,     // discard off len
  };
  Kind kind = Kind::kWrite;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint8_t pattern = 0;       // kWrite, kCompressed without a file
  std::string pattern_file;  // kWriteFile, kCompressed with a file

  static QemuOp Write(uint64_t off, uint64_t len, uint8_t pattern);
  static QemuOp WriteFile(uint64_t off, uint64_t len, std::string file);
  static QemuOp Zero(uint64_t off, uint64_t len, bool unmap = false);
  static QemuOp Compressed(uint64_t off, uint64_t len, uint8_t pattern);
  static QemuOp CompressedFile(uint64_t off, uint64_t len, std::string file);
  static QemuOp Discard(uint64_t off, uint64_t len);

  // The qemu-io command ("write -P 0xab 12345 777").
  std::string ToCommand() const;
};

std::vector<std::string> ToQemuIoCommands(const std::vector<QemuOp>& ops);

// Applies a write / zero / compressed op to an in-memory disk image (for
// model tests). Discards are not modelled (what they leave depends on
// alignment, backing and version): returns false for them and for ops past
// the end of `disk`. `pattern_bytes` is the content of the op's pattern
// file (for kWriteFile / kCompressed with a file).
bool ApplyQemuOpToModel(const QemuOp& op, std::vector<uint8_t>* disk,
                        const std::vector<uint8_t>& pattern_bytes = {});

// Seeded pseudo-random workload for one image of `size` bytes.
// Offsets and lengths of writes, zero writes and discards are byte-granular
// (deliberately not multiples of 512). Compressed writes come first (qemu
// only compresses into unallocated clusters), each on whole clusters that
// lie entirely inside the disk and that no other compressed write used.
struct RandomOpsConfig {
  uint64_t seed = 1;
  uint64_t size = 0;          // disk size; every op stays inside it
  uint32_t cluster_size = 65536;
  int writes = 8;
  int zero_writes = 2;
  // Every n-th zero write (n = 1, 2, ...) is `write -z -u` (may unmap),
  // the others `write -z`; 0: never unmap.
  int zero_unmap_every = 0;
  int compressed_writes = 1;  // at most 2 clusters each
  int discards = 1;
  // Longest plain write/zero/discard; 0 means 2 clusters + a bit (at least
  // 64 KiB). Lengths are drawn log-uniformly: many short, some long.
  uint64_t max_length = 0;
  // When non-empty, plain and compressed writes alternate between this
  // pattern file and -P patterns.
  std::string pattern_file;
};
std::vector<QemuOp> RandomQemuOps(const RandomOpsConfig& config);

// Pseudo-random but compressible bytes (runs over a 16-symbol alphabet
// derived from `seed`): data whose every offset differs, that zlib and zstd
// still shrink to well under a cluster.
std::vector<uint8_t> CompressibleBytes(uint64_t seed, size_t size);

// Writes CompressibleBytes(seed, size) to `path` (for `write -s`).
absl::Status WritePatternFile(const std::string& path, uint64_t seed,
                              size_t size);

// Rewrites every byte of `path` in place, so the host file has no holes
// (qemu punches holes for zero writes and for the unwritten parts of newly
// allocated clusters). The bytes stay the same; only the physical
// allocation changes. Useful because `qemu-img map` looks at the host file's
// holes in two cases: raw files (holes are reported as zero, data false)
// and qcow2 files that its metadata-preallocation heuristic flags (fewer
// physically allocated clusters than refcounted ones: data clusters over
// holes are then reported as zero and data).
absl::Status FillHoles(const std::string& path);

// One file of a chain for QemuBuildChain.
struct QemuLayerSpec {
  // backing_file / backing_format are filled in by QemuBuildChain (the
  // layer below, by its bare file name, with its format). size 0 takes the
  // backing file's size.
  QemuImageSpec image;
  // Raw layers only: when set, the file is first written densely with
  // CompressibleBytes(*raw_fill_seed, raw_file_size or image.size), without
  // qemu (no holes; any byte length, unlike qemu-img create -f raw).
  std::optional<uint64_t> raw_fill_seed;
  uint64_t raw_file_size = 0;
  // Applied with one qemu-io run after creation.
  std::vector<QemuOp> ops;
  // When set, the image is not created with qemu-img create but converted
  // from a raw file holding CompressibleBytes(*convert_from_seed, size)
  // with `qemu-img convert -c` (every cluster compressed) using the spec's
  // options. Not allowed with a backing file (the bottom layer only).
  std::optional<uint64_t> convert_from_seed;
  // After the ops: rewrite every byte of the file in place so that it has
  // no holes (see FillHoles). Contents are unchanged.
  bool fill_holes = false;
};

// Builds a chain in `dir`: layers[0] is the bottom, layers.back() the top.
// Files are named "layerN.qcow2" / "layerN.raw" (N = index from the
// bottom) and each overlay stores the bare name of the layer below.
// Returns the paths, bottom first.
absl::StatusOr<std::vector<std::string>> QemuBuildChain(
    const std::string& dir, const std::vector<QemuLayerSpec>& layers,
    CommandLog* log = nullptr);

}  // namespace qcow2::testing

#endif  // QCOW2_TESTS_UTIL_QEMU_IMAGES_H_
