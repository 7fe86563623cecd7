// SPDX-License-Identifier: Apache-2.0
#include "lib/io/io_plan.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "lib/base/status_macros.h"
#include "lib/io/accounted_file.h"
#include "lib/io/data_cipher.h"

namespace qcow2::internal {

namespace {
constexpr size_t kMaxIov = IOV_MAX;
}  // namespace

void IoPlan::Free::operator()(uint8_t* p) const { std::free(p); }

const DataCipher* CipherOf(const IoOp& op) {
  if (!AnyCipherAttached()) return nullptr;
  if (op.category == IoCategory::kMetadata || op.plain || op.punch ||
      op.file == nullptr) {
    return nullptr;
  }
  const auto* f = dynamic_cast<const AccountedFile*>(op.file);
  return f != nullptr ? f->cipher() : nullptr;
}

absl::Status EncryptOpInto(const DataCipher& c, const IoOp& op, uint8_t* out) {
  if (op.zero_range) {
    std::memset(out, 0, op.bytes);
  } else {
    uint8_t* dst = out;
    for (const iovec& v : op.iov) {
      std::memcpy(dst, v.iov_base, v.iov_len);
      dst += v.iov_len;
    }
  }
  return c.Encrypt(op.offset, absl::MakeSpan(out, op.bytes));
}

uint8_t* IoPlan::Buffer(size_t len) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, len == 0 ? 4096 : (len + 4095) & ~size_t{4095}) != 0) {
    std::abort();  // out of memory
  }
  std::memset(p, 0, len);
  buffers_.emplace_back(static_cast<uint8_t*>(p));
  return static_cast<uint8_t*>(p);
}

void IoPlan::Read(File* file, uint64_t offset, uint8_t* dest, size_t len,
                  IoCategory category, bool plain) {
  if (len == 0) return;
  if (!reads.empty()) {
    IoOp& last = reads.back();
    if (last.file == file && last.category == category && last.plain == plain &&
        last.offset + last.bytes == offset && last.iov.size() < kMaxIov) {
      iovec& tail = last.iov.back();
      if (static_cast<uint8_t*>(tail.iov_base) + tail.iov_len == dest) {
        tail.iov_len += len;
        last.bytes += len;
      } else {
        last.Add(dest, len);
      }
      return;
    }
  }
  IoOp op;
  op.file = file;
  op.offset = offset;
  op.category = category;
  op.plain = plain;
  op.Add(dest, len);
  reads.push_back(std::move(op));
}

// Why first fills stay small: in a buffered file, the size of the writes
// that first fill a range sets how fast every later rewrite of it goes
// (the page cache's large folios are made to the first writes' size, we
// believe, and stay). A vhost-user-blk guest's 1 MiB sequential writes
// into a fresh overlay of 64 KiB clusters, then rewriting it: 0.93x
// qemu-storage-daemon's IOPS when the first fills were our merged 4 MiB
// writes, 1.22-1.29x with fills of 256 KiB (2 MiB fills were slower still,
// 64-256 KiB the fastest): bench/results/2026-12-07-vhost-first-fill.md.
// The extra writes happen once in a cluster's life (a 512 MiB convert
// into a new image: ~6% slower). O_DIRECT files have no folios to shape.
void IoPlan::CoalesceWrites() {
  if (writes.size() < 2) return;
  std::vector<IoOp> out;
  out.reserve(writes.size());
  for (IoOp& op : writes) {
    if (!out.empty()) {
      IoOp& last = out.back();
      if (last.file == op.file && last.offset + last.bytes == op.offset &&
          !last.zero_range && !op.zero_range && last.plain == op.plain &&
          last.iov.size() + op.iov.size() <= kMaxIov &&
          !(op.first_fill && last.bytes + op.bytes > kFirstFillMaxBytes &&
            op.file->alignment() == 1)) {
        // Pieces that follow each other in memory too (consecutive
        // clusters of one guest buffer) become one iovec: one 4 MiB write
        // of 64 KiB clusters is then one buffer, not 64.
        auto next = op.iov.begin();
        if (!last.iov.empty() && next != op.iov.end() &&
            static_cast<uint8_t*>(last.iov.back().iov_base) +
                    last.iov.back().iov_len ==
                next->iov_base) {
          last.iov.back().iov_len += next->iov_len;
          ++next;
        }
        last.iov.insert(last.iov.end(), next, op.iov.end());
        last.bytes += op.bytes;
        last.guest_bytes += op.guest_bytes;
        continue;
      }
    }
    out.push_back(std::move(op));
  }
  writes = std::move(out);
}

void IoPlan::Clear() {
  grow_file = nullptr;
  reads.clear();
  after_reads.clear();
  writes.clear();
  commits.clear();
  aborts.clear();
  decompressed.clear();
  buffers_.clear();
}

const uint8_t* ScatterBase() {
  return reinterpret_cast<const uint8_t*>(uintptr_t{1} << 62);
}

void MapIntoSegments(std::vector<IoOp>* ops, absl::Span<const iovec> segs) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(ScatterBase());
  uint64_t total = 0;
  for (const iovec& v : segs) total += v.iov_len;
  // Where each segment starts in the stand-in buffer.
  std::vector<uint64_t> starts;
  starts.reserve(segs.size());
  for (uint64_t at = 0; const iovec& v : segs) {
    starts.push_back(at);
    at += v.iov_len;
  }
  std::vector<IoOp> out;
  out.reserve(ops->size());
  for (IoOp& op : *ops) {
    bool mapped = false;
    for (const iovec& v : op.iov) {
      const uintptr_t p = reinterpret_cast<uintptr_t>(v.iov_base);
      if (p >= base && p - base < total) mapped = true;
    }
    if (!mapped) {
      out.push_back(std::move(op));
      continue;
    }
    // The op's iovecs, the guest bytes among them pointed into `segs`.
    std::vector<iovec> iov;
    std::vector<bool> guest;
    for (const iovec& v : op.iov) {
      const uintptr_t p = reinterpret_cast<uintptr_t>(v.iov_base);
      if (p < base || p - base >= total) {
        iov.push_back(v);
        guest.push_back(false);
        continue;
      }
      uint64_t at = p - base;
      uint64_t left = v.iov_len;
      // The segment holding `at`: the last one starting at or before it.
      size_t i = static_cast<size_t>(
          std::upper_bound(starts.begin(), starts.end(), at) - starts.begin() -
          1);
      while (left > 0 && i < segs.size()) {
        const uint64_t into = at - starts[i];
        const uint64_t n = std::min<uint64_t>(left, segs[i].iov_len - into);
        if (n > 0) {
          iov.push_back({static_cast<uint8_t*>(segs[i].iov_base) + into, n});
          guest.push_back(true);
        }
        at += n;
        left -= n;
        ++i;
      }
    }
    if (iov.size() <= kMaxIov) {
      op.iov = std::move(iov);
      out.push_back(std::move(op));
      continue;
    }
    // Too many iovecs for one call: consecutive ops, the guest bytes
    // counted where they are.
    uint64_t offset = op.offset;
    uint64_t guest_left = op.guest_bytes;
    for (size_t i = 0; i < iov.size(); i += kMaxIov) {
      IoOp piece;
      piece.file = op.file;
      piece.offset = offset;
      piece.category = op.category;
      uint64_t mapped_bytes = 0;
      for (size_t j = i; j < std::min(iov.size(), i + kMaxIov); ++j) {
        piece.Add(iov[j].iov_base, iov[j].iov_len);
        if (guest[j]) mapped_bytes += iov[j].iov_len;
      }
      piece.guest_bytes = std::min(guest_left, mapped_bytes);
      guest_left -= piece.guest_bytes;
      offset += piece.bytes;
      out.push_back(std::move(piece));
    }
    out.back().guest_bytes += guest_left;
  }
  *ops = std::move(out);
}

void CountIo(const IoOp& op, bool write, IoStats* stats) {
  if (stats == nullptr) return;
  if (op.category == IoCategory::kMetadata) return;
  if (op.zero_range) {
    stats->host_zero_ops++;
    stats->host_zero_bytes += op.bytes;
    return;
  }
  if (write) {
    stats->host_data_write_bytes += op.guest_bytes;
    stats->cow_write_bytes += op.bytes - op.guest_bytes;
  } else if (op.category == IoCategory::kCow) {
    stats->cow_read_bytes += op.bytes;
  } else {
    stats->host_data_read_bytes += op.bytes;
  }
}

namespace {

// RunOp for data of an encrypted file: written from an encrypted copy
// (zeros too: a zeroed range must read back as zeros through the cipher),
// read and then decrypted in place.
absl::Status RunCipherOp(IoOp& op, bool write, const DataCipher& c) {
  if (!write) {
    absl::Status s = op.iov.size() == 1
        ? op.file->ReadAt(op.offset,
                          absl::MakeSpan(static_cast<uint8_t*>(op.iov[0].iov_base),
                                         op.iov[0].iov_len))
        : op.file->ReadvAt(op.offset, op.iov);
    if (s.ok()) s = DecryptIov(c, op.offset, op.iov);
    if (s.ok()) op.done = op.bytes;
    return s;
  }
  // In pieces of at most 1 MiB (a long zero-range op).
  constexpr uint64_t kPiece = 1u << 20;
  IoPlan scratch;
  uint8_t* buf = scratch.Buffer(std::min<uint64_t>(op.bytes, kPiece));
  if (!op.zero_range && op.bytes <= kPiece) {
    RETURN_IF_ERROR(EncryptOpInto(c, op, buf));
    RETURN_IF_ERROR(op.file->WriteAt(op.offset, absl::MakeConstSpan(buf, op.bytes)));
    op.done = op.bytes;
    return absl::OkStatus();
  }
  for (uint64_t at = 0; at < op.bytes; at += kPiece) {
    const uint64_t n = std::min<uint64_t>(kPiece, op.bytes - at);
    IoOp piece;
    piece.offset = op.offset + at;
    piece.bytes = n;
    piece.zero_range = op.zero_range;
    if (!op.zero_range) {
      // The iovecs of [at, at + n) of op.
      uint64_t want = n, pos = 0;
      for (const iovec& v : op.iov) {
        if (pos + v.iov_len <= at) {
          pos += v.iov_len;
          continue;
        }
        const uint64_t into = at > pos ? at - pos : 0;
        const uint64_t take = std::min<uint64_t>(v.iov_len - into, want);
        piece.iov.push_back({static_cast<uint8_t*>(v.iov_base) + into, take});
        want -= take;
        pos += v.iov_len;
        if (want == 0) break;
      }
    }
    RETURN_IF_ERROR(EncryptOpInto(c, piece, buf));
    RETURN_IF_ERROR(op.file->WriteAt(piece.offset, absl::MakeConstSpan(buf, n)));
  }
  op.done = op.bytes;
  return absl::OkStatus();
}

}  // namespace

absl::Status RunOp(IoOp& op, bool write) {
  if (const DataCipher* c = CipherOf(op)) return RunCipherOp(op, write, *c);
  absl::Status s;
  if (op.punch) {
    s = op.file->Discard(op.offset, op.bytes);
  } else if (op.zero_range) {
    s = op.file->WriteZeroes(op.offset, op.bytes);
  } else if (op.iov.size() == 1) {
    auto* base = static_cast<uint8_t*>(op.iov[0].iov_base);
    s = write ? op.file->WriteAt(op.offset,
                                 absl::MakeConstSpan(base, op.iov[0].iov_len))
              : op.file->ReadAt(op.offset, absl::MakeSpan(base, op.iov[0].iov_len));
  } else {
    s = write ? op.file->WritevAt(op.offset, op.iov)
              : op.file->ReadvAt(op.offset, op.iov);
  }
  if (s.ok()) op.done = op.bytes;
  return s;
}

absl::Status RunPlanIo(IoPlan& plan, IoStats* stats) {
  for (IoOp& op : plan.reads) {
    RETURN_IF_ERROR(RunOp(op, false));
    CountIo(op, false, stats);
  }
  for (auto& step : plan.after_reads) RETURN_IF_ERROR(step());
  for (IoOp& op : plan.writes) {
    RETURN_IF_ERROR(RunOp(op, true));
    CountIo(op, true, stats);
  }
  return absl::OkStatus();
}

}  // namespace qcow2::internal
