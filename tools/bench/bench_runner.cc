// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/bench_runner.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <latch>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace qcow2::tool::bench {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Completions reported to Progress in batches of this many.
constexpr uint64_t kProgressBatch = 64;

}  // namespace

double ProcessCpuSeconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec / 1e6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

AlignedBuffer::AlignedBuffer(size_t size, uint8_t fill) : size_(size) {
  const size_t rounded = std::max<size_t>(
      kBufferAlign, (size + kBufferAlign - 1) / kBufferAlign * kBufferAlign);
  data_.reset(static_cast<uint8_t*>(std::aligned_alloc(kBufferAlign, rounded)));
  if (!data_) std::abort();
  std::memset(data_.get(), fill, rounded);
}

LatencyHistogram::LatencyHistogram() : buckets_(60 << kSubBits, 0) {}

int LatencyHistogram::Bucket(uint64_t ns) {
  if (ns < (1u << kSubBits)) return static_cast<int>(ns);
  const int msb = 63 - __builtin_clzll(ns);
  const int shift = msb - kSubBits;
  const int sub = static_cast<int>((ns >> shift) & ((1u << kSubBits) - 1));
  return ((shift + 1) << kSubBits) + sub;
}

double LatencyHistogram::BucketMiddle(int bucket) {
  if (bucket < (1 << kSubBits)) return bucket;
  const int shift = (bucket >> kSubBits) - 1;
  const int sub = bucket & ((1 << kSubBits) - 1);
  const double lower = std::ldexp((1 << kSubBits) + sub, shift);
  return lower + std::ldexp(1, shift) / 2;
}

void LatencyHistogram::Add(uint64_t ns) {
  ++buckets_[Bucket(ns)];
  ++count_;
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  for (size_t i = 0; i < buckets_.size(); ++i) buckets_[i] += other.buckets_[i];
  count_ += other.count_;
}

double LatencyHistogram::PercentileUs(double q) const {
  if (count_ == 0) return 0;
  const uint64_t target = std::max<uint64_t>(
      1, static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_))));
  uint64_t seen = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    seen += buckets_[i];
    if (seen >= target) return BucketMiddle(static_cast<int>(i)) / 1000;
  }
  return BucketMiddle(static_cast<int>(buckets_.size() - 1)) / 1000;
}

Rng::Rng(uint64_t seed) : state_(seed * 0x9e3779b97f4a7c15ull + 1) {
  if (state_ == 0) state_ = 1;
}

uint64_t Rng::Next() {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  return state_ * 0x2545f4914f6cdd1dull;
}

const char* OpName(Op op) { return op == Op::kRead ? "read" : "write"; }

RequestGen RandomRequests(uint64_t start, uint64_t len, uint32_t bs,
                          uint64_t seed) {
  const uint64_t slots = len / bs;
  return [start, bs, slots, rng = Rng(seed)]() mutable {
    return Request{start + rng.Below(slots) * bs, bs};
  };
}

RequestGen SequentialRequests(uint64_t start, uint64_t len, uint32_t bs) {
  return [start, end = start + len, bs, next = start]() mutable {
    if (next + bs > end) next = start;
    Request r{next, bs};
    next += bs;
    return r;
  };
}

RequestGen MixRequests(uint64_t start, uint64_t len, std::vector<MixEntry> mix,
                       uint64_t seed) {
  uint64_t total = 0;
  for (const MixEntry& m : mix) total += m.weight;
  return [start, len, mix = std::move(mix), total, rng = Rng(seed)]() mutable {
    uint64_t pick = rng.Below(total);
    size_t i = 0;
    while (pick >= mix[i].weight) pick -= mix[i++].weight;
    const uint32_t bs = mix[i].bs;
    return Request{start + rng.Below(len / bs) * bs, bs};
  };
}

namespace {

// One RunJob: up to spec.qd requests in flight on `queue`, a flush every
// spec.flush_every requests, until the count or the time is reached.
class JobLoop {
 public:
  JobLoop(Queue& queue, const JobSpec& spec)
      : queue_(queue),
        spec_(spec),
        buffer_(static_cast<size_t>(spec.qd) * spec.max_len, spec.fill),
        started_(spec.qd),
        t0_(Clock::now()),
        deadline_(t0_ + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(spec.seconds))) {
    for (int i = spec.qd - 1; i >= 0; --i) free_slots_.push_back(i);
  }

  absl::StatusOr<JobResult> Run() {
    while (true) {
      while (in_flight_ < spec_.qd && MaySubmit()) {
        if (!SubmitOne()) break;
      }
      MaybeFlush();
      if (in_flight_ == 0 && !flush_in_flight_) break;
      queue_.Poll(1);
    }
    if (error_.ok() && spec_.flush && !StopRequested()) {
      if (absl::Status s = FinalFlush(); !s.ok()) return s;
    }
    result_.seconds = SecondsBetween(t0_, Clock::now());
    if (!error_.ok()) return error_;
    if (StopRequested()) return absl::CancelledError("interrupted");
    return result_;
  }

 private:
  bool MaySubmit() const {
    if (!error_.ok() || StopRequested()) return false;
    if (spec_.count != 0 && submitted_ >= spec_.count) return false;
    return spec_.seconds <= 0 || Clock::now() < deadline_;
  }

  // A request finished in `slot`: its latency and bytes are counted.
  void Complete(int slot, uint32_t len, absl::Status s) {
    const Clock::time_point end = Clock::now();
    --in_flight_;
    free_slots_.push_back(slot);
    if (!s.ok()) {
      if (error_.ok()) error_ = std::move(s);
      return;
    }
    result_.latency.Add(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(end -
                                                             started_[slot])
            .count()));
    ++result_.ops;
    result_.bytes += len;
    if (spec_.progress != nullptr && ++unreported_ == kProgressBatch) {
      spec_.progress->Add(unreported_);
      unreported_ = 0;
    }
  }

  // Submits the next request; false (the error noted) if it failed.
  bool SubmitOne() {
    const int slot = free_slots_.back();
    const Request req = spec_.next();
    Completion done = [this, slot, len = req.len](absl::Status s) {
      Complete(slot, len, std::move(s));
    };
    uint8_t* buf = buffer_.data() + static_cast<size_t>(slot) * spec_.max_len;
    started_[slot] = Clock::now();
    absl::Status s =
        spec_.op == Op::kRead
            ? queue_.SubmitRead(req.offset, absl::MakeSpan(buf, req.len),
                                std::move(done))
            : queue_.SubmitWrite(req.offset, absl::MakeSpan(buf, req.len),
                                 std::move(done));
    if (!s.ok()) {
      error_ = std::move(s);
      return false;
    }
    free_slots_.pop_back();
    ++in_flight_;
    ++submitted_;
    ++since_flush_;
    return true;
  }

  // The flush every spec.flush_every requests, one at a time.
  void MaybeFlush() {
    if (spec_.flush_every == 0 || since_flush_ < spec_.flush_every ||
        flush_in_flight_ || !error_.ok()) {
      return;
    }
    absl::Status s = queue_.SubmitFlush([this](absl::Status fs) {
      flush_in_flight_ = false;
      if (!fs.ok() && error_.ok()) error_ = std::move(fs);
    });
    if (s.ok()) {
      flush_in_flight_ = true;
      since_flush_ -= spec_.flush_every;  // one that came due late still runs
    } else {
      error_ = std::move(s);
    }
  }

  // The closing flush (spec.flush), waited for; its error goes to error_.
  absl::Status FinalFlush() {
    bool flushed = false;
    absl::Status s = queue_.SubmitFlush([&](absl::Status fs) {
      error_ = std::move(fs);
      flushed = true;
    });
    if (!s.ok()) return s;
    while (!flushed) queue_.Poll(1);
    return absl::OkStatus();
  }

  Queue& queue_;
  const JobSpec& spec_;
  AlignedBuffer buffer_;
  std::vector<Clock::time_point> started_;
  std::vector<int> free_slots_;
  JobResult result_;
  absl::Status error_;
  int in_flight_ = 0;
  uint64_t submitted_ = 0, unreported_ = 0;
  uint64_t since_flush_ = 0;  // requests submitted since the last flush
  bool flush_in_flight_ = false;
  const Clock::time_point t0_;
  const Clock::time_point deadline_;
};

}  // namespace

absl::StatusOr<JobResult> RunJob(Queue& queue, const JobSpec& spec) {
  return JobLoop(queue, spec).Run();
}

absl::StatusOr<JobResult> RunOne(Image& image, JobSpec spec) {
  std::vector<ThreadJob> jobs;
  jobs.push_back(ThreadJob{&image, std::move(spec)});
  return RunParallel(std::move(jobs));
}

absl::StatusOr<JobResult> RunParallel(std::vector<ThreadJob> jobs) {
  const size_t n = jobs.size();
  std::vector<absl::StatusOr<JobResult>> results(n, JobResult{});
  std::latch ready(static_cast<std::ptrdiff_t>(n));
  std::latch go(1);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      QueueOptions qo;
      qo.depth = jobs[i].spec.qd + 1;  // room for the final flush
      auto queue = jobs[i].image->CreateQueue(qo);
      ready.count_down();
      go.wait();
      if (!queue.ok()) {
        results[i] = queue.status();
        return;
      }
      results[i] = RunJob(**queue, jobs[i].spec);
    });
  }
  ready.wait();
  const double cpu0 = ProcessCpuSeconds();
  const Clock::time_point t0 = Clock::now();
  go.count_down();
  for (std::thread& t : threads) t.join();
  const double seconds = SecondsBetween(t0, Clock::now());
  const double cpu = ProcessCpuSeconds() - cpu0;

  JobResult total;
  for (auto& r : results) {
    if (!r.ok()) return r.status();
    total.ops += r->ops;
    total.bytes += r->bytes;
    total.latency.Merge(r->latency);
  }
  total.seconds = n == 1 ? results[0]->seconds : seconds;
  total.cpu_seconds = cpu;
  return total;
}

}  // namespace qcow2::tool::bench
