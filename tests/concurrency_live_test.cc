// SPDX-License-Identifier: Apache-2.0
// Live stream, live commit and active commit (Image::LiveStream,
// Image::LiveCommit, Image::LiveActiveCommit) on a
// four-layer chain while several threads, each with its own Queue, write
// random data, zeroes and discards and read back what they own, checked
// against a model the whole time. Each thread owns every fourth 24 KiB
// stripe of the disk (stripes share clusters with their neighbours, so
// guest requests of different threads meet the job's chunks in the same
// clusters); requests of one thread run in submission order where they
// overlap, so a read must return the model as it was when the read was
// submitted. After the job: the chain is the shorter one, the disk equals
// the model, every image passes `qemu-img check`, and a fresh open (and
// qemu-img reading the top) equals the model; after an active commit the
// base is the top, and `qemu-img compare` finds it equal to the model
// written out raw. Cancelled jobs leave the
// old chain; rate-limited ones report progress. Between two chunks the job
// waits for more guest requests to complete, so the guests run during the
// job however the threads are scheduled.
#include <atomic>
#include <cstdio>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "qcow2/live.h"
#include "testing/model.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::TempDir;

constexpr uint64_t kDisk = 4 << 20;
constexpr uint64_t kStripe = 24 << 10;
constexpr int kThreads = 4;

enum class Job { kStream, kCommit, kActive };

struct Config {
  std::string name;
  Job job;
  int base;         // depth in the four-layer chain (0 top .. 3 bottom)
                    // (an active commit's base becomes the top)
  bool raw_bottom;  // the bottom layer is raw
  uint32_t top_cluster;
  bool top_xl2;
  bool cancel = false;
  uint64_t rate_limit = 0;
};

void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

// Layers bottom first, with their cluster sizes and extended L2.
struct LayerSpec {
  const char* file;
  uint32_t cluster;
  bool xl2;
};

class LiveJobTest : public ::testing::TestWithParam<Config> {
 protected:
  std::string Path(int depth) const { return dir_.File(Name(depth)); }
  std::string Name(int depth) const {
    static const char* const kNames[] = {"top.qcow2", "mid2.qcow2",
                                         "mid1.qcow2", "base.qcow2"};
    if (depth == 3 && GetParam().raw_bottom) return "base.raw";
    return kNames[depth];
  }

  // base (64 KiB), mid1 (32 KiB, extended L2), mid2 (4 KiB), top (the
  // config's), each written with data, zeroes and discards (and compressed
  // clusters, in base and mid2) while it was the top, the model
  // following.
  void SetUp() override {
    const Config& c = GetParam();
    const LayerSpec specs[] = {{"", c.top_cluster, c.top_xl2},
                               {"", 4096, false},
                               {"", 32768, true},
                               {"", 65536, false}};
    for (int depth = 3; depth >= 0; --depth) {
      CreateOptions co;
      co.size = kDisk;
      const bool raw = depth == 3 && c.raw_bottom;
      if (raw) {
        co.format = ImageFormat::kRaw;
      } else {
        co.cluster_size = specs[depth].cluster;
        co.extended_l2 = specs[depth].xl2;
      }
      if (depth < 3) {
        co.backing_file = Name(depth + 1);
        co.backing_format = depth == 2 && c.raw_bottom ? "raw" : "qcow2";
      }
      ASSERT_OK(CreateImage(Path(depth), co));
      OpenOptions oo;
      oo.read_write = true;
      ASSERT_OK_AND_ASSIGN(auto img, Image::Open(Path(depth), oo));
      std::mt19937_64 rng(100 + depth);
      for (int i = 0; i < 24; ++i) {
        const uint64_t len = 512 * (1 + rng() % 400);
        const uint64_t off = 512 * (rng() % ((kDisk - len) / 512));
        const int kind = raw ? 0 : static_cast<int>(rng() % 4);
        if (kind == 2) {
          ASSERT_OK(img->WriteZeroes(off, len));
          model_.Zero(off, len);
        } else if (kind == 3) {
          ASSERT_OK(img->Discard(off, len));
          model_.Zero(off, len);
        } else {
          std::vector<uint8_t> buf(len);
          testing::FillPseudoRandom(rng(), absl::MakeSpan(buf));
          ASSERT_OK(img->Write(off, buf));
          model_.Write(off, buf);
        }
      }
      // Compressed clusters in the standard-L2 layers below the top: the
      // jobs read them through the chain (decompressed after the read).
      if (!raw && depth > 0 && !specs[depth].xl2) {
        const uint32_t cluster = specs[depth].cluster;
        std::vector<uint8_t> buf(cluster);
        for (int i = 0; i < 6; ++i) {
          // Compressible: runs of one byte.
          const uint8_t fill = static_cast<uint8_t>(rng());
          for (uint32_t j = 0; j < cluster; ++j) {
            buf[j] = static_cast<uint8_t>(fill + j / 512);
          }
          const uint64_t off = cluster * (rng() % (kDisk / cluster));
          ASSERT_OK(img->WriteCompressed(off, buf));
          model_.Write(off, buf);
        }
      }
      ASSERT_OK(img->Close());
    }
  }

  // One guest thread: random writes, zeroes, discards, reads of its own
  // stripes, and flushes on its own Queue, up to 8 in flight, until `stop`
  // (and at least `min_ops`).
  void Guest(Image* image, int t, const std::atomic<bool>* stop, int min_ops) {
    // A guest that stops early (a failed assertion) stops the job's waits.
    struct Exit {
      std::atomic<int>* running;
      ~Exit() { running->fetch_sub(1); }
    } exit{&guests_running_};
    auto queue = image->CreateQueue();
    ASSERT_OK(queue.status());
    Queue* q = queue->get();
    std::mt19937_64 rng(7 + t);
    struct Pending {
      std::vector<uint8_t> buf;
      std::vector<uint8_t> want;
      uint64_t offset = 0;
      bool read = false;
      bool done = false;
      absl::Status status;
    };
    std::deque<Pending> pending;
    int ops = 0;
    const uint64_t stripes = kDisk / kStripe;
    auto reap = [&] {
      while (!pending.empty() && pending.front().done) {
        Pending& p = pending.front();
        EXPECT_OK(p.status);
        if (p.read) {
          EXPECT_TRUE(p.buf == p.want)
              << "thread " << t << " read at " << p.offset << " (" << p.buf.size()
              << " bytes) does not match the model";
        }
        pending.pop_front();
        guest_done_.fetch_add(1);
      }
    };
    while (ops < min_ops || !stop->load()) {
      // A range inside one of this thread's stripes.
      const uint64_t stripe = (rng() % (stripes / kThreads)) * kThreads + t;
      const uint64_t len = 512 * (1 + rng() % (kStripe / 512));
      const uint64_t off =
          stripe * kStripe + 512 * (rng() % ((kStripe - len) / 512 + 1));
      pending.emplace_back();
      Pending& p = pending.back();
      p.offset = off;
      auto done = [&p](absl::Status s) {
        p.status = std::move(s);
        p.done = true;
      };
      const int kind = static_cast<int>(rng() % 10);
      absl::Status s;
      if (kind < 4) {
        p.buf.resize(len);
        testing::FillPseudoRandom(rng(), absl::MakeSpan(p.buf));
        {
          std::lock_guard<std::mutex> lock(model_mu_);
          model_.Write(off, p.buf);
        }
        s = q->SubmitWrite(off, p.buf, done);
      } else if (kind < 5) {
        {
          std::lock_guard<std::mutex> lock(model_mu_);
          model_.Zero(off, len);
        }
        s = kind == 4 && rng() % 2 ? q->SubmitDiscard(off, len, done)
                                   : q->SubmitWriteZeroes(off, len, false, done);
      } else if (kind < 9) {
        p.read = true;
        p.buf.resize(len);
        {
          std::lock_guard<std::mutex> lock(model_mu_);
          auto r = model_.Range(off, len);
          p.want.assign(r.begin(), r.end());
        }
        s = q->SubmitRead(off, absl::MakeSpan(p.buf), done);
      } else {
        s = q->SubmitFlush(done);
        // Block status walks the chain beside the job (and across its
        // switch): it reads tables of layers the switch may drop.
        EXPECT_OK(image->GetBlockStatus(off, kDisk - off).status());
      }
      ASSERT_OK(s);
      ++ops;
      while (q->in_flight() >= 8) q->Poll(1);
      q->Poll(0);
      reap();
    }
    q->Drain();
    reap();
    EXPECT_TRUE(pending.empty());
  }

  // Opens the top read-write, runs the job while the guests write, and
  // returns its status; `image` stays open for the checks.
  absl::Status RunJob(std::unique_ptr<Image>* image, LiveJobOptions jo) {
    const Config& c = GetParam();
    OpenOptions oo;
    oo.read_write = true;
    auto img = Image::Open(Path(0), oo);
    if (!img.ok()) return img.status();
    *image = std::move(img).value();
    std::atomic<bool> stop{false};
    guests_running_ = kThreads;
    std::vector<std::thread> guests;
    for (int t = 0; t < kThreads; ++t) {
      guests.emplace_back([&, t] { Guest(image->get(), t, &stop, 60); });
    }
    absl::Status s = c.job == Job::kStream   ? (*image)->LiveStream(c.base, jo)
                     : c.job == Job::kCommit ? (*image)->LiveCommit(c.base, jo)
                                             : (*image)->LiveActiveCommit(
                                                   c.base, jo);
    stop = true;
    for (std::thread& g : guests) g.join();
    return s;
  }

  absl::Status CheckDisk(Image* image) {
    std::vector<uint8_t> got(kDisk);
    absl::Status s = image->Read(0, absl::MakeSpan(got));
    if (!s.ok()) return s;
    if (got != model_.bytes()) {
      return absl::InternalError("the disk does not match the model");
    }
    return absl::OkStatus();
  }

  // Every image file passes qemu-img check; the top (`top`: the base of a
  // finished active commit) reopened, and read by qemu-img, equals the
  // model.
  void CheckAfterClose(int top = 0) {
    for (int depth = 0; depth < 4; ++depth) {
      if (depth == 3 && GetParam().raw_bottom) continue;
      if (!testing::HaveQemu()) break;
      testing::CommandResult r = testing::QemuCheck(Path(depth));
      EXPECT_EQ(r.exit_code, 0) << Name(depth) << ": " << r.out << r.err;
    }
    OpenOptions ro;
    ASSERT_OK_AND_ASSIGN(auto again, Image::Open(Path(top), ro));
    EXPECT_OK(CheckDisk(again.get()));
    ASSERT_OK(again->Close());
    if (testing::HaveQemu()) {
      ASSERT_OK_AND_ASSIGN(auto q, testing::QemuReadAll(Path(top)));
      EXPECT_TRUE(q == model_.bytes()) << "qemu-img reads the top differently";
    }
    if (top > 0 && testing::HaveQemu()) {
      // The committed base against the pre-commit chain's view with the
      // guest's writes applied (the model, as a raw file).
      const std::string raw = dir_.File("model.raw");
      ASSERT_OK(testing::WriteFileBytes(raw, model_.bytes()));
      const std::string fmt =
          top == 3 && GetParam().raw_bottom ? "raw" : "qcow2";
      testing::CommandResult r = testing::Run(
          {"qemu-img", "compare", "-f", fmt, "-F", "raw", Path(top), raw});
      EXPECT_EQ(r.exit_code, 0) << "qemu-img compare: " << r.out << r.err;
    }
  }

  // Guest requests completed (and checked), over all threads.
  std::atomic<uint64_t> guest_done_{0};
  std::atomic<int> guests_running_{0};
  TempDir dir_;
  std::mutex model_mu_;
  testing::DiskModel model_{kDisk};
};

TEST_P(LiveJobTest, GuestWritesSurviveAndChainShortens) {
  const Config& c = GetParam();
  LiveJobControl control;
  LiveJobOptions jo;
  jo.chunk = 256 << 10;
  jo.depth = 2;
  jo.control = &control;
  jo.rate_limit = c.rate_limit;
  std::mutex progress_mu;
  uint64_t last_done = 0, calls = 0, total = 0;
  jo.progress = [&](uint64_t done, uint64_t all) {
    // The guests get on between chunks, whatever the scheduler does: each
    // chunk waits here for more guest requests to complete (while the
    // job's other thread copies its own chunk).
    const uint64_t want = guest_done_.load() + 8;
    while (guest_done_.load() < want && guests_running_.load() == kThreads) {
      std::this_thread::yield();
    }
    std::lock_guard<std::mutex> lock(progress_mu);
    EXPECT_GE(done, last_done);
    last_done = done;
    total = all;
    ++calls;
    if (c.cancel && done >= kDisk / 4) control.Cancel();
  };
  std::unique_ptr<Image> image;
  absl::Status s = RunJob(&image, jo);
  ASSERT_NE(image, nullptr) << s;
  const std::vector<LayerInfo> chain = image->GetChainInfo();
  if (c.cancel) {
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
    EXPECT_EQ(chain.size(), 4u);
    EXPECT_EQ(chain[0].backing_file, Name(1));
  } else if (c.job == Job::kActive) {
    ASSERT_OK(s);
    // Each pass over what the guests changed adds to the total.
    EXPECT_GE(total, kDisk);
    printf("[active commit] %s: %llu bytes walked for a %llu-byte disk\n",
           c.name.c_str(), static_cast<unsigned long long>(total),
           static_cast<unsigned long long>(kDisk));
    EXPECT_EQ(last_done, total);
    EXPECT_GT(calls, 0u);
    // The base is the top now, over what was under it.
    ASSERT_EQ(chain.size(), static_cast<size_t>(4 - c.base));
    EXPECT_EQ(chain[0].filename, Path(c.base));
    EXPECT_EQ(chain[0].backing_file, c.base < 3 ? Name(c.base + 1) : "");
    // The layers above it left the chain and are unlocked (opened alone:
    // their chains hold the new top, write-locked); the layers under it
    // are read-locked.
    OpenOptions rw;
    rw.read_write = true;
    rw.open_backing = false;
    for (int depth = 0; depth < 4; ++depth) {
      auto other = Image::Open(Path(depth), rw);
      if (depth < c.base) {
        EXPECT_TRUE(other.ok()) << Name(depth) << " left the chain: "
                                << other.status();
      } else {
        EXPECT_EQ(other.status().code(), absl::StatusCode::kUnavailable)
            << Name(depth) << " is still in the chain: " << other.status();
      }
    }
  } else {
    ASSERT_OK(s);
    EXPECT_EQ(total, kDisk);
    EXPECT_EQ(last_done, kDisk);
    EXPECT_GT(calls, 0u);
    // Stream keeps the base; commit keeps it as the top's backing too.
    const int keep = c.base;
    const size_t want = c.base >= 4 ? 1 : 1 + (4 - keep);
    ASSERT_EQ(chain.size(), want);
    EXPECT_EQ(chain[0].backing_file, c.base >= 4 ? "" : Name(keep));
    if (c.base < 4) {
      EXPECT_EQ(chain[1].filename, Path(keep));
    }
    // The layers that left the chain are unlocked: another writer may
    // open them now. The layers still in it are not.
    OpenOptions rw;
    rw.read_write = true;
    const int dropped = c.job == Job::kStream ? c.base : keep;
    for (int depth = 1; depth < 4; ++depth) {
      auto other = Image::Open(Path(depth), rw);
      if (depth < dropped) {
        EXPECT_TRUE(other.ok()) << Name(depth) << " left the chain: "
                                << other.status();
      } else {
        EXPECT_EQ(other.status().code(), absl::StatusCode::kUnavailable)
            << Name(depth) << " is still in the chain: " << other.status();
      }
    }
  }
  EXPECT_OK(CheckDisk(image.get()));
  ASSERT_OK(image->Close());
  image.reset();
  CheckAfterClose(c.job == Job::kActive && !c.cancel ? c.base : 0);
}

// The refusals, before anything is written.
TEST(LiveJobErrorsTest, RefusesWhatItCannotDo) {
  TempDir dir;
  CreateOptions co;
  co.size = 1 << 20;
  ASSERT_OK(CreateImage(dir.File("b.qcow2"), co));
  co.backing_file = "b.qcow2";
  co.backing_format = "qcow2";
  ASSERT_OK(CreateImage(dir.File("m.qcow2"), co));
  co.backing_file = "m.qcow2";
  ASSERT_OK(CreateImage(dir.File("t.qcow2"), co));
  OpenOptions oo;
  ASSERT_OK_AND_ASSIGN(auto ro, Image::Open(dir.File("t.qcow2"), oo));
  EXPECT_EQ(ro->LiveStream(2).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_OK(ro->Close());
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(dir.File("t.qcow2"), oo));
  EXPECT_EQ(img->LiveActiveCommit(3).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(img->LiveActiveCommit(0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(img->LiveCommit(3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(img->LiveStream(4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(img->LiveStream(0).code(), absl::StatusCode::kInvalidArgument);
  LiveJobOptions bad;
  bad.chunk = 1000;
  EXPECT_EQ(img->LiveStream(2, bad).code(), absl::StatusCode::kInvalidArgument);
  bad.chunk = 1 << 20;
  bad.depth = 0;
  EXPECT_EQ(img->LiveCommit(2, bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(img->GetChainInfo().size(), 3u);
  // A stream to the immediate backing file changes nothing.
  EXPECT_OK(img->LiveStream(1));
  EXPECT_EQ(img->GetChainInfo().size(), 3u);
  // While a job runs, what would change the chain under it refuses, and
  // so does a second job.
  std::vector<absl::Status> during;
  LiveJobOptions watch;
  watch.chunk = 256 << 10;
  watch.progress = [&](uint64_t, uint64_t) {
    if (!during.empty()) return;
    during.push_back(img->CreateOverlay(dir.File("o.qcow2"), {}));
    during.push_back(img->Resize(2 << 20));
    during.push_back(img->ChangeBackingFile("b.qcow2", "qcow2"));
    during.push_back(img->LiveStream(3));
    during.push_back(img->LiveCommit(2));
    during.push_back(img->LiveActiveCommit(1));
  };
  EXPECT_OK(img->LiveStream(3, watch));
  ASSERT_EQ(during.size(), 6u);
  for (const absl::Status& s : during) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  }
  EXPECT_EQ(img->GetChainInfo().size(), 1u);
  EXPECT_EQ(img->size(), 1u << 20);
  ASSERT_OK(img->Close());
}

// An active commit into a base whose size is not the disk's: refused,
// the chain as it was.
TEST(LiveJobErrorsTest, ActiveCommitRefusesBaseOfAnotherSize) {
  TempDir dir;
  CreateOptions co;
  co.size = 2 << 20;
  ASSERT_OK(CreateImage(dir.File("b.qcow2"), co));
  co.size = 1 << 20;
  co.backing_file = "b.qcow2";
  co.backing_format = "qcow2";
  ASSERT_OK(CreateImage(dir.File("t.qcow2"), co));
  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(dir.File("t.qcow2"), oo));
  absl::Status s = img->LiveCommit(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("size"), std::string::npos) << s;
  EXPECT_EQ(img->GetChainInfo().size(), 2u);
  ASSERT_OK(img->Write(0, std::vector<uint8_t>(512, 1)));
  ASSERT_OK(img->Close());
}

INSTANTIATE_TEST_SUITE_P(
    Live, LiveJobTest,
    ::testing::Values(
        Config{"stream_to_mid1", Job::kStream, 2, false, 65536, true},
        Config{"stream_whole_chain", Job::kStream, 4, false, 4096, false},
        Config{"stream_whole_chain_raw", Job::kStream, 4, true, 65536, true},
        Config{"stream_to_raw", Job::kStream, 3, true, 16384, false},
        Config{"commit_into_base", Job::kCommit, 3, false, 65536, true},
        Config{"commit_into_mid1", Job::kCommit, 2, false, 4096, false},
        Config{"commit_into_raw", Job::kCommit, 3, true, 32768, true},
        Config{"stream_cancelled", Job::kStream, 4, false, 65536, false,
               /*cancel=*/true},
        Config{"commit_cancelled", Job::kCommit, 3, false, 16384, true,
               /*cancel=*/true},
        Config{"stream_rate_limited", Job::kStream, 3, false, 65536, true,
               false, /*rate_limit=*/16 << 20},
        Config{"commit_rate_limited", Job::kCommit, 3, true, 65536, false,
               false, /*rate_limit=*/16 << 20},
        // Active commit: into the backing file (4 KiB clusters under a
        // 64 KiB top: the range locks change geometry at the switch), to
        // the bottom, into a raw bottom (a raw top after; rate-limited),
        // and cancelled.
        Config{"active_into_backing", Job::kActive, 1, false, 65536, true},
        Config{"active_into_base", Job::kActive, 3, false, 4096, false},
        Config{"active_into_raw_rate_limited", Job::kActive, 3, true, 32768,
               true, false, /*rate_limit=*/16 << 20},
        Config{"active_cancelled", Job::kActive, 2, false, 16384, false,
               /*cancel=*/true}),
    [](const ::testing::TestParamInfo<Config>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace qcow2
