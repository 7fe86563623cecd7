// SPDX-License-Identifier: Apache-2.0
// Image::LiveStream and Image::LiveCommit (qcow2/live.h): the job's chunks
// on its worker threads, paced by a token bucket, reported and cancelled;
// the copying and the switch are the engine's (lib/engine/engine_live.cc).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/engine/engine.h"
#include "lib/engine/runner.h"
#include "qcow2/image.h"

namespace qcow2 {
namespace {

using internal::Engine;
using internal::Request;

constexpr uint64_t kMaxChunk = 64 << 20;
constexpr int kMaxDepth = 64;

absl::Status CheckOptions(const char* what, const LiveJobOptions& o) {
  if (o.chunk == 0 || o.chunk % 512 != 0 || o.chunk > kMaxChunk) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": chunk size ", o.chunk,
        " must be a non-zero multiple of 512 of at most ", kMaxChunk));
  }
  if (o.depth < 1 || o.depth > kMaxDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": chunks in flight (depth) ", o.depth, " must be 1 to ",
        kMaxDepth));
  }
  return absl::OkStatus();
}

// A job's chunks over [0, total): `depth` threads take the next chunk in
// turn until the end, an error or a cancel; copied bytes are paced by a
// token bucket; progress goes to the caller one call at a time.
class ChunkJob {
 public:
  // With `offsets`, the chunks are those (each `o.chunk` long, cut at
  // `total`) rather than all of [0, total).
  ChunkJob(const char* what, uint64_t total, const LiveJobOptions& o,
           const std::vector<uint64_t>* offsets = nullptr)
      : what_(what), total_(total), o_(o), offsets_(offsets),
        last_refill_(std::chrono::steady_clock::now()),
        tokens_(static_cast<double>(o.rate_limit)) {}

  // fn(offset, len, &copied) copies one chunk.
  absl::Status Run(
      absl::FunctionRef<absl::Status(uint64_t, uint64_t, uint64_t*)> fn) {
    auto work = [&] {
      for (;;) {
        if (Cancelled() || failed_.load()) return;
        uint64_t at = next_.fetch_add(o_.chunk);
        if (offsets_ != nullptr) {
          const uint64_t i = at / o_.chunk;
          if (i >= offsets_->size()) return;
          at = (*offsets_)[i];
        }
        if (at >= total_) return;
        const uint64_t len = std::min(o_.chunk, total_ - at);
        uint64_t copied = 0;
        absl::Status s = fn(at, len, &copied);
        if (!s.ok()) {
          Fail(std::move(s));
          return;
        }
        Pace(copied);
        Report(len);
      }
    };
    std::vector<std::thread> threads;
    const uint64_t chunks = offsets_ != nullptr
                                ? offsets_->size()
                                : (total_ + o_.chunk - 1) / o_.chunk;
    const int n = static_cast<int>(
        std::min<uint64_t>(static_cast<uint64_t>(o_.depth), chunks));
    for (int i = 1; i < n; ++i) threads.emplace_back(work);
    work();
    for (std::thread& t : threads) t.join();
    if (failed_.load()) return error_;
    if (Cancelled()) {
      return absl::CancelledError(absl::StrCat(what_, " cancelled"));
    }
    return absl::OkStatus();
  }

  bool Cancelled() const {
    return o_.control != nullptr && o_.control->cancelled();
  }

 private:
  void Fail(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.exchange(true)) error_ = std::move(s);
  }

  // Takes `bytes` from the bucket (one second of rate_limit at most),
  // sleeping off a deficit in slices short enough to notice a cancel.
  void Pace(uint64_t bytes) {
    if (o_.rate_limit == 0 || bytes == 0) return;
    using Clock = std::chrono::steady_clock;
    Clock::time_point wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const Clock::time_point now = Clock::now();
      const double rate = static_cast<double>(o_.rate_limit);
      const double elapsed =
          std::chrono::duration<double>(now - last_refill_).count();
      last_refill_ = now;
      tokens_ = std::min(rate, tokens_ + elapsed * rate) -
                static_cast<double>(bytes);
      if (tokens_ >= 0) return;
      wake = now + std::chrono::duration_cast<Clock::duration>(
                       std::chrono::duration<double>(-tokens_ / rate));
    }
    while (Clock::now() < wake && !Cancelled()) {
      std::this_thread::sleep_until(
          std::min(wake, Clock::now() + std::chrono::milliseconds(20)));
    }
  }

  void Report(uint64_t len) {
    std::lock_guard<std::mutex> lock(mu_);
    done_ += len;
    if (o_.progress) o_.progress(done_, total_);
  }

  const char* const what_;
  const uint64_t total_;
  const LiveJobOptions& o_;
  const std::vector<uint64_t>* const offsets_;
  std::atomic<uint64_t> next_{0};
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  absl::Status error_;  // guarded by mu_ until the threads are joined
  uint64_t done_ = 0;
  std::chrono::steady_clock::time_point last_refill_;
  double tokens_;
};

// Writes what the layers above `base` allocate in [offset, +len) into
// `writer` (the base's own engine), read through the chain from depth 1.
absl::Status CommitChunk(Engine* chain, Engine* writer, int base,
                         uint64_t offset, uint64_t len, uint64_t* copied) {
  std::vector<uint8_t> buf;
  for (uint64_t pos = offset, end = offset + len; pos < end;) {
    bool allocated = false;
    ASSIGN_OR_RETURN(uint64_t n,
                     chain->AllocatedAbove(base, pos, end - pos, &allocated));
    if (allocated) {
      buf.resize(n);
      RETURN_IF_ERROR(chain->ReadBelowTop(pos, absl::MakeSpan(buf)));
      Request w;
      w.kind = Request::Kind::kWrite;
      w.offset = pos;
      w.len = n;
      w.wbuf = buf.data();
      RETURN_IF_ERROR(internal::RunSync(writer, &w));
      *copied += n;
    }
    pos += n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Image::LiveStream(int base, const LiveJobOptions& opts) {
  constexpr const char* kWhat = "live stream";
  RETURN_IF_ERROR(CheckOptions(kWhat, opts));
  RETURN_IF_ERROR(engine_->BeginLiveJob(kWhat, base));
  absl::Cleanup end = [this] { engine_->EndLiveJob(); };
  if (base == 1) return absl::OkStatus();  // the top's backing already
  ChunkJob job(kWhat, engine_->size(), opts);
  RETURN_IF_ERROR(job.Run([&](uint64_t at, uint64_t len, uint64_t* copied) {
    return engine_->Populate(at, len, base, copied);
  }));
  return engine_->SwitchBacking(base - 1, /*reopen_last=*/false);
}

absl::Status Image::LiveCommit(int base, const LiveJobOptions& opts) {
  constexpr const char* kWhat = "live commit";
  RETURN_IF_ERROR(CheckOptions(kWhat, opts));
  if (base == 1) return LiveActiveCommit(1, opts);
  RETURN_IF_ERROR(engine_->BeginLiveJob(kWhat, base));
  absl::Cleanup end = [this] { engine_->EndLiveJob(); };
  const std::vector<LayerInfo> chain = engine_->GetChainInfo();
  if (base >= static_cast<int>(chain.size())) {
    if (chain.size() < 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          chain[0].filename, ": live commit needs a layer between the top "
          "and the base, and the chain has ", chain.size(), " images"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        chain[0].filename, ": live commit needs a base below the top's "
        "backing file (depth 2 to ", chain.size() - 1, "), not depth ",
        base));
  }
  if (chain[base].virtual_size < chain[0].virtual_size) {
    return absl::UnimplementedError(absl::StrCat(
        chain[0].filename, ": live commit into ", chain[base].filename,
        " (", chain[base].virtual_size, " bytes), smaller than the disk (",
        chain[0].virtual_size, " bytes), is not supported"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> writer,
                   engine_->OpenLayerWriter(base));
  ChunkJob job(kWhat, chain[0].virtual_size, opts);
  absl::Status s = job.Run([&](uint64_t at, uint64_t len, uint64_t* copied) {
    return CommitChunk(engine_.get(), writer.get(), base, at, len, copied);
  });
  // Durable in the base (and the base marked clean) before the top may
  // name it, whatever happens next.
  absl::Status closed = writer->Close();
  if (s.ok()) s = closed;
  if (!s.ok()) {
    engine_->EndLayerWriter(base);
    return s;
  }
  return engine_->SwitchBacking(base, /*reopen_last=*/true);
}

namespace {

// Active commit: after the first pass over the disk, passes over what the
// guest changed meanwhile until what is left is at most the switch's
// share (a sixteenth of the disk, the chunks in flight at least, 16 MiB at
// most), or kMaxPasses passes ran: a guest that writes faster than the
// job copies gets the rest copied during the switch, its requests held.
constexpr uint64_t kMaxSwitchBytes = 16 << 20;
constexpr int kMaxPasses = 8;

uint64_t SwitchBytes(uint64_t size, const LiveJobOptions& o) {
  return std::min<uint64_t>(
      kMaxSwitchBytes,
      std::max<uint64_t>(o.chunk * static_cast<uint64_t>(o.depth), size / 16));
}

}  // namespace

absl::Status Image::LiveActiveCommit(int base, const LiveJobOptions& opts) {
  constexpr const char* kWhat = "active commit";
  RETURN_IF_ERROR(CheckOptions(kWhat, opts));
  RETURN_IF_ERROR(engine_->BeginLiveJob(kWhat, base));
  absl::Cleanup end = [this] {
    engine_->SetDirtyLog(0);
    engine_->EndLiveJob();
  };
  const std::vector<LayerInfo> chain = engine_->GetChainInfo();
  if (base >= static_cast<int>(chain.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        chain[0].filename, ": active commit needs a base below the top "
        "(depth 1 to ", chain.size() - 1, "), not depth ", base));
  }
  const uint64_t size = chain[0].virtual_size;
  if (chain[base].virtual_size != size) {
    return absl::UnimplementedError(absl::StrCat(
        chain[0].filename, ": active commit into ", chain[base].filename,
        " (", chain[base].virtual_size, " bytes), whose size is not the "
        "disk's (", size, " bytes), is not supported"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> writer,
                   engine_->OpenLayerWriter(base));
  // Guest changes are logged from before the first chunk is copied: a
  // chunk copied and then changed is copied again.
  engine_->SetDirtyLog(opts.chunk);
  // Progress over all passes: `total` grows by what each pass re-copies.
  std::mutex progress_mu;
  uint64_t done_before = 0, total_before = 0;
  LiveJobOptions po = opts;
  if (opts.progress) {
    po.progress = [&](uint64_t done, uint64_t total) {
      std::lock_guard<std::mutex> lock(progress_mu);
      opts.progress(done_before + done, total_before + total);
    };
  }
  auto copy = [&](uint64_t at, uint64_t len, uint64_t* copied) {
    return engine_->CopyActive(at, len, base, writer.get(), /*held=*/false,
                               copied);
  };
  absl::Status s = ChunkJob(kWhat, size, po).Run(copy);
  done_before = total_before = size;
  for (int pass = 0; s.ok() && pass < kMaxPasses; ++pass) {
    const std::vector<uint64_t> dirty = engine_->DirtyGranules();
    if (dirty.size() * opts.chunk <= SwitchBytes(size, opts)) break;
    const uint64_t bytes = dirty.size() * opts.chunk;
    s = ChunkJob(kWhat, size, po, &dirty).Run(copy);
    done_before += bytes;
    total_before += bytes;
  }
  if (s.ok() && opts.control != nullptr && opts.control->cancelled()) {
    s = absl::CancelledError(absl::StrCat(kWhat, " cancelled"));
  }
  if (s.ok()) {
    // The rest, with the whole disk held; the base durable (and marked
    // clean) before it is reopened as the top.
    s = engine_->PivotActive(base, [&]() -> absl::Status {
      for (uint64_t at : engine_->DirtyGranules()) {
        uint64_t copied = 0;
        RETURN_IF_ERROR(engine_->CopyActive(
            at, std::min(opts.chunk, size - at), base, writer.get(),
            /*held=*/true, &copied));
      }
      return writer->Close();
    });
    if (s.ok()) {
      if (opts.progress) opts.progress(total_before, total_before);
      return absl::OkStatus();
    }
  }
  // The chain as it was: the base only gained what the chain above it
  // reads, and lets go of its write lock.
  absl::Status closed = writer->Close();
  engine_->EndLayerWriter(base);
  if (s.ok()) s = closed;
  return s;
}

}  // namespace qcow2
