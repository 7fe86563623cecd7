// SPDX-License-Identifier: Apache-2.0
// The kill -9 sweep through the real CLI: a `qcowtool io` writer runs a
// script of writes, each group ending in `flush` and `length` (whose line
// on stdout says the flush before it returned), and is killed with SIGKILL
// at a random instant. After each kill, `qemu-img check` must find no
// errors (leaks are allowed) and every write flushed before the kill must
// read back through qemu-img; the write in flight may have landed in part.
// The image carries over from round to round (a fresh one every 10), so
// writers also open images a killed writer left behind.
//
// QCOW2_KILL_SEED=N replays a run (the seed is printed); QCOW2_KILL_COUNT
// changes the number of kills (default 50).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::CommandResult;
using testing::TempDir;

constexpr uint64_t kImageBytes = 16ull << 20;

struct Write {
  uint64_t offset, len;
  uint8_t pattern;  // 0 for a write of zeros
};

struct Group {
  std::vector<Write> writes;  // then flush, then length (the marker)
};

// The writer's script: `groups` groups of 1 to 3 writes.
std::vector<Group> MakeScript(std::mt19937_64* rng, int groups, int round) {
  std::vector<Group> script;
  for (int g = 0; g < groups; ++g) {
    Group group;
    const int n = 1 + static_cast<int>((*rng)() % 3);
    for (int i = 0; i < n; ++i) {
      Write w;
      // Lengths from 512 bytes to 256 KiB, sector-aligned anywhere:
      // partial clusters, cluster-crossing runs, rewrites in place.
      w.len = 512 * (1 + (*rng)() % 512);
      w.offset = 512 * ((*rng)() % ((kImageBytes - w.len) / 512 + 1));
      w.pattern = (*rng)() % 8 == 0
                      ? 0
                      : static_cast<uint8_t>(1 + (round * 31 + g * 3 + i) % 255);
      group.writes.push_back(w);
    }
    script.push_back(std::move(group));
  }
  return script;
}

std::vector<std::string> WriterArgv(const std::string& image,
                                    const std::vector<Group>& script) {
  std::vector<std::string> argv = {testing::QcowtoolPath(), "io", image};
  for (const Group& g : script) {
    for (const Write& w : g.writes) {
      argv.push_back("-c");
      argv.push_back(w.pattern == 0
                         ? absl::StrCat("write -q -z ", w.offset, " ", w.len)
                         : absl::StrCat("write -q -P ", int{w.pattern}, " ",
                                        w.offset, " ", w.len));
    }
    argv.insert(argv.end(), {"-c", "flush", "-c", "length"});
  }
  return argv;
}

struct Outcome {
  int markers = 0;       // groups whose flush returned
  bool killed = false;   // SIGKILL arrived before the writer finished
  int exit_code = -1;
  std::string err;
};

// Runs the writer, killing it after `delay` (never, if it ends first).
Outcome RunAndKill(const std::vector<std::string>& argv,
                   std::chrono::microseconds delay) {
  Outcome out;
  int outp[2], errp[2];
  if (::pipe(outp) != 0 || ::pipe(errp) != 0) return out;
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(outp[1], 1);
    ::dup2(errp[1], 2);
    ::close(outp[0]);
    ::close(errp[0]);
    std::vector<char*> cargv;
    for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(outp[1]);
  ::close(errp[1]);
  std::string text;
  const auto deadline = start + delay;
  bool open_out = true, open_err = true;
  while (open_out || open_err) {
    int timeout = -1;
    if (!out.killed) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        ::kill(pid, SIGKILL);
        out.killed = true;
      } else {
        timeout = static_cast<int>(left.count());
      }
    }
    pollfd fds[2] = {{open_out ? outp[0] : -1, POLLIN, 0},
                     {open_err ? errp[0] : -1, POLLIN, 0}};
    if (::poll(fds, 2, out.killed ? -1 : timeout) < 0) continue;
    char buf[4096];
    for (int i = 0; i < 2; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        (i == 0 ? open_out : open_err) = false;
        continue;
      }
      (i == 0 ? text : out.err).append(buf, n);
    }
  }
  ::close(outp[0]);
  ::close(errp[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) {
    out.killed = WTERMSIG(status) == SIGKILL;
  } else {
    out.killed = false;
    out.exit_code = WEXITSTATUS(status);
  }
  // `length` prints one line; writes run with -q print none.
  for (char c : text) out.markers += c == '\n';
  return out;
}

void Apply(const Write& w, std::vector<uint8_t>* disk) {
  std::fill(disk->begin() + w.offset, disk->begin() + w.offset + w.len,
            w.pattern);
}

class KillSweepTest : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_QEMU(); }
  TempDir dir_;
};

TEST_F(KillSweepTest, EveryFlushedWriteSurvivesSigkill) {
  const char* seed_env = std::getenv("QCOW2_KILL_SEED");
  const uint64_t seed =
      seed_env ? std::strtoull(seed_env, nullptr, 0)
               : static_cast<uint64_t>(
                     std::chrono::system_clock::now().time_since_epoch().count());
  const char* count_env = std::getenv("QCOW2_KILL_COUNT");
  const int want_kills = count_env ? std::atoi(count_env) : 50;
  std::printf("kill sweep seed %llu (replay: QCOW2_KILL_SEED=%llu)\n",
              static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::string image = dir_.File("sweep.qcow2");
  std::vector<uint8_t> model;
  const int kGroups = 40;

  // How long an unkilled writer runs: kills are spread over that time.
  auto fresh = [&] {
    std::remove(image.c_str());
    CommandResult c = testing::Run({testing::QcowtoolPath(), "create", "-q",
                                    image, std::to_string(kImageBytes)});
    ASSERT_EQ(c.exit_code, 0) << c.err;
    model.assign(kImageBytes, 0);
  };
  ASSERT_NO_FATAL_FAILURE(fresh());
  const auto t0 = std::chrono::steady_clock::now();
  Outcome calib = RunAndKill(WriterArgv(image, MakeScript(&rng, kGroups, 0)),
                             std::chrono::seconds(60));
  ASSERT_EQ(calib.exit_code, 0) << calib.err;
  const auto full = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - t0);
  std::printf("an unkilled writer runs %lld us\n",
              static_cast<long long>(full.count()));

  ASSERT_OK_AND_ASSIGN(model, testing::QemuReadAll(image));
  int kills = 0, partial_groups = 0, round = 0;
  // Kills by how far the writer got: no group flushed, under half, more.
  int none = 0, early = 0, late = 0;
  // Kills land anywhere in the first 90% of a writer's usual run; a writer
  // that finishes anyway (a fast run) is checked the same and not counted.
  while (kills < want_kills && round < 2 * want_kills) {
    ++round;
    if (round % 10 == 1) {
      ASSERT_NO_FATAL_FAILURE(fresh());
    }
    const std::vector<Group> script = MakeScript(&rng, kGroups, round);
    const auto delay = std::chrono::microseconds(
        rng() % static_cast<uint64_t>(full.count() * 9 / 10 + 1));
    Outcome o = RunAndKill(WriterArgv(image, script), delay);
    const std::string where =
        absl::StrCat("round ", round, " (seed ", seed, ", kill after ",
                     delay.count(), " us, ", o.markers, " groups flushed)");
    if (!o.killed) {
      ASSERT_EQ(o.exit_code, 0) << where << ": " << o.err;
      ASSERT_EQ(o.markers, kGroups) << where;
    }
    kills += o.killed;
    if (o.killed) {
      (o.markers == 0 ? none : o.markers < kGroups / 2 ? early : late)++;
    }

    CommandResult check = testing::QemuCheck(image);
    ASSERT_TRUE(check.exit_code == 0 || check.exit_code == 3)
        << where << ": qemu-img check exit " << check.exit_code << "\n"
        << check.out << check.err;
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> disk,
                         testing::QemuReadAll(image));
    ASSERT_EQ(disk.size(), kImageBytes) << where;

    // What must be there: the model with every flushed group applied.
    std::vector<uint8_t> want = model;
    for (int g = 0; g < o.markers && g < kGroups; ++g) {
      for (const Write& w : script[g].writes) Apply(w, &want);
    }
    // The group in flight may have landed in part, byte by byte.
    const std::vector<Write> maybe =
        o.markers < kGroups ? script[o.markers].writes : std::vector<Write>{};
    for (uint64_t b = 0; b < kImageBytes; ++b) {
      if (disk[b] == want[b]) continue;
      bool allowed = false;
      for (const Write& w : maybe) {
        allowed |= b >= w.offset && b < w.offset + w.len &&
                   disk[b] == w.pattern;
      }
      ASSERT_TRUE(allowed) << where << ": byte " << b << " reads "
                           << int{disk[b]} << ", want " << int{want[b]};
    }
    partial_groups += disk != want;
    model = std::move(disk);
  }
  std::printf("%d rounds, %d killed (%d before the first flush returned, "
              "%d in the first half, %d later), %d with the group in flight "
              "(partly) on disk\n",
              round, kills, none, early, late, partial_groups);
  EXPECT_GE(kills, want_kills);
}

}  // namespace
}  // namespace qcow2
