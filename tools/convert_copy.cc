// SPDX-License-Identifier: Apache-2.0
#include "tools/convert_copy.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <semaphore>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "qcow2/maintenance.h"

namespace qcow2::tool {
namespace {

// Bytes a worker reads and writes at a time when not compressing
// (qemu-img's IO_BUF_SIZE).
constexpr uint64_t kChunkBytes = 2 << 20;
// -m's upper bound, as qemu-img's.
constexpr int kMaxWorkers = 16;

// Workers that may write at once out of order: one per CPU, at most -m.
int WriteSlots(int workers) {
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(std::min(workers, cpus), 1, kMaxWorkers);
}

// Bytes of a cluster compressed to guess whether all of it compresses.
constexpr uint64_t kProbeBytes = 2048;

const std::vector<uint8_t>& Zeros() {
  static const auto* zeros = new std::vector<uint8_t>(kChunkBytes, 0);
  return *zeros;
}

bool AllZero(const uint8_t* p, size_t len) {
  return len == 0 || (p[0] == 0 && std::memcmp(p, p + 1, len - 1) == 0);
}

// The memory of one chunk buffer: anonymous, aligned to 2 MiB and, where
// the kernel has them, in transparent huge pages. Every chunk's bytes are
// copied in (the source's read) and out again (the target's write), and
// with 4 KiB pages each buffer costs 512 page faults and a TLB miss per
// page of every copy.
class ChunkMemory {
 public:
  static constexpr size_t kHuge = 2 << 20;
  explicit ChunkMemory(size_t size)
      : size_((size + kHuge - 1) / kHuge * kHuge) {
    // Over-allocated by a huge page, then trimmed to an aligned region.
    void* p = mmap(nullptr, size_ + kHuge, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    const auto base = reinterpret_cast<uintptr_t>(p);
    const uintptr_t aligned = (base + kHuge - 1) / kHuge * kHuge;
    if (aligned > base) munmap(p, aligned - base);
    const uintptr_t end = base + size_ + kHuge;
    if (end > aligned + size_) {
      munmap(reinterpret_cast<void*>(aligned + size_), end - aligned - size_);
    }
    data_ = reinterpret_cast<uint8_t*>(aligned);
    madvise(data_, size_, MADV_HUGEPAGE);  // a hint: failure is harmless
  }
  ~ChunkMemory() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  ChunkMemory(const ChunkMemory&) = delete;
  ChunkMemory& operator=(const ChunkMemory&) = delete;
  // nullptr when the mapping failed.
  uint8_t* data() const { return data_; }

 private:
  const size_t size_;
  uint8_t* data_ = nullptr;
};

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

// The copy on -m threads, each reading chunks (and, compressing in
// order, finding out which clusters do not compress), the chunks written
// with the target's synchronous calls in guest order by whichever worker
// finds the next one ready. With -W, each worker writes (compresses) the
// chunks it read at once, on its own thread, the clusters allocated as
// they come: up to -m compressing writes at a time, or for a plain copy
// up to one per CPU (write_slots_).
// (Two copies through queues were slower on this two-core machine. One
// reader thread handing chunks to one writer thread: each hand-over
// waited for the other thread to be scheduled. A queue per worker, its
// writes in flight while it read on: 1.6-1.9x the time of these
// synchronous writes for a plain -W copy, 1.2x for -W -c, because ext4
// takes no buffered write without blocking, so io_uring hands every one
// to a kernel worker, and the hand-overs left a core idle.)
class Copier : CopyJob {
 public:
  Copier(Image& source, ConvertTarget& target, const CopyOptions& opts,
         std::vector<Chunk> chunks)
      : CopyJob(source, opts, std::move(chunks)),
        target_(target),
        ordered_(!opts.out_of_order) {}

  absl::Status Run() {
    const int n = std::max(1, opts_.workers);
    // In guest order, twice as many buffers as workers: a worker whose
    // chunk waits for the ones before it goes on with another.
    buffers_.resize(static_cast<size_t>(ordered_ ? 2 * n : n));
    for (Buffer& b : buffers_) {
      if (opts_.compressed) {
        b.cluster.resize(opts_.cluster_size);
        b.data = b.cluster.data();
      } else {
        b.chunk_memory = std::make_unique<ChunkMemory>(kChunkBytes);
        b.data = b.chunk_memory->data();
        if (b.data == nullptr) {
          return absl::ResourceExhaustedError(
              "out of memory for the copy's buffers");
        }
      }
      free_.push_back(&b);
    }
    if (ordered_) waiting_.assign(chunks_.size(), nullptr);
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) threads.emplace_back([this] { Work(); });
    for (auto& t : threads) t.join();
    return error_;
  }

 private:
  // How a data cluster is stored when compressing.
  enum class Store { kCompressed, kPlain, kZeros };

  struct Buffer {
    uint8_t* data = nullptr;  // cluster's or chunk_memory's
    std::vector<uint8_t> cluster;  // compressing: one target cluster
    std::unique_ptr<ChunkMemory> chunk_memory;  // else: one chunk
    size_t chunk = 0;
    Store store = Store::kCompressed;
    std::vector<Piece> pieces;  // a plain copy's data and zero runs
    absl::Status status;  // of the read (and the compression probe)
  };

  void Work() {
    std::vector<uint8_t> stream;
    for (;;) {
      Buffer* b = TakeBuffer();
      if (b == nullptr) return;
      const size_t i = next_.fetch_add(1);
      if (i >= chunks_.size()) {
        Finish(b, absl::OkStatus(), 0);
        return;
      }
      const Chunk& c = chunks_[i];
      b->chunk = i;
      b->store = Store::kCompressed;
      b->status = absl::OkStatus();
      if (c.kind == Kind::kData) {
        absl::Status s = source_.Read(c.offset, absl::MakeSpan(b->data, c.len));
        if (!s.ok()) {
          s = absl::Status(s.code(), absl::StrCat("error while reading at byte ",
                                                  c.offset, ": ", s.message()));
        } else if (!opts_.compressed) {
          // Found here, beside the other workers, not in the write's turn.
          b->pieces.clear();
          SplitSparse(c, b->data, opts_.min_sparse, &b->pieces);
        } else if (!opts_.out_of_order) {
          s = Classify(c, b->cluster, &stream, &b->store);
        }
        b->status = std::move(s);
      }
      if (ordered_) {
        WriteInOrder(b);
      } else {
        absl::Status s = b->status;
        if (s.ok()) {
          const bool gated = !opts_.compressed;
          if (gated) write_slots_.acquire();
          s = WriteChunk(c, *b);
          if (gated) write_slots_.release();
        }
        Finish(b, s, c.len);
      }
    }
  }

  // A free buffer; nullptr once a worker failed.
  Buffer* TakeBuffer() {
    std::unique_lock<std::mutex> lock(mu_);
    free_cv_.wait(lock, [&] { return !free_.empty() || failed_; });
    if (failed_) return nullptr;
    Buffer* b = free_.back();
    free_.pop_back();
    return b;
  }

  // The buffer's chunk is written (or failed): the buffer is free again.
  void Finish(Buffer* b, const absl::Status& s, uint64_t len) {
    std::lock_guard<std::mutex> lock(mu_);
    Done(b, s, len);
  }

  void Done(Buffer* b, const absl::Status& s, uint64_t len) {
    if (!s.ok() && error_.ok()) {
      error_ = s;
      failed_ = true;
      free_cv_.notify_all();
    }
    if (s.ok() && len > 0) Report(len);
    free_.push_back(b);
    free_cv_.notify_one();
  }

  // In guest order: chunk i is written after chunk i - 1 (reads run
  // ahead). Whichever worker finds the next chunk to write ready writes
  // it, and the ones after it that are ready too, so that no write waits
  // for a worker to be woken (the next chunk's worker, woken on the
  // waker's core, waited there for it to compress a cluster: the
  // compressing ran on one core at a time).
  void WriteInOrder(Buffer* b) {
    std::unique_lock<std::mutex> lock(mu_);
    waiting_[b->chunk] = b;
    if (writing_) return;
    writing_ = true;
    while (!failed_ && turn_ < chunks_.size() && waiting_[turn_] != nullptr) {
      Buffer* w = waiting_[turn_];
      waiting_[turn_] = nullptr;
      const Chunk& c = chunks_[turn_];
      lock.unlock();
      absl::Status s = w->status;
      if (s.ok()) s = WriteChunk(c, *w);
      lock.lock();
      Done(w, s, c.len);
      ++turn_;
    }
    writing_ = false;
  }

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
      absl::StatusOr<size_t> n = CompressCluster(
          opts_.compression_type, absl::MakeConstSpan(buf.data(), kProbeBytes),
          absl::MakeSpan(stream->data(), kProbeBytes * 7 / 8));
      if (!n.ok()) return n.status();
      if (*n != 0) return absl::OkStatus();
    }
    absl::StatusOr<size_t> n = CompressCluster(
        opts_.compression_type, absl::MakeConstSpan(buf.data(), cs),
        absl::MakeSpan(*stream));
    if (!n.ok()) return n.status();
    if (*n == 0) *store = Store::kPlain;
    return absl::OkStatus();
  }

  absl::Status WriteChunk(const Chunk& c, const Buffer& b) {
    absl::Status s = WriteChunkUnnamed(c, b);
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("error while writing at byte ",
                                               c.offset, ": ", s.message()));
  }

  absl::Status WriteChunkUnnamed(const Chunk& c, const Buffer& b) {
    const uint8_t* data = b.data;
    const Store store = b.store;
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
    return WriteSparse(c, data, b.pieces);
  }

  // Zeros: written as data with -S 0 (a fully allocated target), nothing
  // where the target reads as zeros already, else a write of zeros.
  absl::Status Zero(uint64_t offset, uint64_t len) {
    if (opts_.min_sparse == 0) {
      for (uint64_t done = 0; done < len;) {
        const uint64_t n = std::min<uint64_t>(len - done, kChunkBytes);
        const auto zeros = absl::MakeConstSpan(Zeros().data(), n);
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

  absl::Status WriteSparse(const Chunk& c, const uint8_t* data,
                           const std::vector<Piece>& pieces) {
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
  const bool ordered_;  // writes in guest order
  // A plain copy out of order: at most one worker per CPU writes at a
  // time; the others read on. Buffered writes to one file take its inode
  // lock one at a time, and on a machine with fewer CPUs than workers the
  // waiters spun for an owner that was not running: a plain -W -m 16 copy
  // spent a quarter of its time in rwsem_spin_on_owner and osq_lock, and
  // took 2-3x the time of -m 2 (bench/results/2026-12-05-convert.md).
  // With -c the workers compress inside their writes, all at once as
  // before.
  std::counting_semaphore<kMaxWorkers> write_slots_{WriteSlots(opts_.workers)};
  std::atomic<size_t> next_{0};
  std::vector<Buffer> buffers_;
  std::mutex mu_;
  std::condition_variable free_cv_;
  // Guarded by mu_:
  std::vector<Buffer*> free_;
  std::vector<Buffer*> waiting_;  // in guest order: chunk -> read, unwritten
  size_t turn_ = 0;               // the next chunk to write
  bool writing_ = false;          // a worker writes the chunks in turn
  bool failed_ = false;
  absl::Status error_;  // read after the workers end
};

}  // namespace

absl::Status CopyImage(Image& source, ConvertTarget& target,
                       const CopyOptions& opts) {
  const bool merge = opts.compressed;
  absl::StatusOr<std::vector<Chunk>> chunks = PlanChunks(
      source, opts, merge ? opts.cluster_size : kChunkBytes, merge);
  if (!chunks.ok()) return chunks.status();
  if (opts.progress) opts.progress(0);
  Copier copier(source, target, opts, std::move(chunks).value());
  absl::Status s = copier.Run();
  absl::Status f = target.Finish();
  return s.ok() ? f : s;
}

}  // namespace qcow2::tool
