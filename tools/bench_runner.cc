// SPDX-License-Identifier: Apache-2.0
#include "tools/bench_runner.h"

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

absl::StatusOr<JobResult> RunJob(Queue& queue, const JobSpec& spec) {
  AlignedBuffer buffer(static_cast<size_t>(spec.qd) * spec.max_len, spec.fill);
  std::vector<Clock::time_point> started(spec.qd);
  std::vector<int> free_slots;
  for (int i = spec.qd - 1; i >= 0; --i) free_slots.push_back(i);

  JobResult result;
  absl::Status error;
  int in_flight = 0;
  uint64_t submitted = 0, unreported = 0;
  uint64_t since_flush = 0;  // requests submitted since the last flush
  bool flush_in_flight = false;
  const Clock::time_point t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(spec.seconds));
  auto may_submit = [&] {
    if (!error.ok() || StopRequested()) return false;
    if (spec.count != 0 && submitted >= spec.count) return false;
    return spec.seconds <= 0 || Clock::now() < deadline;
  };

  while (true) {
    while (in_flight < spec.qd && may_submit()) {
      const int slot = free_slots.back();
      const Request req = spec.next();
      Completion done = [&, slot, len = req.len](absl::Status s) {
        const Clock::time_point end = Clock::now();
        --in_flight;
        free_slots.push_back(slot);
        if (!s.ok()) {
          if (error.ok()) error = std::move(s);
          return;
        }
        result.latency.Add(static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(end -
                                                                 started[slot])
                .count()));
        ++result.ops;
        result.bytes += len;
        if (spec.progress != nullptr && ++unreported == kProgressBatch) {
          spec.progress->Add(unreported);
          unreported = 0;
        }
      };
      uint8_t* buf = buffer.data() + static_cast<size_t>(slot) * spec.max_len;
      started[slot] = Clock::now();
      absl::Status s =
          spec.op == Op::kRead
              ? queue.SubmitRead(req.offset, absl::MakeSpan(buf, req.len),
                                 std::move(done))
              : queue.SubmitWrite(req.offset, absl::MakeSpan(buf, req.len),
                                  std::move(done));
      if (!s.ok()) {
        error = std::move(s);
        break;
      }
      free_slots.pop_back();
      ++in_flight;
      ++submitted;
      ++since_flush;
    }
    if (spec.flush_every != 0 && since_flush >= spec.flush_every &&
        !flush_in_flight && error.ok()) {
      absl::Status s = queue.SubmitFlush([&](absl::Status fs) {
        flush_in_flight = false;
        if (!fs.ok() && error.ok()) error = std::move(fs);
      });
      if (s.ok()) {
        flush_in_flight = true;
        since_flush -= spec.flush_every;  // one that came due late still runs
      } else {
        error = std::move(s);
      }
    }
    if (in_flight == 0 && !flush_in_flight) break;
    queue.Poll(1);
  }
  if (error.ok() && spec.flush && !StopRequested()) {
    bool flushed = false;
    absl::Status s = queue.SubmitFlush([&](absl::Status fs) {
      error = std::move(fs);
      flushed = true;
    });
    if (!s.ok()) return s;
    while (!flushed) queue.Poll(1);
  }
  result.seconds = SecondsBetween(t0, Clock::now());
  if (!error.ok()) return error;
  if (StopRequested()) return absl::CancelledError("interrupted");
  return result;
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
