// SPDX-License-Identifier: Apache-2.0
// fuzz_open_read: the input is the bytes of an image file (qcow2, or raw
// when the magic is missing).
//
// Each input is
//  1. opened read-only and read: every cluster of the first 16 MiB of the
//     virtual disk (at most 4096 reads; 4 MiB when opened read-write), the
//     whole GetBlockStatus map (at most 4096 calls, with a read of the start of
//     every allocated run), GetChainInfo, and a few unaligned reads. The first
//     MiB is read twice, cluster by cluster and in one call, and must read the
//     same;
//  2. checked with the refcount checker (CheckImage, no repair);
//  3. on a copy: opened read-write with tiny caches (which rebuilds the
//     refcounts of a dirty image; skipped when that would be slow, as in
//     4.), read, written, zeroed, discarded, grown, flushed and closed,
//     then checked again;
//  4. on another copy: checked with repair (RepairMode::kAll), unless a
//     refcount block lies so far past the end that the repair would count
//     up to it (slow by design; see RepairWouldBeSlow).
// Errors are expected everywhere (most inputs are malformed); what must not
// happen is a crash, a sanitizer report, a leak, a hang, or one of the
// invariants below breaking.
//
// The in-memory file system holds, next to the input ("/fuzz/top.qcow2"),
// fixed backing files the input can name: "base.qcow2" (4 KiB clusters,
// some data), "mid.qcow2" (64 KiB clusters, backed by base.qcow2),
// "ext.qcow2" (extended L2, backed by base.raw), "base.raw", and
// "loop.qcow2" (backed by top.qcow2, i.e. the input: a loop). Chains deeper
// than 3 backing files are refused (OpenOptions::max_chain_depth).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fuzz/fuzz_util.h"
#include "testing/memory_file.h"
#include "lib/check/check.h"
#include "qcow2/image.h"
#include "qcow2/options.h"

namespace qcow2::fuzz {
namespace {

using internal::CheckImage;
using internal::MemoryFile;
using internal::MemoryFileSystem;
using internal::MemoryStore;
using internal::RepairMode;

constexpr char kTop[] = "/fuzz/top.qcow2";
// Per open: the sequential read covers at most this much of the disk.
// (Unallocated ranges cost a zero fill per byte under the instrumentation,
// so this bounds the time per input.)
constexpr uint64_t kMaxReadBytes = 16ull << 20;
constexpr int kMaxReads = 4096;
constexpr int kMaxStatusCalls = 4096;
constexpr uint64_t kCompareBytes = 1ull << 20;
// The image under test never grows past this (see Env).
constexpr uint64_t kTopMaxBytes = 256ull << 20;

void MustOk(const absl::Status& s, const char* what) {
  if (!s.ok())
    Die("setting up the backing files: %s: %s", what, s.ToString().c_str());
}

// Writes a few patterned runs into the image at `path`.
void Populate(MemoryFileSystem* fs, const std::string& path, uint64_t seed) {
  OpenOptions o;
  o.read_write = true;
  o.opener = fs;
  auto img = Image::Open(path, o);
  MustOk(img.status(), path.c_str());
  const uint64_t size = (*img)->size();
  std::vector<uint8_t> buf(96 * 1024);
  for (uint64_t i = 0; i < 6; ++i) {
    FillPattern(seed + i, absl::MakeSpan(buf));
    const uint64_t off = (size / 7) * i + 512 * i;
    const uint64_t len = std::min<uint64_t>(buf.size() - 4096 * i, size - off);
    MustOk((*img)->Write(off, absl::MakeConstSpan(buf.data(), len)), "write");
  }
  MustOk((*img)->WriteZeroes(size / 3, 8192, false), "zero");
  MustOk((*img)->Discard(size / 7, 4096), "discard");
  MustOk((*img)->Close(), "close");
}

struct Env {
  MemoryFileSystem fs;
  std::shared_ptr<MemoryStore> top;

  Env() {
    top = fs.Store(kTop);
    // A small disk: the image under test is held densely in memory, and a
    // repair may legitimately place new metadata past a far-away (broken)
    // pointer. Past this it fails as on a full disk.
    top->max_size = kTopMaxBytes;
    auto raw = fs.Store("/fuzz/base.raw");
    raw->bytes.resize(1 << 20);
    FillPattern(1, absl::MakeSpan(raw->bytes));

    CreateOptions c;
    c.opener = &fs;
    c.size = 4 << 20;
    c.cluster_size = 4096;
    MustOk(CreateImage("/fuzz/base.qcow2", c), "base.qcow2");
    Populate(&fs, "/fuzz/base.qcow2", 100);

    c.size = 0;
    c.cluster_size = 65536;
    c.backing_file = "base.qcow2";
    c.backing_format = "qcow2";
    MustOk(CreateImage("/fuzz/mid.qcow2", c), "mid.qcow2");
    Populate(&fs, "/fuzz/mid.qcow2", 200);

    c.size = 2 << 20;
    c.cluster_size = 32768;
    c.extended_l2 = true;
    c.backing_file = "base.raw";
    c.backing_format = "raw";
    MustOk(CreateImage("/fuzz/ext.qcow2", c), "ext.qcow2");
    Populate(&fs, "/fuzz/ext.qcow2", 300);

    c.size = 1 << 20;
    c.cluster_size = 65536;
    c.extended_l2 = false;
    c.backing_file = "top.qcow2";
    c.backing_format = "";
    MustOk(CreateImage("/fuzz/loop.qcow2", c), "loop.qcow2");

    // Backing files are never written after this.
    for (const char* p :
         {"/fuzz/base.raw", "/fuzz/base.qcow2", "/fuzz/mid.qcow2",
          "/fuzz/ext.qcow2", "/fuzz/loop.qcow2"}) {
      fs.Store(p)->read_only = true;
    }
  }
};

Env& GetEnv() {
  static Env* env = new Env;
  return *env;
}

OpenOptions BaseOptions(MemoryFileSystem* fs) {
  OpenOptions o;
  o.opener = fs;
  o.max_chain_depth = 3;
  o.l2_cache_bytes = 256 * 1024;
  o.refcount_cache_bytes = 64 * 1024;
  return o;
}

// Reads the disk every way the API offers. With `compare`, reads that must
// agree are compared.
void ExerciseReads(Image* img, bool compare, uint64_t max_bytes) {
  const uint64_t size = img->size();
  std::vector<LayerInfo> chain = img->GetChainInfo();
  if (chain.empty()) Die("GetChainInfo returned no layers");
  if (static_cast<int>(chain.size()) != img->chain_length()) {
    Die("GetChainInfo has %zu layers, chain_length() is %d", chain.size(),
        img->chain_length());
  }
  uint64_t chunk = chain[0].cluster_size ? chain[0].cluster_size : 65536;
  chunk = std::clamp<uint64_t>(chunk, 512, 2 << 20);

  // Cluster by cluster; the first MiB is kept for the comparison below.
  const uint64_t keep = std::min(size, kCompareBytes);
  std::vector<uint8_t> first(keep);
  bool first_ok = true;
  std::vector<uint8_t> buf(chunk);
  uint64_t off = 0, bytes = 0;
  for (int reads = 0; off < size && reads < kMaxReads && bytes < max_bytes;
       ++reads) {
    const uint64_t len = std::min(chunk, size - off);
    absl::Status s = img->Read(off, absl::MakeSpan(buf.data(), len));
    if (off < keep) {
      const uint64_t n = std::min(len, keep - off);
      if (s.ok()) {
        std::copy(buf.begin(), buf.begin() + n, first.begin() + off);
      } else {
        first_ok = false;
      }
    }
    off += len;
    bytes += len;
  }

  if (compare && first_ok && keep > 0) {
    std::vector<uint8_t> whole(keep);
    if (img->Read(0, absl::MakeSpan(whole)).ok()) {
      int64_t d = FirstDifference(first, whole);
      if (d >= 0) {
        Die("the first %llu bytes read differently in one call than cluster "
            "by cluster: first difference at %lld (0x%02x vs 0x%02x)",
            (unsigned long long)keep, (long long)d, whole[d], first[d]);
      }
      // And in odd-sized pieces.
      std::vector<uint8_t> piece(3 * 1024 + 7);
      for (uint64_t o = 0; o < keep; o += piece.size()) {
        const uint64_t n = std::min<uint64_t>(piece.size(), keep - o);
        if (!img->Read(o, absl::MakeSpan(piece.data(), n)).ok()) break;
        d = FirstDifference(absl::MakeConstSpan(whole.data() + o, n),
                            absl::MakeConstSpan(piece.data(), n));
        if (d >= 0) {
          Die("bytes at %llu read differently in a %llu-byte read at %llu",
              (unsigned long long)(o + d), (unsigned long long)n,
              (unsigned long long)o);
        }
      }
    }
  }

  // The map, and the start of every allocated run.
  uint64_t pos = 0;
  int reads = 0;
  for (int calls = 0; pos < size && calls < kMaxStatusCalls; ++calls) {
    auto bs = img->GetBlockStatus(pos, size - pos);
    if (!bs.ok()) {
      pos += chunk - pos % chunk;  // skip the bad cluster
      continue;
    }
    if (bs->offset != pos || bs->length == 0 || bs->length > size - pos) {
      Die("GetBlockStatus(%llu, %llu) returned offset %llu length %llu",
          (unsigned long long)pos, (unsigned long long)(size - pos),
          (unsigned long long)bs->offset, (unsigned long long)bs->length);
    }
    if (bs->depth < 0 || bs->depth >= img->chain_length()) {
      Die("GetBlockStatus depth %d outside a chain of %d", bs->depth,
          img->chain_length());
    }
    if (bs->data && reads < kMaxReads) {
      const uint64_t len = std::min<uint64_t>(bs->length, 4096);
      img->Read(pos, absl::MakeSpan(buf.data(), std::min(len, chunk)))
          .IgnoreError();
      ++reads;
    }
    pos += bs->length;
  }

  // Small unaligned reads at the edges; past the end must fail.
  uint8_t tiny[3];
  if (size >= 3) {
    img->Read(1, absl::MakeSpan(tiny, 2)).IgnoreError();
    img->Read(size - 3, absl::MakeSpan(tiny, 3)).IgnoreError();
    if (img->Read(size - 1, absl::MakeSpan(tiny, 2)).ok()) {
      Die("a read past the end of a %llu-byte disk succeeded",
          (unsigned long long)size);
    }
  }
}

// Writes through the image; any outcome but a crash is acceptable.
void ExerciseWrites(Image* img) {
  const uint64_t size = img->size();
  std::vector<uint8_t> data(8192);
  FillPattern(7, absl::MakeSpan(data));
  if (size >= 4096)
    img->Write(0, absl::MakeSpan(data.data(), 4096)).IgnoreError();
  if (size >= 8192) {
    img->Write(size / 2 - 1000, absl::MakeSpan(data.data(), 3000))
        .IgnoreError();
    img->WriteZeroes(size / 3, 4096, true).IgnoreError();
    img->WriteZeroes(size / 5, 5000, false).IgnoreError();
    img->Discard(size - 8192, 8192).IgnoreError();
    img->Write(size - 100, absl::MakeSpan(data.data(), 100)).IgnoreError();
  }
  img->Flush().IgnoreError();
  if (size < (1ull << 40)) img->Resize(size + (1 << 20)).IgnoreError();
  if (img->size() > size && img->size() - size >= 4096) {
    img->Write(size, absl::MakeSpan(data.data(), 4096)).IgnoreError();
  }
  img->Close().IgnoreError();
}

// Whether a repair would track refcounts for a far-away cluster. A
// refcount block past the end of the file makes the repair count up to it,
// as QEMU does (it grows the file there): up to kMaxCheckClusters 16-bit
// counters, i.e. 512 MiB and seconds per input. That is by design and
// bounded, but it would take most of the fuzzing time, so such inputs get
// no repair pass. Bytes past the end of the input read as zero.
bool RepairWouldBeSlow(const uint8_t* data, size_t size) {
  auto be = [&](uint64_t at, int n) -> uint64_t {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = v << 8 | (at + i < size ? data[at + i] : 0);
    return v;
  };
  if (size < 72 || std::memcmp(data, "QFI\xfb", 4) != 0) return false;
  const uint64_t bits = be(20, 4);
  if (bits < 9 || bits > 21) return false;
  const uint64_t table = be(48, 8);
  const uint64_t entries = be(56, 4) << (bits - 3);
  constexpr uint64_t kFar = 1ull << 20;  // clusters: 2 MiB of counters
  for (uint64_t i = 0; i < entries && table + 8 * i < size; ++i) {
    const uint64_t block = be(table + 8 * i, 8) & ~511ull;
    if (block >= size && (block >> bits) > kFar) return true;
  }
  return false;
}

void Check(std::shared_ptr<MemoryStore> store, RepairMode mode) {
  MemoryFile f(kTop, std::move(store), mode == RepairMode::kNone);
  auto r = CheckImage(&f, mode);
  if (r.ok()) {
    // Touch the result so nothing is optimised away.
    volatile size_t n = r->messages.size() + r->failure.size();
    (void)n;
  }
}

}  // namespace
}  // namespace qcow2::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qcow2;
  using namespace qcow2::fuzz;
  Env& env = GetEnv();

  // 1. Read-only.
  SetBytes(*env.top, data, size);
  {
    OpenOptions o = BaseOptions(&env.fs);
    auto img = Image::Open(
        std::make_unique<MemoryFile>(kTop, env.top, /*read_only=*/true), o);
    if (img.ok()) ExerciseReads(img->get(), /*compare=*/true, kMaxReadBytes);
  }
  // 2. Check, no repair.
  Check(env.top, RepairMode::kNone);

  // 3. Read-write on a copy, with tiny caches. (Opening a dirty image
  // read-write repairs it: skipped when that repair would be slow.)
  const bool dirty = size > 79 && (data[79] & 1) != 0;
  const bool slow_repair = RepairWouldBeSlow(data, size);
  SetBytes(*env.top, data, size);
  if (!(dirty && slow_repair)) {
    OpenOptions o = BaseOptions(&env.fs);
    o.read_write = true;
    o.l2_cache_bytes = 2048;
    o.l2_slice_bytes = 512;
    o.refcount_cache_bytes = 1;
    auto img = Image::Open(
        std::make_unique<MemoryFile>(kTop, env.top, /*read_only=*/false), o);
    if (img.ok()) {
      ExerciseReads(img->get(), /*compare=*/false, kMaxReadBytes / 4);
      ExerciseWrites(img->get());
      Check(env.top, RepairMode::kNone);
    }
  }

  // 4. Repair on another copy.
  if (!slow_repair) {
    SetBytes(*env.top, data, size);
    Check(env.top, RepairMode::kAll);
  }
  return 0;
}
