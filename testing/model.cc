// SPDX-License-Identifier: Apache-2.0
#include "testing/model.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace qcow2::testing {

namespace {

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Log-uniform in [lo, hi]: as many short as long lengths per power of two.
uint64_t LogUniform(TestRng& rng, uint64_t lo, uint64_t hi) {
  if (hi <= lo) return lo;
  const int lo_bits = 63 - __builtin_clzll(std::max<uint64_t>(lo, 1));
  const int hi_bits = 63 - __builtin_clzll(hi);
  const int e = static_cast<int>(rng.Range(lo_bits, hi_bits));
  uint64_t a = std::max(lo, uint64_t{1} << e);
  uint64_t b = std::min(hi, (uint64_t{2} << e) - 1);
  if (a > b) a = b;
  return rng.Range(a, b);
}

uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }

}  // namespace

void FillPseudoRandom(uint64_t seed, absl::Span<uint8_t> out) {
  uint64_t state = seed * 0x2545f4914f6cdd1dull + 1;
  const size_t n = out.size();
  uint8_t* p = out.data();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t x = SplitMix(state);
    std::memcpy(p + i, &x, 8);
  }
  if (i < n) {
    const uint64_t x = SplitMix(state);
    std::memcpy(p + i, &x, n - i);
  }
  // Never a zero byte, so data never passes for a hole.
  for (i = 0; i < n; ++i) p[i] += p[i] == 0;
}

std::vector<uint8_t> ModelOp::Data() const {
  std::vector<uint8_t> d(length);
  FillPseudoRandom(data_seed, absl::MakeSpan(d));
  return d;
}

std::string ModelOp::ToString() const {
  auto range = [&] {
    return absl::StrFormat("off=%d len=%d (0x%x+0x%x, end 0x%x)", offset,
                           length, offset, length, offset + length);
  };
  switch (kind) {
    case Kind::kWrite:
      return absl::StrFormat("write    %s seed=%d", range(), data_seed);
    case Kind::kZero:
      return absl::StrFormat("zero     %s unmap=%d", range(), unmap ? 1 : 0);
    case Kind::kDiscard:
      return absl::StrFormat("discard  %s", range());
    case Kind::kFlush:
      return "flush";
    case Kind::kReopen:
      return "close+reopen";
    case Kind::kResize:
      return absl::StrFormat("resize   to %d (0x%x)", new_size, new_size);
    case Kind::kOverlay:
      return absl::StrCat(
          new_size == 0 ? std::string("new overlay (backing size)")
                        : absl::StrFormat("new overlay size=%d", new_size),
          qemu_create ? " by qemu-img create" : "",
          live ? " live (Image::CreateOverlay)" : "");
  }
  return "?";
}

void DiskModel::Write(uint64_t offset, absl::Span<const uint8_t> data) {
  if (offset > bytes_.size() || data.size() > bytes_.size() - offset) {
    fprintf(stderr, "DiskModel: write past the end\n");
    abort();
  }
  std::copy(data.begin(), data.end(), bytes_.begin() + offset);
}

void DiskModel::Zero(uint64_t offset, uint64_t length) {
  if (offset > bytes_.size() || length > bytes_.size() - offset) {
    fprintf(stderr, "DiskModel: zero past the end\n");
    abort();
  }
  std::fill(bytes_.begin() + offset, bytes_.begin() + offset + length, 0);
}

void DiskModel::Apply(const ModelOp& op) {
  switch (op.kind) {
    case ModelOp::Kind::kWrite: {
      std::vector<uint8_t> d = op.Data();
      Write(op.offset, d);
      break;
    }
    case ModelOp::Kind::kZero:
    case ModelOp::Kind::kDiscard:
      Zero(op.offset, op.length);
      break;
    case ModelOp::Kind::kFlush:
    case ModelOp::Kind::kReopen:
      break;
    case ModelOp::Kind::kOverlay:
      Resize(op.new_size != 0 ? op.new_size : bytes_.size());
      break;
    case ModelOp::Kind::kResize:
      fprintf(stderr, "DiskModel: kResize needs Grow()\n");
      abort();
  }
}

void GrowBytes(std::vector<uint8_t>* bytes, std::vector<uint8_t>* tail,
               uint64_t size, absl::Span<const uint8_t> backing) {
  const uint64_t old = bytes->size();
  if (size <= old) return;
  bytes->resize(size, 0);
  if (backing.size() > old) {
    const uint64_t n = std::min<uint64_t>(backing.size(), size) - old;
    std::copy(backing.begin() + old, backing.begin() + old + n,
              bytes->begin() + old);
  }
  const uint64_t kept = std::min<uint64_t>(tail->size(), size - old);
  std::copy(tail->begin(), tail->begin() + kept, bytes->begin() + old);
  tail->erase(tail->begin(), tail->begin() + kept);
}

void ZeroTailBytes(std::vector<uint8_t>* tail, uint64_t size, uint64_t offset,
                   uint64_t len, uint64_t cluster_size, bool has_backing) {
  if (has_backing || tail->empty() || offset + len != size) return;
  if (offset <= size / cluster_size * cluster_size) {
    std::fill(tail->begin(), tail->end(), 0);
  }
}

void ShrinkBytes(std::vector<uint8_t>* bytes, std::vector<uint8_t>* tail,
                 uint64_t size, uint64_t cluster_size,
                 absl::Span<const uint8_t> backing) {
  const uint64_t old = bytes->size();
  if (size >= old) return;
  const uint64_t cluster_end =
      (size + cluster_size - 1) / cluster_size * cluster_size;
  // The kept bytes: what the disk read in [size, cluster_end), the part
  // past the old end included (kept by an earlier shrink, or a fresh
  // end's backing or zeros).
  std::vector<uint8_t> kept(cluster_end - size, 0);
  const uint64_t visible = std::min(old, cluster_end) - size;
  std::copy(bytes->begin() + size, bytes->begin() + size + visible,
            kept.begin());
  for (uint64_t i = visible; i < kept.size(); ++i) {
    if (i - visible < tail->size()) {
      kept[i] = (*tail)[i - visible];
    } else if (size + i < backing.size()) {
      kept[i] = backing[size + i];
    }
  }
  bytes->resize(size);
  *tail = std::move(kept);
}

std::string DescribeMismatch(absl::Span<const uint8_t> expected,
                             absl::Span<const uint8_t> actual, uint64_t base) {
  if (expected.size() != actual.size()) {
    return absl::StrFormat("size differs: expected %d bytes, got %d",
                           expected.size(), actual.size());
  }
  if (expected.empty() ||
      std::memcmp(expected.data(), actual.data(), expected.size()) == 0) {
    return "";
  }
  size_t first = expected.size(), last = 0, count = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] != actual[i]) {
      if (first == expected.size()) first = i;
      last = i;
      ++count;
    }
  }
  if (count == 0) return "";
  std::string s = absl::StrFormat(
      "%d bytes differ in guest range [0x%x, 0x%x] (%d..%d); first at 0x%x "
      "(%d): expected 0x%02x, got 0x%02x",
      count, base + first, base + last, base + first, base + last,
      base + first, base + first, expected[first], actual[first]);
  // Show a few bytes around the first difference, and whether the actual
  // bytes there are zeros (a lost write) or stale data.
  size_t from = first, to = std::min(expected.size(), first + 16);
  std::string e, a;
  bool actual_zero = true;
  for (size_t i = from; i < to; ++i) {
    absl::StrAppendFormat(&e, "%02x", expected[i]);
    absl::StrAppendFormat(&a, "%02x", actual[i]);
  }
  for (size_t i = first; i <= last; ++i) {
    if (actual[i] != 0) {
      actual_zero = false;
      break;
    }
  }
  absl::StrAppend(&s, "\n  expected[0x", absl::Hex(base + from), "..]: ", e,
                  "\n  actual  [0x", absl::Hex(base + from), "..]: ", a);
  if (actual_zero) absl::StrAppend(&s, "\n  (actual bytes there are all zero)");
  return s;
}

void OpGenerator::RandomRange(uint64_t size, uint64_t* offset,
                              uint64_t* length) {
  const uint64_t cs = config_.cluster_size;
  const uint64_t sub = config_.subcluster_size;
  uint64_t off = 0, len = 1;
  const uint64_t r = rng_.Uniform(100);
  if (r < 40) {
    // Small and unaligned: 1 byte .. 3 clusters.
    len = LogUniform(rng_, 1, std::min(size, 3 * cs));
    off = rng_.Uniform(size - len + 1);
  } else if (r < 47) {
    // One byte anywhere.
    len = 1;
    off = rng_.Uniform(size);
  } else if (r < 57) {
    // Ends exactly at the end of the disk (sometimes a single byte).
    len = rng_.OneIn(4) ? 1 : LogUniform(rng_, 1, std::min(size, 2 * cs));
    off = size - len;
  } else if (r < 70) {
    // Cluster aligned, 1..4 clusters (clamped at the end of the disk).
    const uint64_t clusters = (size + cs - 1) / cs;
    const uint64_t n = rng_.Range(1, 4);
    off = rng_.Uniform(clusters) * cs;
    len = std::min(n * cs, size - off);
  } else if (r < 80) {
    // Aligned to subclusters or sectors, a few of them.
    uint64_t a = sub;
    if (sub == cs || rng_.OneIn(2)) a = rng_.OneIn(2) ? 512 : 4096;
    a = std::min(a, cs);
    const uint64_t units = std::max<uint64_t>(1, size / a);
    off = rng_.Uniform(units) * a;
    len = std::min(rng_.Range(1, 40) * a, size - off);
  } else if (r < 86) {
    // Unaligned start, ending on a cluster boundary, or the reverse.
    len = LogUniform(rng_, 1, std::min(size, 3 * cs));
    if (rng_.OneIn(2)) {
      uint64_t end = AlignDown(rng_.Range(len, size), cs);
      if (end < len) end = std::min(size, cs);
      off = end >= len ? end - len : 0;
      len = std::min(len, size - off);
    } else {
      off = AlignDown(rng_.Uniform(size), cs);
      len = std::min(len, size - off);
    }
  } else if (r < 96) {
    // Spanning many clusters, unaligned.
    uint64_t max_long = config_.max_long_length ? config_.max_long_length
                                                : size / 2;
    max_long = std::max<uint64_t>(std::min(max_long, size), 1);
    const uint64_t lo = std::min(max_long, 3 * cs + 1);
    len = LogUniform(rng_, lo, max_long);
    off = rng_.Uniform(size - len + 1);
  } else {
    // The whole disk, or from 0 / to the end.
    const uint64_t k = rng_.Uniform(3);
    if (k == 0) {
      off = 0;
      len = size;
    } else if (k == 1) {
      off = 0;
      len = rng_.Range(1, size);
    } else {
      off = rng_.Uniform(size);
      len = size - off;
    }
  }
  if (config_.max_long_length != 0 && len > config_.max_long_length) {
    // Capped (the whole-disk kind too): keep the range's end or start.
    if (off + len == size && rng_.OneIn(2)) off = size - config_.max_long_length;
    len = config_.max_long_length;
  }
  if (len == 0) len = 1;
  if (off >= size) off = size - 1;
  if (len > size - off) len = size - off;
  *offset = off;
  *length = len;
}

ModelOp OpGenerator::DataOp(ModelOp::Kind kind, uint64_t disk_size) {
  ModelOp op;
  op.kind = kind;
  RandomRange(disk_size, &op.offset, &op.length);
  if (kind == ModelOp::Kind::kWrite && last_write_end_ < disk_size &&
      rng_.OneIn(3)) {
    // A stream: small 4 KiB-aligned writes that follow one another (what
    // deferred copy-on-write waits for), sometimes starting back inside
    // the last write's 4 KiB.
    op.offset = last_write_end_ / 4096 * 4096;
    if (rng_.OneIn(8)) op.offset = last_write_end_;  // unaligned: no stream
    op.length = std::min<uint64_t>(4096 * rng_.Range(1, 4),
                                   disk_size - op.offset);
  }
  if (kind == ModelOp::Kind::kWrite) last_write_end_ = op.offset + op.length;
  if (kind == ModelOp::Kind::kWrite) op.data_seed = rng_.Next() >> 16;
  if (kind == ModelOp::Kind::kZero) op.unmap = rng_.OneIn(2);
  return op;
}

ModelOp OpGenerator::Next(uint64_t disk_size, int depth) {
  const OpWeights& w = config_.weights;
  const int overlay = depth < config_.max_depth ? w.overlay : 0;
  const int total =
      w.write + w.zero + w.discard + w.flush + w.reopen + overlay + w.resize;
  int r = static_cast<int>(rng_.Uniform(total));
  if ((r -= w.write) < 0) return DataOp(ModelOp::Kind::kWrite, disk_size);
  if ((r -= w.zero) < 0) return DataOp(ModelOp::Kind::kZero, disk_size);
  if ((r -= w.discard) < 0) return DataOp(ModelOp::Kind::kDiscard, disk_size);
  ModelOp op;
  if ((r -= w.flush) < 0) {
    op.kind = ModelOp::Kind::kFlush;
  } else if ((r -= w.reopen) < 0) {
    op.kind = ModelOp::Kind::kReopen;
  } else if ((r -= overlay) >= 0) {
    op.kind = ModelOp::Kind::kResize;
    if (rng_.OneIn(6) && disk_size > 512) {
      // Shrinking (which must fail and change nothing).
      op.new_size = disk_size - 512 * rng_.Range(1, 8);
    } else {
      // Grow by sectors, by clusters, or by many clusters (an L1 table
      // that no longer covers the disk is reallocated).
      const uint64_t cs = config_.cluster_size;
      uint64_t delta;
      switch (rng_.Uniform(3)) {
        case 0: delta = 512 * rng_.Range(1, 8); break;
        case 1: delta = LogUniform(rng_, 1, 4 * cs); break;
        default: delta = LogUniform(rng_, cs, std::max(cs, disk_size)); break;
      }
      op.new_size = disk_size + delta;
      if (rng_.OneIn(2)) op.new_size = (op.new_size + 511) / 512 * 512;
      if (config_.max_size != 0 && op.new_size > config_.max_size) {
        op.new_size = disk_size;
      }
    }
  } else {
    op.kind = ModelOp::Kind::kOverlay;
    if (config_.resize_overlays && rng_.OneIn(5)) {
      // Grow or shrink by some sectors, possibly clusters (sizes stay
      // multiples of 512 as qcow2 requires).
      const uint64_t delta =
          512 * LogUniform(rng_, 1, std::max<uint64_t>(
                                        1, 4 * config_.cluster_size / 512));
      if (rng_.OneIn(2) || disk_size < config_.min_size + delta) {
        op.new_size = disk_size + delta;
      } else {
        op.new_size = disk_size - delta;
      }
      op.new_size = (op.new_size + 511) / 512 * 512;
      if (op.new_size == disk_size ||
          (config_.max_size != 0 && op.new_size > config_.max_size)) {
        op.new_size = 0;
      }
    }
  }
  return op;
}

std::string FormatOpLog(const std::vector<ModelOp>& ops, int mark,
                        size_t keep) {
  std::string out;
  const size_t n = ops.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 2 * keep && i == keep) {
      absl::StrAppend(&out, "    ... ", n - 2 * keep, " ops omitted ...\n");
      i = n - keep - 1;
      continue;
    }
    absl::StrAppendFormat(&out, "  #%-4d %s%s\n", i, ops[i].ToString(),
                          static_cast<int>(i) == mark ? "   <== failed here"
                                                      : "");
  }
  return out;
}

}  // namespace qcow2::testing
