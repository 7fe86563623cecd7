// SPDX-License-Identifier: Apache-2.0
// qcowtool bench pattern: `qemu-img bench` on an existing image, with its
// flags and request pattern, so the two can be compared run for run.
//
// The request loop follows qemu-img.c's bench_cb(): up to DEPTH requests
// in flight; the next request goes to `offset`, then offset += STEP and
// offset %= image size (a request that would cross the end fails, as in
// QEMU 7.2); with --flush-interval=N a flush is sent whenever the number of
// requests not yet submitted is a multiple of N, after draining the queue
// unless --no-drain. The clock runs from the first submission until the
// last request completes; a write run then ends with one untimed flush
// (qemu-img's happens when it closes the image) so that the host bytes
// include the metadata. Completions only record what happened; the loop
// itself submits (a Queue's callbacks run inside Poll()).
#include <chrono>
#include <cinttypes>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench_workloads.h"

namespace qcow2::tool::bench {
namespace {

using Clock = std::chrono::steady_clock;

// bench_cb's state.
struct BenchState {
  uint64_t n = 0;          // requests not yet completed
  uint64_t in_flight = 0;  // requests (not flushes) in flight
  bool in_flush = false;   // a draining flush is in flight
  bool blocked = false;    // drained flush pending: submit nothing
  int flushes_wanted = 0;  // flushes to submit from the loop
  uint64_t offset = 0;
  absl::Status error;
};

absl::Status Validate(const PatternFlags& p) {
  if (p.write && p.force_share) {
    return OptionError("force-share=on can only be used with read-only images");
  }
  if (!p.write && p.flush_interval != 0) {
    return OptionError("--flush-interval is only available in write tests");
  }
  if (p.flush_interval != 0 &&
      p.flush_interval < static_cast<uint64_t>(p.depth)) {
    return OptionError("--flush-interval can't be smaller than depth (-d)");
  }
  return absl::OkStatus();
}

absl::StatusOr<JobResult> RunLoop(Queue& queue, const PatternFlags& p,
                                  uint64_t image_size, uint64_t step,
                                  Progress& progress) {
  AlignedBuffer buffer(static_cast<size_t>(p.depth) * p.size, p.pattern);
  std::vector<Clock::time_point> started(p.depth);
  std::vector<int> free_slots;
  for (int i = p.depth - 1; i >= 0; --i) free_slots.push_back(i);
  BenchState b;
  b.n = p.count;
  b.offset = p.offset;
  JobResult result;

  auto on_request = [&](int slot, absl::Status s) {
    const Clock::time_point end = Clock::now();
    free_slots.push_back(slot);
    if (!s.ok() && b.error.ok()) b.error = std::move(s);
    result.latency.Add(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(end -
                                                             started[slot])
            .count()));
    ++result.ops;
    result.bytes += p.size;
    const uint64_t remaining = b.n - b.in_flight;
    --b.n;
    --b.in_flight;
    if (p.flush_interval != 0 && remaining % p.flush_interval == 0) {
      if (b.in_flight == 0 || !p.drain_on_flush) ++b.flushes_wanted;
      if (p.drain_on_flush) b.blocked = true;
    }
    if ((result.ops & 63) == 0) progress.Add(64);
  };

  const Clock::time_point t0 = Clock::now();
  while (b.n > 0 && b.error.ok() && !StopRequested()) {
    for (; b.flushes_wanted > 0; --b.flushes_wanted) {
      const bool drain = p.drain_on_flush;
      if (drain) b.in_flush = true;
      absl::Status s = queue.SubmitFlush([&, drain](absl::Status fs) {
        if (!fs.ok() && b.error.ok()) b.error = std::move(fs);
        if (drain) b.in_flush = b.blocked = false;
      });
      if (!s.ok()) return s;
    }
    while (!b.blocked && !b.in_flush && b.n > b.in_flight &&
           b.in_flight < static_cast<uint64_t>(p.depth)) {
      const int slot = free_slots.back();
      uint8_t* buf = buffer.data() + static_cast<size_t>(slot) * p.size;
      Completion done = [&, slot](absl::Status s) {
        on_request(slot, std::move(s));
      };
      started[slot] = Clock::now();
      absl::Status s =
          p.write ? queue.SubmitWrite(b.offset, absl::MakeSpan(buf, p.size),
                                      std::move(done))
                  : queue.SubmitRead(b.offset, absl::MakeSpan(buf, p.size),
                                     std::move(done));
      if (!s.ok()) {
        queue.Drain();
        return s;
      }
      free_slots.pop_back();
      ++b.in_flight;
      b.offset = image_size == 0 ? 0 : (b.offset + step) % image_size;
    }
    queue.Poll(1);
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // Untimed, as in qemu-img (whose final flush runs when the image is
  // closed), but inside the counters' window so metadata is counted.
  if (b.error.ok() && p.write && !StopRequested()) {
    absl::Status s = queue.SubmitFlush([&](absl::Status fs) {
      if (!fs.ok() && b.error.ok()) b.error = std::move(fs);
    });
    if (!s.ok() && b.error.ok()) b.error = std::move(s);
  }
  queue.Drain();
  if (!b.error.ok()) return b.error;
  if (StopRequested()) return absl::CancelledError("interrupted");
  return result;
}

}  // namespace

absl::Status RunPattern(Env& env, Report* report) {
  const PatternFlags& p = env.opts.pattern;
  if (absl::Status s = Validate(p); !s.ok()) return s;
  const uint64_t step = p.step.value_or(0) != 0 ? *p.step : p.size;

  OpenOptions open = BenchOpenOptions(env.direct, p.write, p.format);
  open.force_share = p.force_share;
  auto image = Image::Open(p.image, open);
  if (!image.ok()) return image.status();
  const uint64_t image_size = (*image)->size();
  const std::string engine = EngineName(**image);

  report->params.Set("image", Value::Str(p.image))
      .Set("op", Value::Str(p.write ? "write" : "read"))
      .Set("count", Value::Uint(p.count))
      .Set("qd", Value::Uint(p.depth))
      .Set("bs", Value::Uint(p.size))
      .Set("step", Value::Uint(step))
      .Set("offset", Value::Uint(p.offset))
      .Set("pattern", Value::Uint(p.pattern))
      .Set("flush_interval", Value::Uint(p.flush_interval))
      .Set("drain_on_flush", Value::Bool(p.drain_on_flush))
      .Set("aio", p.aio.empty() ? Value() : Value::Str(p.aio))
      .Set("image_size", Value::Uint(image_size));
  AddCommonParams(env.direct, engine, &report->params);

  QueueOptions qo;
  qo.depth = p.depth + 64;  // requests plus undrained flushes
  auto queue = (*image)->CreateQueue(qo);
  if (!queue.ok()) return queue.status();
  env.progress.BeginCell(absl::StrFormat("%u %s requests of %u bytes", p.count,
                                         p.write ? "write" : "read", p.size));
  const IoStats before = (*image)->GetStats();
  const double cpu0 = ProcessCpuSeconds();
  auto r = RunLoop(**queue, p, image_size, step, env.progress);
  if (r.ok()) r->cpu_seconds = ProcessCpuSeconds() - cpu0;
  queue->reset();
  if (!r.ok()) return r.status();
  const IoStats delta = (*image)->GetStats().Since(before);
  env.progress.EndCell(CellSummary(*r));
  if (absl::Status s = (*image)->Close(); !s.ok()) return s;

  Record row;
  row.Set("op", Value::Str(p.write ? "write" : "read"))
      .Set("bs", Value::Uint(p.size))
      .Set("qd", Value::Uint(p.depth));
  AddRateColumns(*r, &row);
  AddIoColumns(delta, p.write ? Op::kWrite : Op::kRead, &row);
  report->rows.push_back(row);

  // qemu-img bench's own lines, then ours.
  report->head = absl::StrFormat(
      "Sending %u %s requests, %u bytes each, %d in parallel (starting at "
      "offset %u, step size %u)\n",
      p.count, p.write ? "write" : "read", p.size, p.depth, p.offset, step);
  if (p.flush_interval != 0) {
    absl::StrAppendFormat(&report->head, "Sending flush every %u requests\n",
                          p.flush_interval);
  }
  absl::StrAppendFormat(&report->head, "Run completed in %3.3f seconds.\n",
                        r->seconds);
  auto cell = [&](const char* key, int decimals) {
    return FormatCell(*row.Find(key), decimals);
  };
  absl::StrAppendFormat(
      &report->head,
      "%.0f IOPS, %.2f MB/s, latency p50 %s us, p99 %s us, CPU %s us per "
      "request\n"
      "Host I/O (libqcow2 counters): %s bytes read, %s bytes written for %s "
      "guest bytes; write amplification %s, COW read per guest byte %s\n"
      "Engine: %s, cache: %s\n",
      r->iops(), r->mb_per_s(), cell("lat_p50_us", 1), cell("lat_p99_us", 1),
      cell("cpu_us_per_op", 2),
      cell("host_read_bytes", 0), cell("host_write_bytes", 0),
      cell("guest_bytes", 0), cell("write_amplification", 3),
      cell("cow_read_per_guest_byte", 3), engine,
      env.direct ? "none" : "writeback");
  return absl::OkStatus();
}

}  // namespace qcow2::tool::bench
