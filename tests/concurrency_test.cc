// SPDX-License-Identifier: Apache-2.0
// Many queues on one chain, issuing random overlapping reads, writes,
// write-zeroes, discards and flushes at once, checked against a serial
// model.
//
// The queue contract (qcow2/queue.h) says overlapping requests run in the
// order their Submit calls reached the image, and every request sees all
// or none of another's effect. The test makes that order observable by
// numbering Submit calls under one test mutex; replaying the operations in
// that order on a flat model must then reproduce every read result and the
// final disk exactly. The final image is also read back by qemu-img and
// must pass `qemu-img check`.
#include <atomic>
#include <string>
#include <mutex>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "testing/model.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::TempDir;

#if defined(__SANITIZE_THREAD__)
constexpr int kSlowdown = 8;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr int kSlowdown = 8;
#else
constexpr int kSlowdown = 1;
#endif
#else
constexpr int kSlowdown = 1;
#endif

struct LoggedOp {
  uint64_t seq = 0;
  testing::ModelOp op;  // kWrite, kZero, kDiscard, kFlush; or a read below
  bool read = false;
  std::vector<uint8_t> data;    // write: the bytes written
  std::vector<uint8_t> result;  // read: what came back
  absl::Status status;
};

struct Config {
  int queues = 4;
  int ops_per_queue = 600;
  int depth = 16;
  uint64_t disk = 4 << 20;
  uint32_t cluster = 4096;
  bool extended_l2 = false;
  bool backing = true;
  bool direct = false;
  bool use_io_uring = true;
  // 0: the defaults. A tiny L2 cache keeps entries leaving and coming back,
  // so misses read without the lock meet write-backs of the same slices.
  uint64_t l2_cache_bytes = 0;
  uint32_t l2_slice_bytes = 0;
  // Most writes continue the queue's last one in 4 KiB multiples, and
  // flushes are twice as common: clusters are left pending (deferred
  // copy-on-write) and flushes from several queues fill them while
  // other requests run.
  bool streams = false;
};

void CreateQcow2(const std::string& path, uint64_t size, uint32_t cluster,
                 bool extended_l2, const std::string& backing) {
  CreateOptions co;
  co.size = size;
  co.cluster_size = cluster;
  co.extended_l2 = extended_l2;
  if (!backing.empty()) {
    co.backing_file = backing;
    co.backing_format = "qcow2";
  }
  ASSERT_OK(CreateImage(path, co));
}

std::string ConfigName(const Config& c) {
  return std::to_string(c.cluster / 1024) + "k" +
         (c.extended_l2 ? "_ext" : "") +
         (c.backing ? "_overlay" : "_nobacking") +
         (c.direct ? "_direct" : "") + (c.use_io_uring ? "" : "_sync") +
         (c.l2_cache_bytes != 0 ? "_tinyl2" : "") +
         (c.streams ? "_streams" : "");
}

void PrintTo(const Config& c, std::ostream* os) { *os << ConfigName(c); }

class ConcurrencyTest : public ::testing::TestWithParam<Config> {};

TEST_P(ConcurrencyTest, RandomOverlappingOpsMatchSerialModel) {
  const Config cfg = GetParam();
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  const std::string top = dir.File("top.qcow2");
  testing::DiskModel model(cfg.disk);
  if (cfg.backing) {
    // A backing file with data in every other 64 KiB, so copy-on-write has
    // something to copy.
    CreateQcow2(base, cfg.disk, 65536, false, "");
    OpenOptions oo;
    oo.read_write = true;
    ASSERT_OK_AND_ASSIGN(auto b, Image::Open(base, oo));
    std::vector<uint8_t> chunk(65536);
    for (uint64_t off = 0; off < cfg.disk; off += 2 * chunk.size()) {
      testing::FillPseudoRandom(off + 1, absl::MakeSpan(chunk));
      ASSERT_OK(b->Write(off, chunk));
      model.Write(off, chunk);
    }
    ASSERT_OK(b->Close());
  }
  CreateQcow2(top, cfg.disk, cfg.cluster, cfg.extended_l2,
              cfg.backing ? "base.qcow2" : "");

  OpenOptions oo;
  oo.read_write = true;
  oo.direct_io = cfg.direct;
  if (cfg.l2_cache_bytes != 0) oo.l2_cache_bytes = cfg.l2_cache_bytes;
  if (cfg.l2_slice_bytes != 0) oo.l2_slice_bytes = cfg.l2_slice_bytes;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image, Image::Open(top, oo));

  std::mutex order_mu;
  uint64_t next_seq = 0;
  std::vector<std::vector<std::unique_ptr<LoggedOp>>> logs(cfg.queues);
  std::atomic<int> uring_queues{0};
  const int ops = cfg.ops_per_queue / kSlowdown;

  auto worker = [&](int q) {
    QueueOptions qo;
    qo.depth = cfg.depth;
    qo.use_io_uring = cfg.use_io_uring;
    auto queue_or = image->CreateQueue(qo);
    ASSERT_TRUE(queue_or.ok()) << queue_or.status();
    std::unique_ptr<Queue> queue = std::move(*queue_or);
    if (queue->uses_io_uring()) uring_queues++;
    std::mt19937_64 rng(1000 + q);
    auto& log = logs[q];
    uint64_t stream_end = cfg.disk / cfg.queues * q;
    for (int i = 0; i < ops; ++i) {
      while (queue->in_flight() >= cfg.depth) queue->Poll(1);
      auto entry = std::make_unique<LoggedOp>();
      LoggedOp* e = entry.get();
      const int kind = static_cast<int>(rng() % 100);
      // Lengths up to a few clusters, offsets sector aligned or not (O_DIRECT
      // needs 4 KiB alignment of everything).
      const uint64_t unit = cfg.direct ? 4096 : (rng() % 2 ? 512 : 1);
      // With streams, other requests are short, so that streams mostly
      // enter clusters nothing allocated yet.
      const uint64_t span = cfg.streams ? cfg.cluster / 4 : 3 * cfg.cluster;
      uint64_t len = ((rng() % span) / unit + 1) * unit;
      uint64_t off = (rng() % (cfg.disk - len)) / unit * unit;
      if (cfg.streams && kind < 40 && rng() % 10 < 7) {
        len = 4096 * (rng() % 3 + 1);
        off = stream_end + len <= cfg.disk ? stream_end : 0;
        stream_end = off + len;
      }
      const int flush_from = cfg.streams ? 90 : 95;
      absl::Status s;
      auto done = [e](absl::Status st) { e->status = std::move(st); };
      std::lock_guard<std::mutex> lock(order_mu);
      e->seq = next_seq++;
      e->op.offset = off;
      e->op.length = len;
      if (kind < 40) {
        e->op.kind = testing::ModelOp::Kind::kWrite;
        e->op.data_seed = e->seq * 7919 + 1;
        e->data = e->op.Data();
        // O_DIRECT wants aligned memory: copy into an aligned vector.
        s = queue->SubmitWrite(off, e->data, done);
      } else if (kind < 75) {
        e->read = true;
        e->result.resize(len);
        s = queue->SubmitRead(off, absl::MakeSpan(e->result), done);
      } else if (kind < 85) {
        e->op.kind = testing::ModelOp::Kind::kZero;
        e->op.unmap = rng() % 2;
        s = queue->SubmitWriteZeroes(off, len, e->op.unmap, done);
      } else if (kind < flush_from) {
        e->op.kind = testing::ModelOp::Kind::kDiscard;
        s = queue->SubmitDiscard(off, len, done);
      } else {
        e->op.kind = testing::ModelOp::Kind::kFlush;
        s = queue->SubmitFlush(done);
      }
      ASSERT_TRUE(s.ok()) << s;
      log.push_back(std::move(entry));
    }
    queue->Drain();
  };
  std::vector<std::thread> threads;
  for (int q = 0; q < cfg.queues; ++q) threads.emplace_back(worker, q);
  for (auto& t : threads) t.join();
  if (cfg.use_io_uring) {
    EXPECT_EQ(uring_queues.load(), cfg.queues);
  }

  // Replay in arrival order.
  std::vector<LoggedOp*> all;
  for (auto& log : logs) {
    for (auto& e : log) all.push_back(e.get());
  }
  std::sort(all.begin(), all.end(),
            [](const LoggedOp* a, const LoggedOp* b) { return a->seq < b->seq; });
  ASSERT_EQ(all.size(), static_cast<size_t>(cfg.queues) * ops);
  int reads_checked = 0;
  for (LoggedOp* e : all) {
    ASSERT_TRUE(e->status.ok()) << "op " << e->seq << ": " << e->status;
    if (e->read) {
      ASSERT_EQ(testing::DescribeMismatch(
                    model.Range(e->op.offset, e->op.length), e->result,
                    e->op.offset),
                "")
          << "read #" << e->seq << " at " << e->op.offset << " len "
          << e->op.length;
      ++reads_checked;
    } else if (e->op.kind == testing::ModelOp::Kind::kWrite) {
      model.Write(e->op.offset, e->data);
    } else if (e->op.IsDataOp()) {
      model.Apply(e->op);
    }
  }
  EXPECT_GT(reads_checked, 0);

  // The whole disk, through us and through qemu-img.
  std::vector<uint8_t> all_bytes(cfg.disk);
  ASSERT_OK(image->Read(0, absl::MakeSpan(all_bytes)));
  EXPECT_EQ(testing::DescribeMismatch(model.bytes(), all_bytes), "");
  ASSERT_OK(image->Close());
  image.reset();
  if (!testing::HaveQemu()) return;
  testing::CommandResult check = testing::QemuCheck(top);
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> qemu, testing::QemuReadAll(top));
  EXPECT_EQ(testing::DescribeMismatch(model.bytes(), qemu), "");
}

Config Make(uint32_t cluster, bool ext, bool backing, bool direct,
            bool uring) {
  Config c;
  c.cluster = cluster;
  c.extended_l2 = ext;
  c.backing = backing;
  c.direct = direct;
  c.use_io_uring = uring;
  return c;
}

Config Streams(Config c) {
  c.streams = true;
  c.disk = 64 << 20;  // room for streams into unallocated clusters
  return c;
}

Config TinyL2Cache(Config c) {
  c.l2_cache_bytes = 2048;  // four 512-byte slices
  c.l2_slice_bytes = 512;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Chains, ConcurrencyTest,
    ::testing::Values(Make(4096, false, true, false, true),
                      Make(65536, false, true, false, true),
                      Make(65536, true, true, false, true),
                      Make(4096, false, false, false, true),
                      Make(65536, true, true, true, true),
                      Make(65536, false, true, false, false),
                      TinyL2Cache(Make(4096, false, true, false, true)),
                      TinyL2Cache(Make(65536, true, true, false, false)),
                      Streams(Make(65536, false, true, false, true)),
                      Streams(Make(65536, false, true, true, true)),
                      Streams(Make(65536, true, true, false, false))),
    [](const ::testing::TestParamInfo<Config>& info) {
      return ConfigName(info.param);
    });

// Two queues write the two halves of one unallocated cluster at the same
// time, many times over: the cluster is allocated once and both halves
// survive.
TEST(ConcurrencySameCluster, TwoWritersOneFreshCluster) {
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  const std::string top = dir.File("top.qcow2");
  const uint64_t disk = 8 << 20;
  CreateQcow2(base, disk, 65536, false, "");
  CreateQcow2(top, disk, 65536, false, "base.qcow2");
  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(top, oo));
  const int clusters = static_cast<int>(disk / 65536);
  auto writer = [&](int half) {
    auto q = image->CreateQueue();
    ASSERT_TRUE(q.ok());
    std::vector<std::vector<uint8_t>> bufs(clusters,
                                           std::vector<uint8_t>(32768));
    for (int c = 0; c < clusters; ++c) {
      std::fill(bufs[c].begin(), bufs[c].end(),
                static_cast<uint8_t>(c * 2 + half + 1));
      ASSERT_OK((*q)->SubmitWrite(uint64_t(c) * 65536 + half * 32768,
                                  bufs[c], [](absl::Status s) {
                                    ASSERT_TRUE(s.ok()) << s;
                                  }));
      while ((*q)->in_flight() >= 8) (*q)->Poll(1);
    }
    (*q)->Drain();
  };
  std::thread a(writer, 0), b(writer, 1);
  a.join();
  b.join();
  const IoStats st = image->GetStats();
  EXPECT_EQ(st.cluster_allocations, static_cast<uint64_t>(clusters));
  std::vector<uint8_t> back(65536);
  for (int c = 0; c < clusters; ++c) {
    ASSERT_OK(image->Read(uint64_t(c) * 65536, absl::MakeSpan(back)));
    for (int half = 0; half < 2; ++half) {
      EXPECT_EQ(back[half * 32768], static_cast<uint8_t>(c * 2 + half + 1));
      EXPECT_EQ(back[half * 32768 + 32767], static_cast<uint8_t>(c * 2 + half + 1));
    }
  }
  ASSERT_OK(image->Close());
  if (testing::HaveQemu()) {
    testing::CommandResult check = testing::QemuCheck(top);
    EXPECT_EQ(check.exit_code, 0) << check.out;
  }
}

// The synchronous API from several threads at once.
TEST(ConcurrencySync, ThreadsOnDisjointRanges) {
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  const uint64_t disk = 16 << 20;
  CreateQcow2(path, disk, 65536, false, "");
  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(auto image, Image::Open(path, oo));
  const int threads = 4;
  const uint64_t region = disk / threads;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::vector<uint8_t> buf(12345);
      for (uint64_t off = t * region; off + buf.size() <= (t + 1) * region;
           off += buf.size()) {
        testing::FillPseudoRandom(off, absl::MakeSpan(buf));
        ASSERT_OK(image->Write(off, buf));
      }
    });
  }
  for (auto& t : ts) t.join();
  std::vector<uint8_t> buf(12345), back(12345);
  for (int t = 0; t < threads; ++t) {
    for (uint64_t off = t * region; off + buf.size() <= (t + 1) * region;
         off += buf.size()) {
      testing::FillPseudoRandom(off, absl::MakeSpan(buf));
      ASSERT_OK(image->Read(off, absl::MakeSpan(back)));
      ASSERT_EQ(buf, back) << off;
    }
  }
  ASSERT_OK(image->Close());
}

}  // namespace
}  // namespace qcow2
