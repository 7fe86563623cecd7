// SPDX-License-Identifier: Apache-2.0
// The request loop of `qcowtool bench`: keeps up to QD requests in flight
// on a qcow2::Queue (Submit*, then Poll(1) for at least one completion),
// times every request from its Submit call to its callback, and counts
// what finished. RunParallel gives each job a thread and a Queue of its
// own, as the Queue contract asks (one queue per thread).
#ifndef QCOW2_TOOLS_BENCH_RUNNER_H_
#define QCOW2_TOOLS_BENCH_RUNNER_H_

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"
#include "tools/bench/bench_progress.h"

namespace qcow2::tool::bench {

// I/O buffers start on a 4096-byte boundary (O_DIRECT).
inline constexpr size_t kBufferAlign = 4096;

// A heap buffer aligned to kBufferAlign, filled with one byte.
class AlignedBuffer {
 public:
  AlignedBuffer(size_t size, uint8_t fill);
  uint8_t* data() { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  size_t size_;
  std::unique_ptr<uint8_t, Free> data_;
};

// Request latencies in log-linear buckets: 32 per power of two, so a
// percentile is within about 3% of the true value. Not thread-safe; merge
// per-thread histograms.
class LatencyHistogram {
 public:
  LatencyHistogram();
  void Add(uint64_t ns);
  void Merge(const LatencyHistogram& other);
  uint64_t count() const { return count_; }
  // The latency below which a fraction `q` (0..1) of requests finished, in
  // microseconds (the middle of its bucket); 0 when empty.
  double PercentileUs(double q) const;

 private:
  static constexpr int kSubBits = 5;
  static int Bucket(uint64_t ns);
  static double BucketMiddle(int bucket);
  std::vector<uint64_t> buckets_;
  uint64_t count_ = 0;
};

// A small, fast, deterministic random source (xorshift64*).
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  // Uniform in [0, n). REQUIRES: n > 0.
  uint64_t Below(uint64_t n) { return Next() % n; }

 private:
  uint64_t state_;
};

enum class Op { kRead, kWrite };
const char* OpName(Op op);  // "read", "write"

struct Request {
  uint64_t offset = 0;
  uint32_t len = 0;
};
// Produces the next request of a job; called on the job's thread only.
using RequestGen = std::function<Request()>;

// Random requests of `bs` bytes at multiples of `bs` inside
// [start, start + len). REQUIRES: len >= bs > 0.
RequestGen RandomRequests(uint64_t start, uint64_t len, uint32_t bs,
                          uint64_t seed);
// Back-to-back requests of `bs` bytes from `start`, wrapping to `start`
// when the next one would pass start + len. REQUIRES: len >= bs > 0.
RequestGen SequentialRequests(uint64_t start, uint64_t len, uint32_t bs);

struct MixEntry {
  uint32_t bs = 4096;
  uint32_t weight = 1;
};
// Random sizes drawn from `mix` by weight, each at a random multiple of
// its own size inside [start, start + len). REQUIRES: every bs <= len.
RequestGen MixRequests(uint64_t start, uint64_t len, std::vector<MixEntry> mix,
                       uint64_t seed);

struct JobSpec {
  Op op = Op::kRead;
  int qd = 1;            // requests kept in flight
  uint32_t max_len = 0;  // largest request `next` produces
  RequestGen next;
  double seconds = 0;   // stop submitting after this long (0: no limit)
  uint64_t count = 0;   // stop after this many requests (0: no limit)
  bool flush = false;   // end with a flush (inside the timed span)
  // Also flush after every this many requests submitted (0: never), one
  // flush in flight at a time (a flush due while one runs waits for it,
  // then runs: count / flush_every flushes in all, besides the last).
  // The queue needs room for it: depth > qd.
  uint64_t flush_every = 0;
  uint8_t fill = 0xa5;  // the bytes written
  Progress* progress = nullptr;
};

struct JobResult {
  uint64_t ops = 0;    // requests completed
  uint64_t bytes = 0;  // guest bytes they moved
  double seconds = 0;  // first submit to last completion (flush included)
  // CPU time (user + system) of the whole process over the run, io_uring's
  // kernel workers included (RunParallel only; getrusage RUSAGE_SELF).
  double cpu_seconds = 0;
  LatencyHistogram latency;

  double iops() const { return seconds > 0 ? ops / seconds : 0; }
  // CPU microseconds per completed request; 0 when none completed.
  double cpu_us_per_op() const { return ops > 0 ? cpu_seconds * 1e6 / ops : 0; }
  double mb_per_s() const { return seconds > 0 ? bytes / seconds / 1e6 : 0; }
};

// User + system CPU seconds the process has used so far, every thread and
// the io_uring workers it started included.
double ProcessCpuSeconds();

// Runs one job on `queue` from the calling thread. Stops at the first
// failed request (after draining) and returns its error; kCancelled when a
// stop was requested (InstallStopHandler).
// REQUIRES: queue.depth() > spec.qd; spec.qd >= 1.
absl::StatusOr<JobResult> RunJob(Queue& queue, const JobSpec& spec);

struct ThreadJob {
  Image* image = nullptr;  // not owned
  JobSpec spec;
};

// Runs every job at once, each on its own thread with its own Queue, all
// released together once every queue exists. The result sums requests and
// bytes, merges latencies, and takes `seconds` from the release to the
// last job's end (wall clock). Returns the first error of any job.
absl::StatusOr<JobResult> RunParallel(std::vector<ThreadJob> jobs);

// Runs one job on a fresh Queue of `image` from the calling thread.
absl::StatusOr<JobResult> RunOne(Image& image, JobSpec spec);

}  // namespace qcow2::tool::bench

#endif  // QCOW2_TOOLS_BENCH_RUNNER_H_
