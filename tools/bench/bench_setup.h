// SPDX-License-Identifier: Apache-2.0
// What the `qcowtool bench` workloads share: the scratch directory, opening
// and filling images, and turning a cell's result and IoStats delta into
// result columns.
#ifndef QCOW2_TOOLS_BENCH_SETUP_H_
#define QCOW2_TOOLS_BENCH_SETUP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "qcow2/image.h"
#include "qcow2/stats.h"
#include "tools/bench/bench_output.h"
#include "tools/bench/bench_progress.h"
#include "tools/bench/bench_runner.h"

namespace qcow2::tool::bench {

// Where scratch images live. Made from --dir (files are named
// "bench-PID-NAME" and removed afterwards; the directory stays) or, without
// it, a fresh directory under $TMPDIR or /tmp, removed with its contents.
class Scratch {
 public:
  static absl::StatusOr<std::unique_ptr<Scratch>> Make(const std::string& dir);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // The path for scratch file `name` (removed when the Scratch dies).
  std::string Path(const std::string& name);
  // The same path's last component (for backing file names).
  std::string BaseName(const std::string& name);
  // Removes a scratch file now (missing files are fine).
  absl::Status Remove(const std::string& path);
  const std::string& dir() const { return dir_; }

 private:
  Scratch(std::string dir, bool owned);
  std::string dir_;
  bool owned_;
  std::vector<std::string> files_;
};

// Open options for the benchmark: O_DIRECT per `direct`, `format` ("qcow2",
// "raw" or empty to probe).
OpenOptions BenchOpenOptions(bool direct, bool read_write,
                             const std::string& format);

absl::StatusOr<std::unique_ptr<Image>> OpenBenchImage(
    const std::string& path, bool direct, bool read_write,
    const std::string& format);

// Creates `path` with `opts` (a raw file is created sparse) and opens it
// read-write.
absl::StatusOr<std::unique_ptr<Image>> CreateBenchImage(
    const std::string& path, const CreateOptions& opts, bool direct);

// Writes every byte of the image (sequential 1 MiB writes at QD 8, then a
// flush), so that reads find data and later writes find it allocated; or,
// with `len`, only [start, start + len).
absl::Status FillImage(Image& image, uint8_t byte, Progress& progress,
                       const std::string& what, uint64_t start = 0,
                       uint64_t len = 0);

// A qcow2 image and a raw file (opened with format=raw) of the same size in
// the scratch directory, both written in full and left open read-write.
// The raw target's requests go to [raw_start, raw_start + size).
struct Targets {
  std::unique_ptr<Image> qcow2;
  std::unique_ptr<Image> raw;
  std::string qcow2_path, raw_path;
  uint64_t raw_start = 0;
};
// raw_first: the raw file is written first (in the page cache, the file
// written second gets other memory; bench qd alternates the order).
absl::StatusOr<Targets> MakeFilledTargets(Scratch& scratch, Progress& progress,
                                          const std::string& stem,
                                          uint64_t size, uint32_t cluster,
                                          bool direct, bool raw_first = false);
// The same on a block device of `device_size` bytes: the qcow2 image is
// created on the device (from its start), and the raw target is the
// device itself, opened with format=raw and without image locks (the
// qcow2 image holds them), its requests in the last `size` bytes.
// Where the raw range starts on a device of `device_size` bytes, or
// nullopt when the device has no room for both.
std::optional<uint64_t> DeviceRawStart(uint64_t device_size, uint64_t size);
absl::StatusOr<Targets> MakeDeviceTargets(const std::string& device,
                                          uint64_t device_size,
                                          Progress& progress, uint64_t size,
                                          uint32_t cluster, bool direct);

// "engine": "io_uring" or "sync" (what a Queue of `image` uses).
std::string EngineName(Image& image);

// num / den, or nullopt when den is 0 (printed as "-" / null).
std::optional<double> Ratio(double num, double den);

// Adds ops, seconds, iops, mb_per_s, lat_p50_us and lat_p99_us.
void AddRateColumns(const JobResult& r, Record* row);

// Adds guest_bytes (the op's guest bytes as the library counted them),
// host_read_bytes, host_write_bytes, cow_read_bytes, write_amplification
// (host_write_bytes / guest write bytes) and cow_read_per_guest_byte
// (cow_read_bytes / guest write bytes); both null for reads or when the
// counters say no guest bytes were written.
void AddIoColumns(const IoStats& delta, Op op, Record* row);

// The summary Progress prints when a cell ends.
std::string CellSummary(const JobResult& r);

// Parameters every workload records.
void AddCommonParams(bool direct, const std::string& engine, Record* params);

}  // namespace qcow2::tool::bench

#endif  // QCOW2_TOOLS_BENCH_SETUP_H_
