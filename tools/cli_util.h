// SPDX-License-Identifier: Apache-2.0
// Helpers shared by qcowtool's commands: exit codes, usage and error
// reporting, qemu-style size parsing and printing, option values.
//
// Every command follows the same conventions:
//   exit 0  success (also for CMD --help);
//   exit 1  wrong arguments: the message and the command's usage go to
//           stderr (UsageError);
//   exit 2  the image could not be opened, read or written: one line
//           "qcowtool: <message>" on stderr (ReportError).
#ifndef QCOW2_TOOLS_CLI_UTIL_H_
#define QCOW2_TOOLS_CLI_UTIL_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "qcow2/image.h"
#include "tools/json_writer.h"

namespace qcow2::tool {

inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 1;
inline constexpr int kExitImageError = 2;
// qemu-img's status for any error, usage or image.
inline constexpr int kExitFailure = 1;

// The lines the usage of io, serve and bench (verbs of our own) ends with.
inline constexpr char kExitStatusHelp[] =
    "Exit status: 0 on success, 1 for wrong arguments, 2 when the image\n"
    "cannot be opened, read or written.\n";

// The same for the verbs that are qemu-img's (info, map, convert, create,
// snapshot): its status, 1 for every error.
inline constexpr char kQemuImgExitStatusHelp[] =
    "Exit status (qemu-img's): 0 on success, 1 on any error.\n";

// The top-level usage's.
inline constexpr char kToolExitStatusHelp[] =
    "Exit status: 0 on success; 1 on any error in qemu-img's verbs, and for\n"
    "wrong arguments; io, serve and bench exit 2 when the image cannot be\n"
    "opened, read or written (each verb's --help has its own).\n";

// A read-only string argument: accepts std::string, std::string_view,
// C strings and absl::string_view alike (Debian's Abseil has its own
// string_view type, so status.message() is not a std::string_view).
class TextArg {
 public:
  TextArg(const char* s) : view_(s) {}                         // NOLINT
  TextArg(const std::string& s) : view_(s) {}                  // NOLINT
  TextArg(std::string_view s) : view_(s) {}                    // NOLINT
  TextArg(absl::string_view s) : view_(s.data(), s.size()) {}  // NOLINT
  std::string_view view() const { return view_; }

 private:
  std::string_view view_;
};

// Prints "qcowtool: <message>" (when `message` is not empty) and then
// `usage` to stderr. Returns kExitUsage.
int UsageError(TextArg usage, TextArg message);

// Prints "qcowtool: <status message>" to stderr. Returns kExitImageError.
int ReportError(const absl::Status& status);

// Prints as ReportError does. Returns kExitFailure: the status qemu-img
// gives when an image cannot be opened, read or written.
int ReportQemuImgError(const absl::Status& status);

// Prints "qcowtool: <message>" to stderr. Returns 1: the status of the
// commands that, like qemu-img resize and measure, exit 1 on any error.
int ReportFailure(TextArg message);

// Prints `usage` to stdout (for --help). Returns kExitOk.
int PrintHelp(TextArg usage);

// Parses a size the way qemu-img and qemu-io do: a decimal number with an
// optional suffix b/B (bytes), k/K, m/M, g/G, t/T, p/P, e/E (powers of
// 1024), a decimal fraction before a suffix other than b ("1.5G"), or a
// hex number with a 0x prefix and no suffix. Errors are kInvalidArgument
// naming the text: garbage, negative numbers, a fraction without a unit,
// or a value above INT64_MAX (QEMU's limit).
absl::StatusOr<uint64_t> ParseSize(std::string_view text);

// Formats a byte count like QEMU's size_to_str(): three significant
// digits and a binary unit, e.g. "0 B", "512 B", "1 MiB", "264 KiB",
// "1.5 GiB", "10 GiB".
std::string FormatSize(uint64_t bytes);

enum class OutputFormat { kHuman, kJson };

// Parses an --output value ("human" or "json").
absl::StatusOr<OutputFormat> ParseOutputFormat(std::string_view text);

// Options shared by the commands that open images: -U and --backing-root
// as given (OptionParser::Policy adds both; the usage text adds the
// matching help lines).
struct OpenPolicy {
  bool force_share = false;
  std::string backing_root;
  // --object secret,id=ID,data=STRING|file=PATH[,format=raw|base64], as
  // qemu-img takes them: the secrets by id.
  std::map<std::string, std::string> secrets;
  // --image-opts: image operands are option strings
  // (driver=qcow2,file.filename=PATH,encrypt.key-secret=ID).
  bool image_opts = false;
  // The key secret of the image being opened (ResolveImage), and those of
  // its backing images by depth (backing.encrypt.key-secret=ID,
  // backing.backing.encrypt.key-secret=ID, ...).
  std::string key_secret;
  std::vector<std::string> backing_key_secrets;
  // What ResolveImage was given (the option string under --image-opts),
  // the id its encrypt.key-secret named, and the backing.* keys it had:
  // what qemu-img prints and refuses (QemuImageName, info).
  std::string image_spec;
  std::string key_secret_id;
  std::vector<std::string> backing_keys;

  // Adds one --object (only secret objects; qemu-img's messages).
  absl::Status AddObject(std::string_view spec);
  // With --image-opts, turns `*image` into its file name and `*format`
  // into its driver, and sets key_secret from encrypt.key-secret; without,
  // does nothing.
  absl::Status ResolveImage(std::string* image, std::string* format);

  // Sets OpenOptions::force_share, backing_root, key_secret and
  // backing_key_secrets.
  void ApplyTo(OpenOptions* opts) const;

  // The name QEMU gives the image ResolveImage resolved to `path` (bs->
  // filename, what `qemu-img info` prints): `path`, or with an option
  // QEMU deems not a default (encrypt.key-secret) a json: name of the
  // options, `format` the driver opened.
  std::string QemuImageName(const std::string& path,
                            std::string_view format) const;
};
inline constexpr char kSecretHelp[] =
    "  --object secret,id=ID,data=STRING|file=PATH  a secret, for\n"
    "                   encrypt.key-secret=ID\n"
    "  --image-opts     IMAGE is driver=qcow2,file.filename=PATH,\n"
    "                   encrypt.key-secret=ID\n";
inline constexpr char kForceShareHelp[] =
    "  -U, --force-share  open IMAGE even while another process (QEMU,\n"
    "                   qcowtool) writes it: only the shared read lock is\n"
    "                   taken and what is read may be inconsistent\n";
inline constexpr char kBackingRootHelp[] =
    "  --backing-root=DIR  refuse backing files that resolve outside DIR\n"
    "                   (for images from untrusted sources)\n";

// Validates a -f value: "qcow2" or "raw".
absl::Status CheckImageFormat(std::string_view text);

// Combines a backing file name with the name of the image that refers to
// it as QEMU does (path_combine): absolute names are kept, relative ones
// get `image_name`'s directory part up to and including the last '/'
// ("b.qcow2" + "a.qcow2" -> "a.qcow2", "d/b.qcow2" + "../a" -> "d/../a").
std::string QemuPathCombine(std::string_view image_name,
                            std::string_view backing);

// The names QEMU shows for the files of a chain, top first: `top` as given,
// then each backing file combined with the name of the image above it.
// (LayerInfo::filename is the path libqcow2 opened, which may differ in
// spelling, e.g. "./a.qcow2" for "a.qcow2".)
std::vector<std::string> QemuChainNames(const std::string& top,
                                        const std::vector<LayerInfo>& chain);

// st_blocks * 512 of `path`: the space the file takes on disk, as
// qemu-img's "actual-size". Errors from stat() name the path.
absl::StatusOr<uint64_t> AllocatedFileSize(const std::string& path);

// Applies a qemu-img cache mode (none, writeback, unsafe, directsync,
// writethrough) to `opts`: none and directsync open with O_DIRECT, unsafe
// sets an opener whose files' flushes make nothing durable (as QEMU's
// cache.no-flush), the others the default opener.
// kInvalidArgument, qemu-img's "Invalid cache option: MODE", otherwise.
absl::Status ApplyCacheMode(std::string_view mode, OpenOptions* opts);

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_CLI_UTIL_H_
