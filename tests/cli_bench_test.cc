// SPDX-License-Identifier: Apache-2.0
// qcowtool bench: short runs of every workload with --output=json, checked
// for shape and internal consistency (never for speed), option errors, the
// SVG chart, and the tool's latency histogram and chart renderer.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "tests/util/json_lite.h"
#include "tests/util/loop_device.h"
#include "tests/util/test_util.h"
#include "tools/bench/bench_output.h"
#include "tools/bench/bench_runner.h"
#include "tools/bench/bench_setup.h"
#include "tools/bench/bench_svg.h"

// The tool's helpers are not part of any library target: compile them in.
#include "tools/bench/bench_output.cc"    // NOLINT(build/include)
#include "tools/bench/bench_progress.cc"  // NOLINT(build/include)
#include "tools/bench/bench_runner.cc"    // NOLINT(build/include)
#include "tools/bench/bench_setup.cc"     // NOLINT(build/include)
#include "tools/bench/bench_svg.cc"       // NOLINT(build/include)
#include "tools/cli_util.cc"        // NOLINT(build/include)

namespace qcow2::tool::bench {
namespace {

using ::qcow2::testing::CommandResult;
using ::qcow2::testing::TempDir;
namespace json = ::qcow2::testing::json;

CommandResult RunCmd(const std::vector<std::string>& argv) {
  return ::qcow2::testing::Run(argv);
}

std::string Qcowtool() {
#ifdef QCOWTOOL_BIN
  return QCOWTOOL_BIN;
#else
  return ::qcow2::testing::QcowtoolPath();
#endif
}

// "--cache=none" where the scratch file system takes O_DIRECT, else
// "--cache=writeback" (tmpfs on older kernels).
std::string CacheFlag(const std::string& dir) {
  const std::string probe = dir + "/odirect-probe";
  int fd = open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT, 0644);
  if (fd >= 0) close(fd);
  unlink(probe.c_str());
  return fd >= 0 ? "--cache=none" : "--cache=writeback";
}

// Runs `qcowtool bench ARGS -q --output=json --dir DIR` and parses stdout.
json::Value RunJson(const TempDir& dir, std::vector<std::string> args) {
  std::vector<std::string> argv = {Qcowtool(), "bench"};
  argv.insert(argv.end(), args.begin(), args.end());
  for (const char* a : {"-q", "--output=json"}) argv.push_back(a);
  if (args.empty() || args[0] != "pattern") {
    argv.push_back("--dir=" + dir.path());
    argv.push_back(CacheFlag(dir.path()));
  }
  CommandResult r = RunCmd(argv);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto v = json::Parse(r.out);
  EXPECT_TRUE(v.ok()) << v.status() << "\n" << r.out;
  return v.ok() ? *v : json::Value();
}

bool DirEmpty(const std::string& dir) { return std::filesystem::is_empty(dir); }

double Num(const json::Value& row, const char* key) {
  return row[key].as_double();
}

// The rate and I/O columns every timed row has, and their consistency:
// amplification = host_write_bytes / guest_bytes as printed (null when the
// counters saw no guest bytes, and always for reads).
void CheckRow(const json::Value& row, const std::string& op) {
  for (const char* key :
       {"ops", "seconds", "iops", "mb_per_s", "lat_p50_us", "lat_p99_us",
        "guest_bytes", "host_read_bytes", "host_write_bytes",
        "write_amplification", "cow_read_per_guest_byte"}) {
    EXPECT_NE(row.Find(key), nullptr) << key << " missing: " << row.ToString();
  }
  EXPECT_GT(Num(row, "ops"), 0) << row.ToString();
  EXPECT_LE(Num(row, "lat_p50_us"), Num(row, "lat_p99_us"));
  if (Num(row, "seconds") > 0) {
    EXPECT_NEAR(Num(row, "iops"), Num(row, "ops") / Num(row, "seconds"),
                1e-3 * Num(row, "iops") + 1e-3);
  }
  const double guest = Num(row, "guest_bytes");
  const json::Value& amp = row["write_amplification"];
  const json::Value& cow = row["cow_read_per_guest_byte"];
  if (op == "read" || guest == 0) {
    EXPECT_TRUE(amp.is_null()) << row.ToString();
    EXPECT_TRUE(cow.is_null()) << row.ToString();
    return;
  }
  ASSERT_TRUE(amp.is_number()) << row.ToString();
  EXPECT_NEAR(amp.as_double(), Num(row, "host_write_bytes") / guest,
              1e-5 * amp.as_double());
  EXPECT_NEAR(cow.as_double(), Num(row, "cow_read_bytes") / guest,
              1e-5 * cow.as_double() + 1e-9);
  EXPECT_GE(Num(row, "host_write_bytes"), guest);
}

// A well-formedness check for the SVG we write: one root <svg> element,
// every tag closed in order, no stray '<' or '&' in text.
::testing::AssertionResult WellFormedSvg(const std::string& svg) {
  if (!absl::StartsWith(svg, "<?xml")) {
    return ::testing::AssertionFailure() << "no XML declaration";
  }
  std::vector<std::string> open;
  int roots = 0;
  size_t i = svg.find("?>") + 2;
  while ((i = svg.find_first_of("<&", i)) != std::string::npos) {
    if (svg[i] == '&') {
      const size_t semi = svg.find(';', i);
      const std::string ent = svg.substr(i, semi - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;") {
        return ::testing::AssertionFailure() << "bad entity at " << i;
      }
      i = semi;
      continue;
    }
    const size_t end = svg.find('>', i);
    if (end == std::string::npos) {
      return ::testing::AssertionFailure() << "unterminated tag at " << i;
    }
    std::string tag = svg.substr(i + 1, end - i - 1);
    if (tag.find('<') != std::string::npos) {
      return ::testing::AssertionFailure() << "'<' inside a tag at " << i;
    }
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) {
        return ::testing::AssertionFailure() << "mismatched </" << tag << ">";
      }
      open.pop_back();
    } else if (tag.back() != '/') {
      const std::string name = tag.substr(0, tag.find(' '));
      if (open.empty()) ++roots;
      if (open.empty() && name != "svg") {
        return ::testing::AssertionFailure() << "root is <" << name << ">";
      }
      open.push_back(name);
    }
    i = end + 1;
  }
  if (!open.empty()) return ::testing::AssertionFailure() << "unclosed tags";
  if (roots != 1) return ::testing::AssertionFailure() << roots << " roots";
  return ::testing::AssertionSuccess();
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(BenchCliTest, OverlayRowsAndParams) {
  TempDir dir;
  json::Value v = RunJson(
      dir, {"overlay", "--image-size=8M", "--depth=2", "--bs=4k,64k", "--qd=4",
            "--count=40", "--plot=" + dir.File("overlay.svg")});
  EXPECT_EQ(v["workload"].as_string(), "overlay");
  const json::Value& p = v["params"];
  EXPECT_EQ(p["depth"].as_uint64(), 2u);
  EXPECT_EQ(p["image_size"].as_uint64(), 8u << 20);
  EXPECT_EQ(p["cluster_size"].as_uint64(), 65536u);
  EXPECT_FALSE(p["extended_l2"].as_bool());
  EXPECT_EQ(p["count"].as_uint64(), 40u);
  EXPECT_TRUE(p["time"].is_null());
  EXPECT_EQ(p["bs"].ToString(), "[4096,65536]");
  EXPECT_EQ(p["qd"].ToString(), "[4]");
  EXPECT_TRUE(p["engine"].is_string());
  // depths (0..2) x ops (read, write) x sizes (2) x queue depths (1).
  const json::Value& rows = v["rows"];
  ASSERT_EQ(rows.size(), 3u * 2 * 2);
  size_t i = 0;
  for (uint64_t depth = 0; depth <= 2; ++depth) {
    for (const char* op : {"read", "write"}) {
      for (uint64_t bs : {4096u, 65536u}) {
        const json::Value& row = rows[i++];
        EXPECT_EQ(row["depth"].as_uint64(), depth);
        EXPECT_EQ(row["op"].as_string(), op);
        EXPECT_EQ(row["bs"].as_uint64(), bs);
        EXPECT_EQ(row["qd"].as_uint64(), 4u);
        EXPECT_EQ(row["ops"].as_uint64(), 40u);
        CheckRow(row, op);
        const uint64_t guest = row["guest_bytes"].as_uint64();
        EXPECT_TRUE(guest == 0 || guest == 40 * bs) << row.ToString();
      }
    }
  }
  const std::string svg = ReadText(dir.File("overlay.svg"));
  EXPECT_TRUE(WellFormedSvg(svg));
  EXPECT_TRUE(absl::StrContains(svg, "IOPS by chain depth"));
  EXPECT_TRUE(absl::StrContains(svg, "write 4k"));
  // Scratch images are gone; only the chart is left.
  std::filesystem::remove(dir.File("overlay.svg"));
  EXPECT_TRUE(DirEmpty(dir.path()));
}

TEST(BenchCliTest, DefaultScratchDirIsRemoved) {
  TempDir tmp;
  CommandResult r = ::qcow2::testing::RunShell(absl::StrCat(
      "TMPDIR=", tmp.path(), " ", Qcowtool(),
      " bench overlay --image-size=2M --depth=1 --bs=4k --count=8 ",
      CacheFlag(tmp.path())));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Human output: a header and one line per row; a progress line per cell.
  EXPECT_TRUE(absl::StrContains(r.out, "write amp")) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1 + 2 * 2);
  EXPECT_TRUE(absl::StrContains(r.err, "[4/4] depth 1 write 4k")) << r.err;
  EXPECT_TRUE(DirEmpty(tmp.path()));
}

TEST(BenchCliTest, ScalingRatiosMatchRawRows) {
  TempDir dir;
  json::Value v =
      RunJson(dir, {"scaling", "--writers=1,2", "--size-per-writer=1M",
                    "--bs=256k", "--qd=2", "--repeat=3"});
  EXPECT_EQ(v["params"]["repeat"].as_uint64(), 3u);
  const json::Value& rows = v["rows"];
  ASSERT_EQ(rows.size(), 2u * 4);
  for (size_t i = 0; i < rows.size(); ++i) {
    const json::Value& row = rows[i];
    const std::string mode = row["mode"].as_string();
    // The median run's own counts, inside the spread of the three.
    EXPECT_EQ(row["ops"].as_uint64(), row["writers"].as_uint64() * 4);
    EXPECT_EQ(row["runs"].as_uint64(), 3u);
    EXPECT_LE(Num(row, "min_mb_per_s"), Num(row, "mb_per_s"));
    EXPECT_LE(Num(row, "mb_per_s"), Num(row, "max_mb_per_s"));
    CheckRow(row, "write");
    // Rows go by writers, then mode: one writer's row in this mode is
    // rows[i % 4].
    const json::Value& one = rows[i % 4];
    ASSERT_EQ(one["mode"].as_string(), mode);
    ASSERT_EQ(one["writers"].as_uint64(), 1u);
    EXPECT_NEAR(Num(row, "ratio_vs_1_writer"),
                Num(row, "mb_per_s") / Num(one, "mb_per_s"),
                1e-3 * Num(row, "ratio_vs_1_writer"));
    if (absl::StartsWith(mode, "raw-")) {
      EXPECT_TRUE(row["ratio_vs_raw"].is_null());
      continue;
    }
    const json::Value& raw = rows[i + 2];
    ASSERT_EQ(raw["mode"].as_string(), "raw-" + mode);
    EXPECT_NEAR(Num(row, "ratio_vs_raw"),
                Num(row, "mb_per_s") / Num(raw, "mb_per_s"),
                1e-3 * Num(row, "ratio_vs_raw"));
  }
  EXPECT_TRUE(DirEmpty(dir.path()));
}

// With --flush-interval each writer also flushes every N of its writes:
// 4 writes each, so 2 more flushes per writer beside the final one (one
// may be put off while another runs, but none is dropped).
TEST(BenchCliTest, ScalingFlushInterval) {
  TempDir dir;
  json::Value v = RunJson(
      dir, {"scaling", "--writers=1,2", "--modes=shared,raw-shared",
            "--size-per-writer=1M", "--bs=256k", "--qd=2", "--repeat=1",
            "--flush-interval=2"});
  EXPECT_EQ(v["params"]["flush_interval"].as_uint64(), 2u);
  const json::Value& rows = v["rows"];
  ASSERT_EQ(rows.size(), 2u * 2);
  for (size_t i = 0; i < rows.size(); ++i) {
    const json::Value& row = rows[i];
    const uint64_t writers = row["writers"].as_uint64();
    EXPECT_EQ(row["ops"].as_uint64(), writers * 4);
    EXPECT_EQ(row["guest_flushes"].as_uint64(), writers * 3)
        << row.ToString();
    CheckRow(row, "write");
  }
  EXPECT_TRUE(DirEmpty(dir.path()));
}

// The median over rounds of a's IOPS over b's in the same round (upper
// median for an even count), from the rows' round_iops.
double MedianRoundRatio(const json::Value& a, const json::Value& b) {
  const auto& x = a["round_iops"].array();
  const auto& y = b["round_iops"].array();
  EXPECT_EQ(x.size(), y.size());
  std::vector<double> r;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    r.push_back(x[i].as_double() / y[i].as_double());
  }
  std::sort(r.begin(), r.end());
  return r.empty() ? 0 : r[r.size() / 2];
}

// A row measured in `rounds` rounds: its IOPS is the median round's.
void CheckRounds(const json::Value& row, size_t rounds) {
  ASSERT_EQ(row["runs"].as_uint64(), rounds) << row.ToString();
  std::vector<double> iops;
  for (const json::Value& x : row["round_iops"].array()) {
    iops.push_back(x.as_double());
  }
  ASSERT_EQ(iops.size(), rounds);
  std::sort(iops.begin(), iops.end());
  EXPECT_NEAR(Num(row, "iops"), iops[rounds / 2], 1e-5 * iops[rounds / 2]);
  EXPECT_NEAR(Num(row, "iops_min"), iops.front(), 1e-5 * iops.front());
  EXPECT_NEAR(Num(row, "iops_max"), iops.back(), 1e-5 * iops.back());
}

// The rmw rows: fresh overlays (standard and extended L2) and the
// allocated image per size, then reads at depth 0 and N. The counters show
// the copy-on-write each row implies; ratios point at the right baseline.
TEST(BenchCliTest, RmwRowsAndBaselines) {
  TempDir dir;
  json::Value v = RunJson(dir, {"rmw", "--image-size=8M", "--depth=3",
                                "--count=200", "--time=0.2", "--repeat=3"});
  const json::Value& rows = v["rows"];
  // Per size: standard L2, extended L2, allocated, sparse raw, reserved
  // raw. Then three sequential rows and two read rows.
  constexpr size_t kPerSize = 5;
  ASSERT_EQ(rows.size(), 2u * kPerSize + 3 + 2);
  auto iops_of = [&](size_t i) { return Num(rows[i], "iops"); };
  for (size_t b = 0; b < 2; ++b) {
    const uint64_t bs = b == 0 ? 4096 : 65536;
    const size_t first = kPerSize * b;
    const json::Value& std_l2 = rows[first];
    const json::Value& ext_l2 = rows[first + 1];
    const json::Value& alloc = rows[first + 2];
    const json::Value& raw = rows[first + 3];
    const json::Value& reserved = rows[first + 4];
    EXPECT_EQ(raw["target"].as_string(), "fresh raw file");
    EXPECT_EQ(reserved["target"].as_string(), "reserved raw file");
    for (const json::Value* r : {&raw, &reserved}) {
      EXPECT_EQ(Num(*r, "cow_read_per_guest_byte"), 0);
      EXPECT_EQ((*r)["cluster_allocations"].as_uint64(), 0u);
    }
    for (const json::Value* r : {&std_l2, &ext_l2, &alloc, &raw, &reserved}) {
      EXPECT_EQ((*r)["bs"].as_uint64(), bs);
      EXPECT_EQ((*r)["op"].as_string(), "write");
      EXPECT_EQ((*r)["ops"].as_uint64(), 200u);
      CheckRow(*r, "write");
    }
    EXPECT_EQ(std_l2["target"].as_string(), "fresh overlay");
    EXPECT_FALSE(std_l2["extended_l2"].as_bool());
    EXPECT_TRUE(ext_l2["extended_l2"].as_bool());
    EXPECT_EQ(alloc["target"].as_string(), "allocated");
    EXPECT_TRUE(alloc["ratio_vs_baseline"].is_null());
    EXPECT_EQ(alloc["cluster_allocations"].as_uint64(), 0u);
    EXPECT_GT(std_l2["cluster_allocations"].as_uint64(), 0u);
    // Each write row is the median of three rounds; its ratios are the
    // medians of the rounds' ratios, against the allocated image and (for
    // the fresh overlays) the reserved raw file of the same round.
    for (size_t i = first; i < first + kPerSize; ++i) CheckRounds(rows[i], 3);
    for (size_t i : {first, first + 1, first + 3, first + 4}) {
      EXPECT_NEAR(Num(rows[i], "ratio_vs_baseline"),
                  MedianRoundRatio(rows[i], alloc),
                  1e-3 * Num(rows[i], "ratio_vs_baseline"));
    }
    for (size_t i : {first, first + 1}) {
      EXPECT_NEAR(Num(rows[i], "ratio_vs_raw"),
                  MedianRoundRatio(rows[i], reserved),
                  1e-3 * Num(rows[i], "ratio_vs_raw"));
    }
    for (size_t i : {first + 2, first + 3, first + 4}) {
      EXPECT_TRUE(rows[i]["ratio_vs_raw"].is_null()) << rows[i].ToString();
    }
    // 64 KiB writes cover whole clusters and 4 KiB ones whole subclusters:
    // no copy at all. Standard L2 with 4 KiB writes copies the rest of
    // each new cluster: 60 KiB read per allocation.
    EXPECT_EQ(Num(ext_l2, "cow_read_per_guest_byte"), 0);
    if (bs == 65536) {
      EXPECT_EQ(Num(std_l2, "cow_read_per_guest_byte"), 0);
    } else {
      EXPECT_NEAR(Num(std_l2, "cow_read_clusters_per_alloc"), 60.0 / 64,
                  1e-9);
    }
  }
  // Sequential 4 KiB writes (200 of them: 12.5 clusters). With standard
  // L2 only the first cluster is copied on its first write (60 KiB) and
  // the half-written last one at the flush (32 KiB): each cluster between
  // is filled by the writes alone.
  for (size_t i = 10; i < 13; ++i) {
    EXPECT_EQ(rows[i]["pattern"].as_string(), "sequential");
    EXPECT_EQ(rows[i]["bs"].as_uint64(), 4096u);
    EXPECT_EQ(rows[i]["ops"].as_uint64(), 200u);
    CheckRow(rows[i], "write");
  }
  EXPECT_EQ(rows[0]["pattern"].as_string(), "random");
  EXPECT_FALSE(rows[10]["extended_l2"].as_bool());
  EXPECT_TRUE(rows[11]["extended_l2"].as_bool());
  EXPECT_EQ(rows[12]["target"].as_string(), "allocated");
  EXPECT_NEAR(Num(rows[10], "cow_read_per_guest_byte"),
              (61440.0 + 32768) / (200 * 4096), 1e-9);
  EXPECT_EQ(Num(rows[11], "cow_read_per_guest_byte"), 0);
  for (size_t i : {10u, 11u, 12u}) {
    CheckRounds(rows[i], 3);
    EXPECT_TRUE(rows[i]["ratio_vs_raw"].is_null()) << rows[i].ToString();
  }
  for (size_t i : {10u, 11u}) {
    EXPECT_NEAR(Num(rows[i], "ratio_vs_baseline"),
                MedianRoundRatio(rows[i], rows[12]),
                1e-3 * Num(rows[i], "ratio_vs_baseline"));
  }
  EXPECT_EQ(rows[13]["depth"].as_uint64(), 0u);
  EXPECT_EQ(rows[14]["depth"].as_uint64(), 3u);
  EXPECT_TRUE(rows[13]["ratio_vs_baseline"].is_null());
  EXPECT_NEAR(Num(rows[14], "ratio_vs_baseline"),
              MedianRoundRatio(rows[14], rows[13]),
              1e-3 * Num(rows[14], "ratio_vs_baseline"));
  // Each read row is the median of three rounds, inside their spread.
  EXPECT_EQ(v["params"]["rounds"].as_uint64(), 3u);
  for (size_t i : {13u, 14u}) {
    CheckRow(rows[i], "read");
    CheckRounds(rows[i], 3);
    EXPECT_TRUE(rows[i]["ratio_vs_raw"].is_null());
    EXPECT_EQ(rows[i]["runs"].as_uint64(), 3u);
    EXPECT_LE(Num(rows[i], "iops_min"), iops_of(i));
    EXPECT_GE(Num(rows[i], "iops_max"), iops_of(i));
  }
  EXPECT_TRUE(DirEmpty(dir.path()));
}

TEST(BenchCliTest, QdSideBySide) {
  TempDir dir;
  json::Value v = RunJson(dir, {"qd", "--image-size=4M", "--qd=1,4",
                                "--count=50", "--plot=" + dir.File("qd.svg")});
  const json::Value& rows = v["rows"];
  ASSERT_EQ(rows.size(), 4u);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i]["qd"].as_uint64(), i < 2 ? 1u : 4u);
    EXPECT_EQ(rows[i]["target"].as_string(), i % 2 ? "raw" : "qcow2");
    CheckRow(rows[i], "read");
  }
  EXPECT_NEAR(Num(rows[0], "ratio_vs_raw"),
              Num(rows[0], "iops") / Num(rows[1], "iops"),
              1e-3 * Num(rows[0], "ratio_vs_raw"));
  EXPECT_TRUE(rows[1]["ratio_vs_raw"].is_null());
  EXPECT_TRUE(WellFormedSvg(ReadText(dir.File("qd.svg"))));
}

// --modes=read,write measures both, and every row carries the CPU time
// per request, with qcow2's against raw's on the qcow2 row.
TEST(BenchCliTest, QdWritesAndCpuPerRequest) {
  TempDir dir;
  json::Value v = RunJson(dir, {"qd", "--image-size=4M", "--qd=2",
                                "--modes=read,write", "--count=2000"});
  EXPECT_EQ(v["params"]["modes"].as_string(), "read,write");
  const json::Value& rows = v["rows"];
  ASSERT_EQ(rows.size(), 4u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string op = i < 2 ? "read" : "write";
    EXPECT_EQ(rows[i]["op"].as_string(), op);
    CheckRow(rows[i], op);
    EXPECT_EQ(rows[i]["ops"].as_uint64(), 2000u);
    EXPECT_GT(Num(rows[i], "cpu_us_per_op"), 0) << i;
  }
  for (size_t i : {0u, 2u}) {
    EXPECT_NEAR(Num(rows[i], "cpu_ratio_vs_raw"),
                Num(rows[i], "cpu_us_per_op") /
                    Num(rows[i + 1], "cpu_us_per_op"),
                1e-3 * Num(rows[i], "cpu_ratio_vs_raw"));
    EXPECT_TRUE(rows[i + 1]["cpu_ratio_vs_raw"].is_null());
  }
  EXPECT_GT(rows[2]["guest_bytes"].as_uint64(), 0u);
}

// --repeat=N: N rounds on newly written targets (the scratch directory
// holds one pair at a time and is empty afterwards); each target's row is
// the median round, and the round ratios' spread brackets nothing wider
// than the rounds themselves.
TEST(BenchCliTest, QdRoundsOnNewTargets) {
  TempDir dir;
  json::Value v = RunJson(dir, {"qd", "--image-size=4M", "--qd=2",
                                "--modes=read,write", "--count=300",
                                "--repeat=3"});
  EXPECT_EQ(v["params"]["rounds"].as_uint64(), 3u);
  const json::Value& rows = v["rows"];
  ASSERT_EQ(rows.size(), 4u);
  for (size_t i = 0; i < rows.size(); ++i) {
    CheckRow(rows[i], i < 2 ? "read" : "write");
    EXPECT_EQ(rows[i]["rounds"].as_uint64(), 3u);
    EXPECT_EQ(rows[i]["ops"].as_uint64(), 300u);
  }
  for (size_t i : {0u, 2u}) {
    const double lo = Num(rows[i], "round_ratio_min");
    const double hi = Num(rows[i], "round_ratio_max");
    EXPECT_GT(lo, 0);
    EXPECT_LE(lo, hi);
    EXPECT_NEAR(Num(rows[i], "ratio_vs_raw"),
                Num(rows[i], "iops") / Num(rows[i + 1], "iops"),
                1e-3 * Num(rows[i], "ratio_vs_raw"));
    EXPECT_TRUE(rows[i + 1]["round_ratio_min"].is_null());
  }
  EXPECT_TRUE(DirEmpty(dir.path()));
  // The human table names the spread.
  CommandResult h = RunCmd({Qcowtool(), "bench", "qd", "-q", "--image-size=4M",
                            "--qd=2", "--count=100", "--repeat=2",
                            "--dir=" + dir.path(), CacheFlag(dir.path())});
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(h.out.find("round min"), std::string::npos) << h.out;
}

// --device: a block device that holds something is refused without
// --force, and left as it was; a file is not a device.
TEST(BenchCliTest, DeviceWithContentsIsRefusedUnlessForced) {
  TempDir dir;
  const std::string backing = dir.File("dev.img");
  testing::LoopDevice loop(backing, 40 << 20, 0);
  if (loop.path().empty()) GTEST_SKIP() << "no loop device: " << loop.why();
  // An ext4 superblock's magic, where ext4 keeps it.
  {
    int fd = ::open(loop.path().c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const uint8_t magic[2] = {0x53, 0xef};
    ASSERT_EQ(::pwrite(fd, magic, 2, 1080), 2);
    ::fsync(fd);
    ::close(fd);
  }
  const std::vector<std::string> qd = {
      Qcowtool(), "bench", "qd", "-q", "--device=" + loop.path(),
      "--image-size=8M", "--qd=2", "--count=100", "--dir=" + dir.path(),
      CacheFlag(dir.path())};
  CommandResult r = RunCmd(qd);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "ext2/3/4")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "--force")) << r.err;
  {
    std::ifstream in(loop.path(), std::ios::binary);
    in.seekg(1080);
    char got[2];
    in.read(got, 2);
    EXPECT_EQ(static_cast<uint8_t>(got[0]), 0x53) << "device written";
  }
  std::vector<std::string> forced = qd;
  forced.push_back("--force");
  forced.push_back("--output=json");
  r = RunCmd(forced);
  EXPECT_EQ(r.exit_code, 0) << r.err;

  r = RunCmd({Qcowtool(), "bench", "qd", "--device=" + backing});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "is not a block device")) << r.err;
  r = RunCmd({Qcowtool(), "bench", "overlay", "--device=" + loop.path()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "--device")) << r.err;
}

// qd and rmw on a block device: the qcow2 images are written there (the
// fresh overlays allocate), the raw rows are the device, and the device's
// first MiB is zeroed afterwards so a new run is not refused.
TEST(BenchCliTest, QdAndRmwOnADevice) {
  TempDir dir;
  testing::LoopDevice loop(dir.File("dev.img"), 48 << 20, 0);
  if (loop.path().empty()) GTEST_SKIP() << "no loop device: " << loop.why();
  const std::string dev = "--device=" + loop.path();
  json::Value v = RunJson(dir, {"qd", dev, "--image-size=8M", "--qd=2",
                                "--modes=read,write", "--count=300"});
  EXPECT_EQ(v["params"]["device"].as_string(), loop.path());
  ASSERT_EQ(v["rows"].size(), 4u);
  for (const json::Value& row : v["rows"].array()) {
    CheckRow(row, row["op"].as_string());
    EXPECT_EQ(row["ops"].as_uint64(), 300u);
  }
  // Too small for both targets: a usage error naming the device.
  CommandResult r =
      RunCmd({Qcowtool(), "bench", "qd", "-q", dev, "--image-size=40M"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "too small")) << r.err;

  v = RunJson(dir, {"rmw", dev, "--image-size=8M", "--bs=4k,64k",
                    "--count=200", "--depth=1", "--repeat=1", "--time=0.2"});
  std::vector<std::string> targets;
  for (const json::Value& row : v["rows"].array()) {
    targets.push_back(row["target"].as_string());
    CheckRow(row, row["op"].as_string());
  }
  const std::vector<std::string> want = {
      "fresh overlay", "fresh overlay", "allocated", "raw device",
      "fresh overlay", "fresh overlay", "allocated", "raw device",
      "fresh overlay", "fresh overlay", "allocated", "depth 0", "depth 1"};
  EXPECT_EQ(targets, want);
  for (const json::Value& row : v["rows"].array()) {
    if (row["target"].as_string() == "fresh overlay") {
      EXPECT_GT(row["cluster_allocations"].as_uint64(), 0u);
    }
  }
  // One round: a fresh overlay's ratio to raw is its IOPS over the raw
  // device's, in its size's group.
  const auto& dev_rows = v["rows"].array();
  for (size_t g = 0; g < 2; ++g) {
    const json::Value& raw_dev = dev_rows[4 * g + 3];
    for (size_t i = 4 * g; i < 4 * g + 2; ++i) {
      EXPECT_NEAR(Num(dev_rows[i], "ratio_vs_raw"),
                  Num(dev_rows[i], "iops") / Num(raw_dev, "iops"),
                  1e-3 * Num(dev_rows[i], "ratio_vs_raw"));
    }
  }
  std::vector<uint8_t> head(1 << 20, 1);
  int fd = ::open(loop.path().c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pread(fd, head.data(), head.size(), 0),
            static_cast<ssize_t>(head.size()));
  ::close(fd);
  EXPECT_TRUE(std::all_of(head.begin(), head.end(),
                          [](uint8_t b) { return b == 0; }));
}

TEST(BenchCliTest, CdmTable) {
  TempDir dir;
  json::Value v = RunJson(dir, {"cdm", "--image-size=2M", "--count=8"});
  const json::Value& rows = v["rows"];
  ASSERT_EQ(rows.size(), 4u * 2 * 2);  // tests x ops x targets
  for (const json::Value& row : rows.array()) {
    CheckRow(row, row["op"].as_string());
    EXPECT_EQ(row["ops"].as_uint64(), 8 * row["threads"].as_uint64());
  }
  EXPECT_EQ(rows[4]["test"].as_string(), "RND4K Q32T16");
  EXPECT_EQ(rows[4]["threads"].as_uint64(), 16u);
  EXPECT_EQ(rows[8]["op"].as_string(), "write");
}

TEST(BenchCliTest, SweepRecommends) {
  TempDir dir;
  json::Value v = RunJson(dir, {"sweep", "--image-size=4M", "--count=40",
                                "--cluster-sizes=4k,64k", "--mix=4k:3,16k:1"});
  const json::Value& rows = v["rows"];
  // 4k has no extended-L2 variant (it needs 16k clusters).
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_FALSE(rows[0]["extended_l2"].as_bool());
  EXPECT_TRUE(rows[2]["extended_l2"].as_bool());
  for (const json::Value& row : rows.array()) CheckRow(row, "write");
  const json::Value& rec = v["recommendation"];
  ASSERT_TRUE(rec.is_object());
  EXPECT_TRUE(absl::StrContains(rec["create"].as_string(), "cluster_size="));
  EXPECT_TRUE(absl::StrContains(rec["snapshot"].as_string(), "extended_l2="));
  EXPECT_EQ(v["params"]["mix"].as_string(), "4k:3,16k:1");
}

TEST(BenchCliTest, PatternFollowsQemuImgBench) {
  TempDir dir;
  const std::string image = dir.File("p.qcow2");
  CreateOptions c;
  c.size = 1 << 20;
  ASSERT_OK(CreateImage(image, c));
  json::Value v = RunJson(dir, {"pattern", "-c", "200", "-d", "8", "-s", "4k",
                                "-S", "8k", "-w", "--pattern=0xab", image});
  EXPECT_EQ(v["params"]["step"].as_uint64(), 8192u);
  EXPECT_EQ(v["params"]["cache"].as_string(), "writeback");  // qemu's -t
  ASSERT_EQ(v["rows"].size(), 1u);
  EXPECT_EQ(v["rows"][0]["ops"].as_uint64(), 200u);
  CheckRow(v["rows"][0], "write");
  // 200 requests, 8 KiB apart, wrapping at 1 MiB: every step was written,
  // the 4 KiB between steps were not.
  OpenOptions o;
  auto img = Image::Open(image, o);
  ASSERT_TRUE(img.ok()) << img.status();
  std::vector<uint8_t> buf(4096);
  ASSERT_OK((*img)->Read(1016 * 1024, absl::MakeSpan(buf)));
  EXPECT_EQ(buf[0], 0xab);
  ASSERT_OK((*img)->Read(4096, absl::MakeSpan(buf)));
  EXPECT_EQ(buf[0], 0);

  CommandResult r = RunCmd(
      {Qcowtool(), "bench", "pattern", "-q", "-c", "10", "-d", "2", image});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StartsWith(
      r.out,
      "Sending 10 read requests, 4096 bytes each, 2 in parallel "
      "(starting at offset 0, step size 4096)\nRun completed in "))
      << r.out;
  // A request crossing the end fails, as in qemu-img bench.
  r = RunCmd({Qcowtool(), "bench", "pattern", "-q", "-c", "2", "-o", "1046528",
              "-s", "4k", image});
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

// A new image of `format` and `size` bytes, every byte `fill`.
absl::Status CreateFilled(const std::string& path, ImageFormat format,
                          uint64_t size, uint8_t fill) {
  CreateOptions c;
  c.format = format;
  c.size = size;
  if (absl::Status s = CreateImage(path, c); !s.ok()) return s;
  OpenOptions o;
  o.read_write = true;
  o.format = format == ImageFormat::kRaw ? "raw" : "qcow2";
  auto img = Image::Open(path, o);
  if (!img.ok()) return img.status();
  if (absl::Status s = (*img)->Write(0, std::vector<uint8_t>(size, fill));
      !s.ok()) {
    return s;
  }
  return (*img)->Close();
}

// --pair: the same requests go to two images in turns. A qcow2 overlay
// (extended L2, over a backing file) and a raw file, both written with
// the same pattern at the same offsets, must end up holding the same
// guest data (qemu-img compare), each passing qemu-img check.
TEST(BenchCliTest, PatternPairRunsTheSameRequestsOnBothImages) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  const std::string top = dir.File("top.qcow2");
  const std::string raw = dir.File("b.raw");
  // The raw file holds what the base does, so the two read alike before.
  ASSERT_OK(CreateFilled(base, ImageFormat::kQcow2, 4 << 20, 0x11));
  ASSERT_OK(CreateFilled(raw, ImageFormat::kRaw, 4 << 20, 0x11));
  CreateOptions ov;
  ov.size = 4 << 20;
  ov.extended_l2 = true;
  ov.backing_file = base;
  ov.backing_format = "qcow2";
  ASSERT_OK(CreateImage(top, ov));

  // 250 writes of 4 KiB, 68 KiB apart (wrapping at 4 MiB), in turns of
  // 64: four turns each, the last short.
  json::Value v = RunJson(dir, {"pattern", "-w", "-c", "250", "-d", "8",
                                "-s", "4k", "-S", "68k", "--pattern=0xcd",
                                "--burst=64", "--pair=" + raw, top});
  EXPECT_EQ(v["params"]["pair"].as_string(), raw);
  EXPECT_EQ(v["params"]["burst"].as_uint64(), 64u);
  ASSERT_EQ(v["rows"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const json::Value& row = v["rows"][i];
    EXPECT_EQ(row["image"].as_string(), i == 0 ? top : raw);
    EXPECT_EQ(row["ops"].as_uint64(), 250u);
    EXPECT_EQ(row["guest_bytes"].as_uint64(), 250u * 4096);
    CheckRow(row, "write");
  }
  EXPECT_GT(v["rows"][0]["ratio_vs_pair"].as_double(), 0);
  EXPECT_EQ(v["rows"][0]["bursts"].as_uint64(), 4u);
  EXPECT_LE(v["rows"][0]["burst_ratio_q1"].as_double(),
            v["rows"][0]["burst_ratio_median"].as_double());
  EXPECT_LE(v["rows"][0]["burst_ratio_median"].as_double(),
            v["rows"][0]["burst_ratio_q3"].as_double());
  EXPECT_TRUE(v["rows"][1]["ratio_vs_pair"].is_null());
  // The raw file took the guest bytes alone; the overlay its metadata too.
  EXPECT_EQ(v["rows"][1]["host_write_bytes"].as_uint64(), 250u * 4096);
  EXPECT_GT(v["rows"][0]["host_write_bytes"].as_uint64(), 250u * 4096);

  testing::CommandResult check = testing::QemuCheck(top);
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  CommandResult cmp = RunCmd({"qemu-img", "compare", "-f", "qcow2", "-F",
                              "raw", top, raw});
  EXPECT_EQ(cmp.exit_code, 0) << cmp.out << cmp.err;
  // The writes landed where qemu-img bench's offsets say: the 250th at
  // 249 * 68 KiB modulo 4 MiB. The 4 KiB block 2 (8 KiB) is none of the
  // 250 blocks 17 * k modulo 1024.
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> all, testing::QemuReadAll(top));
  EXPECT_EQ(all[(249u * 68 * 1024) % (4u << 20)], 0xcd);
  EXPECT_EQ(all[2 * 4096], 0x11);

  CommandResult text = RunCmd({Qcowtool(), "bench", "pattern", "-q", "-c",
                               "40", "-d", "4", "--burst=16", "--pair=" + raw,
                               top});
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_TRUE(absl::StrContains(text.out, "IOPS of " + top + " over " + raw))
      << text.out;
}

TEST(BenchCliTest, BadOptionsExit1NamingThem) {
  struct Case {
    std::vector<std::string> args;
    const char* named;
  } cases[] = {
      {{"--bogus"}, "--bogus"},
      {{"nope"}, "nope"},
      {{"overlay", "--bs=3x"}, "--bs"},
      {{"overlay", "--qd=0"}, "--qd"},
      {{"overlay", "--count=0"}, "--count"},
      {{"pattern", "-f", "vmdk", "img"}, "-f"},
      {{"overlay", "--cache=fast"}, "--cache"},
      {{"overlay", "--output=xml"}, "--output"},
      {{"qd", "--depth=2"}, "--depth"},
      {{"qd", "--modes=shared"}, "--modes"},
      {{"scaling", "--modes=write"}, "--modes"},
      {{"qd", "--modes=append"}, "--modes"},
      {{"overlay", "--image-size=1M", "--bs=2M"}, "--bs"},
      {{"scaling", "--size-per-writer=1M", "--bs=3M"}, "--size-per-writer"},
      {{"sweep", "--mix=4k"}, "--mix"},
      {{"pattern", "-c", "x", "img"}, "-c"},
      {{"pattern"}, "image"},
      {{"pattern", "-w", "--flush-interval=2", "-d", "8", "img"},
       "--flush-interval"},
      {{"pattern", "-w", "--flush-interval=64", "-d", "8", "--pair=b", "a"},
       "--pair"},
      {{"pattern", "--pair=a", "a"}, "--pair"},
      {{"pattern", "--burst=0", "--pair=b", "a"}, "--burst"},
      {{"pattern", "--burst=8", "a"}, "--burst"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {Qcowtool(), "bench"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    CommandResult r = RunCmd(argv);
    EXPECT_EQ(r.exit_code, 1) << c.named << ": " << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, c.named)) << r.err;
  }
  CommandResult r = RunCmd({Qcowtool(), "bench", "pattern", "/nonexistent"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  r = RunCmd({Qcowtool(), "help", "bench"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "sweep")) << r.out;
}

TEST(LatencyHistogramTest, PercentilesWithinBucketError) {
  LatencyHistogram h;
  for (uint64_t us = 1; us <= 1000; ++us) h.Add(us * 1000);
  EXPECT_EQ(h.count(), 1000u);
  EXPECT_NEAR(h.PercentileUs(0.5), 500, 500 * 0.04);
  EXPECT_NEAR(h.PercentileUs(0.99), 990, 990 * 0.04);
  LatencyHistogram other;
  other.Add(5);
  h.Merge(other);
  EXPECT_EQ(h.count(), 1001u);
  EXPECT_LT(h.PercentileUs(0.0), 0.01);
  EXPECT_EQ(LatencyHistogram().PercentileUs(0.5), 0);
}

// What the real engine's counters will look like: a 4 KiB write into a
// fresh 64 KiB cluster copies 60 KiB and writes an L2 slice.
TEST(BenchOutputTest, AmplificationFromCounters) {
  IoStats d;
  d.guest_write_ops = 1;
  d.guest_write_bytes = 4096;
  d.host_data_write_bytes = 4096;
  d.cow_read_bytes = 61440;
  d.cow_write_bytes = 61440;
  d.l2_write_bytes = 4096;
  d.l2_read_bytes = 4096;
  Report report;
  report.workload = "unit";
  report.params.Set("name", Value::Str("a \"quoted\" name"));
  JobResult jr;
  jr.ops = 1;
  jr.bytes = 4096;
  jr.seconds = 0.001;
  jr.latency.Add(900'000);
  Record row;
  AddRateColumns(jr, &row);
  AddIoColumns(d, Op::kWrite, &row);
  report.rows.push_back(row);
  Record read;
  AddIoColumns(d, Op::kRead, &read);
  report.rows.push_back(read);
  report.rows.push_back(Record().Set("x", Value::Num(std::nan(""))));
  auto v = json::Parse(ReportJson(report));
  ASSERT_TRUE(v.ok()) << v.status() << ReportJson(report);
  EXPECT_EQ((*v)["params"]["name"].as_string(), "a \"quoted\" name");
  const json::Value& w = (*v)["rows"][0];
  EXPECT_EQ(w["guest_bytes"].as_uint64(), 4096u);
  EXPECT_EQ(w["host_write_bytes"].as_uint64(), 4096u + 61440 + 4096);
  EXPECT_EQ(w["host_read_bytes"].as_uint64(), 61440u + 4096);
  EXPECT_DOUBLE_EQ(w["write_amplification"].as_double(), 17.0);
  EXPECT_DOUBLE_EQ(w["cow_read_per_guest_byte"].as_double(), 15.0);
  EXPECT_DOUBLE_EQ(w["iops"].as_double(), 1000.0);
  CheckRow(w, "write");
  const json::Value& r = (*v)["rows"][1];
  EXPECT_TRUE(r["write_amplification"].is_null());
  EXPECT_EQ(r["guest_bytes"].as_uint64(), 0u);  // no guest reads counted
  EXPECT_TRUE((*v)["rows"][2]["x"].is_null());  // NaN is written as null
  EXPECT_EQ(FormatCell(Value(), 2), "-");
  EXPECT_EQ(FormatCell(Value::Num(16.999), 2), "17.00");
  EXPECT_EQ(FormatBlockSize(4096), "4k");
  EXPECT_EQ(FormatBlockSize(2 << 20), "2M");
  EXPECT_EQ(FormatBlockSize(1536), "1536");
}

TEST(BenchSvgTest, ChartsWithDataAndGapsAreWellFormed) {
  Panel lines{"IOPS <by> depth & more", "depth", "IOPS", {"0", "1", "2"}};
  lines.series = {{"read 4k", {1000, std::nullopt, 3000}},
                  {"write 4k", {10, 20, 30}}};
  Panel bars{"amp", "cluster", "bytes", {"4k", "64k\next L2"}};
  bars.bars = true;
  bars.series = {{"host", {16.2, 1.01}}, {"cow", {15.0, std::nullopt}}};
  Panel empty{"nothing", "x", "y", {"a"}};
  empty.series = {{"s", {std::nullopt}}};
  const std::string svg = RenderSvg("title", {lines, bars, empty});
  EXPECT_TRUE(WellFormedSvg(svg));
  EXPECT_TRUE(absl::StrContains(svg, "IOPS &lt;by&gt; depth &amp; more"));
  EXPECT_TRUE(absl::StrContains(svg, "no data"));
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

}  // namespace
}  // namespace qcow2::tool::bench
