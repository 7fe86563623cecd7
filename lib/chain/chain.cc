// SPDX-License-Identifier: Apache-2.0
#include "lib/chain/chain.h"
#include "lib/chain/probe_guard.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/crypto/secure_buffer.h"
#include "lib/io/accounted_file.h"
#include "lib/io/io_plan.h"
#include "lib/format/header.h"
#include "lib/driver/qcow2_layer.h"
#include "lib/base/endian.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

namespace {

// Protocol prefixes QEMU would interpret instead of opening a file. A
// backing name from an untrusted image must never reach the network or a
// JSON-described block graph.
constexpr const char* kProtocols[] = {
    "json", "nbd",    "nbd+unix", "http", "https", "ftp",   "ftps",
    "ssh",  "iscsi",  "rbd",      "gluster", "nfs", "sheepdog", "vxhs",
    "host_device", "host_cdrom", "null-co", "null-aio", "blkdebug",
    "blkverify", "quorum", "throttle", "vvfat", "fd"};

std::string DirName(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// A key identifying a file for loop detection.
std::string FileKey(const std::string& path) {
  std::error_code ec;
  auto canon = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : canon.string();
}

}  // namespace

absl::StatusOr<std::string> ResolveBackingName(const std::string& image_name,
                                               const std::string& backing) {
  if (backing.empty()) {
    return absl::InvalidArgumentError("empty backing file name");
  }
  if (backing.find('\0') != std::string::npos) {
    return absl::DataLossError(absl::StrCat(
        image_name, ": backing file name contains a NUL byte"));
  }
  auto colon = backing.find(':');
  auto slash = backing.find('/');
  if (colon != std::string::npos && (slash == std::string::npos || colon < slash)) {
    std::string prefix = backing.substr(0, colon);
    for (const char* p : kProtocols) {
      if (absl::EqualsIgnoreCase(prefix, p)) {
        return absl::PermissionDeniedError(absl::StrCat(
            image_name, ": backing file '", backing, "' uses the protocol '",
            prefix, ":'; only plain paths are allowed"));
      }
    }
  }
  if (backing[0] == '/') return backing;
  // Spelled the way qemu-img spells it: no "./" for an image in the
  // current directory, no "//" under the root.
  if (image_name.find('/') == std::string::npos) return backing;
  const std::string dir = DirName(image_name);
  return dir == "/" ? absl::StrCat("/", backing)
                    : absl::StrCat(dir, "/", backing);
}

FileOptions TopFileOptions(const OpenOptions& opts) {
  FileOptions fo;
  fo.read_only = !opts.read_write;
  fo.direct = opts.direct_io;
  fo.lock = opts.lock;
  fo.force_share = opts.force_share;
  fo.no_flush = opts.no_flush;
  return fo;
}

absl::StatusOr<std::unique_ptr<File>> OpenDataFile(const std::string& image,
                                                  const std::string& stored,
                                                  const OpenOptions& opts) {
  // An explicit path (QEMU's data-file option) is the caller's own; the
  // name the image stores is untrusted, as a backing name is (no
  // protocol prefix, no NUL, under backing_root). Unlike a backing name,
  // QEMU opens a relative data file name from its working directory, not
  // the image's: so do we, or an image would name different files for
  // QEMU and for us.
  std::string path = opts.data_file;
  if (path.empty()) {
    absl::StatusOr<std::string> checked = ResolveBackingName("", stored);
    if (!checked.ok()) {
      return absl::Status(checked.status().code(),
                          absl::StrCat(image, ": external data file: ",
                                       checked.status().message()));
    }
    path = *std::move(checked);
    if (!opts.backing_root.empty()) {
      const std::string root = FileKey(opts.backing_root);
      const std::string key = FileKey(path);
      if (!absl::StartsWith(key, root + "/")) {
        return absl::PermissionDeniedError(absl::StrCat(
            image, ": data file '", stored, "' resolves to ", key,
            ", outside the allowed directory ", root));
      }
    }
  }
  if (FileKey(path) == FileKey(image)) {
    return absl::DataLossError(
        absl::StrCat(image, ": the external data file is the image itself"));
  }
  FileOpener* opener = opts.opener ? opts.opener : DefaultFileOpener();
  absl::StatusOr<std::unique_ptr<File>> f =
      opener->Open(path, TopFileOptions(opts));
  if (!f.ok()) {
    return absl::Status(
        f.status().code(),
        absl::StrCat(image, ": cannot open its external data file '", stored,
                     "': ", f.status().message()));
  }
  return f;
}

absl::StatusOr<std::unique_ptr<Layer>> OpenLayer(std::unique_ptr<File> file,
                                                 const std::string& format,
                                                 const OpenOptions& opts) {
  file = AccountedFile::Wrap(std::move(file));
  std::string fmt = format;
  uint8_t magic[4] = {0, 0, 0, 0};
  RETURN_IF_ERROR(file->ReadAt(0, absl::MakeSpan(magic, 4)));
  bool is_qcow2 = LoadBE32(magic) == kQcowMagic;
  if (fmt.empty()) fmt = is_qcow2 ? "qcow2" : "raw";
  if (fmt == "qcow2") {
    const std::string image = file->name();
    auto open_data = [&](const std::string& stored)
        -> absl::StatusOr<std::unique_ptr<File>> {
      return OpenDataFile(image, stored, opts);
    };
    ASSIGN_OR_RETURN(auto layer,
                     Qcow2Layer::Open(std::move(file), opts, open_data));
    if (!opts.data_file.empty() && layer->data_file() == layer->file()) {
      return absl::InvalidArgumentError(absl::StrCat(
          image, ": a data file can only be given for an image with an "
          "external data file"));
    }
    return std::unique_ptr<Layer>(std::move(layer));
  }
  if (!opts.data_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file->name(), ": a data file can only be given for a qcow2 image"));
  }
  if (fmt == "raw") {
    // Probed (not named) and writable: the guest may not make it probe as
    // something else.
    if (format.empty() && opts.read_write) {
      file = GuardProbedRaw(std::move(file));
    }
    ASSIGN_OR_RETURN(auto layer,
                     RawLayer::Open(std::move(file), !opts.read_write));
    return std::unique_ptr<Layer>(std::move(layer));
  }
  return absl::UnimplementedError(absl::StrCat(
      file->name(), ": image format '", fmt,
      "' is not supported (qcow2 and raw are)"));
}

Chain::~Chain() = default;

absl::StatusOr<std::unique_ptr<Chain>> Chain::Open(std::unique_ptr<File> top,
                                                   const OpenOptions& opts) {
  auto chain = std::unique_ptr<Chain>(new Chain);
  FileOpener* opener = opts.opener ? opts.opener : DefaultFileOpener();
  std::set<std::string> seen{FileKey(top->name())};
  std::string root;
  if (!opts.backing_root.empty()) root = FileKey(opts.backing_root);

  ASSIGN_OR_RETURN(auto layer, OpenLayer(std::move(top), opts.format, opts));
  chain->writable_ = opts.read_write;
  chain->opts_ = opts;
  // The key secret is not kept once every layer is unlocked (reopening an
  // encrypted layer later needs it again from the caller).
  WipeString(&chain->opts_.key_secret);
  for (std::string& s : chain->opts_.backing_key_secrets) WipeString(&s);
  chain->layers_.push_back(std::move(layer));

  OpenOptions backing_opts = opts;
  backing_opts.read_write = false;
  for (std::string& s : backing_opts.backing_key_secrets) WipeString(&s);
  backing_opts.data_file.clear();  // the top's alone
  backing_opts.no_flush = false;
  struct Wiper {
    std::string* s;
    ~Wiper() { WipeString(s); }
  } wipe_backing{&backing_opts.key_secret};
  while (opts.open_backing) {
    Layer* cur = chain->layers_.back().get();
    std::string name = cur->backing_file();
    if (name.empty()) break;
    if (chain->length() > opts.max_chain_depth) {
      return absl::FailedPreconditionError(absl::StrCat(
          chain->layers_[0]->filename(), ": backing chain is deeper than ",
          opts.max_chain_depth, " images"));
    }
    ASSIGN_OR_RETURN(std::string path,
                     ResolveBackingName(cur->filename(), name));
    std::string key = FileKey(path);
    if (!root.empty() && !absl::StartsWith(key, root + "/")) {
      return absl::PermissionDeniedError(absl::StrCat(
          cur->filename(), ": backing file '", name, "' resolves to ", key,
          ", outside the allowed directory ", root));
    }
    if (!seen.insert(key).second) {
      return absl::DataLossError(absl::StrCat(
          cur->filename(), ": backing chain loops back to ", path));
    }
    FileOptions fo;
    fo.read_only = true;
    fo.direct = opts.direct_io;
    fo.lock = opts.lock;
    fo.force_share = opts.force_share;
    auto file = opener->Open(path, fo);
    if (!file.ok()) {
      return absl::Status(
          file.status().code(),
          absl::StrCat(cur->filename(), ": cannot open backing file '", name,
                       "': ", file.status().message()));
    }
    // This layer's own secret, else the chain's (wiped on the way out).
    const size_t below_depth = chain->layers_.size();
    WipeString(&backing_opts.key_secret);
    backing_opts.key_secret =
        below_depth <= opts.backing_key_secrets.size() &&
                !opts.backing_key_secrets[below_depth - 1].empty()
            ? opts.backing_key_secrets[below_depth - 1]
            : opts.key_secret;
    auto below = OpenLayer(std::move(file).value(), cur->backing_format(),
                           backing_opts);
    if (!below.ok()) return below.status();
    chain->resolved_backing_.push_back(path);
    chain->layers_.push_back(std::move(below).value());
  }
  chain->resolved_backing_.resize(chain->layers_.size());
  chain->ConnectBacking();
  return chain;
}

absl::Status Chain::ClosedError() const {
  return absl::FailedPreconditionError(
      absl::StrCat(layers_[0]->filename(), ": image is closed"));
}

absl::Status Chain::CheckRange(uint64_t offset, uint64_t len) const {
  if (closed_) return ClosedError();
  uint64_t end;
  if (__builtin_add_overflow(offset, len, &end) || end > layers_[0]->size()) {
    return absl::OutOfRangeError(absl::StrCat(
        "request at ", offset, " (", len, " bytes) runs past the end of ",
        layers_[0]->filename(), " (", layers_[0]->size(), " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status Chain::PlanRead(int depth, uint64_t offset, uint8_t* dest,
                             uint64_t len, IoPlan* plan, IoCategory category) {
  if (ThroughBackingMap(depth)) {
    return PlanBackingRead(offset, dest, len, plan, category);
  }
  uint64_t pos = 0;
  while (pos < len) {
    const uint64_t cur = offset + pos;
    if (depth >= length() || cur >= layers_[depth]->size()) {
      std::memset(dest + pos, 0, len - pos);
      return absl::OkStatus();
    }
    Layer* layer = layers_[depth].get();
    ASSIGN_OR_RETURN(Extent e, layer->Map(cur, len - pos));
    switch (e.kind) {
      case Extent::kUnallocated:
        RETURN_IF_ERROR(
            PlanRead(depth + 1, cur, dest + pos, e.length, plan, category));
        break;
      case Extent::kZero:
        std::memset(dest + pos, 0, e.length);
        break;
      case Extent::kData:
        plan->Read(layer->data_file(), e.host_offset, dest + pos, e.length,
                   category);
        break;
      case Extent::kCompressed: {
        auto* q = layer->AsQcow2();
        if (q == nullptr) {
          return absl::InternalError("compressed extent in a raw layer");
        }
        RETURN_IF_ERROR(q->reader().PlanCompressedRead(e.entry, cur, dest + pos,
                                              e.length, plan, category));
        break;
      }
    }
    pos += e.length;
  }
  return absl::OkStatus();
}

absl::StatusOr<BackingMap::Piece> Chain::BackingPieceAt(
    uint64_t offset) {
  if (std::optional<BackingMap::Piece> p = backing_map_.Find(offset)) {
    return *p;
  }
  // The whole aligned window around `offset` is resolved at once, layer by
  // layer: a layer's Map returns a run of clusters per call, so a sparse
  // overlay answers for the window in one call instead of one per granule.
  // Not clamped to the top's size: what the layers below hold does not
  // depend on it, and the top may grow (or be asked about its old end).
  const uint64_t window_start = offset / resolve_window_ * resolve_window_;
  const uint64_t window_end = window_start + resolve_window_;
  struct Span {
    uint64_t start, end;
  };
  // What the map does not hold yet, merged across granule edges.
  absl::InlinedVector<Span, 4> todo;
  for (uint64_t pos = window_start; pos < window_end;) {
    if (std::optional<BackingMap::Piece> p = backing_map_.Find(pos)) {
      pos = p->start + p->length;
      continue;
    }
    const uint64_t end = std::min(backing_map_.FreeEnd(pos), window_end);
    if (!todo.empty() && todo.back().end == pos) {
      todo.back().end = end;
    } else {
      todo.push_back({pos, end});
    }
    pos = end;
  }
  absl::InlinedVector<BackingMap::Piece, 8> found;
  for (int d = 1; !todo.empty(); ++d) {
    absl::InlinedVector<Span, 4> below;  // unallocated in layer d
    for (const Span& span : todo) {
      for (uint64_t pos = span.start; pos < span.end;) {
        BackingMap::Piece piece;
        piece.start = pos;
        if (d >= length() || pos >= layers_[d]->size()) {
          piece.extent.kind = Extent::kZero;
          piece.extent.length = span.end - pos;
        } else {
          ASSIGN_OR_RETURN(piece.extent,
                           layers_[d]->MapStatus(pos, span.end - pos));
          piece.depth = d;
        }
        piece.length = piece.extent.length;
        pos += piece.length;
        if (piece.extent.kind != Extent::kUnallocated) {
          found.push_back(piece);
        } else if (!below.empty() && below.back().end == piece.start) {
          below.back().end = pos;
        } else {
          below.push_back({piece.start, pos});
        }
      }
    }
    todo.swap(below);
  }
  // Stored cut at granule edges.
  std::optional<BackingMap::Piece> wanted;
  for (const BackingMap::Piece& piece : found) {
    for (uint64_t pos = piece.start; pos < piece.start + piece.length;) {
      const uint64_t edge = (pos / BackingMap::kGranule + 1) *
                            BackingMap::kGranule;
      BackingMap::Piece part = piece;
      const uint64_t into = pos - piece.start;
      part.start = pos;
      part.length = std::min(edge, piece.start + piece.length) - pos;
      part.extent.length = part.length;
      if (part.extent.kind == Extent::kData ||
          part.extent.has_host_cluster) {
        part.extent.host_offset += into;
      }
      if (offset - part.start < part.length) wanted = part;
      backing_map_.Insert(part);
      pos += part.length;
    }
  }
  if (!wanted) {
    return absl::InternalError(absl::StrCat(
        layers_[0]->filename(), ": resolving guest offset ", offset,
        " through the backing chain found no piece holding it"));
  }
  return *wanted;
}

absl::Status Chain::PlanBackingRead(uint64_t offset, uint8_t* dest,
                                    uint64_t len, IoPlan* plan,
                                    IoCategory category) {
  uint64_t pos = 0;
  while (pos < len) {
    const uint64_t cur = offset + pos;
    ASSIGN_OR_RETURN(BackingMap::Piece p, BackingPieceAt(cur));
    const uint64_t into = cur - p.start;
    const uint64_t n = std::min(len - pos, p.length - into);
    switch (p.extent.kind) {
      case Extent::kZero:
      case Extent::kUnallocated:
        std::memset(dest + pos, 0, n);
        break;
      case Extent::kData:
        plan->Read(layers_[p.depth]->data_file(), p.extent.host_offset + into,
                   dest + pos, n, category);
        break;
      case Extent::kCompressed: {
        auto* q = layers_[p.depth]->AsQcow2();
        if (q == nullptr) {
          return absl::InternalError("compressed extent in a raw layer");
        }
        RETURN_IF_ERROR(q->reader().PlanCompressedRead(p.extent.entry, cur, dest + pos,
                                              n, plan, category));
        break;
      }
    }
    pos += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Chain::ReadsAsZero(int depth, uint64_t offset,
                                        uint64_t len) {
  uint64_t pos = 0;
  if (ThroughBackingMap(depth)) {
    // As PlanRead reads: the lookups this makes are those a copy from
    // below will need.
    while (pos < len) {
      const uint64_t cur = offset + pos;
      ASSIGN_OR_RETURN(BackingMap::Piece p, BackingPieceAt(cur));
      if (p.extent.kind != Extent::kZero &&
          p.extent.kind != Extent::kUnallocated) {
        return false;
      }
      pos += std::min(len - pos, p.length - (cur - p.start));
    }
    return true;
  }
  while (pos < len) {
    const uint64_t cur = offset + pos;
    if (depth >= length() || cur >= layers_[depth]->size()) return true;
    ASSIGN_OR_RETURN(Extent e, layers_[depth]->MapStatus(cur, len - pos));
    if (e.kind == Extent::kUnallocated) {
      ASSIGN_OR_RETURN(bool zero, ReadsAsZero(depth + 1, cur, e.length));
      if (!zero) return false;
    } else if (e.kind != Extent::kZero) {
      return false;
    }
    pos += e.length;
  }
  return true;
}

absl::StatusOr<BlockStatus> Chain::BlockStatusAt(uint64_t offset,
                                                 uint64_t max_len) {
  if (closed_) return ClosedError();
  if (offset >= size()) {
    return absl::OutOfRangeError(absl::StrCat(
        "offset ", offset, " is past the end of the image (", size(), ")"));
  }
  BlockStatus bs;
  bs.offset = offset;
  uint64_t len = std::min(max_len, size() - offset);
  for (int d = 0;; ++d) {
    Layer* layer = layers_[d].get();
    bs.depth = d;
    ASSIGN_OR_RETURN(Extent e, layer->MapStatus(offset, len));
    len = e.length;
    // Encrypted clusters have no offset where their bytes could be read
    // as they are (QEMU's map leaves it out too).
    const bool offsets =
        layer->AsQcow2() == nullptr || layer->AsQcow2()->luks() == nullptr;
    switch (e.kind) {
      case Extent::kUnallocated: {
        // Go down while the layer below covers the range; past its end (or
        // at the bottom) the range reads as zeros, allocated nowhere, and
        // is reported at this depth, as qemu-img does.
        const bool below = d + 1 < length() && offset < layers_[d + 1]->size();
        if (below) {
          len = std::min(len, layers_[d + 1]->size() - offset);
          continue;
        }
        bs.length = len;
        bs.zero = true;
        if (e.has_host_cluster && offsets) bs.host_offset = e.host_offset;
        return bs;
      }
      case Extent::kZero:
        bs.length = len;
        bs.present = true;
        bs.zero = true;
        if (e.has_host_cluster && offsets) bs.host_offset = e.host_offset;
        return bs;
      case Extent::kData:
        bs.length = len;
        bs.present = true;
        bs.data = true;
        if (offsets) bs.host_offset = e.host_offset;
        return bs;
      case Extent::kCompressed:
        bs.length = len;
        bs.present = true;
        bs.data = true;
        bs.compressed = true;
        return bs;
    }
  }
}

std::vector<LayerInfo> Chain::GetChainInfo() const {
  std::vector<LayerInfo> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    LayerInfo info = layers_[i]->Info();
    info.full_backing_filename = resolved_backing_[i];
    if (info.full_backing_filename.empty() && !info.backing_file.empty()) {
      auto r = ResolveBackingName(info.filename, info.backing_file);
      if (r.ok()) info.full_backing_filename = *r;
    }
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace qcow2::internal
