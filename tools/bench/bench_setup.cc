// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/bench_setup.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/cli_util.h"

namespace qcow2::tool::bench {

absl::StatusOr<std::unique_ptr<Scratch>> Scratch::Make(const std::string& dir) {
  if (!dir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) {
      return absl::NotFoundError(
          absl::StrCat("--dir ", dir, " is not a directory"));
    }
    return std::unique_ptr<Scratch>(new Scratch(dir, false));
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp",
                                   "/qcowtool-bench.XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("mkdtemp ", templ));
  }
  return std::unique_ptr<Scratch>(new Scratch(templ, true));
}

Scratch::Scratch(std::string dir, bool owned)
    : dir_(std::move(dir)), owned_(owned) {}

Scratch::~Scratch() {
  std::error_code ec;
  if (owned_) {
    std::filesystem::remove_all(dir_, ec);
    return;
  }
  for (const std::string& f : files_) std::filesystem::remove(f, ec);
}

std::string Scratch::BaseName(const std::string& name) {
  return owned_ ? name : absl::StrCat("bench-", getpid(), "-", name);
}

std::string Scratch::Path(const std::string& name) {
  std::string path = absl::StrCat(dir_, "/", BaseName(name));
  files_.push_back(path);
  return path;
}

absl::Status Scratch::Remove(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot remove ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

OpenOptions BenchOpenOptions(bool direct, bool read_write,
                             const std::string& format) {
  OpenOptions o;
  o.direct_io = direct;
  o.read_write = read_write;
  o.format = format;
  return o;
}

absl::StatusOr<std::unique_ptr<Image>> OpenBenchImage(
    const std::string& path, bool direct, bool read_write,
    const std::string& format) {
  return Image::Open(path, BenchOpenOptions(direct, read_write, format));
}

absl::StatusOr<std::unique_ptr<Image>> CreateBenchImage(
    const std::string& path, const CreateOptions& opts, bool direct) {
  if (absl::Status s = CreateImage(path, opts); !s.ok()) return s;
  return OpenBenchImage(path, direct, true,
                        opts.format == ImageFormat::kRaw ? "raw" : "qcow2");
}

absl::Status FillImage(Image& image, uint8_t byte, Progress& progress,
                       const std::string& what, uint64_t start,
                       uint64_t len) {
  const uint64_t size = len != 0 ? len : image.size() - start;
  uint32_t chunk = 1 << 20;
  while (chunk > 512 && (size % chunk != 0 || start % chunk != 0)) chunk /= 2;
  if (size < chunk) return absl::OkStatus();
  progress.Step(absl::StrCat("filling ", what, " (", FormatSize(size), ")"));
  JobSpec spec;
  spec.op = Op::kWrite;
  spec.qd = 8;
  spec.max_len = chunk;
  spec.next = SequentialRequests(start, size, chunk);
  spec.count = size / chunk;
  spec.flush = true;
  spec.fill = byte;
  absl::StatusOr<JobResult> r = RunOne(image, std::move(spec));
  return r.status();
}

absl::StatusOr<Targets> MakeFilledTargets(Scratch& scratch, Progress& progress,
                                          const std::string& stem,
                                          uint64_t size, uint32_t cluster,
                                          bool direct, bool raw_first) {
  Targets t;
  t.qcow2_path = scratch.Path(stem + ".qcow2");
  t.raw_path = scratch.Path(stem + ".raw");
  for (int k = 0; k < 2; ++k) {
    const bool raw = (k == 0) == raw_first;
    CreateOptions c;
    c.size = size;
    c.cluster_size = cluster;
    if (raw) c.format = ImageFormat::kRaw;
    const std::string& path = raw ? t.raw_path : t.qcow2_path;
    auto image = CreateBenchImage(path, c, direct);
    if (!image.ok()) return image.status();
    std::unique_ptr<Image>& slot = raw ? t.raw : t.qcow2;
    slot = std::move(*image);
    if (auto s = FillImage(*slot, 0x5a, progress, stem + (raw ? ".raw" : ".qcow2"));
        !s.ok()) {
      return s;
    }
  }
  return t;
}

std::optional<uint64_t> DeviceRawStart(uint64_t device_size, uint64_t size) {
  // Room for the qcow2 image written in full (data, and metadata well
  // under 1/64 of it) below the raw range, which starts on a MiB.
  const uint64_t raw_start = (device_size - std::min(device_size, size)) &
                             ~uint64_t{(1 << 20) - 1};
  if (raw_start < size + size / 64 + (4 << 20)) return std::nullopt;
  return raw_start;
}

absl::StatusOr<Targets> MakeDeviceTargets(const std::string& device,
                                          uint64_t device_size,
                                          Progress& progress, uint64_t size,
                                          uint32_t cluster, bool direct) {
  const std::optional<uint64_t> raw_start = DeviceRawStart(device_size, size);
  if (!raw_start) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", device, " (", FormatSize(device_size),
        ") is too small for a qcow2 image and a raw range of --image-size ",
        FormatSize(size), " each"));
  }
  Targets t;
  t.qcow2_path = device;
  t.raw_path = device;
  t.raw_start = *raw_start;
  CreateOptions c;
  c.size = size;
  c.cluster_size = cluster;
  auto q = CreateBenchImage(device, c, direct);
  if (!q.ok()) return q.status();
  t.qcow2 = std::move(*q);
  if (auto s = FillImage(*t.qcow2, 0x5a, progress, "qcow2 on " + device);
      !s.ok()) {
    return s;
  }
  OpenOptions raw = BenchOpenOptions(direct, true, "raw");
  raw.lock = false;
  auto r = Image::Open(device, raw);
  if (!r.ok()) return r.status();
  t.raw = std::move(*r);
  if (auto s = FillImage(*t.raw, 0x5a, progress, "raw range of " + device,
                         *raw_start, size);
      !s.ok()) {
    return s;
  }
  return t;
}

std::string EngineName(Image& image) {
  auto q = image.CreateQueue();
  if (!q.ok()) return "unknown";
  return (*q)->uses_io_uring() ? "io_uring" : "sync";
}

std::optional<double> Ratio(double num, double den) {
  if (den == 0) return std::nullopt;
  return num / den;
}

void AddRateColumns(const JobResult& r, Record* row) {
  row->Set("ops", Value::Uint(r.ops))
      .Set("seconds", Value::Num(r.seconds))
      .Set("iops", Value::Num(r.iops()))
      .Set("mb_per_s", Value::Num(r.mb_per_s()))
      .Set("lat_p50_us", Value::Num(r.latency.PercentileUs(0.50)))
      .Set("lat_p99_us", Value::Num(r.latency.PercentileUs(0.99)))
      .Set("cpu_us_per_op", Value::Num(r.cpu_us_per_op()));
}

void AddIoColumns(const IoStats& d, Op op, Record* row) {
  const uint64_t guest =
      op == Op::kWrite ? d.guest_write_bytes : d.guest_read_bytes;
  const double written = static_cast<double>(d.guest_write_bytes);
  row->Set("guest_bytes", Value::Uint(guest))
      .Set("host_read_bytes", Value::Uint(d.host_read_bytes()))
      .Set("host_write_bytes", Value::Uint(d.host_write_bytes()))
      .Set("cow_read_bytes", Value::Uint(d.cow_read_bytes))
      .Set("host_calls_under_lock", Value::Uint(d.host_calls_under_lock))
      .Set("write_amplification",
           Value::Ratio(
               op == Op::kWrite
                   ? Ratio(static_cast<double>(d.host_write_bytes()), written)
                   : std::nullopt))
      .Set("cow_read_per_guest_byte",
           Value::Ratio(
               op == Op::kWrite
                   ? Ratio(static_cast<double>(d.cow_read_bytes), written)
                   : std::nullopt));
}

std::string CellSummary(const JobResult& r) {
  return absl::StrFormat("%.0f IOPS, %.1f MB/s, p99 %.0f us", r.iops(),
                         r.mb_per_s(), r.latency.PercentileUs(0.99));
}

void AddCommonParams(bool direct, const std::string& engine, Record* params) {
  params->Set("cache", Value::Str(direct ? "none" : "writeback"))
      .Set("engine", Value::Str(engine));
}

}  // namespace qcow2::tool::bench
