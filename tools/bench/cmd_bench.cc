// SPDX-License-Identifier: Apache-2.0
// qcowtool bench: performance workloads over libqcow2's asynchronous Queue
// API. This file parses the command line, checks which options apply to
// the workload, runs it and prints its report; the workloads themselves are
// in tools/bench/cmd_bench_*.cc, the request loop in tools/bench/bench_runner.cc.
#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "tools/bench/bench_options.h"
#include "tools/bench/bench_device.h"
#include "tools/bench/bench_workloads.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace qcow2::tool {
namespace bench {
namespace {

constexpr char kOptionErrorUrl[] = "qcowtool/bench/option-error";

constexpr char kGeneralUsage[] =
    "usage: qcowtool bench [WORKLOAD] [options]\n"
    "\n"
    "Measures libqcow2 through its asynchronous Queue API on scratch images\n"
    "(for 'pattern': on an existing image). Without WORKLOAD, runs\n"
    "'overlay' with its defaults (about a minute).\n"
    "\n"
    "Workloads ('qcowtool bench WORKLOAD --help' lists a workload's\n"
    "options):\n"
    "  overlay  random reads and writes through backing chains of depth\n"
    "           0..N, writes into a fresh overlay (default)\n"
    "  scaling  1, 2, 4, 8 writers, each a thread with its own Queue, on\n"
    "           separate or shared images, qcow2 and raw\n"
    "  qd       4 KiB random reads at queue depths 1..128, qcow2 vs raw\n"
    "  pattern  'qemu-img bench' with its flags, on IMAGE\n"
    "  cdm      CrystalDiskMark's four tests, qcow2 vs raw\n"
    "  sweep    cluster size x extended L2 against a write-size mix; prints\n"
    "           the best options\n"
    "  rmw      copy-on-write after a snapshot: writes into fresh overlays\n"
    "           vs an allocated image, reads at depth 0 vs a deep chain\n";

constexpr char kCommonHelp[] =
    "Common options:\n"
    "  --output=human|json  aligned table (default) or one JSON document\n"
    "                       {\"workload\", \"params\", \"rows\"}\n"
    "  --dir=DIR            scratch images in DIR (default: a new directory\n"
    "                       under $TMPDIR or /tmp, removed afterwards)\n"
    "  --cache=none|writeback, -t MODE\n"
    "                       O_DIRECT (none, the default) or the page cache\n"
    "  --seed=N             seed of the random offsets (default 1)\n"
    "  -q, --quiet          no progress line on stderr\n"
    "  -h, --help           show this help\n";

constexpr char kTimedHelp[] =
    "  --time=SECONDS       length of each cell (default: 1, cdm 2)\n"
    "  --count=N            requests per cell instead (with --time too:\n"
    "                       whichever limit comes first)\n"
    "  --plot=FILE.svg      also draw the results as an SVG chart\n";

// The --device options' help, in the usage of the workloads that take them.
#define QCOW2_BENCH_DEVICE_HELP                                            \
  "  --device=/dev/X          put the measured images on this block\n"     \
  "                           device (see below); it must be unused and\n" \
  "                           hold no file system, partition table or\n"   \
  "                           image unless --force\n"                      \
  "  --force                  overwrite what --device holds\n"

struct Workload {
  const char* name;
  absl::Status (*run)(Env&, Report*);
  const char* usage;
  std::initializer_list<const char*> options;  // besides the common ones
  bool direct_default;
};

const Workload kWorkloads[] = {
    {"overlay",
     RunOverlay,
     "usage: qcowtool bench [overlay] [options]\n\n"
     "Creates a qcow2 base image (filled), stacks --depth overlays on it\n"
     "(each given a 4 KiB write in --overlay-writes percent of its\n"
     "clusters), then for each depth 0..N measures random reads of the image\n"
     "whose top is at that depth, and random writes into a fresh overlay\n"
     "created on top of it (deleted afterwards), per --bs and --qd.\n\n"
     "  --depth=N                overlays to stack (default 3)\n"
     "  --image-size=SIZE        virtual size (default 1G)\n"
     "  --cluster-size=SIZE      base cluster size (default 64k)\n"
     "  --overlay-cluster-size=SIZE  overlays' (default: --cluster-size)\n"
     "  --extended-l2=on|off     for the fresh overlays (default off)\n"
     "  --overlay-writes=PCT     share of each stacked overlay's clusters\n"
     "                           given a random 4 KiB write (default 10)\n"
     "  --bs=LIST                block sizes (default 4k,64k)\n"
     "  --qd=LIST                queue depths (default 32)\n",
     {"--time", "--count", "--plot", "--depth", "--image-size",
      "--cluster-size", "--overlay-cluster-size", "--extended-l2",
      "--overlay-writes", "--bs", "--qd"},
     true},
    {"scaling",
     RunScaling,
     "usage: qcowtool bench scaling [options]\n\n"
     "For each writer count, each writer (a thread with its own Queue)\n"
     "writes its own --size-per-writer region of a fresh image\n"
     "sequentially, then flushes. Modes: separate (an image per writer),\n"
     "shared (one image), raw-separate, raw-shared (sparse raw files\n"
     "opened with format=raw).\n\n"
     "  --writers=LIST           writer counts (default 1,2,4,8)\n"
     "  --modes=LIST             default separate,shared,raw-separate,\n"
     "                           raw-shared\n"
     "  --size-per-writer=SIZE   default 256M\n"
     "  --bs=SIZE                write size (default 4M)\n"
     "  --qd=N                   per writer (default 4)\n"
     "  --cluster-size=SIZE      qcow2 cluster size (default 64k)\n"
     "  --extended-l2=on|off     (default off)\n"
     "  --repeat=N               run every cell N times, rounds interleaved,\n"
     "                           and report the median run (default 3)\n"
     "  --flush-interval=N       each writer also flushes after every N of\n"
     "                           its writes (default 0: only at the end)\n"
     "  --plot=FILE.svg          also draw the results as an SVG chart\n",
     {"--writers", "--modes", "--size-per-writer", "--bs", "--qd",
      "--cluster-size", "--extended-l2", "--repeat", "--flush-interval",
      "--plot"},
     true},
    {"qd",
     RunQd,
     "usage: qcowtool bench qd [options]\n\n"
     "Random reads (and with --modes, writes) of a fully written qcow2\n"
     "image and of a raw file of the same size (opened with format=raw,\n"
     "same engine), per queue depth, with the CPU time (user + system, of\n"
     "the whole process) each request cost.\n\n"
     "  --modes=LIST             read, write (default read)\n"
     "  --qd=LIST                queue depths (default 1,8,32,128)\n"
     "  --bs=SIZE                request size (default 4k)\n"
     "  --image-size=SIZE        default 1G\n"
     "  --cluster-size=SIZE      default 64k\n"
     "  --repeat=N               N rounds (default 1), each on newly written\n"
     "                           targets, the two taking turns going first;\n"
     "                           a row is the median round, with the lowest\n"
     "                           and highest of the rounds' ratios\n"
     QCOW2_BENCH_DEVICE_HELP "\n"
     "With --device, the qcow2 image is created on the device and the raw\n"
     "target is the device's last --image-size bytes (the device needs\n"
     "room for both).\n",
     {"--time", "--count", "--plot", "--modes", "--qd", "--bs",
      "--image-size", "--cluster-size", "--repeat", "--device", "--force"},
     true},
    {"pattern",
     RunPattern,
     "usage: qcowtool bench pattern [-c COUNT] [-d DEPTH] [-f FMT]\n"
     "         [--flush-interval=N] [-i AIO] [-n] [--no-drain] [-o OFFSET]\n"
     "         [--pattern=BYTE] [-s SIZE] [-S STEP] [-t CACHE] [-w] [-U]\n"
     "         [--pair=IMAGE2 [--burst=N]] [--object secret,...]\n"
     "         [--image-opts] IMAGE\n\n"
     "Runs 'qemu-img bench' on IMAGE with the same flags and semantics:\n"
     "COUNT requests (default 75000) of SIZE bytes (default 4k), DEPTH in\n"
     "flight (default 64), at OFFSET (default 0), OFFSET+STEP, ... (STEP\n"
     "defaults to SIZE), the offset taken modulo the image size; -w writes\n"
     "BYTE (default 0). Like qemu-img bench, -t defaults to writeback; use\n"
     "-t none for O_DIRECT. -i and -n are accepted and recorded only (the\n"
     "library picks its engine). -U (reads only) opens IMAGE while another\n"
     "process writes it (the shared read lock only). Prints qemu-img bench's\n"
     "lines, then IOPS, MB/s, latency and the host bytes the library\n"
     "counted.\n\n"
     "  --pair=IMAGE2   run the same requests on IMAGE2 too, side by side:\n"
     "                  both images open at once, each with its own queue,\n"
     "                  taking turns in bursts (the order swapped every\n"
     "                  burst), so that a slow spell of the machine lands\n"
     "                  on both alike; prints both, and IMAGE's IOPS over\n"
     "                  IMAGE2's (from the summed times, and the median\n"
     "                  and quartiles of the bursts' ratios). Not with\n"
     "                  --flush-interval.\n"
     "  --burst=N       requests per turn with --pair (default 16384)\n"
     "  --object secret,id=ID,data=STRING|file=PATH  a secret, for\n"
     "                  encrypt.key-secret=ID\n"
     "  --image-opts    IMAGE is driver=qcow2,file.filename=PATH,\n"
     "                  encrypt.key-secret=ID\n",
     {"-c", "-d", "-f", "-i", "-n", "-o", "-s", "-S", "-w", "-U", "--pattern",
      "--flush-interval", "--no-drain", "--pair", "--burst", "--object",
      "--image-opts"},
     false},
    {"cdm",
     RunCdm,
     "usage: qcowtool bench cdm [options]\n\n"
     "CrystalDiskMark's tests, SEQ1M Q8T1, SEQ128K Q32T1, RND4K Q32T16 (16\n"
     "threads, each its own Queue at QD 32) and RND4K Q1T1, reads then\n"
     "writes, on a qcow2 image and a raw file of the same size in the same\n"
     "directory, both written in full first.\n\n"
     "  --image-size=SIZE        default 1G\n"
     "  --cluster-size=SIZE      default 64k\n",
     {"--time", "--count", "--plot", "--image-size", "--cluster-size"},
     true},
    {"rmw",
     RunRmw,
     "usage: qcowtool bench rmw [options]\n\n"
     "Creates a qcow2 base image (filled) and stacks --depth overlays on it\n"
     "(each given 4 KiB writes into 1% of its clusters). For each --bs:\n"
     "random writes into a fresh overlay over the base with standard and\n"
     "with extended L2 entries, then the same writes into the fully\n"
     "allocated base ('vs base' compares IOPS with that row), into a\n"
     "fresh sparse raw file and into a fresh raw file reserved with\n"
     "fallocate (the file system's own cost for new blocks). Then 4 KiB\n"
     "sequential writes into fresh overlays (standard and extended L2)\n"
     "and into the allocated base. Then 4 KiB random reads of the base\n"
     "and of the top of the chain ('vs base': against depth 0), in\n"
     "--repeat rounds of both; each read row is the median round, with\n"
     "the lowest and highest IOPS.\n\n"
     "  --bs=LIST                write sizes (default 4k,64k)\n"
     "  --qd=N                   queue depth (default 32)\n"
     "  --count=N                writes per write cell (default 10000)\n"
     "  --time=SECONDS           length of each read cell (default 2)\n"
     "  --depth=N                overlays stacked for the read rows\n"
     "                           (default 32)\n"
     "  --repeat=N               rounds of the read rows (default 3)\n"
     "  --image-size=SIZE        default 1G\n"
     "  --cluster-size=SIZE      of every image, 16k or more (default 64k)\n"
     QCOW2_BENCH_DEVICE_HELP "\n"
     "With --device, the images written are on the device: each fresh\n"
     "overlay (over the base in the scratch directory) and the allocated\n"
     "image (a qcow2 image written in full first), and the raw row is the\n"
     "device itself (no file system, so no fresh or reserved raw file).\n"
     "The base and the read chain stay in the scratch directory.\n",
     {"--bs", "--qd", "--count", "--time", "--depth", "--repeat",
      "--image-size", "--cluster-size", "--device", "--force"},
     true},
    {"sweep",
     RunSweep,
     "usage: qcowtool bench sweep [options]\n\n"
     "For each cluster size and extended L2 setting, creates a fresh\n"
     "overlay over a fully written backing file and runs --count random\n"
     "writes drawn from --mix at --qd; reports host bytes written and COW\n"
     "bytes read per guest byte, and recommends the option set with the\n"
     "lowest write amplification (ties: more IOPS).\n\n"
     "  --mix=SIZE:WEIGHT,...    write sizes (default 4k:70,64k:30)\n"
     "  --cluster-sizes=LIST     default 4k,16k,64k,256k,1M,2M\n"
     "  --extended-l2=on|off|both  default both (on needs >= 16k)\n"
     "  --count=N                writes per option set (default 20000)\n"
     "  --qd=N                   default 32\n"
     "  --image-size=SIZE        default 1G\n"
     "  --cluster-size=SIZE      the backing file's (default 64k)\n"
     "  --plot=FILE.svg          also draw the results as an SVG chart\n",
     {"--mix", "--cluster-sizes", "--extended-l2", "--count", "--qd",
      "--image-size", "--cluster-size", "--plot"},
     true},
};

constexpr const char* kCommonOptions[] = {"--output", "--dir", "--cache",
                                          "--seed",   "-q",    "--quiet"};

const Workload* Find(std::string_view name) {
  for (const Workload& w : kWorkloads) {
    if (name == w.name) return &w;
  }
  return nullptr;
}

std::string UsageFor(std::string_view workload, bool full) {
  const Workload* w = Find(workload);
  if (!full) {
    const std::string name = w == nullptr ? "" : w->name;
    return absl::StrCat("usage: qcowtool bench ",
                        w == nullptr ? "[WORKLOAD]" : name,
                        name == "pattern" ? " [flags] IMAGE" : " [options]",
                        "\n('qcowtool bench ", name, name.empty() ? "" : " ",
                        "--help' lists the options)\n");
  }
  if (w == nullptr) {
    return absl::StrCat(kGeneralUsage, "\n", kCommonHelp, kTimedHelp, "\n",
                        kExitStatusHelp);
  }
  const std::string_view name = w->name;
  const bool timed = name == "overlay" || name == "qd" || name == "cdm";
  std::string text = absl::StrCat(w->usage, "\n");
  if (name == "pattern") {
    absl::StrAppend(&text,
                    "  --output=human|json  qemu-img's lines (default) or "
                    "JSON\n  -q, --quiet          no progress line\n"
                    "  -h, --help           show this help\n");
  } else {
    absl::StrAppend(&text, kCommonHelp, timed ? kTimedHelp : "");
  }
  return absl::StrCat(text, "\n", kExitStatusHelp);
}

bool Accepts(const Workload& w, std::string_view option) {
  if (std::string_view(w.name) == "pattern") {
    if (option == "--dir" || option == "--seed") return false;
  }
  for (const char* o : kCommonOptions) {
    if (option == o) return true;
  }
  for (const char* o : w.options) {
    if (option == o) return true;
  }
  return false;
}

int Print(const BenchOptions& o, const Report& report) {
  const std::string text = o.output == OutputFormat::kJson
                               ? ReportJson(report)
                               : ReportHuman(report);
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (std::fflush(stdout) != 0) {
    return ReportError(absl::InternalError("cannot write to stdout"));
  }
  if (!o.plot.empty()) {
    absl::Status s = WriteSvg(o.plot, report.plot_title, report.plot);
    if (!s.ok()) return ReportError(s);
  }
  return kExitOk;
}

int Run(const BenchOptions& o, const Workload& w) {
  const std::string usage = UsageFor(w.name, false);
  std::unique_ptr<Scratch> scratch;
  if (std::string_view(w.name) != "pattern") {
    auto s = Scratch::Make(o.dir);
    if (!s.ok()) return UsageError(usage, s.status().message());
    scratch = std::move(*s);
  }
  uint64_t device_size = 0;
  if (!o.device.empty()) {
    auto size = CheckBenchDevice(o.device, o.force);
    if (!size.ok()) return UsageError(usage, size.status().message());
    device_size = *size;
  }
  InstallStopHandler();
  Report report;
  report.workload = w.name;
  absl::Status status;
  {
    Progress progress(!o.quiet);
    Env env{o, scratch.get(), progress, o.direct_io.value_or(w.direct_default)};
    env.device = o.device;
    env.device_size = device_size;
    status = w.run(env, &report);
  }
  scratch.reset();
  if (!o.device.empty()) {
    if (absl::Status s = WipeBenchDevice(o.device); !s.ok() && status.ok()) {
      status = s;
    }
  }
  if (IsOptionError(status)) return UsageError(usage, status.message());
  if (!status.ok()) return ReportError(status);
  return Print(o, report);
}

}  // namespace

absl::Status OptionError(std::string_view message) {
  absl::Status s = absl::InvalidArgumentError(
      absl::string_view(message.data(), message.size()));
  s.SetPayload(kOptionErrorUrl, absl::Cord("1"));
  return s;
}

bool IsOptionError(const absl::Status& s) {
  return s.GetPayload(kOptionErrorUrl).has_value();
}

}  // namespace bench

int RunBench(int argc, char** argv) {
  bench::BenchOptions o;
  if (int rc = bench::ParseBenchArgs(argc, argv, bench::UsageFor, &o);
      rc >= 0) {
    return rc;
  }
  const bench::Workload& w = *bench::Find(o.workload);
  for (const std::string& name : o.given) {
    if (!bench::Accepts(w, name)) {
      return UsageError(bench::UsageFor(w.name, false),
                        absl::StrCat("option ", name,
                                     " does not apply to "
                                     "the '",
                                     w.name, "' workload"));
    }
  }
  if (std::string_view(w.name) == "pattern" && o.pattern.image.empty()) {
    return UsageError(bench::UsageFor(w.name, false),
                      "expecting an image name");
  }
  return bench::Run(o, w);
}

}  // namespace qcow2::tool
