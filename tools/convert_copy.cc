// SPDX-License-Identifier: Apache-2.0
#include "tools/convert_copy.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <new>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/format/compress.h"
#include "qcow2/queue.h"

namespace qcow2::tool {
namespace {

// Bytes a worker reads and writes at a time when not compressing
// (qemu-img's IO_BUF_SIZE).
constexpr uint64_t kChunkBytes = 2 << 20;

// Bytes of a cluster compressed to guess whether all of it compresses.
constexpr uint64_t kProbeBytes = 2048;

// A chunk's buffer, aligned for O_DIRECT (-t none).
struct FreeBuffer {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t[], FreeBuffer>;

Buffer NewBuffer(uint64_t len) {
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(4096, len));
  if (p == nullptr) throw std::bad_alloc();
  return Buffer(p);
}

const uint8_t* Zeros() {
  static const uint8_t* zeros = [] {
    uint8_t* p = NewBuffer(kChunkBytes).release();
    std::memset(p, 0, kChunkBytes);
    return p;
  }();
  return zeros;
}

bool AllZero(const uint8_t* p, size_t len) {
  return len == 0 || (p[0] == 0 && std::memcmp(p, p + 1, len - 1) == 0);
}

// What a range of the target needs: the source's data, zeros, or nothing
// (its backing file provides it).
enum class Kind { kData, kZero, kSkip };

struct Chunk {
  uint64_t offset;
  uint64_t len;
  Kind kind;
};

// The chunks of the whole disk, none crossing a multiple of `window`;
// with `merge_window` (compressing: one chunk per target cluster), a
// window of mixed kinds is one data chunk (read through the source's
// chain, which gives the backing's bytes too).
absl::StatusOr<std::vector<Chunk>> PlanChunks(Image& source,
                                              const CopyOptions& opts,
                                              uint64_t window,
                                              bool merge_window) {
  const uint64_t size = source.size();
  const bool source_has_backing = source.chain_length() > 1;
  std::vector<Chunk> chunks;
  auto add = [&](uint64_t off, uint64_t len, Kind kind) {
    while (len > 0) {
      const uint64_t n = std::min(len, window - off % window);
      Chunk* last = chunks.empty() ? nullptr : &chunks.back();
      const bool same_window =
          last != nullptr && last->offset / window == off / window;
      if (same_window && (last->kind == kind || merge_window)) {
        last->len += n;
        if (last->kind != kind) last->kind = Kind::kData;
      } else {
        chunks.push_back({off, n, kind});
      }
      off += n;
      len -= n;
    }
  };
  for (uint64_t pos = 0; pos < size;) {
    absl::StatusOr<BlockStatus> bs = source.GetBlockStatus(pos, size - pos);
    if (!bs.ok()) return bs.status();
    if (bs->length == 0) {
      return absl::InternalError(
          absl::StrCat("no block status at byte ", pos, " of the source"));
    }
    Kind kind = bs->zero ? Kind::kZero : Kind::kData;
    if (opts.target_has_backing && !(bs->present && bs->depth == 0)) {
      // Not in the source's top: as qemu-img, left to the target's
      // backing file when the top has one, else zeros.
      kind = source_has_backing ? Kind::kSkip : Kind::kZero;
    }
    add(pos, bs->length, kind);
    pos += bs->length;
  }
  return chunks;
}

// Largest power of two <= n (n > 0).
uint64_t Pow2Floor(uint64_t n) { return uint64_t{1} << (63 - __builtin_clzll(n)); }

// What one part of a data chunk's write is: the chunk's bytes, or zeros.
struct Piece {
  uint64_t offset;
  uint64_t len;
  bool zero;
};

// qemu-img's sparse detection (is_allocated_sectors_min): zero runs of
// at least -S bytes (a short chunk: its length), counted in units of
// -S's power-of-two floor aligned to the disk, are zeros; the rest, and
// shorter zero runs, data. With -S 0, the whole chunk is data.
void SplitSparse(const Chunk& c, const uint8_t* data, uint64_t min_sparse,
                 std::vector<Piece>* pieces) {
  const uint64_t end = c.offset + c.len;
  if (min_sparse == 0) {
    pieces->push_back({c.offset, c.len, false});
    return;
  }
  const uint64_t unit = Pow2Floor(min_sparse);
  const uint64_t min = std::min(min_sparse, c.len);
  uint64_t data_from = c.offset;  // start of the data not yet written
  uint64_t pos = c.offset;
  while (pos < end) {
    // The zero run starting at pos, if any.
    uint64_t run_end = pos;
    while (run_end < end) {
      const uint64_t u_end = std::min(end, (run_end / unit + 1) * unit);
      if (!AllZero(data + (run_end - c.offset), u_end - run_end)) break;
      run_end = u_end;
    }
    if (run_end - pos >= min) {
      if (pos > data_from) pieces->push_back({data_from, pos - data_from, false});
      pieces->push_back({pos, run_end - pos, true});
      data_from = run_end;
      pos = run_end;
    } else {
      pos = std::min(end, (std::max(run_end, pos + 1) / unit + 1) * unit);
      if (run_end > pos) pos = run_end;
    }
  }
  if (end > data_from) pieces->push_back({data_from, end - data_from, false});
}

// What both copy loops share: the plan, and the progress report.
class CopyJob {
 protected:
  CopyJob(Image& source, const CopyOptions& opts, std::vector<Chunk> chunks)
      : source_(source),
        opts_(opts),
        chunks_(std::move(chunks)),
        size_(source.size()) {}

  // A chunk of `len` bytes is done (one call at a time).
  void Report(uint64_t len) const {
    if (opts_.progress) {
      opts_.progress(static_cast<float>(100.0 * static_cast<double>(len) /
                                        static_cast<double>(size_)));
    }
  }

  Image& source_;
  const CopyOptions& opts_;
  const std::vector<Chunk> chunks_;
  const uint64_t size_;
};

// The copy on -m threads, each reading a chunk and writing it with the
// target's synchronous calls: compressed copies (each thread compresses
// its own), raw targets.
class Copier : CopyJob {
 public:
  Copier(Image& source, ConvertTarget& target, const CopyOptions& opts,
         std::vector<Chunk> chunks)
      : CopyJob(source, opts, std::move(chunks)), target_(target) {}

  absl::Status Run() {
    const int n = std::max(1, opts_.workers);
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) threads.emplace_back([this] { Work(); });
    for (auto& t : threads) t.join();
    return error_;
  }

 private:
  void Work() {
    std::vector<uint8_t> buf(
        opts_.compressed ? opts_.cluster_size : kChunkBytes);
    std::vector<uint8_t> stream;
    for (;;) {
      const size_t i = next_.fetch_add(1);
      if (i >= chunks_.size() || failed_.load()) return;
      const Chunk& c = chunks_[i];
      absl::Status s;
      Store store = Store::kCompressed;
      if (c.kind == Kind::kData) {
        s = source_.Read(c.offset, absl::MakeSpan(buf.data(), c.len));
        if (!s.ok()) {
          s = absl::Status(s.code(), absl::StrCat("error while reading at byte ",
                                                  c.offset, ": ", s.message()));
        } else if (opts_.compressed && !opts_.out_of_order) {
          s = Classify(c, buf, &stream, &store);
        }
      }
      if (!WaitTurn(i)) return;
      if (s.ok()) s = WriteChunk(c, buf.data(), store);
      EndTurn(i, s, c.len);
      if (!s.ok()) return;
    }
  }

  // How a data cluster is stored when compressing.
  enum class Store { kCompressed, kPlain, kZeros };

  // In guest order, the writes are one at a time, and so would be the
  // compression inside WriteCompressed: the worker finds out beforehand,
  // beside the others, what the write will store. A cluster that does
  // not compress (the library would write it as it is: the same codec,
  // the same test) is written plain; one of zeros is left out; only
  // clusters that compress are compressed in the write's turn.
  absl::Status Classify(const Chunk& c, std::vector<uint8_t>& buf,
                        std::vector<uint8_t>* stream, Store* store) {
    *store = Store::kCompressed;
    if (opts_.min_sparse > 0 && AllZero(buf.data(), c.len)) {
      *store = Store::kZeros;
      return absl::OkStatus();
    }
    const uint64_t cs = opts_.cluster_size;
    if (c.len < cs) std::memset(buf.data() + c.len, 0, cs - c.len);
    stream->resize(cs - 1);
    // A cluster whose first 2 KiB compress to less than 7/8 is taken to
    // compress (the write finds out for sure, once): the whole test is
    // made only for likely misses, so that most clusters are compressed
    // once.
    if (cs > kProbeBytes) {
      absl::StatusOr<size_t> n = internal::CompressCluster(
          opts_.compression_type, absl::MakeConstSpan(buf.data(), kProbeBytes),
          absl::MakeSpan(stream->data(), kProbeBytes * 7 / 8));
      if (!n.ok()) return n.status();
      if (*n != 0) return absl::OkStatus();
    }
    absl::StatusOr<size_t> n = internal::CompressCluster(
        opts_.compression_type, absl::MakeConstSpan(buf.data(), cs),
        absl::MakeSpan(*stream));
    if (!n.ok()) return n.status();
    if (*n == 0) *store = Store::kPlain;
    return absl::OkStatus();
  }

  // In guest order unless -W: chunk i is written after chunk i - 1's write
  // finished (reads run ahead). False when another worker failed.
  bool WaitTurn(size_t i) {
    if (opts_.out_of_order) return !failed_.load();
    std::unique_lock<std::mutex> lock(mu_);
    Slot(i).wait(lock, [&] { return turn_ == i || failed_.load(); });
    return !failed_.load();
  }

  // The worker with chunk i waits on its slot, so that the end of a turn
  // wakes the next chunk's worker alone (a shared wake-up woke all of
  // them for each chunk: 70,000 futex calls for 2,048 chunks).
  std::condition_variable& Slot(size_t i) { return slots_[i % kSlots]; }

  void EndTurn(size_t i, const absl::Status& s, uint64_t len) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok() && error_.ok()) {
      error_ = s;
      failed_.store(true);
    }
    if (!opts_.out_of_order) {
      turn_ = i + 1;
      if (failed_.load()) {
        for (auto& slot : slots_) slot.notify_all();
      } else {
        Slot(i + 1).notify_all();
      }
    }
    if (s.ok()) Report(len);
  }

  absl::Status WriteChunk(const Chunk& c, const uint8_t* data, Store store) {
    absl::Status s = WriteChunkUnnamed(c, data, store);
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("error while writing at byte ",
                                               c.offset, ": ", s.message()));
  }

  absl::Status WriteChunkUnnamed(const Chunk& c, const uint8_t* data,
                                 Store store) {
    switch (c.kind) {
      case Kind::kSkip:
        return absl::OkStatus();
      case Kind::kZero:
        return Zero(c.offset, c.len);
      case Kind::kData:
        break;
    }
    const auto whole = absl::MakeConstSpan(data, c.len);
    if (opts_.compressed) {
      // A cluster is written whole: only an all-zero one is saved.
      if (store == Store::kZeros ||
          (opts_.min_sparse > 0 && AllZero(data, c.len))) {
        return Zero(c.offset, c.len);
      }
      if (store == Store::kPlain) return target_.Write(c.offset, whole);
      return target_.WriteCompressed(c.offset, whole);
    }
    return WriteSparse(c, data);
  }

  // Zeros: written as data with -S 0 (a fully allocated target), nothing
  // where the target reads as zeros already, else a write of zeros.
  absl::Status Zero(uint64_t offset, uint64_t len) {
    if (opts_.min_sparse == 0) {
      for (uint64_t done = 0; done < len;) {
        const uint64_t n = std::min<uint64_t>(len - done, kChunkBytes);
        const auto zeros = absl::MakeConstSpan(Zeros(), n);
        absl::Status s = opts_.compressed
                             ? target_.WriteCompressed(offset + done, zeros)
                             : target_.Write(offset + done, zeros);
        if (!s.ok()) return s;
        done += n;
      }
      return absl::OkStatus();
    }
    if (opts_.zero_init) return absl::OkStatus();
    return target_.WriteZeroes(offset, len);
  }

  absl::Status WriteSparse(const Chunk& c, const uint8_t* data) {
    std::vector<Piece> pieces;
    SplitSparse(c, data, opts_.min_sparse, &pieces);
    for (const Piece& p : pieces) {
      absl::Status s =
          p.zero ? Zero(p.offset, p.len)
                 : target_.Write(p.offset,
                                 absl::MakeConstSpan(data + (p.offset - c.offset),
                                                     p.len));
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  ConvertTarget& target_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  static constexpr size_t kSlots = 32;  // more than the workers (-m 16)
  std::condition_variable slots_[kSlots];
  size_t turn_ = 0;     // guarded by mu_
  absl::Status error_;  // guarded by mu_ (read after the workers end)
};

// The copy through the asynchronous engine, for a plain (uncompressed)
// copy into an image, on two threads: a reader with a queue on the source
// keeps -m chunks in flight into their buffers and finds each chunk's
// zero runs once it is read; the writer (the calling thread) submits the
// chunks' writes to a queue on the target, in guest order (unless -W: in
// the order the reads finished), with those of the chunks before still in
// flight. Clusters are allocated in submission order, so that the
// target's layout follows the guest's, as qemu-img's.
class QueueCopier : CopyJob {
 public:
  QueueCopier(Image& source, Image& target, const CopyOptions& opts,
              std::vector<Chunk> chunks)
      : CopyJob(source, opts, std::move(chunks)),
        target_(target),
        slot_of_(chunks_.size(), -1) {}

  absl::Status Run() {
    absl::StatusOr<std::unique_ptr<Queue>> sq = source_.CreateQueue();
    if (!sq.ok()) return sq.status();
    absl::StatusOr<std::unique_ptr<Queue>> tq = target_.CreateQueue();
    if (!tq.ok()) return tq.status();
    tq_ = std::move(tq).value();
    slots_.resize(static_cast<size_t>(std::max(1, opts_.workers)));
    for (Slot& slot : slots_) {
      slot.buf = NewBuffer(kChunkBytes);
      free_.push_back(&slot);
    }
    std::thread reader([this, q = std::move(sq).value()]() mutable {
      Read(*q);
      q.reset();  // its requests finish first
    });
    Write();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    reader.join();
    tq_.reset();
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  struct Slot {
    Buffer buf;
    size_t chunk = 0;
    bool read = false;          // pieces are set (guarded by mu_)
    std::vector<Piece> pieces;  // the writes
    size_t submitted = 0;       // pieces submitted (writer only)
    size_t pending = 0;         // submitted, not finished (writer only)
  };

  void Fail(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = std::move(s);
    cv_.notify_all();
  }

  static absl::Status Named(const char* what, uint64_t offset,
                            const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("error while ", what,
                                               " at byte ", offset, ": ",
                                               s.message()));
  }

  // The reader: a free slot takes the next chunk (a data chunk is read
  // into it, the others are ready at once).
  void Read(Queue& q) {
    for (;;) {
      std::vector<std::pair<Slot*, size_t>> start;
      {
        std::unique_lock<std::mutex> lock(mu_);
        auto can_start = [&] {
          return !free_.empty() && next_read_ < chunks_.size();
        };
        if (q.in_flight() == 0) {
          cv_.wait(lock, [&] {
            return stop_ || !error_.ok() || can_start();
          });
        }
        if (stop_ || !error_.ok()) return;
        while (can_start()) {
          Slot* slot = free_.back();
          free_.pop_back();
          slot->chunk = next_read_;
          slot->read = false;
          slot_of_[next_read_] = static_cast<int>(slot - slots_.data());
          start.emplace_back(slot, next_read_++);
        }
      }
      for (auto [slot, i] : start) {
        const Chunk& c = chunks_[i];
        if (c.kind != Kind::kData) {
          Split(slot);
          continue;
        }
        absl::Status s = q.SubmitRead(
            c.offset, absl::MakeSpan(slot->buf.get(), c.len),
            [this, slot](absl::Status st) {
              if (!st.ok()) {
                return Fail(Named("reading", chunks_[slot->chunk].offset, st));
              }
              Split(slot);
            });
        if (!s.ok()) return Fail(Named("reading", c.offset, s));
      }
      if (q.in_flight() > 0) q.Poll(start.empty() ? 1 : 0);
    }
  }

  // On the reader: the chunk's writes, then ready for the writer.
  void Split(Slot* slot) {
    const Chunk& c = chunks_[slot->chunk];
    slot->pieces.clear();
    slot->submitted = 0;
    slot->pending = 0;
    if (c.kind == Kind::kData) {
      SplitSparse(c, slot->buf.get(), opts_.min_sparse, &slot->pieces);
    } else if (c.kind == Kind::kZero &&
               (opts_.min_sparse == 0 || !opts_.zero_init)) {
      slot->pieces.push_back({c.offset, c.len, true});
    }
    std::lock_guard<std::mutex> lock(mu_);
    slot->read = true;
    ready_.push_back(slot);
    cv_.notify_all();
  }

  // The writer: chunks read are written, in guest order the next one
  // (then the one after it, once all of its writes are submitted), with
  // -W any.
  void Write() {
    Slot* current = nullptr;  // being submitted
    for (;;) {
      if (current == nullptr) {
        std::unique_lock<std::mutex> lock(mu_);
        auto next = [&]() -> Slot* {
          if (opts_.out_of_order) {
            return ready_.empty() ? nullptr : ready_.front();
          }
          if (next_write_ >= chunks_.size() || slot_of_[next_write_] < 0) {
            return nullptr;
          }
          Slot* slot = &slots_[slot_of_[next_write_]];
          return slot->read ? slot : nullptr;
        };
        auto done = [&] { return written_ == chunks_.size() || !error_.ok(); };
        if (tq_->in_flight() == 0) {
          cv_.wait(lock, [&] { return done() || next() != nullptr; });
        }
        if (done()) return;
        current = next();
        if (current != nullptr) {
          if (opts_.out_of_order) {
            ready_.pop_front();
          } else {
            ready_.clear();  // in order, slots are found by chunk
            ++next_write_;
          }
        }
      }
      if (current != nullptr && Submit(current)) {
        current = nullptr;
        tq_->Poll(0);
      } else {
        tq_->Poll(1);
      }
    }
  }

  // Submits the slot's writes it can; true when all are.
  bool Submit(Slot* slot) {
    const Chunk& c = chunks_[slot->chunk];
    while (slot->submitted < slot->pieces.size()) {
      if (tq_->in_flight() >= tq_->depth()) return false;
      const Piece& p = slot->pieces[slot->submitted];
      const uint8_t* data =
          p.zero ? Zeros() : slot->buf.get() + (p.offset - c.offset);
      auto done = [this, slot, offset = p.offset](absl::Status st) {
        if (!st.ok()) Fail(Named("writing", offset, st));
        if (--slot->pending == 0 && slot->submitted == slot->pieces.size()) {
          Release(slot);
        }
      };
      // Zeros are data with -S 0 (a fully allocated target).
      absl::Status s =
          p.zero && opts_.min_sparse > 0
              ? tq_->SubmitWriteZeroes(p.offset, p.len, /*unmap=*/true,
                                       std::move(done))
              : tq_->SubmitWrite(p.offset, absl::MakeConstSpan(data, p.len),
                                 std::move(done));
      if (!s.ok()) {
        Fail(Named("writing", p.offset, s));
        return true;
      }
      ++slot->submitted;
      ++slot->pending;
    }
    if (slot->pending == 0) Release(slot);
    return true;
  }

  void Release(Slot* slot) {
    const Chunk& c = chunks_[slot->chunk];
    {
      std::lock_guard<std::mutex> lock(mu_);
      slot_of_[slot->chunk] = -1;
      free_.push_back(slot);
      ++written_;
      cv_.notify_all();
    }
    Report(c.len);
  }

  Image& target_;
  std::unique_ptr<Queue> tq_;  // the writer's
  std::vector<Slot> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_:
  std::vector<int> slot_of_;  // chunk -> its slot while read or written
  std::vector<Slot*> free_;
  std::deque<Slot*> ready_;  // read, not yet taken by the writer
  size_t next_read_ = 0;
  size_t next_write_ = 0;
  size_t written_ = 0;
  bool stop_ = false;
  absl::Status error_;
};

}  // namespace

absl::Status CopyImage(Image& source, ConvertTarget& target,
                       const CopyOptions& opts) {
  const bool merge = opts.compressed;
  absl::StatusOr<std::vector<Chunk>> chunks = PlanChunks(
      source, opts, merge ? opts.cluster_size : kChunkBytes, merge);
  if (!chunks.ok()) return chunks.status();
  if (opts.progress) opts.progress(0);
  absl::Status s;
  if (target.image() != nullptr && !opts.compressed) {
    QueueCopier copier(source, *target.image(), opts,
                       std::move(chunks).value());
    s = copier.Run();
  } else {
    Copier copier(source, target, opts, std::move(chunks).value());
    s = copier.Run();
  }
  absl::Status f = target.Finish();
  return s.ok() ? f : s;
}

}  // namespace qcow2::tool
