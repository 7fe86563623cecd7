// SPDX-License-Identifier: Apache-2.0
// The interop read matrix: images and backing chains built by QEMU's own
// tools (qemu-img create/convert, qemu-io writes at unaligned offsets) across
// cluster sizes, refcount widths, versions, extended L2, compression types,
// zero and compressed clusters, raw and shorter backing files. For every
// image our reader must return the bytes `qemu-img convert -O raw` returns,
// report the block status `qemu-img map --output=json` reports, and the
// per-layer facts `qemu-img info --backing-chain` reports.
//
// The matrix is a covering set, not the cross product: every value of every
// dimension appears in several cells, each time next to different values of
// the others. Test names carry every layer's parameters, top first, e.g.
// Matrix/InteropReadTest.BlockStatusMatchesQemuMap/
//   d1_c64k_rb16_v3_zstd_xl2_on_rawdense_short
// reads "depth-1 chain: a v3 qcow2 with 64 KiB clusters, 16-bit refcounts,
// zstd and extended L2 over a dense raw file shorter than it".

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "qcow2/options.h"
#include "tests/util/json_lite.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2::testing {
namespace {

constexpr uint64_t K = 1024;
constexpr uint64_t M = 1024 * 1024;

// ---------------------------------------------------------------------------
// The matrix.

enum class RawKind {
  kNone,    // a qcow2 layer
  kDense,   // raw file written in full (no holes), by the test itself
  kSparse,  // `qemu-img create -f raw` + qemu-io writes, zero writes, discards
  kOdd,     // dense raw file whose length is not a multiple of 512
};

struct Layer {
  QemuImageSpec spec;  // spec.size: virtual size (raw: file size)
  RawKind raw = RawKind::kNone;
  bool converted = false;  // built with `qemu-img convert -c` from raw data
  // Keep the holes qemu leaves in the qcow2 host file (see below).
  bool holes = false;
};

struct Cell {
  std::vector<Layer> layers;  // bottom first
  uint64_t seed = 0;

  int depth() const { return static_cast<int>(layers.size()) - 1; }

  // "d<depth>_<top>_on_<next>_on_..._<bottom>", each layer as its spec
  // token, "_short" when smaller than the layer above, "_conv" when made by
  // `qemu-img convert -c`.
  std::string Name() const {
    std::vector<std::string> parts;
    for (int i = depth(); i >= 0; --i) {
      const Layer& l = layers[i];
      std::string t;
      switch (l.raw) {
        case RawKind::kNone: t = l.spec.Token(); break;
        case RawKind::kDense: t = "rawdense"; break;
        case RawKind::kSparse: t = "rawsparse"; break;
        case RawKind::kOdd: t = "rawodd"; break;
      }
      if (l.converted) t += "_conv";
      if (l.holes) t += "_holes";
      if (i < depth() && l.spec.size < layers[i + 1].spec.size) t += "_short";
      if (i < depth() && l.spec.size > layers[i + 1].spec.size) t += "_long";
      parts.push_back(t);
    }
    return absl::StrCat("d", depth(), "_", absl::StrJoin(parts, "_on_"));
  }
};

void PrintTo(const Cell& c, std::ostream* os) { *os << c.Name(); }

Layer Qcow(const char* compat, uint64_t cluster, uint32_t rb,
           const char* compression, bool xl2, uint64_t size) {
  Layer l;
  l.spec.format = "qcow2";
  l.spec.compat = compat;
  l.spec.cluster_size = static_cast<uint32_t>(cluster);
  l.spec.refcount_bits = rb;
  l.spec.compression_type = compression;
  l.spec.extended_l2 = xl2;
  l.spec.size = size;
  return l;
}
Layer V2(uint64_t cluster, uint64_t size) {
  return Qcow("0.10", cluster, 16, "zlib", false, size);
}
Layer V3(uint64_t cluster, uint32_t rb, const char* compression, bool xl2,
         uint64_t size) {
  return Qcow("1.1", cluster, rb, compression, xl2, size);
}
Layer Converted(Layer l) {
  l.converted = true;
  return l;
}
Layer Holes(Layer l) {
  l.holes = true;
  return l;
}
Layer Lazy(Layer l) {
  l.spec.lazy_refcounts = true;
  return l;
}
Layer Raw(RawKind kind, uint64_t size) {
  Layer l;
  l.spec.format = "raw";
  l.raw = kind;
  l.spec.size = size;
  return l;
}

constexpr bool kXl2 = true;
constexpr bool kStd = false;

std::vector<Cell> MakeCells() {
  std::vector<std::vector<Layer>> chains = {
      // Depth 0, v3: every cluster size x every refcount width, with zlib
      // and zstd and extended L2 (where allowed) spread over them. Sizes are
      // not multiples of the cluster size where that leaves a partial last
      // cluster.
      {V3(512, 1, "zlib", kStd, 3 * M + 1536)},
      {V3(512, 16, "zstd", kStd, 2 * M + 512)},
      {V3(512, 64, "zlib", kStd, 2 * M)},
      {V3(4 * K, 1, "zstd", kStd, 4 * M - 512)},
      {V3(4 * K, 16, "zlib", kStd, 3 * M + 4608)},
      {V3(4 * K, 64, "zstd", kStd, 5 * M)},
      {V3(64 * K, 1, "zlib", kXl2, 4 * M + 1024)},
      {V3(64 * K, 16, "zstd", kXl2, 3 * M)},
      {V3(64 * K, 64, "zstd", kStd, 6 * M - 3584)},
      {Lazy(V3(64 * K, 16, "zlib", kStd, 4 * M))},
      {V3(2 * M, 1, "zstd", kXl2, 12 * M + 512)},
      {V3(2 * M, 16, "zlib", kStd, 9 * M)},
      {V3(2 * M, 64, "zlib", kXl2, 16 * M - 2560)},
      {V3(2 * M, 64, "zstd", kStd, 8 * M)},
      // Keeping the holes qemu leaves in the host file (see fill_holes).
      {Holes(V3(2 * M, 64, "zstd", kStd, 8 * M))},
      {Holes(V3(64 * K, 16, "zlib", kStd, 4 * M))},
      // Depth 0, v2 (no zero flag: qemu deallocates or writes zeros).
      {V2(512, 2 * M + 1024)},
      {V2(4 * K, 3 * M)},
      {V2(64 * K, 4 * M + 2560)},
      {V2(2 * M, 10 * M)},
      // Depth 0, every cluster compressed by qemu-img convert -c, then
      // partly overwritten.
      {Converted(V3(64 * K, 16, "zstd", kStd, 3 * M))},
      {Converted(V2(4 * K, 2 * M))},
      {Converted(V3(2 * M, 64, "zlib", kXl2, 8 * M))},

      // Depth 1.
      {V3(64 * K, 16, "zlib", kStd, 4 * M), V3(64 * K, 16, "zlib", kStd, 4 * M)},
      {Raw(RawKind::kDense, 3 * M), V3(64 * K, 16, "zstd", kXl2, 4 * M)},
      {Raw(RawKind::kSparse, 4 * M), V2(4 * K, 4 * M)},
      {V3(4 * K, 16, "zlib", kStd, 5 * M), V3(512, 64, "zstd", kStd, 3 * M)},
      {V2(64 * K, 3 * M + 512), V3(2 * M, 1, "zlib", kXl2, 8 * M)},
      {Converted(V3(4 * K, 1, "zstd", kStd, 2 * M)),
       V3(64 * K, 64, "zlib", kXl2, 4 * M)},
      {Holes(V3(64 * K, 16, "zlib", kStd, 3 * M)),
       Holes(V3(4 * K, 16, "zstd", kStd, 3 * M))},
      // Depth 2.
      {Raw(RawKind::kDense, 2 * M), V2(64 * K, 3 * M),
       V3(4 * K, 64, "zstd", kStd, 4 * M)},
      {V3(64 * K, 16, "zlib", kXl2, 3 * M), V3(512, 1, "zlib", kStd, 4 * M),
       V3(2 * M, 16, "zstd", kXl2, 8 * M)},
      {V3(2 * M, 16, "zlib", kStd, 6 * M), V3(2 * M, 64, "zlib", kXl2, 8 * M),
       V3(2 * M, 64, "zstd", kStd, 10 * M + 512)},
      // Depth 3.
      {Raw(RawKind::kOdd, 2 * M + 1000), V2(4 * K, 3 * M), V2(512, 3 * M),
       V2(64 * K, 4 * M)},
      {V3(64 * K, 16, "zlib", kXl2, 4 * M), V3(64 * K, 1, "zstd", kXl2, 4 * M),
       V3(64 * K, 64, "zlib", kXl2, 4 * M), V3(64 * K, 16, "zstd", kXl2, 4 * M)},
      // Depth 4.
      {Raw(RawKind::kDense, 2 * M), V3(64 * K, 64, "zstd", kXl2, 3 * M),
       V2(4 * K, 3 * M + 512), V3(2 * M, 1, "zlib", kStd, 8 * M),
       V3(512, 16, "zstd", kStd, 8 * M)},
      // Depth 5.
      {Converted(V3(4 * K, 16, "zstd", kStd, 2 * M)),
       V3(64 * K, 16, "zlib", kStd, 3 * M), V3(4 * K, 1, "zstd", kStd, 2 * M),
       V3(64 * K, 64, "zlib", kXl2, 4 * M), V2(64 * K, 4 * M),
       V3(4 * K, 16, "zlib", kStd, 5 * M)},
      {Raw(RawKind::kSparse, 1 * M), V3(512, 16, "zlib", kStd, 2 * M),
       V3(2 * M, 16, "zstd", kXl2, 6 * M), V2(4 * K, 6 * M),
       V3(64 * K, 1, "zstd", kXl2, 8 * M), V3(4 * K, 64, "zlib", kStd, 8 * M)},
  };
  std::vector<Cell> cells;
  for (auto& layers : chains) {
    Cell c;
    c.layers = std::move(layers);
    // Seeded by the name (FNV-1a), so a cell keeps its images when others
    // are added or moved.
    uint64_t h = 0xcbf29ce484222325ull;
    for (char ch : c.Name()) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
    c.seed = h % 1000003;
    cells.push_back(std::move(c));
  }
  return cells;
}

// ---------------------------------------------------------------------------
// Building the images (once per cell, shared by the tests of that cell).

struct Built {
  absl::Status status;
  std::unique_ptr<TempDir> dir;
  std::vector<std::string> paths;  // bottom first
  std::string top;
  CommandLog log;

  std::string Commands() const {
    return absl::StrCat("image built with:\n  ", absl::StrJoin(log, "\n  "));
  }
};

// Per layer: which ops, how many. Pattern files differ per layer so that a
// read from the wrong layer or the wrong offset shows.
std::vector<QemuOp> OpsFor(const Cell& cell, size_t i, const std::string& dir,
                           absl::Status* status) {
  const Layer& l = cell.layers[i];
  std::string pat = absl::StrCat(dir, "/pattern", i, ".bin");
  uint64_t seed = cell.seed * 100 + i;
  // Odd length so that repeats never line up with clusters.
  *status = WritePatternFile(pat, seed, M + 4099);
  RandomOpsConfig rc;
  rc.seed = seed;
  rc.size = l.spec.size;
  rc.cluster_size = l.spec.cluster_size;
  rc.pattern_file = pat;
  const bool top = static_cast<int>(i) == cell.depth();
  rc.writes = top ? 12 : 8;
  rc.zero_writes = top ? 3 : 2;
  rc.zero_unmap_every = 2;
  rc.discards = top ? 2 : 1;
  rc.compressed_writes = l.spec.cluster_size >= 2 * M ? 1 : (top ? 3 : 2);
  switch (l.raw) {
    case RawKind::kNone:
      if (l.converted) rc.compressed_writes = 0;  // every cluster allocated
      break;
    case RawKind::kDense:
    case RawKind::kOdd:
      // Plain writes only: zero writes and discards would punch holes, and
      // qemu sees an odd-sized file rounded up to 512 bytes.
      rc.size = l.spec.size / 512 * 512;
      rc.zero_writes = 0;
      rc.discards = 0;
      rc.compressed_writes = 0;
      rc.cluster_size = 512;
      break;
    case RawKind::kSparse:
      // `write -z -u` punches holes; plain `write -z` would leave unwritten
      // extents, which SEEK_DATA reports as holes or data depending on the
      // page cache.
      rc.zero_unmap_every = 1;
      rc.compressed_writes = 0;
      rc.cluster_size = 512;
      break;
  }
  return RandomQemuOps(rc);
}

Built Build(const Cell& cell) {
  Built b;
  b.dir = std::make_unique<TempDir>();
  std::vector<QemuLayerSpec> specs;
  for (size_t i = 0; i < cell.layers.size(); ++i) {
    const Layer& l = cell.layers[i];
    QemuLayerSpec s;
    s.image = l.spec;
    if (l.raw == RawKind::kDense || l.raw == RawKind::kOdd) {
      s.raw_fill_seed = cell.seed * 100 + 50 + i;
      s.raw_file_size = l.spec.size;
    }
    if (l.converted) s.convert_from_seed = cell.seed * 100 + 60 + i;
    // qemu leaves holes in qcow2 files (zero writes, the untouched parts of
    // new clusters). When the file has clearly fewer physically allocated
    // clusters than refcounted ones, qemu-img map guesses "metadata
    // preallocation" and reports data clusters over host holes as
    // "zero": true, "data": true; what it finds there depends on the host
    // filesystem and even on the page cache. The matrix fills the holes so
    // that qemu-img map reports what the qcow2 metadata says, on any
    // filesystem; the "_holes" cells keep them and compare at the qcow2
    // level (see WithoutHostHoleZeroes).
    s.fill_holes = l.raw == RawKind::kNone && !l.holes;
    absl::Status st;
    s.ops = OpsFor(cell, i, b.dir->path(), &st);
    if (!st.ok()) {
      b.status = st;
      return b;
    }
    specs.push_back(std::move(s));
  }
  auto paths = QemuBuildChain(b.dir->path(), specs, &b.log);
  if (!paths.ok()) {
    b.status = paths.status();
    return b;
  }
  b.paths = *paths;
  b.top = b.paths.back();
  // The oracle must have produced consistent images.
  for (size_t i = 0; i < cell.layers.size(); ++i) {
    if (cell.layers[i].raw != RawKind::kNone) continue;
    CommandResult r = QemuCheck(b.paths[i]);
    if (r.exit_code != 0) {
      b.status = absl::InternalError(absl::StrCat(
          "qemu-img check ", b.paths[i], " exited with ", r.exit_code, ": ",
          r.out, r.err));
      return b;
    }
  }
  return b;
}

class InteropReadTest : public ::testing::TestWithParam<Cell> {
 protected:
  static void TearDownTestSuite() { Cache().clear(); }

  // Builds the cell's chain on first use; null (with the test failed or
  // skipped) when it cannot be built.
  const Built* GetBuilt() {
    if (!HaveQemu()) return nullptr;
    auto& cache = Cache();
    std::string name = GetParam().Name();
    auto it = cache.find(name);
    if (it == cache.end()) {
      it = cache.emplace(name, std::make_unique<Built>(Build(GetParam())))
               .first;
    }
    const Built& b = *it->second;
    if (!b.status.ok()) {
      ADD_FAILURE() << "cannot build " << name << ": " << b.status << "\n"
                    << b.Commands();
      return nullptr;
    }
    return &b;
  }

 private:
  static std::map<std::string, std::unique_ptr<Built>>& Cache() {
    static auto* cache = new std::map<std::string, std::unique_ptr<Built>>;
    return *cache;
  }
};

// ---------------------------------------------------------------------------
// Block status as `qemu-img map --output=json` prints it.

struct MapEntry {
  uint64_t start = 0;
  uint64_t length = 0;
  int64_t depth = 0;
  bool present = false;
  bool zero = false;
  bool data = false;
  bool has_offset = false;
  uint64_t offset = 0;

  bool operator==(const MapEntry& o) const {
    return start == o.start && length == o.length && depth == o.depth &&
           present == o.present && zero == o.zero && data == o.data &&
           has_offset == o.has_offset && (!has_offset || offset == o.offset);
  }

  // Exactly qemu-img 7.2's line for the entry.
  std::string ToJson() const {
    std::string s = absl::StrFormat(
        "{ \"start\": %d, \"length\": %d, \"depth\": %d, \"present\": %s, "
        "\"zero\": %s, \"data\": %s",
        start, length, depth, present ? "true" : "false",
        zero ? "true" : "false", data ? "true" : "false");
    if (has_offset) absl::StrAppend(&s, ", \"offset\": ", offset);
    return s + "}";
  }
};

// qemu-img's mapentry_mergeable + the merge in its map loop.
void AppendMerged(std::vector<MapEntry>* out, const MapEntry& next) {
  if (!out->empty()) {
    MapEntry& cur = out->back();
    bool mergeable = cur.length > 0 && cur.zero == next.zero &&
                     cur.data == next.data && cur.depth == next.depth &&
                     cur.present == next.present &&
                     cur.has_offset == next.has_offset &&
                     cur.start + cur.length == next.start &&
                     (!cur.has_offset || cur.offset + cur.length == next.offset);
    if (mergeable) {
      cur.length += next.length;
      return;
    }
  }
  out->push_back(next);
}

absl::StatusOr<std::vector<MapEntry>> OurMap(Image& image) {
  std::vector<MapEntry> out;
  const uint64_t size = image.size();
  uint64_t pos = 0;
  while (pos < size) {
    absl::StatusOr<BlockStatus> bs = image.GetBlockStatus(pos, size - pos);
    if (!bs.ok()) return bs.status();
    if (bs->offset != pos || bs->length == 0 || bs->length > size - pos) {
      return absl::InternalError(absl::StrCat(
          "GetBlockStatus(", pos, ", ", size - pos, ") returned offset ",
          bs->offset, " length ", bs->length));
    }
    MapEntry e;
    e.start = bs->offset;
    e.length = bs->length;
    e.depth = bs->depth;
    e.present = bs->present;
    e.zero = bs->zero;
    e.data = bs->data;
    e.has_offset = bs->host_offset.has_value();
    e.offset = bs->host_offset.value_or(0);
    AppendMerged(&out, e);
    pos += bs->length;
  }
  return out;
}

absl::StatusOr<std::vector<MapEntry>> ParseQemuMap(const json::Value& v) {
  if (!v.is_array()) return absl::InternalError("qemu-img map: not an array");
  std::vector<MapEntry> out;
  for (const json::Value& j : v.array()) {
    for (const char* key : {"start", "length", "depth"}) {
      if (!j[key].is_integer()) {
        return absl::InternalError(
            absl::StrCat("qemu-img map entry without '", key, "': ",
                         j.ToString()));
      }
    }
    MapEntry e;
    e.start = j["start"].as_uint64();
    e.length = j["length"].as_uint64();
    e.depth = j["depth"].as_int64();
    e.present = j["present"].as_bool();
    e.zero = j["zero"].as_bool();
    e.data = j["data"].as_bool();
    if (const json::Value* off = j.Find("offset")) {
      e.has_offset = true;
      e.offset = off->as_uint64();
    }
    // qemu-img prints entries already merged; merging again is a no-op
    // that keeps both sides comparable even if it did not.
    AppendMerged(&out, e);
  }
  return out;
}

// "zero": true together with "data": true comes only from qemu looking
// through a qcow2 data cluster at the host file (after its metadata
// preallocation heuristic fired: fewer physically allocated clusters than
// refcounted ones) and finding a hole or unwritten extent there. Whether
// SEEK_DATA reports an unwritten ext4 extent as data depends on what the
// page cache holds at that moment (reading the image, e.g. with qemu-img
// convert, flips the answer), so that part of qemu's answer is not
// reproducible. For the "_holes" cells the expected map is taken at the
// qcow2 level: such entries count as plain data and are merged again.
std::vector<MapEntry> WithoutHostHoleZeroes(const std::vector<MapEntry>& in) {
  std::vector<MapEntry> out;
  for (MapEntry e : in) {
    if (e.zero && e.data) e.zero = false;
    AppendMerged(&out, e);
  }
  return out;
}

// Side-by-side excerpt around the first difference.
std::string DescribeMapDifference(const std::vector<MapEntry>& want,
                                  const std::vector<MapEntry>& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  std::string s = absl::StrCat("first difference at entry ", i, "\n");
  size_t from = i >= 2 ? i - 2 : 0;
  absl::StrAppend(&s, "  qemu-img map (expected):\n");
  for (size_t k = from; k < std::min(want.size(), i + 3); ++k) {
    absl::StrAppend(&s, k == i ? "  > " : "    ", want[k].ToJson(), "\n");
  }
  if (i >= want.size()) absl::StrAppend(&s, "  > (end)\n");
  absl::StrAppend(&s, "  libqcow2 GetBlockStatus (actual):\n");
  for (size_t k = from; k < std::min(got.size(), i + 3); ++k) {
    absl::StrAppend(&s, k == i ? "  > " : "    ", got[k].ToJson(), "\n");
  }
  if (i >= got.size()) absl::StrAppend(&s, "  > (end)\n");
  return s;
}

// Every difference, one line each (capped), to see the pattern at a glance.
std::string ListMapDifferences(const std::vector<MapEntry>& want,
                               const std::vector<MapEntry>& got) {
  std::string s;
  size_t n = std::max(want.size(), got.size()), shown = 0;
  for (size_t k = 0; k < n && shown < 12; ++k) {
    bool a = k < want.size(), b = k < got.size();
    if (a && b && want[k] == got[k]) continue;
    ++shown;
    absl::StrAppend(&s, "  [", k, "] want ",
                    a ? want[k].ToJson() : std::string("(none)"), "\n", "       got  ",
                    b ? got[k].ToJson() : std::string("(none)"), "\n");
  }
  return s;
}

std::string EntryAt(const std::vector<MapEntry>& map, uint64_t off) {
  for (const MapEntry& e : map) {
    if (off >= e.start && off - e.start < e.length) return e.ToJson();
  }
  return "(none)";
}

// ---------------------------------------------------------------------------
// Tests.

TEST_P(InteropReadTest, ReadsMatchQemuConvert) {
  SKIP_WITHOUT_QEMU();
  const Built* b = GetBuilt();
  if (b == nullptr) return;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> want, QemuReadAll(b->top));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image,
                       Image::Open(b->top, OpenOptions{}));
  EXPECT_FALSE(image->writable());
  ASSERT_EQ(image->chain_length(), GetParam().depth() + 1) << b->Commands();
  ASSERT_EQ(image->size(), want.size())
      << "virtual size differs from qemu-img convert's output\n"
      << b->Commands();
  const uint64_t size = want.size();

  // Chunkings: (name, chunk sizes in order; 0 = random).
  struct Chunking {
    const char* name;
    uint64_t chunk;  // 0: seeded random sizes
    bool backwards;
  };
  const Chunking chunkings[] = {
      {"whole image", size, false},
      {"12345-byte chunks", 12345, false},
      {"65537-byte chunks, last to first", 65537, true},
      {"random 1..300000-byte chunks", 0, false},
  };
  std::vector<uint8_t> got(size);
  for (const Chunking& c : chunkings) {
    // A fresh image each time, so caches start cold for every order.
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> img,
                         Image::Open(b->top, OpenOptions{}));
    std::fill(got.begin(), got.end(), 0xEE);
    std::vector<std::pair<uint64_t, uint64_t>> pieces;
    TestRng rng(GetParam().seed * 7919 + 3);
    for (uint64_t pos = 0; pos < size;) {
      uint64_t n = c.chunk ? c.chunk : rng.Range(1, 300000);
      n = std::min(n, size - pos);
      pieces.emplace_back(pos, n);
      pos += n;
    }
    if (c.backwards) std::reverse(pieces.begin(), pieces.end());
    bool failed = false;
    for (auto [pos, n] : pieces) {
      absl::Status s = img->Read(pos, absl::MakeSpan(got.data() + pos, n));
      if (!s.ok()) {
        ADD_FAILURE() << c.name << ": Read(" << pos << ", " << n
                      << ") failed: " << s << "\n"
                      << b->Commands();
        failed = true;
        break;
      }
    }
    if (failed) continue;
    if (got == want) continue;
    uint64_t first = 0;
    while (first < size && got[first] == want[first]) ++first;
    uint64_t last = first;
    uint64_t count = 0;
    for (uint64_t k = first; k < size; ++k) {
      if (got[k] != want[k]) {
        last = k;
        ++count;
      }
    }
    std::string qemu_map_entry = "(qemu-img map failed)";
    auto qmap = QemuMapJson(b->top);
    if (qmap.ok()) {
      auto parsed = ParseQemuMap(*qmap);
      if (parsed.ok()) qemu_map_entry = EntryAt(*parsed, first);
    }
    ADD_FAILURE() << "DISAGREEMENT with qemu-img convert (" << c.name
                  << "): " << count << " bytes differ in [" << first << ", "
                  << last + 1 << "); first at guest offset " << first
                  << ": qemu 0x" << absl::StrFormat("%02x", want[first])
                  << ", libqcow2 0x" << absl::StrFormat("%02x", got[first])
                  << "\n  qemu-img map entry there: " << qemu_map_entry << "\n"
                  << b->Commands();
  }
}

TEST_P(InteropReadTest, BlockStatusMatchesQemuMap) {
  SKIP_WITHOUT_QEMU();
  const Built* b = GetBuilt();
  if (b == nullptr) return;
  ASSERT_OK_AND_ASSIGN(json::Value qjson, QemuMapJson(b->top));
  ASSERT_OK_AND_ASSIGN(std::vector<MapEntry> want, ParseQemuMap(qjson));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image,
                       Image::Open(b->top, OpenOptions{}));
  ASSERT_OK_AND_ASSIGN(std::vector<MapEntry> got, OurMap(*image));
  const auto& layers = GetParam().layers;
  if (std::any_of(layers.begin(), layers.end(),
                  [](const Layer& l) { return l.holes; })) {
    want = WithoutHostHoleZeroes(want);
  }
  if (got != want) {
    ADD_FAILURE() << "DISAGREEMENT with qemu-img map --output=json "
                  << b->top << "\n"
                  << DescribeMapDifference(want, got)
                  << "all differing entries:\n"
                  << ListMapDifferences(want, got) << b->Commands();
  }
}

TEST_P(InteropReadTest, ChainInfoMatchesQemuInfo) {
  SKIP_WITHOUT_QEMU();
  const Built* b = GetBuilt();
  if (b == nullptr) return;
  ASSERT_OK_AND_ASSIGN(json::Value info, QemuInfoChainJson(b->top));
  ASSERT_TRUE(info.is_array());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image,
                       Image::Open(b->top, OpenOptions{}));
  std::vector<LayerInfo> ours = image->GetChainInfo();
  ASSERT_EQ(ours.size(), info.size()) << b->Commands();
  for (size_t i = 0; i < ours.size(); ++i) {
    const json::Value& q = info[i];
    const LayerInfo& l = ours[i];
    SCOPED_TRACE(absl::StrCat("layer ", i, " (top = 0): ", l.filename, "\n",
                              q.ToString()));
    const bool qcow2 = q["format"].as_string() == "qcow2";
    EXPECT_EQ(l.format == ImageFormat::kQcow2 ? "qcow2" : "raw",
              q["format"].as_string());
    EXPECT_EQ(l.virtual_size, q["virtual-size"].as_uint64())
        << "DISAGREEMENT with qemu-img info: virtual size\n" << b->Commands();
    EXPECT_EQ(l.filename, q["filename"].as_string());
    EXPECT_EQ(l.backing_file, q["backing-filename"].as_string());
    if (!l.backing_file.empty()) {
      EXPECT_EQ(l.full_backing_filename, q["full-backing-filename"].as_string());
    }
    EXPECT_EQ(l.backing_format, q["backing-filename-format"].as_string());
    if (!qcow2) continue;
    const json::Value& d = q["format-specific"]["data"];
    EXPECT_EQ(l.cluster_size, q["cluster-size"].as_uint64());
    EXPECT_EQ(l.version, d["compat"].as_string() == "0.10" ? 2u : 3u);
    EXPECT_EQ(l.refcount_bits, d["refcount-bits"].as_uint64());
    EXPECT_EQ(l.dirty, q["dirty-flag"].as_bool());
    if (l.version == 3) {
      EXPECT_EQ(l.extended_l2, d["extended-l2"].as_bool());
      EXPECT_EQ(l.compression_type == CompressionType::kZstd ? "zstd" : "zlib",
                d["compression-type"].as_string());
      EXPECT_EQ(l.lazy_refcounts, d["lazy-refcounts"].as_bool());
      EXPECT_EQ(l.corrupt, d["corrupt"].as_bool());
    }
  }
}

// Whether `qcowtool map --output=json` works at all (tried once on a small
// image), so that the tests below do not build their chains for nothing.
bool QcowtoolHasJsonMap() {
  static const bool ok = [] {
    TempDir dir;
    QemuImageSpec spec;
    spec.size = 1 * M;
    std::string img = dir.File("probe.qcow2");
    if (!QemuCreate(img, spec).ok()) return false;
    CommandResult r =
        ::qcow2::testing::Run({QcowtoolPath(), "map", "--output=json", img});
    return r.exit_code == 0 && absl::StartsWith(r.out, "[");
  }();
  return ok;
}

// `qcowtool map --output=json` must print qemu-img's text byte for byte.
// The comparison runs only when the tool exits 0 and prints a JSON array:
// qcowtool is built from the same tree and its map command may not exist in
// a given checkout, in which case this test reports itself skipped rather
// than failing on a missing feature; the library's own block status is
// compared by BlockStatusMatchesQemuMap regardless.
TEST_P(InteropReadTest, QcowtoolMapMatchesQemuMap) {
  SKIP_WITHOUT_QEMU();
  if (!QcowtoolHasJsonMap()) {
    GTEST_SKIP() << "qcowtool map --output=json not available in this build";
  }
  const Built* b = GetBuilt();
  if (b == nullptr) return;
  CommandResult tool =
      ::qcow2::testing::Run({QcowtoolPath(), "map", "--output=json", b->top});
  if (tool.exit_code != 0 || !absl::StartsWith(tool.out, "[")) {
    GTEST_SKIP() << "qcowtool map --output=json not available (exit "
                 << tool.exit_code << ")";
  }
  ASSERT_OK_AND_ASSIGN(std::string want, QemuMapJsonText(b->top));
  if (tool.out != want) {
    size_t i = 0;
    while (i < want.size() && i < tool.out.size() && want[i] == tool.out[i]) {
      ++i;
    }
    size_t line_start = want.rfind('\n', i == 0 ? 0 : i - 1);
    line_start = line_start == std::string::npos ? 0 : line_start + 1;
    ADD_FAILURE() << "DISAGREEMENT: qcowtool map --output=json differs from "
                     "qemu-img map at byte "
                  << i << "\n  qemu-img: "
                  << want.substr(line_start, want.find('\n', i) - line_start)
                  << "\n  qcowtool: "
                  << tool.out.substr(line_start,
                                     tool.out.find('\n', i) - line_start)
                  << "\n"
                  << b->Commands();
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, InteropReadTest,
                         ::testing::ValuesIn(MakeCells()),
                         [](const ::testing::TestParamInfo<Cell>& info) {
                           return info.param.Name();
                         });

// The helpers the matrix relies on.

TEST(JsonLiteTest, ParsesQemuMapOutput) {
  const char* text =
      "[{ \"start\": 0, \"length\": 65536, \"depth\": 0, \"present\": true, "
      "\"zero\": false, \"data\": true, \"offset\": 327680},\n"
      "{ \"start\": 65536, \"length\": 18446744073709551615, \"depth\": 1, "
      "\"present\": false, \"zero\": true, \"data\": false}]\n";
  ASSERT_OK_AND_ASSIGN(json::Value v, json::Parse(text));
  ASSERT_TRUE(v.is_array());
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0]["offset"].as_uint64(), 327680u);
  EXPECT_TRUE(v[0]["present"].as_bool());
  EXPECT_EQ(v[1].Find("offset"), nullptr);
  EXPECT_EQ(v[1]["length"].type(), json::Value::Type::kUint);
  EXPECT_EQ(v[1]["length"].as_uint64(), UINT64_MAX);
  EXPECT_EQ(v[1]["depth"].as_int64(), 1);
}

TEST(JsonLiteTest, ScalarsStringsAndErrors) {
  ASSERT_OK_AND_ASSIGN(
      json::Value v,
      json::Parse(" {\"a\": [1, -2, 3.5, -9223372036854775808, 1e3, null, "
                  "true], \"s\": \"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9"
                  "\\ud83d\\ude00\", \"o\": {}} "));
  EXPECT_EQ(v["a"][1].as_int64(), -2);
  EXPECT_EQ(v["a"][2].as_double(), 3.5);
  EXPECT_EQ(v["a"][3].as_int64(), INT64_MIN);
  EXPECT_EQ(v["a"][4].type(), json::Value::Type::kDouble);
  EXPECT_TRUE(v["a"][5].is_null());
  EXPECT_TRUE(v["a"][6].as_bool());
  EXPECT_EQ(v["s"].as_string(), "q\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(v["o"].is_object());
  EXPECT_TRUE(v["missing"].is_null());
  ASSERT_OK_AND_ASSIGN(json::Value round, json::Parse(v.ToString()));
  EXPECT_EQ(round, v);
  for (const char* bad : {"", "[1,]", "{\"a\" 1}", "[1] x", "\"\\ud800\"",
                          "01", "[", "{\"a\":}", "tru", "\"a\nb\"", "-",
                          "1.", "1e"}) {
    EXPECT_FALSE(json::Parse(bad).ok()) << bad;
  }
  std::string deep(1000, '[');
  EXPECT_FALSE(json::Parse(deep).ok());
}

TEST(QemuImagesTest, RandomOpsAreDeterministicUnalignedAndInBounds) {
  RandomOpsConfig rc;
  rc.seed = 42;
  rc.size = 3 * M + 1536;
  rc.cluster_size = 64 * K;
  rc.compressed_writes = 3;
  rc.pattern_file = "/nonexistent/pattern";
  std::vector<QemuOp> a = RandomQemuOps(rc), b = RandomQemuOps(rc);
  EXPECT_EQ(ToQemuIoCommands(a), ToQemuIoCommands(b));
  int unaligned = 0;
  for (const QemuOp& op : a) {
    EXPECT_GT(op.length, 0u);
    EXPECT_LE(op.offset + op.length, rc.size) << op.ToCommand();
    if (op.kind == QemuOp::Kind::kCompressed) {
      EXPECT_EQ(op.offset % rc.cluster_size, 0u) << op.ToCommand();
      EXPECT_EQ(op.length % rc.cluster_size, 0u) << op.ToCommand();
    } else if (op.offset % 512 != 0 || op.length % 512 != 0) {
      ++unaligned;
    }
  }
  EXPECT_GE(unaligned, rc.writes);
  rc.seed = 43;
  EXPECT_NE(ToQemuIoCommands(RandomQemuOps(rc)), ToQemuIoCommands(a));
}

TEST(QemuImagesTest, ModelMatchesQemuForWritesAndZeroes) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  std::string pat = dir.File("pat.bin");
  ASSERT_OK(WritePatternFile(pat, 9, 70001));
  QemuImageSpec spec;
  spec.size = 1 * M;
  spec.cluster_size = 4096;
  RandomOpsConfig rc;
  rc.seed = 9;
  rc.size = spec.size;
  rc.cluster_size = spec.cluster_size;
  rc.discards = 0;
  rc.compressed_writes = 2;
  rc.writes = 10;
  rc.pattern_file = pat;
  std::vector<QemuOp> ops = RandomQemuOps(rc);
  std::vector<uint8_t> model(spec.size, 0);
  std::vector<uint8_t> pattern = CompressibleBytes(9, 70001);
  for (const QemuOp& op : ops) {
    ASSERT_TRUE(ApplyQemuOpToModel(op, &model, pattern)) << op.ToCommand();
  }
  CommandLog log;
  std::string img = dir.File("m.qcow2");
  ASSERT_OK(QemuCreate(img, spec, &log));
  ASSERT_OK(QemuIo(img, ToQemuIoCommands(ops), "qcow2", &log));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> qemu, QemuReadAll(img));
  EXPECT_TRUE(qemu == model) << absl::StrJoin(log, "\n");
}

}  // namespace
}  // namespace qcow2::testing
