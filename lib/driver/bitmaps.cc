// SPDX-License-Identifier: Apache-2.0
#include "lib/driver/bitmaps.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/base/endian.h"
#include "lib/base/events.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/driver/pending_clusters.h"

namespace qcow2::internal {

namespace {

// The bitmaps extension in `h`, or null.
const RawExtension* FindExtension(const Header& h) {
  for (const RawExtension& e : h.other_extensions) {
    if (e.magic == kExtBitmaps) return &e;
  }
  return nullptr;
}

// Whether `h` claims consistent bitmaps: a v3 header with the extension
// and its autoclear bit.
bool HasConsistentExtension(const Header& h) {
  return h.version >= 3 && (h.autoclear_features & kAutoclearBitmaps) &&
         FindExtension(h) != nullptr;
}

absl::Status ReadAt(File* file, uint64_t offset, absl::Span<uint8_t> buf,
                    const std::string& what) {
  absl::Status s = file->ReadAt(offset, buf);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(file->name(), ": reading ",
                                               what, ": ", s.message()));
  }
  return absl::OkStatus();
}

// Decodes the extension and reads and decodes the directory.
absl::StatusOr<std::pair<BitmapsExtension, std::vector<BitmapDirEntry>>>
ReadDirectory(File* file, const Header& h, uint64_t file_size) {
  const RawExtension* raw = FindExtension(h);
  ASSIGN_OR_RETURN(BitmapsExtension ext,
                   DecodeBitmapsExtension(raw->data, h, file_size,
                                          file->name()));
  std::vector<uint8_t> dir(ext.directory_size);
  RETURN_IF_ERROR(ReadAt(file, ext.directory_offset, absl::MakeSpan(dir),
                         "the bitmap directory"));
  ASSIGN_OR_RETURN(std::vector<BitmapDirEntry> entries,
                   DecodeBitmapDirectory(dir, ext, h, file_size, file->name()));
  return std::make_pair(ext, std::move(entries));
}

// Clears the bits of `bits` past bit `nbits` (tail bits must be zero).
void ClearTail(std::vector<uint8_t>* bits, uint64_t nbits) {
  if (nbits % 8 != 0 && !bits->empty()) {
    (*bits)[nbits / 8] &= static_cast<uint8_t>((1u << (nbits % 8)) - 1);
  }
}

// Sets bits [first, last] of `bits`.
void SetBits(std::vector<uint8_t>* bits, uint64_t first, uint64_t last) {
  uint8_t* p = bits->data();
  while (first <= last && first % 8 != 0) {
    p[first / 8] |= static_cast<uint8_t>(1u << (first % 8));
    ++first;
  }
  if (first > last) return;
  const uint64_t full_end = (last + 1) / 8;  // bytes [first/8, full_end)
  if (full_end > first / 8) {
    std::memset(p + first / 8, 0xff, full_end - first / 8);
    first = full_end * 8;
  }
  for (; first <= last; ++first) {
    p[first / 8] |= static_cast<uint8_t>(1u << (first % 8));
  }
}

bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<BitmapInfo>> ListBitmaps(File* file,
                                                    const Header& h,
                                                    uint64_t file_size) {
  std::vector<BitmapInfo> out;
  if (!HasConsistentExtension(h)) return out;
  ASSIGN_OR_RETURN(auto dir, ReadDirectory(file, h, file_size));
  for (const BitmapDirEntry& e : dir.second) {
    BitmapInfo& b = out.emplace_back();
    b.name = e.name;
    b.granularity = e.granularity();
    b.enabled = (e.flags & kBitmapAuto) != 0;
    b.in_use = (e.flags & kBitmapInUse) != 0;
  }
  return out;
}

absl::Status DirtyBitmaps::LoadReadOnly() {
  if (loaded_ || s_->writable) return absl::OkStatus();
  if (!HasConsistentExtension(s_->header)) return absl::OkStatus();
  absl::Status s = Load();
  if (!s.ok()) {
    bitmaps_.clear();
    return s;
  }
  loaded_ = true;
  return absl::OkStatus();
}

absl::Status DirtyBitmaps::Load() {
  const Header& h = s_->header;
  const std::string& name = s_->file->name();
  ASSIGN_OR_RETURN(auto dir, ReadDirectory(s_->file.get(), h, s_->file_size));
  for (BitmapDirEntry& e : dir.second) {
    if (std::string why = BitmapUnsupported(e); !why.empty()) {
      return absl::UnimplementedError(absl::StrCat(
          name, ": ", why, "; an image with such a bitmap can only be "
          "opened read-only"));
    }
    Bitmap b;
    b.entry = std::move(e);
    b.consistent = (b.entry.flags & kBitmapInUse) == 0;
    b.enabled = (b.entry.flags & kBitmapAuto) != 0;
    RETURN_IF_ERROR(LoadTable(&b, b.consistent));
    bitmaps_.push_back(std::move(b));
  }
  return absl::OkStatus();
}

absl::Status DirtyBitmaps::OpenForWriting() {
  if (!HasConsistentExtension(s_->header)) return absl::OkStatus();
  RETURN_IF_ERROR(Load());
  maintained_ = true;
  header_writer_->set_kept_autoclear(kAutoclearBitmaps);
  // Mark the consistent ones in use before anything else is written.
  std::vector<BitmapDirEntry> entries;
  bool any = false;
  for (const Bitmap& b : bitmaps_) {
    entries.push_back(b.entry);
    if (b.consistent) {
      entries.back().flags |= kBitmapInUse;
      any = true;
    }
  }
  if (!any) return absl::OkStatus();
  EmitEvent("bitmaps-in-use");
  RETURN_IF_ERROR(SwitchDirectory(entries));
  for (size_t i = 0; i < bitmaps_.size(); ++i) {
    bitmaps_[i].entry.flags = entries[i].flags;
  }
  return absl::OkStatus();
}

absl::Status DirtyBitmaps::LoadTable(Bitmap* b, bool load) {
  const Header& h = s_->header;
  const BitmapDirEntry& e = b->entry;
  const uint64_t cs = h.cluster_size();
  std::vector<uint8_t> raw(uint64_t{e.table_size} * 8);
  RETURN_IF_ERROR(ReadAt(s_->file.get(), e.table_offset, absl::MakeSpan(raw),
                         absl::StrCat("the table of bitmap '", e.name, "'")));
  const uint64_t nbits = DivRoundUp(h.size, e.granularity());
  if (load) b->bits.assign(BitmapDataBytes(h.size, e.granularity_bits), 0);
  std::vector<uint8_t> cluster(load ? cs : 0);
  for (uint64_t i = 0; i < e.table_size; ++i) {
    const uint64_t entry = LoadBE64(&raw[i * 8]);
    RETURN_IF_ERROR(CheckBitmapTableEntry(entry, i, e.table_offset, e, h,
                                          s_->file_size, s_->file->name()));
    const uint64_t off = entry & kBitmapTableOffsetMask;
    if (off != 0) b->data_clusters.push_back(off);
    if (!load || i * cs >= b->bits.size()) continue;
    const uint64_t n = std::min<uint64_t>(cs, b->bits.size() - i * cs);
    if (off != 0) {
      RETURN_IF_ERROR(ReadAt(s_->file.get(), off, absl::MakeSpan(cluster),
                             absl::StrCat("the data of bitmap '", e.name,
                                          "'")));
      std::memcpy(&b->bits[i * cs], cluster.data(), n);
    } else if (entry & kBitmapTableAllOnes) {
      std::memset(&b->bits[i * cs], 0xff, n);
    }
  }
  if (load) ClearTail(&b->bits, nbits);
  return absl::OkStatus();
}

void DirtyBitmaps::Resize(Bitmap* b) {
  const Header& h = s_->header;
  const uint32_t g = b->entry.granularity_bits;
  const uint64_t need = BitmapDataBytes(h.size, g);
  if (b->bits.size() >= need) return;
  if (CheckNewBitmap(b->entry.name, b->entry.granularity(), h.size,
                     h.cluster_bits)
          .ok()) {
    b->bits.resize(need, 0);
    return;
  }
  // The disk grew past what this bitmap can describe (QEMU's limits):
  // it can no longer be maintained. It stays in use on disk (a bitmap
  // added since the last store is dropped), as after a crash.
  b->consistent = false;
  b->changed = false;
  b->bits.clear();
  b->bits.shrink_to_fit();
}

void DirtyBitmaps::Mark(uint64_t offset, uint64_t len) {
  if (!maintained_ || len == 0) return;
  for (Bitmap& b : bitmaps_) {
    if (!b.consistent || !b.enabled) continue;
    Resize(&b);
    if (!b.consistent) continue;
    const uint32_t g = b.entry.granularity_bits;
    const uint64_t first = offset >> g;
    uint64_t last = (offset + len - 1) >> g;
    if (b.bits.empty() || first >= b.bits.size() * 8) continue;
    last = std::min<uint64_t>(last, b.bits.size() * 8 - 1);
    SetBits(&b.bits, first, last);
    b.changed = true;
  }
}

absl::StatusOr<uint64_t> DirtyBitmaps::Allocate(uint64_t bytes) {
  const uint32_t cb = s_->header.cluster_bits;
  const uint64_t clusters = DivRoundUp(bytes, s_->header.cluster_size());
  absl::StatusOr<uint64_t> off = s_->refcounts->Allocate(clusters);
  if (!off.ok()) return header_writer_->Fail(off.status());
  s_->refcounts->NoteMetadataEnd((*off >> cb) + clusters);
  return *off;
}

absl::Status DirtyBitmaps::Free(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return header_writer_->Fail(s_->refcounts->Update(
      offset, AlignUp(bytes, s_->header.cluster_size()), -1));
}

absl::Status DirtyBitmaps::FreeTable(
    const BitmapDirEntry& e, const std::vector<uint64_t>& data_clusters) {
  for (uint64_t off : data_clusters) {
    RETURN_IF_ERROR(Free(off, s_->header.cluster_size()));
  }
  return Free(e.table_offset, uint64_t{e.table_size} * 8);
}

absl::Status DirtyBitmaps::WriteData(Bitmap* b, uint64_t* table_offset,
                                     uint32_t* table_size,
                                     std::vector<uint64_t>* clusters) {
  const Header& h = s_->header;
  const uint64_t cs = h.cluster_size();
  Resize(b);
  const uint64_t entries =
      BitmapTableEntries(h.size, b->entry.granularity_bits, h.cluster_bits);
  std::vector<uint8_t> table(AlignUp(std::max<uint64_t>(entries, 1) * 8, cs),
                             0);
  std::vector<uint8_t> buf(cs);
  for (uint64_t i = 0; i < entries; ++i) {
    const uint64_t n = std::min<uint64_t>(cs, b->bits.size() - i * cs);
    if (AllZero(&b->bits[i * cs], n)) continue;  // entry 0: reads as zeros
    std::fill(buf.begin(), buf.end(), 0);
    std::memcpy(buf.data(), &b->bits[i * cs], n);
    ASSIGN_OR_RETURN(uint64_t off, Allocate(cs));
    clusters->push_back(off);
    RETURN_IF_ERROR(header_writer_->Fail(s_->meta->WriteAt(off, buf)));
    StoreBE64(&table[i * 8], off);
  }
  ASSIGN_OR_RETURN(*table_offset, Allocate(table.size()));
  *table_size = static_cast<uint32_t>(entries);
  return header_writer_->Fail(s_->meta->WriteAt(*table_offset, table));
}

absl::Status DirtyBitmaps::SwitchDirectory(
    const std::vector<BitmapDirEntry>& entries) {
  RETURN_IF_ERROR(header_writer_->PrepareWrite());
  Header& header = s_->header;
  const RawExtension* raw = FindExtension(header);
  BitmapsExtension old;
  if (raw != nullptr && raw->data.size() == kBitmapsExtensionSize) {
    old.directory_size = LoadBE64(&raw->data[8]);
    old.directory_offset = LoadBE64(&raw->data[16]);
  }
  BitmapsExtension ext;
  if (!entries.empty()) {
    std::vector<uint8_t> dir = EncodeBitmapDirectory(entries);
    if (entries.size() > kMaxBitmaps || dir.size() > kMaxBitmapDirectorySize) {
      return absl::ResourceExhaustedError(absl::StrCat(
          s_->file->name(), ": too many bitmaps (", entries.size(),
          ", directory of ", dir.size(), " bytes)"));
    }
    ext.nb_bitmaps = static_cast<uint32_t>(entries.size());
    ext.directory_size = dir.size();
    dir.resize(AlignUp(dir.size(), header.cluster_size()), 0);
    ASSIGN_OR_RETURN(ext.directory_offset, Allocate(dir.size()));
    RETURN_IF_ERROR(
        header_writer_->Fail(s_->meta->WriteAt(ext.directory_offset, dir)));
  }
  // Data, tables, directory and their refcounts durable before the header
  // names them.
  RETURN_IF_ERROR(pending_->SettleAndFlush());
  const Header before = header;
  auto& exts = header.other_extensions;
  exts.erase(std::remove_if(exts.begin(), exts.end(),
                            [](const RawExtension& e) {
                              return e.magic == kExtBitmaps;
                            }),
             exts.end());
  if (entries.empty()) {
    header.autoclear_features &= ~kAutoclearBitmaps;
    header_writer_->set_kept_autoclear(0);
    maintained_ = false;
  } else {
    exts.push_back(RawExtension{kExtBitmaps, EncodeBitmapsExtension(ext)});
    header.autoclear_features |= kAutoclearBitmaps;
  }
  EmitEvent("bitmap-directory-switch");
  absl::Status s = header_writer_->WriteWholeHeader();
  if (!s.ok()) {
    header = before;  // the new directory leaks at most
    if (entries.empty()) {
      header_writer_->set_kept_autoclear(kAutoclearBitmaps);
      maintained_ = true;
    }
    return s;
  }
  return Free(old.directory_offset, old.directory_size);
}

absl::Status DirtyBitmaps::Store() {
  if (!maintained_) return absl::OkStatus();
  // A bitmap added since the last store and outgrown by the disk since
  // (Resize) was never on disk: it goes.
  for (Bitmap& b : bitmaps_) {
    if (b.consistent) Resize(&b);
  }
  const size_t before = bitmaps_.size();
  bitmaps_.erase(std::remove_if(bitmaps_.begin(), bitmaps_.end(),
                                [](const Bitmap& b) {
                                  return !b.consistent &&
                                         b.entry.table_offset == 0;
                                }),
                 bitmaps_.end());
  if (bitmaps_.size() != before) edited_ = true;
  // New tables for the changed bitmaps; the old ones are freed only once
  // the header names the new directory.
  std::vector<BitmapDirEntry> entries;
  std::vector<std::vector<uint64_t>> new_clusters(bitmaps_.size());
  bool any = edited_;
  for (size_t i = 0; i < bitmaps_.size(); ++i) {
    Bitmap& b = bitmaps_[i];
    BitmapDirEntry e = b.entry;
    if (b.consistent) {
      if (b.changed) {
        RETURN_IF_ERROR(
            WriteData(&b, &e.table_offset, &e.table_size, &new_clusters[i]));
      }
      e.flags = b.enabled ? kBitmapAuto : 0;
    }
    any = any || e.flags != b.entry.flags || b.changed;
    entries.push_back(std::move(e));
  }
  if (!any) return absl::OkStatus();
  EmitEvent("bitmaps-store");
  RETURN_IF_ERROR(SwitchDirectory(entries));
  // The header names the new directory: free what it no longer names.
  absl::Status freed;
  for (size_t i = 0; i < bitmaps_.size(); ++i) {
    Bitmap& b = bitmaps_[i];
    if (b.consistent && b.changed) {
      if (freed.ok()) freed = FreeTable(b.entry, b.data_clusters);
      b.data_clusters = std::move(new_clusters[i]);
    }
    b.entry = entries[i];
    b.changed = false;
  }
  for (const Bitmap& b : removed_) {
    if (freed.ok()) freed = FreeTable(b.entry, b.data_clusters);
  }
  removed_.clear();
  edited_ = false;
  return freed;
}

DirtyBitmaps::Bitmap* DirtyBitmaps::Find(const std::string& name) {
  return const_cast<Bitmap*>(std::as_const(*this).Find(name));
}

const DirtyBitmaps::Bitmap* DirtyBitmaps::Find(const std::string& name) const {
  for (const Bitmap& b : bitmaps_) {
    if (b.entry.name == name) return &b;
  }
  return nullptr;
}

absl::StatusOr<DirtyBitmaps::Bitmap*> DirtyBitmaps::FindUsable(
    const std::string& name) {
  ASSIGN_OR_RETURN(const Bitmap* b, std::as_const(*this).FindUsable(name));
  return const_cast<Bitmap*>(b);
}

absl::Status DirtyBitmaps::Add(const std::string& name, uint64_t granularity,
                               bool enabled) {
  const Header& h = s_->header;
  if (!s_->writable) {
    return absl::FailedPreconditionError(
        absl::StrCat(s_->file->name(), " is not open for writing"));
  }
  if (!maintained_ && FindExtension(h) != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        s_->file->name(), ": the bitmaps extension is marked inconsistent "
        "(autoclear bit clear); repair the image first"));
  }
  if (absl::Status s =
          CheckNewBitmap(name, granularity, h.size, h.cluster_bits);
      !s.ok()) {
    if (name.empty() || name.size() > kMaxBitmapNameSize ||
        absl::StartsWith(s.message(), "Granularity")) {
      return s;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("Can't make bitmap '", name, "' persistent in '",
                     s_->file->name(), "': ", s.message()));
  }
  if (Find(name) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("Bitmap already exists: ", name));
  }
  if (h.version < 3) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Can't make bitmap '", name, "' persistent in '", s_->file->name(),
        "': Cannot store dirty bitmaps in qcow2 v2 files"));
  }
  if (bitmaps_.size() >= kMaxBitmaps) {
    return absl::ResourceExhaustedError(
        "Maximum number of persistent bitmaps is already reached");
  }
  Bitmap b;
  b.entry.name = name;
  b.entry.granularity_bits =
      static_cast<uint8_t>(__builtin_ctzll(granularity));
  b.entry.type = kBitmapTypeDirty;
  b.entry.flags = kBitmapInUse;  // nothing on disk yet
  b.consistent = true;
  b.changed = true;
  b.enabled = enabled;
  b.bits.assign(BitmapDataBytes(h.size, b.entry.granularity_bits), 0);
  bitmaps_.push_back(std::move(b));
  if (!maintained_) {
    maintained_ = true;
    header_writer_->set_kept_autoclear(kAutoclearBitmaps);
  }
  edited_ = true;
  return absl::OkStatus();
}

absl::Status DirtyBitmaps::Remove(const std::string& name) {
  for (size_t i = 0; i < bitmaps_.size(); ++i) {
    if (bitmaps_[i].entry.name != name) continue;
    Bitmap b = std::move(bitmaps_[i]);
    bitmaps_.erase(bitmaps_.begin() + static_cast<ptrdiff_t>(i));
    // A bitmap added since the last store has no table on disk.
    if (b.entry.table_offset != 0) removed_.push_back(std::move(b));
    edited_ = true;
    return absl::OkStatus();
  }
  return absl::NotFoundError(
      absl::StrCat("Dirty bitmap '", name, "' not found"));
}

absl::Status DirtyBitmaps::Clear(const std::string& name) {
  ASSIGN_OR_RETURN(Bitmap * b, FindUsable(name));
  std::fill(b->bits.begin(), b->bits.end(), 0);
  b->changed = true;
  return absl::OkStatus();
}

absl::Status DirtyBitmaps::SetEnabled(const std::string& name, bool enabled) {
  ASSIGN_OR_RETURN(Bitmap * b, FindUsable(name));
  b->enabled = enabled;
  return absl::OkStatus();
}

absl::StatusOr<const DirtyBitmaps::Bitmap*> DirtyBitmaps::FindUsable(
    const std::string& name) const {
  const Bitmap* b = Find(name);
  if (b == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("Dirty bitmap '", name, "' not found"));
  }
  if (!b->consistent) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Bitmap '", name, "' is inconsistent and cannot be used"));
  }
  return b;
}

absl::StatusOr<std::pair<std::vector<uint8_t>, uint32_t>> DirtyBitmaps::Bits(
    const std::string& name) const {
  ASSIGN_OR_RETURN(const Bitmap* b, FindUsable(name));
  return std::make_pair(b->bits, uint32_t{b->entry.granularity_bits});
}

absl::StatusOr<BitmapStatus> DirtyBitmaps::Status(const std::string& name,
                                                  uint64_t offset,
                                                  uint64_t max_len) const {
  ASSIGN_OR_RETURN(const Bitmap* b, FindUsable(name));
  const uint64_t size = s_->header.size;
  if (offset >= size) {
    return absl::OutOfRangeError(absl::StrCat(
        "offset ", offset, " is past the end of the image (", size, ")"));
  }
  if (max_len == 0) {
    return absl::InvalidArgumentError("bitmap status of an empty range");
  }
  const uint64_t end = offset + std::min(max_len, size - offset);
  const uint32_t g = b->entry.granularity_bits;
  // Bits past the loaded ones (a disk grown since, for a disabled bitmap)
  // are clean: no write reached them while it recorded.
  const uint64_t nbits = b->bits.size() * 8;
  auto bit = [&](uint64_t i) {
    return i < nbits && (b->bits[i / 8] & (1u << (i % 8))) != 0;
  };
  const uint64_t last = (end - 1) >> g;
  uint64_t i = offset >> g;
  const bool dirty = bit(i);
  const uint8_t same = dirty ? 0xff : 0x00;
  ++i;
  while (i <= last) {
    // Whole bytes at a time where they are uniform.
    if (i % 8 == 0 && i + 8 <= last + 1 &&
        (i >= nbits ? !dirty : b->bits[i / 8] == same)) {
      i += 8;
      continue;
    }
    if (bit(i) != dirty) break;
    ++i;
  }
  BitmapStatus st;
  st.offset = offset;
  st.length = std::min(end, i << g) - offset;
  st.dirty = dirty;
  return st;
}

absl::Status DirtyBitmaps::MergeInto(const std::string& dst,
                                     const std::vector<uint8_t>& bits,
                                     uint32_t granularity_bits) {
  ASSIGN_OR_RETURN(Bitmap * b, FindUsable(dst));
  Resize(b);
  // Every granule of the source that is set dirties the destination's
  // granules it overlaps.
  const uint64_t size = s_->header.size;
  const uint32_t g = b->entry.granularity_bits;
  for (uint64_t i = 0; i < bits.size() * 8; ++i) {
    if (!(bits[i / 8] & (1u << (i % 8)))) continue;
    const uint64_t start = i << granularity_bits;
    if (start >= size) break;
    const uint64_t end = std::min(size, start + (uint64_t{1} << granularity_bits));
    SetBits(&b->bits, start >> g, (end - 1) >> g);
  }
  b->changed = true;
  return absl::OkStatus();
}

std::vector<BitmapInfo> DirtyBitmaps::List() const {
  std::vector<BitmapInfo> out;
  for (const Bitmap& b : bitmaps_) {
    BitmapInfo& info = out.emplace_back();
    info.name = b.entry.name;
    info.granularity = b.entry.granularity();
    info.enabled = b.enabled;
    info.in_use = !b.consistent;
  }
  return out;
}

}  // namespace qcow2::internal
