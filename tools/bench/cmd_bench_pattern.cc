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
//
// With --pair=IMAGE2 both images are open at once, each with its own
// queue, and take turns: --burst requests on one, then the same requests
// on the other, the order swapped every burst, each image's offsets
// carrying on from its last burst. Only the turns are timed (and their CPU
// time counted), so a slow spell of a shared machine lands on both images
// alike and their ratio stays meaningful where two runs one after the
// other would differ by more than what is measured. Each image ends with
// one untimed flush.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench/bench_workloads.h"

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
  if (!p.pair.empty() && p.flush_interval != 0) {
    return OptionError("--flush-interval cannot be used with --pair");
  }
  if (!p.pair.empty() && p.pair == p.image) {
    return OptionError("--pair must name another image than IMAGE");
  }
  return absl::OkStatus();
}

// Runs p.count requests from p.offset; with `end_flush` (writes), then one
// untimed flush.
absl::StatusOr<JobResult> RunLoop(Queue& queue, const PatternFlags& p,
                                  uint64_t image_size, uint64_t step,
                                  Progress& progress, bool end_flush) {
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
  if (b.error.ok() && p.write && end_flush && !StopRequested()) {
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

// One image of a run: open, its queue, where its next request goes and
// what its requests did.
struct Side {
  std::string path;
  std::unique_ptr<Image> image;
  std::unique_ptr<Queue> queue;
  std::string engine;
  uint64_t size = 0;
  uint64_t offset = 0;
  IoStats before;
  IoStats delta;  // set when it is closed
  JobResult result;
};

absl::Status OpenSide(const Env& env, const PatternFlags& p, Side* side) {
  // --image-opts: the operand's file name, format and key secret.
  std::string format = p.format;
  OpenPolicy secrets = p.secrets;
  if (absl::Status s = secrets.ResolveImage(&side->path, &format); !s.ok()) {
    return s;
  }
  OpenOptions open = BenchOpenOptions(env.direct, p.write, format);
  open.force_share = p.force_share;
  open.key_secret = secrets.key_secret;
  open.backing_key_secrets = secrets.backing_key_secrets;
  auto image = Image::Open(side->path, open);
  if (!image.ok()) return image.status();
  side->image = std::move(*image);
  side->size = side->image->size();
  side->engine = EngineName(*side->image);
  side->offset = p.offset;
  QueueOptions qo;
  qo.depth = p.depth + 64;  // requests plus undrained flushes
  auto queue = side->image->CreateQueue(qo);
  if (!queue.ok()) return queue.status();
  side->queue = std::move(*queue);
  side->before = side->image->GetStats();
  return absl::OkStatus();
}

// Runs `count` requests on `side` from where its last turn ended and adds
// them (and the process's CPU time meanwhile) to its result. Returns the
// turn's IOPS.
absl::StatusOr<double> RunTurn(Side& side, const PatternFlags& p,
                               uint64_t step, uint64_t count,
                               Progress& progress, bool end_flush) {
  PatternFlags turn = p;
  turn.count = count;
  turn.offset = side.offset;
  const double cpu0 = ProcessCpuSeconds();
  auto r = RunLoop(*side.queue, turn, side.size, step, progress, end_flush);
  if (!r.ok()) return r.status();
  side.result.cpu_seconds += ProcessCpuSeconds() - cpu0;
  side.result.ops += r->ops;
  side.result.bytes += r->bytes;
  side.result.seconds += r->seconds;
  side.result.latency.Merge(r->latency);
  if (side.size != 0) {
    side.offset = static_cast<uint64_t>(
        (static_cast<unsigned __int128>(side.offset) +
         static_cast<unsigned __int128>(count) * step) %
        side.size);
  }
  return r->iops();
}

// One flush, waited for (not timed).
absl::Status FlushSide(Side& side) {
  absl::Status result;
  absl::Status s = side.queue->SubmitFlush(
      [&result](absl::Status fs) { result = std::move(fs); });
  if (!s.ok()) return s;
  side.queue->Drain();
  return result;
}

// The q-quantile (0..1) of sorted `v`, interpolated. REQUIRES: v not empty.
double Quantile(const std::vector<double>& v, double q) {
  const double at = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

// The first image's IOPS over the second's: overall, and per pair of turns.
struct PairRatios {
  std::optional<double> overall;
  std::vector<double> bursts;  // sorted once all turns ran

  std::optional<double> At(double q) const {
    if (bursts.empty()) return std::nullopt;
    return Quantile(bursts, q);
  }
};

void SetPatternParams(const Env& env, const PatternFlags& p, uint64_t step,
                      const std::vector<Side>& sides, Report* report) {
  const bool paired = sides.size() == 2;
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
      .Set("image_size", Value::Uint(sides[0].size))
      .Set("pair", paired ? Value::Str(p.pair) : Value())
      .Set("burst", paired ? Value::Uint(p.burst) : Value());
  AddCommonParams(env.direct, sides[0].engine, &report->params);
}

// Two images taking turns of --burst requests, the first going first in
// even pairs of turns; notes each pair's IOPS ratio.
absl::Status RunPairedTurns(Env& env, const PatternFlags& p, uint64_t step,
                            std::vector<Side>& sides, PairRatios* ratios) {
  uint64_t done = 0;
  for (uint64_t k = 0; done < p.count; ++k) {
    const uint64_t n = std::min(p.burst, p.count - done);
    double iops[2] = {0, 0};
    for (int j = 0; j < 2; ++j) {
      const int i = k % 2 == 0 ? j : 1 - j;
      auto r = RunTurn(sides[i], p, step, n, env.progress,
                       /*end_flush=*/false);
      if (!r.ok()) return r.status();
      iops[i] = *r;
    }
    if (iops[1] > 0) ratios->bursts.push_back(iops[0] / iops[1]);
    done += n;
  }
  if (p.write) {
    for (Side& side : sides) {
      if (absl::Status s = FlushSide(side); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// Closes every side, noting its counters; returns the progress summary.
absl::StatusOr<std::string> CloseSides(std::vector<Side>& sides) {
  std::string summary;
  for (Side& side : sides) {
    side.queue.reset();
    side.delta = side.image->GetStats().Since(side.before);
    if (absl::Status s = side.image->Close(); !s.ok()) return s;
    if (!summary.empty()) summary += "; ";
    summary += CellSummary(side.result);
  }
  return summary;
}

void AddPatternRows(const PatternFlags& p, const std::vector<Side>& sides,
                    const PairRatios& ratios, Report* report) {
  const bool paired = sides.size() == 2;
  for (size_t i = 0; i < sides.size(); ++i) {
    const Side& side = sides[i];
    Record row;
    row.Set("op", Value::Str(p.write ? "write" : "read"))
        .Set("bs", Value::Uint(p.size))
        .Set("qd", Value::Uint(p.depth));
    if (paired) row.Set("image", Value::Str(side.path));
    AddRateColumns(side.result, &row);
    AddIoColumns(side.delta, p.write ? Op::kWrite : Op::kRead, &row);
    if (paired) {
      // The first image's row carries the ratios to the second's.
      const bool first = i == 0;
      auto only_first = [first](std::optional<double> v) {
        return Value::Ratio(first ? v : std::nullopt);
      };
      row.Set("ratio_vs_pair", only_first(ratios.overall))
          .Set("burst_ratio_median", only_first(ratios.At(0.5)))
          .Set("burst_ratio_q1", only_first(ratios.At(0.25)))
          .Set("burst_ratio_q3", only_first(ratios.At(0.75)))
          .Set("bursts", first ? Value::Uint(ratios.bursts.size()) : Value());
    }
    report->rows.push_back(row);
  }
}

// qemu-img bench's own opening lines.
std::string QemuHead(const PatternFlags& p, uint64_t step, bool paired) {
  std::string head = absl::StrFormat(
      "Sending %u %s requests, %u bytes each, %d in parallel (starting at "
      "offset %u, step size %u)\n",
      p.count, p.write ? "write" : "read", p.size, p.depth, p.offset, step);
  if (p.flush_interval != 0) {
    absl::StrAppendFormat(&head, "Sending flush every %u requests\n",
                          p.flush_interval);
  }
  if (paired) {
    absl::StrAppendFormat(&head,
                          "The same requests to %s, taking turns of %u "
                          "requests with %s\n",
                          p.pair, p.burst, p.image);
  }
  return head;
}

// Each side's result lines: qemu-img's, then the counters.
std::string SideLines(const Side& side, const Record& row, bool paired) {
  auto cell = [&](const char* key, int decimals) {
    return FormatCell(*row.Find(key), decimals);
  };
  const std::string who = paired ? side.path + ": " : "";
  std::string out = absl::StrFormat("%sRun completed in %3.3f seconds.\n",
                                    who, side.result.seconds);
  absl::StrAppendFormat(
      &out,
      "%s%.0f IOPS, %.2f MB/s, latency p50 %s us, p99 %s us, CPU %s us per "
      "request\n"
      "%sHost I/O (libqcow2 counters): %s bytes read, %s bytes written for "
      "%s guest bytes; write amplification %s, COW read per guest byte %s\n",
      who, side.result.iops(), side.result.mb_per_s(), cell("lat_p50_us", 1),
      cell("lat_p99_us", 1), cell("cpu_us_per_op", 2), who,
      cell("host_read_bytes", 0), cell("host_write_bytes", 0),
      cell("guest_bytes", 0), cell("write_amplification", 3),
      cell("cow_read_per_guest_byte", 3));
  return out;
}

// qemu-img bench's own lines, then ours.
void SetPatternHead(const Env& env, const PatternFlags& p, uint64_t step,
                    const std::vector<Side>& sides, const PairRatios& ratios,
                    Report* report) {
  const bool paired = sides.size() == 2;
  report->head = QemuHead(p, step, paired);
  for (size_t i = 0; i < sides.size(); ++i) {
    report->head += SideLines(sides[i], report->rows[i], paired);
  }
  if (paired && ratios.overall) {
    absl::StrAppendFormat(
        &report->head,
        "IOPS of %s over %s: %.3f; over %u pairs of turns: median %.3f, "
        "quartiles %.3f-%.3f\n",
        p.image, p.pair, *ratios.overall, ratios.bursts.size(),
        *ratios.At(0.5), *ratios.At(0.25), *ratios.At(0.75));
  }
  absl::StrAppendFormat(&report->head, "Engine: %s, cache: %s\n",
                        sides[0].engine, env.direct ? "none" : "writeback");
}

}  // namespace

absl::Status RunPattern(Env& env, Report* report) {
  const PatternFlags& p = env.opts.pattern;
  if (absl::Status s = Validate(p); !s.ok()) return s;
  const uint64_t step = p.step.value_or(0) != 0 ? *p.step : p.size;
  const bool paired = !p.pair.empty();
  if (!paired && env.opts.Given("--burst")) {
    return OptionError("--burst is only used with --pair");
  }

  std::vector<Side> sides(paired ? 2 : 1);
  sides[0].path = p.image;
  if (paired) sides[1].path = p.pair;
  for (Side& side : sides) {
    if (absl::Status s = OpenSide(env, p, &side); !s.ok()) return s;
  }
  SetPatternParams(env, p, step, sides, report);

  env.progress.BeginCell(absl::StrFormat(
      "%u %s requests of %u bytes%s", p.count, p.write ? "write" : "read",
      p.size, paired ? " on each of two images, taking turns" : ""));
  PairRatios ratios;
  if (!paired) {
    auto r = RunTurn(sides[0], p, step, p.count, env.progress,
                     /*end_flush=*/true);
    if (!r.ok()) return r.status();
  } else if (absl::Status s = RunPairedTurns(env, p, step, sides, &ratios);
             !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> summary = CloseSides(sides);
  if (!summary.ok()) return summary.status();
  env.progress.EndCell(*summary);

  if (paired && sides[1].result.iops() > 0) {
    ratios.overall = sides[0].result.iops() / sides[1].result.iops();
  }
  std::sort(ratios.bursts.begin(), ratios.bursts.end());
  AddPatternRows(p, sides, ratios, report);
  SetPatternHead(env, p, step, sides, ratios, report);
  return absl::OkStatus();
}

}  // namespace qcow2::tool::bench
