// SPDX-License-Identifier: Apache-2.0
// A reference model of a virtual disk for randomized model tests: a flat
// byte array per disk, the operations applied to it, and a seeded generator
// of operation sequences (offsets and lengths biased towards the awkward
// cases: unaligned, tiny, at the very end of the disk, cluster aligned,
// spanning many clusters).
//
//   OpGenConfig gc;
//   gc.cluster_size = 4096;
//   OpGenerator gen(seed, gc);
//   DiskModel model(disk_size);
//   for (int i = 0; i < 100; ++i) {
//     ModelOp op = gen.Next(model.size(), depth);
//     ... apply op to the image under test ...
//     model.Apply(op);
//   }
//
// Semantics (libqcow2's contract): write stores bytes; write-zeroes (with or
// without unmap) and discard make the range read as zeros; flush, close and
// reopen change nothing; a new overlay starts with the contents of its
// backing file (truncated or zero-extended when given another size);
// growing the disk (Image::Resize) exposes the backing file where it
// reaches and zeros beyond; shrinking is refused.
#ifndef QCOW2_TESTING_MODEL_H_
#define QCOW2_TESTING_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "testing/rng.h"

namespace qcow2::testing {

// Fills `out` with bytes determined by `seed` alone (splitmix64 stream),
// never all-zero runs longer than a few bytes, so a write is never mistaken
// for a zero write or a stale cluster.
void FillPseudoRandom(uint64_t seed, absl::Span<uint8_t> out);

struct ModelOp {
  enum class Kind {
    kWrite,     // bytes FillPseudoRandom(data_seed) at [offset, +length)
    kZero,      // WriteZeroes(offset, length, unmap)
    kDiscard,   // Discard(offset, length)
    kFlush,     // Flush()
    kReopen,    // Close() and Image::Open() again
    kOverlay,   // Close(); create an overlay backed by the top; open it
                // (or, `live`, Image::CreateOverlay without closing)
    kResize,    // Image::Resize(new_size): grows; shrinking must fail
  };
  Kind kind = Kind::kWrite;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool unmap = false;      // kZero
  uint64_t data_seed = 0;  // kWrite
  // kOverlay: virtual size (0 = the backing's size); kResize: the size
  // asked for.
  uint64_t new_size = 0;
  bool qemu_create = false;  // kOverlay: made by qemu-img create, not by us
  bool live = false;  // kOverlay: Image::CreateOverlay on the open image

  // The data a kWrite op writes.
  std::vector<uint8_t> Data() const;
  // One line: "write off=12345 len=777 (end 13122) seed=0x..".
  std::string ToString() const;
  // Whether the op touches guest data (write, zero, discard).
  bool IsDataOp() const {
    return kind == Kind::kWrite || kind == Kind::kZero ||
           kind == Kind::kDiscard;
  }
};

// DiskModel::Grow and Shrink on a model's own bytes, for a model that
// keeps them in a plain vector (fuzz/fuzz_ops.cc). `tail` is what the
// image holds past the end (what a shrink kept); it starts empty.
void GrowBytes(std::vector<uint8_t>* bytes, std::vector<uint8_t>* tail,
               uint64_t size, absl::Span<const uint8_t> backing);
void ShrinkBytes(std::vector<uint8_t>* bytes, std::vector<uint8_t>* tail,
                 uint64_t size, uint64_t cluster_size,
                 absl::Span<const uint8_t> backing);
// A write-zeroes or discard of [offset, +len) on a disk of `size` bytes
// that covers its final partial cluster from the cluster's start to the
// end zeroes that cluster whole when the image has no backing file (the
// library's rule, lib/driver/zeroer.cc): what a shrink kept past the end
// then reads as zeros.
void ZeroTailBytes(std::vector<uint8_t>* tail, uint64_t size, uint64_t offset,
                   uint64_t len, uint64_t cluster_size, bool has_backing);

// The expected contents of the virtual disk.
class DiskModel {
 public:
  explicit DiskModel(uint64_t size) : bytes_(size, 0) {}
  explicit DiskModel(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}

  uint64_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  absl::Span<const uint8_t> Range(uint64_t offset, uint64_t length) const {
    return absl::MakeConstSpan(bytes_).subspan(offset, length);
  }

  // Applies the effect of `op` on the contents. kOverlay with new_size != 0
  // resizes (new bytes read as zero); kResize is not handled here (see
  // Grow). Ops past the end are a test bug and abort.
  void Apply(const ModelOp& op);
  void Write(uint64_t offset, absl::Span<const uint8_t> data);
  void Zero(uint64_t offset, uint64_t length);
  // A new top image of `size` bytes (an overlay): nothing is left past
  // its end.
  void Resize(uint64_t size) {
    bytes_.resize(size, 0);
    tail_.clear();
  }
  // Grows to `size` (Image::Resize): the new range reads as the backing
  // file's contents where the backing file reaches (`backing` is what it
  // reads as), as zeros beyond; except what a Shrink kept past the end,
  // which reads as it did.
  void Grow(uint64_t size, absl::Span<const uint8_t> backing) {
    GrowBytes(&bytes_, &tail_, size, backing);
  }
  // Shrinks to `size` (Image::Resize of a qcow2 image): the clusters
  // (of `cluster_size` bytes) wholly past the new end are dropped, so that
  // a later Grow reads them as the backing file or zeros, but the cluster
  // the new end falls in keeps its bytes past it, as QEMU's shrink keeps
  // them, and a later Grow shows them again. `backing` as for Grow.
  void Shrink(uint64_t size, uint64_t cluster_size,
              absl::Span<const uint8_t> backing) {
    ShrinkBytes(&bytes_, &tail_, size, cluster_size, backing);
  }
  // After a write-zeroes or discard of [offset, +len): see ZeroTailBytes.
  void ZeroTail(uint64_t offset, uint64_t len, uint64_t cluster_size,
                bool has_backing) {
    ZeroTailBytes(&tail_, bytes_.size(), offset, len, cluster_size,
                  has_backing);
  }

 private:
  std::vector<uint8_t> bytes_;
  // What the disk holds in [size(), size() + tail_.size()): bytes a Shrink
  // kept in the cluster its new end fell in.
  std::vector<uint8_t> tail_;
};

// Empty when equal; otherwise a description of the first difference and of
// the extent of the differences ("3 bytes differ in [0x1000, 0x1003); first
// at 0x1000: expected 0x5a, got 0x00 ..."). `base` is the guest offset of
// element 0 (for messages).
std::string DescribeMismatch(absl::Span<const uint8_t> expected,
                             absl::Span<const uint8_t> actual,
                             uint64_t base = 0);

// Relative weights of the op kinds; 0 disables a kind.
struct OpWeights {
  int write = 45;
  int zero = 14;
  int discard = 12;
  int flush = 7;
  int reopen = 4;
  int overlay = 3;
  int resize = 2;
};

struct OpGenConfig {
  uint64_t cluster_size = 65536;
  // Subcluster size (cluster_size / 32 with extended L2, else
  // cluster_size): some ranges are aligned to it.
  uint64_t subcluster_size = 65536;
  OpWeights weights;
  // Deepest chain allowed: kOverlay is generated only while depth < this.
  int max_depth = 3;
  // New overlays sometimes get an explicit size other than the backing's
  // (grown or shrunk by a few sectors / clusters, never below min_size).
  bool resize_overlays = true;
  uint64_t min_size = 1 << 20;
  // Resizes and grown overlays stay at or below this size (0: no limit);
  // beyond it kResize asks for the current size (a no-op).
  uint64_t max_size = 0;
  // Longest range of the "many clusters" kind; 0: half the disk. When set,
  // it caps every range (whole-disk ranges included).
  uint64_t max_long_length = 0;
};

// Seeded generator of ops. The same seed and the same sequence of
// (disk_size, depth) arguments give the same ops.
class OpGenerator {
 public:
  OpGenerator(uint64_t seed, const OpGenConfig& config)
      : rng_(seed), config_(config) {}

  // The next op for a disk of `disk_size` bytes whose top has `depth`
  // backing files below it.
  ModelOp Next(uint64_t disk_size, int depth);

  // A data op (write / zero / discard) of the given kind on a random range.
  ModelOp DataOp(ModelOp::Kind kind, uint64_t disk_size);

  // A random range inside a disk of `disk_size` bytes (length >= 1).
  void RandomRange(uint64_t disk_size, uint64_t* offset, uint64_t* length);

  TestRng& rng() { return rng_; }

 private:
  TestRng rng_;
  OpGenConfig config_;
  uint64_t last_write_end_ = ~uint64_t{0};  // none yet
};

// The op log, numbered, one op a line. With `mark` >= 0 that op is flagged
// ("<== failed here"). Long logs keep the first and the last `keep` lines.
std::string FormatOpLog(const std::vector<ModelOp>& ops, int mark = -1,
                        size_t keep = 200);

}  // namespace qcow2::testing

#endif  // QCOW2_TESTING_MODEL_H_
