// SPDX-License-Identifier: Apache-2.0
// The sizes `qemu-img measure` reports for a new image: what the file
// needs at least for the data given, and fully allocated. The formulas are
// QEMU's (qcow2_measure, qcow2_calc_prealloc_size, raw_measure), so that
// the numbers agree with qemu-img's to the byte.
#include <utility>
#include <vector>

#include "qcow2/maintenance.h"

namespace qcow2 {
namespace {

constexpr uint64_t kMaxL1Bytes = 32u << 20;  // QEMU's QCOW_MAX_L1_SIZE
constexpr uint64_t kTableEntryBytes = 8;      // L1 and refcount table entries
constexpr uint64_t kSectorBytes = 512;

uint64_t DivRoundUp(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
uint64_t RoundUp(uint64_t a, uint64_t b) { return DivRoundUp(a, b) * b; }

// Bytes of refcount table and blocks that count `clusters` clusters and
// themselves (QEMU's qcow2_refcount_metadata_size without the generous
// increase).
uint64_t RefcountMetadataBytes(uint64_t clusters, uint64_t cluster_size,
                               uint32_t refcount_bits) {
  const uint64_t per_table_cluster = cluster_size / kTableEntryBytes;
  const uint64_t per_block = cluster_size * 8 / refcount_bits;
  uint64_t table = 0, blocks = 0, n = 0, last = 0;
  // The fixed point where the refcount structures also count themselves.
  do {
    last = n;
    blocks = DivRoundUp(clusters + table + blocks, per_block);
    table = DivRoundUp(blocks, per_table_cluster);
    n = clusters + blocks + table;
  } while (n != last);
  return (blocks + table) * cluster_size;
}

// Everything a fully allocated qcow2 image of `virtual_size` bytes holds:
// header cluster, L2 and L1 tables, refcount structures, data.
uint64_t FullyAllocatedBytes(const MeasureTarget& t, uint64_t virtual_size) {
  const uint64_t cs = t.cluster_size;
  const uint64_t l2e = t.extended_l2 ? 16 : 8;
  const uint64_t aligned = RoundUp(virtual_size, cs);
  uint64_t meta = cs;  // the header
  const uint64_t l2_entries = RoundUp(aligned / cs, cs / l2e);
  meta += l2_entries * l2e;
  const uint64_t l1_entries =
      RoundUp(l2_entries * l2e / cs, cs / kTableEntryBytes);
  meta += l1_entries * kTableEntryBytes;
  meta += RefcountMetadataBytes((meta + aligned) / cs, cs, t.refcount_bits);
  return meta + aligned;
}

// Bitmap clusters, bitmap tables and the directory, as if every bitmap of
// a disk of `disk_size` bytes were copied into clusters of `cs` bytes.
uint64_t BitmapBytes(const std::vector<MeasureSource::Bitmap>& bitmaps,
                     uint64_t disk_size, uint64_t cs) {
  uint64_t total = 0, directory = 0;
  for (const MeasureSource::Bitmap& b : bitmaps) {
    const uint64_t bits = DivRoundUp(disk_size, b.granularity);
    const uint64_t clusters = DivRoundUp(DivRoundUp(bits, 8), cs);
    total += clusters * cs;                              // the bitmap
    total += RoundUp(clusters * kTableEntryBytes, cs);  // its table
    directory += RoundUp(24 + b.name_length, 8);        // its entry
  }
  return total + RoundUp(directory, cs);
}

MeasureReport MeasureRaw(const MeasureTarget& t, const MeasureSource* src) {
  MeasureReport r;
  r.required = src != nullptr ? src->size : RoundUp(t.size, kSectorBytes);
  r.fully_allocated = r.required;
  return r;
}


}  // namespace

absl::StatusOr<MeasureReport> Measure(const MeasureTarget& t,
                                      const MeasureSource* src) {
  if (t.format == ImageFormat::kRaw) return MeasureRaw(t, src);
  const uint64_t cs = t.cluster_size;
  uint64_t virtual_size = RoundUp(t.size, cs);
  const uint64_t l2e = t.extended_l2 ? 16 : 8;
  const uint64_t l2_tables = DivRoundUp(virtual_size / cs, cs / l2e);
  if (l2_tables * kTableEntryBytes > kMaxL1Bytes) {
    return absl::InvalidArgumentError(
        "The image size is too large (try using a larger cluster size)");
  }
  uint64_t data = 0;
  if (src != nullptr) {
    virtual_size = RoundUp(src->size, cs);
    // With a backing file nothing is known to be shared: count it all.
    data = t.has_backing_file ? virtual_size : src->data_bytes;
  }
  if (t.preallocation == Preallocation::kFull ||
      t.preallocation == Preallocation::kFalloc) {
    data = virtual_size;
  }
  MeasureReport r;
  r.fully_allocated = FullyAllocatedBytes(t, virtual_size);
  r.required = r.fully_allocated - virtual_size + data;
  if (t.version >= 3 && src != nullptr && src->bitmaps.has_value()) {
    r.bitmaps = BitmapBytes(*src->bitmaps, src->size, cs);
  }
  return r;
}

MeasureTarget MeasureTargetFor(const CreateOptions& opts) {
  MeasureTarget t;
  t.format = opts.format;
  t.cluster_size = opts.cluster_size;
  t.extended_l2 = opts.extended_l2;
  t.version = opts.compat == "0.10" || opts.compat == "v2" ? 2 : 3;
  t.refcount_bits = opts.refcount_bits;
  t.preallocation = opts.preallocation;
  t.has_backing_file = !opts.backing_file.empty();
  t.size = opts.size;
  return t;
}

absl::StatusOr<MeasureSource> MeasureSourceOf(Image& image,
                                              const MeasureTarget& target) {
  MeasureSource src;
  src.size = image.size();
  if (target.format == ImageFormat::kQcow2) {
    // QEMU's walk: ranges that read as zeros cost nothing; a range of
    // data allocated in the chain costs the target's clusters it touches.
    const uint64_t cs = target.cluster_size;
    for (uint64_t offset = 0, n = 0; offset < src.size; offset += n) {
      absl::StatusOr<BlockStatus> bs =
          image.GetBlockStatus(offset, src.size - offset);
      if (!bs.ok()) return bs.status();
      n = bs->length;
      if (!bs->zero && bs->data && bs->present) {
        n = (offset + n + cs - 1) / cs * cs - offset;
        src.data_bytes += offset % cs + n;
      }
    }
  }
  const LayerInfo top = image.GetChainInfo().front();
  if (top.format == ImageFormat::kQcow2 && top.version >= 3) {
    if (!top.bitmaps_error.empty()) {
      return absl::DataLossError(top.bitmaps_error);
    }
    std::vector<MeasureSource::Bitmap> bitmaps;
    for (const BitmapInfo& b : top.bitmaps) {
      bitmaps.push_back({b.name.size(), b.granularity});
    }
    src.bitmaps = std::move(bitmaps);
  }
  return src;
}

}  // namespace qcow2
