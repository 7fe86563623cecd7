// SPDX-License-Identifier: Apache-2.0
// fuzz_ops: guest operation sequences decoded from the input, applied to a
// writable image on the in-memory file system and to a flat byte model.
//
// The input decodes (FuzzedDataProvider) into:
//  - the top image: qcow2 with a chosen cluster size (512 B .. 2 MiB),
//    compat (v2/v3), refcount width, extended L2, lazy refcounts,
//    compression type, preallocation; or, rarely, a raw image;
//  - optionally a backing file: a qcow2 image (its own options, some data
//    written) or a raw file, of a size that may differ from the top's;
//  - cache options (tiny caches evict all the time);
//  - up to kMaxOps operations: write, write-zeroes (with or without unmap),
//    discard, flush, read, resize (grow; shrink must be refused), reopen,
//    overlay (Image::CreateOverlay, or close + CreateImage + open), and
//    check (flush, then the refcount checker on the open top).
// After every data op the op's clusters and one cluster either side are
// read back and compared with the model; after a reopen or a new overlay,
// the whole disk. At the end every qcow2 file written is checked with
// CheckImage (no corruptions and no check errors; leaks are allowed) and
// the chain is reopened read-only and compared once more.
//
// Semantics (include/qcow2/image.h, testing/model.h): write-zeroes and
// discard read as zeros afterwards; a new overlay reads as its backing file
// (cut or zero-extended to its size); growing exposes the backing file
// where it reaches and zeros beyond.
//
// QCOW2_FUZZ_VERBOSE=1 prints every op as it runs (for reproducing).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fuzz/fuzz_util.h"
#include "testing/memory_file.h"
#include "testing/model.h"
#include "lib/check/check.h"
#include "qcow2/image.h"
#include "qcow2/options.h"

namespace qcow2::fuzz {
namespace {

using internal::CheckImage;
using internal::CheckResult;
using internal::MemoryFile;
using internal::MemoryFileSystem;
using internal::RepairMode;

constexpr int kMaxOps = 32;
constexpr int kMaxDepth = 4;                // backing files below the top
constexpr uint64_t kMaxDiskSize = 4 << 20;  // resizes stay below this
constexpr uint64_t kMaxWrite = 256 << 10;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }

bool Verbose() {
  static const bool v = getenv("QCOW2_FUZZ_VERBOSE") != nullptr;
  return v;
}

std::string Describe(const CreateOptions& o) {
  if (o.format == ImageFormat::kRaw) return "raw";
  return absl::StrCat(
      "qcow2 compat=", o.compat, " cluster_size=", o.cluster_size,
      " refcount_bits=", o.refcount_bits, " extended_l2=", o.extended_l2,
      " lazy_refcounts=", o.lazy_refcounts, " compression=",
      o.compression_type == CompressionType::kZstd ? "zstd" : "zlib",
      " prealloc=", static_cast<int>(o.preallocation),
      o.backing_file.empty() ? ""
                             : absl::StrCat(" backing=", o.backing_file, " (",
                                            o.backing_format, ")"));
}

class Runner {
 public:
  Runner(const uint8_t* data, size_t size) : fdp_(data, size) {}

  void Run() {
    Setup();
    for (int i = 0; i < kMaxOps && fdp_.remaining_bytes() > 0; ++i) Step();
    Finish();
  }

 private:
  // ---- logging and failure -------------------------------------------------

  void Log(std::string line) {
    if (Verbose()) fprintf(stderr, "  %s\n", line.c_str());
    log_.push_back(std::move(line));
  }

  [[noreturn]] void Fail(const std::string& what) {
    fprintf(stderr, "\nfuzz_ops: %zu steps:\n", log_.size());
    for (size_t i = 0; i < log_.size(); ++i) {
      fprintf(stderr, "  #%zu %s\n", i, log_[i].c_str());
    }
    Die("%s", what.c_str());
  }

  void MustOk(const absl::Status& s, const std::string& what) {
    if (!s.ok()) Fail(absl::StrCat(what, " failed: ", s.ToString()));
  }

  // ---- choices from the input ---------------------------------------------

  template <typename T>
  T In(T lo, T hi) {
    return fdp_.ConsumeIntegralInRange<T>(lo, hi);
  }

  CreateOptions RandomCreateOptions(bool with_backing) {
    CreateOptions o;
    o.opener = &fs_;
    // 2 MiB clusters are slow (every small write copies a whole cluster):
    // one image in 32.
    static constexpr uint32_t kBits[] = {9, 10, 11, 12, 13, 14, 15, 16, 17};
    const uint32_t bits =
        In(0, 31) == 31 ? 21 : kBits[In<size_t>(0, std::size(kBits) - 1)];
    o.cluster_size = 1u << bits;
    const bool v2 = In(0, 7) == 0;
    o.compat = v2 ? "0.10" : "1.1";
    if (!v2) {
      o.refcount_bits = 1u << In(0, 6);
      o.extended_l2 = bits >= 14 && fdp_.ConsumeBool();
      o.lazy_refcounts = In(0, 3) == 0;
      o.compression_type =
          fdp_.ConsumeBool() ? CompressionType::kZstd : CompressionType::kZlib;
    }
    // Preallocation, rarely (and with a backing file only where allowed).
    if (In(0, 7) == 0 && (!with_backing || o.extended_l2)) {
      o.preallocation = static_cast<Preallocation>(In(1, 3));
    }
    return o;
  }

  uint64_t RandomSize(uint64_t cs) {
    switch (In(0, 3)) {
      case 0:
        return In<uint64_t>(1, 64 << 10);
      case 1:
        return In<uint64_t>(64 << 10, 512 << 10);
      case 2:
        return In<uint64_t>(512 << 10, 2 << 20);
      default:
        return std::min<uint64_t>(cs * In<uint64_t>(1, 32), 2 << 20);
    }
  }

  OpenOptions RandomOpenOptions(bool rw) {
    OpenOptions o;
    o.read_write = rw;
    o.opener = &fs_;
    o.max_chain_depth = kMaxDepth + 1;
    switch (In(0, 3)) {
      case 0:  // tiny caches: constant eviction
        o.l2_cache_bytes = 2048;
        o.l2_slice_bytes = 512;
        o.refcount_cache_bytes = 1;
        break;
      case 1:
        o.l2_cache_bytes = 16384;
        o.l2_slice_bytes = 1u << In(9, 16);
        o.refcount_cache_bytes = 16384;
        break;
      default:
        break;
    }
    if (top_raw_) o.format = "raw";  // never probe guest data
    return o;
  }

  // A range of a disk of `size` bytes, biased towards awkward cases.
  void RandomRange(uint64_t size, uint64_t* off, uint64_t* len) {
    const uint64_t cs = top_cs_;
    const uint64_t sc = top_sc_;
    switch (In(0, 6)) {
      case 0:  // unaligned, small
        *off = In<uint64_t>(0, size - 1);
        *len = In<uint64_t>(1, std::min(size - *off, 2 * cs));
        break;
      case 1: {  // whole clusters
        const uint64_t c = In<uint64_t>(0, (size - 1) / cs);
        *off = c * cs;
        *len = std::min(size - *off, cs * In<uint64_t>(1, 4));
        break;
      }
      case 2: {  // whole subclusters
        const uint64_t c = In<uint64_t>(0, (size - 1) / sc);
        *off = c * sc;
        *len = std::min(size - *off, sc * In<uint64_t>(1, 40));
        break;
      }
      case 3:  // at the very end
        *len = In<uint64_t>(1, std::min(size, 2 * cs));
        *off = size - *len;
        break;
      case 4: {  // sectors
        const uint64_t s = In<uint64_t>(0, (size - 1) / 512);
        *off = s * 512;
        *len = std::min(size - *off, 512 * In<uint64_t>(1, 16));
        break;
      }
      case 5:  // inside one cluster
        *off = In<uint64_t>(0, size - 1);
        *len = In<uint64_t>(1, std::min(size - *off, cs - *off % cs));
        break;
      default:  // long
        *off = In<uint64_t>(0, size - 1);
        *len = In<uint64_t>(1, size - *off);
        break;
    }
  }

  // ---- files ----------------------------------------------------------------

  std::string NewPath(const char* stem) {
    return absl::StrCat("/fuzz/", stem, counter_++, ".img");
  }
  static std::string BaseName(const std::string& p) {
    return p.substr(p.rfind('/') + 1);
  }

  void OpenTop(bool rw) {
    OpenOptions o = RandomOpenOptions(rw);
    auto img = Image::Open(chain_.back(), o);
    if (!img.ok())
      Fail(absl::StrCat("Open ", chain_.back(), ": ", img.status().ToString()));
    image_ = std::move(img).value();
    if (image_->size() != model_.size()) {
      Fail(absl::StrCat("size() is ", image_->size(),
                        " after opening, expected ", model_.size()));
    }
    if (image_->chain_length() != static_cast<int>(chain_.size())) {
      Fail(absl::StrCat("chain_length() is ", image_->chain_length(),
                        ", expected ", chain_.size()));
    }
  }

  void CloseTop() {
    absl::Status s = image_->Close();
    image_.reset();
    MustOk(s, "Close");
  }

  void SetTopGeometry(const CreateOptions& o) {
    top_raw_ = o.format == ImageFormat::kRaw;
    top_cs_ = top_raw_ ? 4096 : o.cluster_size;
    top_sc_ = o.extended_l2 ? top_cs_ / 32 : top_cs_;
    top_lazy_ = o.lazy_refcounts;
    tail_.clear();
  }

  // The backing file, if any: a populated qcow2 image or a raw file.
  void SetupBacking() {
    const int kind = In(0, 3);  // 0, 1: none
    if (kind < 2) return;
    const uint64_t size = AlignUp(In<uint64_t>(4096, 2 << 20), 512);
    if (kind == 3) {
      const std::string p = "/fuzz/base.raw";
      auto store = fs_.Store(p);
      store->bytes.resize(size);
      FillPattern(fdp_.ConsumeIntegral<uint16_t>(),
                  absl::MakeSpan(store->bytes));
      store->read_only = true;
      Log(absl::StrCat("backing ", p, " raw size=", size));
      chain_.push_back(p);
      backing_raw_ = true;
      model_ = store->bytes;
      return;
    }
    CreateOptions o = RandomCreateOptions(false);
    o.size = size;
    const std::string p = "/fuzz/base.qcow2";
    Log(absl::StrCat("backing ", p, " ", Describe(o), " size=", size));
    MustOk(CreateImage(p, o), "CreateImage of the backing file");
    chain_.push_back(p);
    written_.push_back(p);
    SetTopGeometry(o);
    model_.assign(size, 0);
    OpenTop(true);
    const int writes = In(0, 6);
    for (int i = 0; i < writes; ++i) {
      uint64_t off, len;
      RandomRange(size, &off, &len);
      len = std::min(len, kMaxWrite);
      const uint64_t seed = fdp_.ConsumeIntegral<uint32_t>();
      Log(absl::StrCat("backing write off=", off, " len=", len,
                       " seed=", seed));
      DoWrite(off, len, seed);
    }
    CloseTop();
  }

  void Setup() {
    SetupBacking();
    CreateOptions o;
    const bool raw_top = chain_.empty() && In(0, 15) == 0;
    if (raw_top) {
      o.format = ImageFormat::kRaw;
      o.opener = &fs_;
    } else {
      o = RandomCreateOptions(!chain_.empty());
    }
    uint64_t size = RandomSize(raw_top ? 4096 : o.cluster_size);
    if (!chain_.empty()) {
      o.backing_file = BaseName(chain_.back());
      o.backing_format = backing_raw_ ? "raw" : "qcow2";
      if (In(0, 3) == 0) size = 0;  // the backing file's size
      backing_view_ = model_;
    }
    o.size = size;
    const std::string p = NewPath(raw_top ? "top" : "top");
    Log(absl::StrCat("create ", p, " ", Describe(o), " size=", size));
    MustOk(CreateImage(p, o), "CreateImage of the top");
    chain_.push_back(p);
    if (!raw_top) written_.push_back(p);
    SetTopGeometry(o);
    model_.resize(size == 0 ? backing_view_.size() : AlignUp(size, 512), 0);
    OpenTop(true);
    VerifyAll("the new image");
  }

  // ---- verification ---------------------------------------------------------

  void VerifyRange(uint64_t off, uint64_t len, const char* what) {
    if (len == 0) return;
    if (read_buf_.size() < len) read_buf_.resize(len);
    absl::Span<uint8_t> buf(read_buf_.data(), len);
    absl::Status s = image_->Read(off, buf);
    if (!s.ok())
      Fail(absl::StrCat("Read(", off, ", ", len, ") of ", what, ": ",
                        s.ToString()));
    const int64_t d =
        FirstDifference(absl::MakeConstSpan(model_.data() + off, len), buf);
    if (d >= 0) {
      uint64_t last = off + d, count = 0;
      for (uint64_t i = d; i < len; ++i) {
        if (model_[off + i] != buf[i]) {
          last = off + i;
          ++count;
        }
      }
      Fail(absl::StrCat("read-back of ", what, " [", off, ", +", len,
                        "): ", count, " bytes differ, first at ", off + d,
                        " (expected 0x", absl::Hex(model_[off + d]), ", got 0x",
                        absl::Hex(buf[d]), "), last at ", last,
                        "; top cluster size ", top_cs_));
    }
  }

  void VerifyAll(const char* what) { VerifyRange(0, model_.size(), what); }

  // The op's clusters and one cluster either side.
  void VerifyAround(uint64_t off, uint64_t len) {
    const uint64_t cs = top_cs_;
    uint64_t from = AlignDown(off, cs);
    from = from >= cs ? from - cs : 0;
    const uint64_t to =
        std::min<uint64_t>(model_.size(), AlignUp(off + len, cs) + cs);
    VerifyRange(from, to - from, "the op's neighbourhood");
  }

  // Runs the refcount checker on `path`; no corruptions, no check errors.
  void CheckFile(const std::string& path, const char* when) {
    MemoryFile f(path, fs_.Store(path), /*read_only=*/true);
    auto r = CheckImage(&f, RepairMode::kNone);
    if (!r.ok())
      Fail(absl::StrCat("CheckImage(", path, ") ", when, ": ",
                        r.status().ToString()));
    if (r->corruptions != 0 || r->check_errors != 0 || !r->failure.empty()) {
      Fail(absl::StrCat("CheckImage(", path, ") ", when, ": ", r->corruptions,
                        " corruptions, ", r->check_errors, " check errors ",
                        r->failure, "\n    ",
                        absl::StrJoin(r->messages, "\n    ")));
    }
  }

  // ---- operations -----------------------------------------------------------

  void DoWrite(uint64_t off, uint64_t len, uint64_t seed) {
    std::vector<uint8_t> data(len);
    FillPattern(seed, absl::MakeSpan(data));
    MustOk(image_->Write(off, data), "Write");
    std::copy(data.begin(), data.end(), model_.begin() + off);
  }

  void Resize() {
    const uint64_t old = model_.size();
    uint64_t want;
    switch (In(0, 5)) {
      case 0:
        want = old + 512 * In<uint64_t>(1, 8);
        break;
      case 1:
        want = old + In<uint64_t>(1, 4 * top_cs_);
        break;
      case 2:
        want = old + top_cs_ * In<uint64_t>(1, 64);
        break;
      case 3:
        want = old + In<uint64_t>(1, kMaxDiskSize);
        break;
      case 4:
        want = old;
        break;
      default:
        want = old > 512 ? old - In<uint64_t>(1, old - 512) : old;
        break;
    }
    want = std::min(want, std::max(old, kMaxDiskSize));
    const uint64_t rounded = AlignUp(want, 512);
    Log(absl::StrCat("resize ", want, " (from ", old, ")"));
    absl::Status s = image_->Resize(want);
    // Raw images keep their size; qcow2 ones grow and shrink (no
    // snapshots or bitmaps here), as testing/model.h's Grow and Shrink.
    if (top_raw_ && rounded != old) {
      if (s.code() != absl::StatusCode::kUnimplemented) {
        Fail(absl::StrCat("Resize(", want, ") from ", old,
                          ": expected kUnimplemented, got ", s.ToString()));
      }
    } else {
      MustOk(s, absl::StrCat("Resize(", want, ")"));
      if (rounded < old) {
        testing::ShrinkBytes(&model_, &tail_, rounded, top_cs_, backing_view_);
      } else {
        testing::GrowBytes(&model_, &tail_, rounded, backing_view_);
      }
    }
    if (image_->size() != model_.size()) {
      Fail(absl::StrCat("size() is ", image_->size(),
                        " after Resize, expected ", model_.size()));
    }
    const uint64_t low = std::min(old, model_.size());
    const uint64_t from =
        low >= 2 * top_cs_ ? AlignDown(low, top_cs_) - top_cs_ : 0;
    VerifyRange(from, model_.size() - from, "around the old end");
  }

  void Reopen() {
    const bool via_read_only = In(0, 3) == 0;
    Log(absl::StrCat("reopen", via_read_only ? " (read-only first)" : ""));
    CloseTop();
    if (via_read_only) {
      OpenTop(false);
      VerifyAll("a read-only reopen");
      CloseTop();
    }
    OpenTop(true);
    VerifyAll("after reopen");
  }

  void Overlay() {
    const bool live = fdp_.ConsumeBool();
    CreateOptions o = RandomCreateOptions(true);
    uint64_t size = 0;
    if (In(0, 4) == 0) {
      const uint64_t delta = 512 * In<uint64_t>(1, 4 * o.cluster_size / 512);
      const uint64_t cur = model_.size();
      size = fdp_.ConsumeBool() || cur <= delta ? cur + delta : cur - delta;
      size = std::min(size, kMaxDiskSize);
    }
    o.size = size;
    const std::string p = NewPath("overlay");
    const std::string backing = chain_.back();
    o.backing_file = BaseName(backing);
    o.backing_format = top_raw_ ? "raw" : "qcow2";
    Log(absl::StrCat(live ? "live overlay " : "overlay ", p, " ", Describe(o),
                     " size=", size));
    if (live) {
      o.backing_file.clear();  // filled in by CreateOverlay
      o.backing_format.clear();
      MustOk(image_->CreateOverlay(p, o), "CreateOverlay");
    } else {
      CloseTop();
      MustOk(CreateImage(p, o), "CreateImage of an overlay");
    }
    chain_.push_back(p);
    written_.push_back(p);
    backing_view_ = model_;
    if (size != 0) model_.resize(AlignUp(size, 512), 0);
    SetTopGeometry(o);
    if (live) {
      if (image_->size() != model_.size() ||
          image_->chain_length() != static_cast<int>(chain_.size())) {
        Fail(absl::StrCat("after CreateOverlay: size() ", image_->size(),
                          " chain_length() ", image_->chain_length(),
                          ", expected ", model_.size(), " and ",
                          chain_.size()));
      }
    } else {
      OpenTop(true);
    }
    VerifyAll("the new overlay");
  }

  void MidCheck() {
    Log("flush + check");
    MustOk(image_->Flush(), "Flush");
    // Lazy refcounts leave the refcounts stale until close; raw has none.
    if (top_raw_ || top_lazy_) return;
    CheckFile(chain_.back(), "after a flush, image open");
  }

  void Step() {
    const uint64_t size = model_.size();
    const int kind = In(0, 15);
    uint64_t off = 0, len = 0;
    if (kind <= 9 || kind == 14) RandomRange(size, &off, &len);
    if (kind <= 5) {
      len = std::min(len, kMaxWrite);
      const uint64_t seed = fdp_.ConsumeIntegral<uint32_t>();
      Log(absl::StrCat("write off=", off, " len=", len, " seed=", seed));
      DoWrite(off, len, seed);
      VerifyAround(off, len);
    } else if (kind <= 7) {
      const bool unmap = fdp_.ConsumeBool();
      Log(absl::StrCat("zero off=", off, " len=", len, unmap ? " unmap" : ""));
      MustOk(image_->WriteZeroes(off, len, unmap), "WriteZeroes");
      std::fill(model_.begin() + off, model_.begin() + off + len, 0);
      testing::ZeroTailBytes(&tail_, model_.size(), off, len, top_cs_,
                             chain_.size() > 1);
      VerifyAround(off, len);
    } else if (kind <= 9) {
      Log(absl::StrCat("discard off=", off, " len=", len));
      MustOk(image_->Discard(off, len), "Discard");
      std::fill(model_.begin() + off, model_.begin() + off + len, 0);
      testing::ZeroTailBytes(&tail_, model_.size(), off, len, top_cs_,
                             chain_.size() > 1);
      VerifyAround(off, len);
    } else if (kind == 10) {
      Log("flush");
      MustOk(image_->Flush(), "Flush");
    } else if (kind == 11) {
      Resize();
    } else if (kind == 12) {
      Reopen();
    } else if (kind == 13) {
      if (static_cast<int>(chain_.size()) <= kMaxDepth) Overlay();
    } else if (kind == 14) {
      Log(absl::StrCat("read off=", off, " len=", len));
      VerifyRange(off, len, "a read");
    } else {
      MidCheck();
    }
  }

  void Finish() {
    VerifyAll("at the end");
    Log("close");
    CloseTop();
    for (const std::string& p : written_) CheckFile(p, "after close");
    OpenTop(false);
    VerifyAll("a read-only reopen at the end");
    image_.reset();
  }

  FuzzedDataProvider fdp_;
  MemoryFileSystem fs_;
  std::vector<std::string> chain_;    // bottom first; back() is the top
  std::vector<std::string> written_;  // qcow2 files written by the library
  std::unique_ptr<Image> image_;
  std::vector<uint8_t> model_;         // what the disk reads as
  std::vector<uint8_t> backing_view_;  // what the top's backing reads as
  std::vector<uint8_t> tail_;  // what the top holds past its end (Shrink)
  std::vector<uint8_t> read_buf_;
  std::vector<std::string> log_;
  uint64_t top_cs_ = 65536, top_sc_ = 65536;
  bool top_raw_ = false, top_lazy_ = false, backing_raw_ = false;
  int counter_ = 0;
};

}  // namespace
}  // namespace qcow2::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qcow2::fuzz::Runner(data, size).Run();
  return 0;
}
