// SPDX-License-Identifier: Apache-2.0
// Image::WriteCompressed against QEMU. Every image we write passes
// `qemu-img check` with no leak, reads back through qemu-img as the model
// says, and QEMU counts the clusters we compressed as compressed (check's
// "compressed-clusters"; map gives them no host offset). The same clusters
// written by `qemu-io -c 'write -c -s FILE'` into a twin image pack into
// the same file length (QEMU's packing: several streams per host cluster,
// byte-granular). Cluster sizes 512 B .. 2 MiB, zlib and zstd, extended
// L2, incompressible clusters (stored plain), overwrites, a cluster shared
// with an internal snapshot, queues and threads, and the refusals.
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "qcow2/c.h"
#include "qcow2/image.h"
#include "tests/util/json_lite.h"
#include "tests/util/qemu_images.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::CommandResult;
using testing::Qcow2Spec;
using testing::QemuImageSpec;

std::vector<uint8_t> RandomBytes(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

absl::StatusOr<testing::json::Value> CheckJson(const std::string& path) {
  CommandResult r = testing::QemuCheck(path);
  if (r.exit_code != 0) {
    return absl::InternalError(absl::StrCat("qemu-img check exit ",
                                            r.exit_code, ": ", r.out, r.err));
  }
  return testing::json::Parse(r.out);
}

std::unique_ptr<Image> OpenRw(const std::string& path) {
  OpenOptions oo;
  oo.read_write = true;
  auto img = Image::Open(path, oo);
  EXPECT_TRUE(img.ok()) << img.status();
  return img.ok() ? std::move(img).value() : nullptr;
}

QemuImageSpec With(QemuImageSpec s, const std::string& compression) {
  s.compression_type = compression;
  return s;
}

class CompressedWriteTest : public ::testing::TestWithParam<QemuImageSpec> {
 protected:
  void SetUp() override { SKIP_WITHOUT_QEMU(); }
  testing::TempDir dir_;
};

// Clusters 0..n-1 of a disk whose last cluster is partial: compressible
// ones, an incompressible one (stored plain), zeros (compressed too, as
// QEMU does), and the partial last cluster.
TEST_P(CompressedWriteTest, QemuReadsChecksAndPacksAsItsOwn) {
  QemuImageSpec spec = GetParam();
  const uint64_t cs = spec.cluster_size;
  const uint64_t clusters = cs >= (1 << 20) ? 5 : 12;
  // Sizes are whole sectors: with 512-byte clusters none is partial.
  spec.size = (clusters - 1) * cs +
              std::max<uint64_t>(512, std::min<uint64_t>(cs / 2, 1536));
  const std::string ours = dir_.File("ours.qcow2");
  const std::string theirs = dir_.File("theirs.qcow2");
  ASSERT_OK(testing::QemuCreate(ours, spec));
  ASSERT_OK(testing::QemuCreate(theirs, spec));
  std::vector<uint8_t> model(spec.size, 0);
  std::vector<std::string> qemu_cmds;
  int expect_compressed = 0;
  {
    auto img = OpenRw(ours);
    ASSERT_NE(img, nullptr);
    for (uint64_t c = 0; c < clusters; ++c) {
      const uint64_t off = c * cs;
      const uint64_t n = std::min<uint64_t>(cs, spec.size - off);
      std::vector<uint8_t> data;
      if (c == 2) {
        data = RandomBytes(c, n);  // does not compress
      } else if (c == 3) {
        data.assign(n, 0);
        ++expect_compressed;
      } else {
        data = testing::CompressibleBytes(c + 100, n);
        ++expect_compressed;
      }
      ASSERT_OK(img->WriteCompressed(off, data));
      std::copy(data.begin(), data.end(), model.begin() + off);
      const std::string file = dir_.File(absl::StrCat("c", c, ".bin"));
      ASSERT_OK(testing::WriteFileBytes(file, data));
      qemu_cmds.push_back(absl::StrCat("write -c -s ", file, " ", off, " ", n));
    }
    ASSERT_OK(img->Close());
  }
  ASSERT_OK(testing::QemuIo(theirs, qemu_cmds));
  ASSERT_OK_AND_ASSIGN(auto check, CheckJson(ours));
  EXPECT_EQ(check["compressed-clusters"].as_int64(), expect_compressed);
  EXPECT_EQ(check["allocated-clusters"].as_int64(),
            static_cast<int64_t>(clusters));
  ASSERT_OK_AND_ASSIGN(auto check_theirs, CheckJson(theirs));
  EXPECT_EQ(check["image-end-offset"].as_int64(),
            check_theirs["image-end-offset"].as_int64())
      << "our streams pack differently from QEMU's";
  ASSERT_OK_AND_ASSIGN(auto got, testing::QemuReadAll(ours));
  EXPECT_TRUE(got == model) << "qemu-img reads other bytes";
  CommandResult cmp = testing::Run({"qemu-img", "compare", ours, theirs});
  EXPECT_EQ(cmp.exit_code, 0) << cmp.out << cmp.err;
  // map: the plain cluster has a host offset, the compressed ones none.
  ASSERT_OK_AND_ASSIGN(auto map, testing::QemuMapJson(ours));
  for (size_t i = 0; i < map.size(); ++i) {
    const uint64_t start = map[i]["start"].as_uint64();
    const uint64_t len = map[i]["length"].as_uint64();
    EXPECT_TRUE(map[i]["data"].as_bool());
    const bool plain = start <= 2 * cs && 2 * cs < start + len;
    EXPECT_EQ((map[i].Find("offset") != nullptr), plain) << "map entry at " << start;
  }
  // And through us: the status says compressed.
  {
    OpenOptions ro;
    auto img = Image::Open(ours, ro);
    ASSERT_TRUE(img.ok()) << img.status();
    ASSERT_OK_AND_ASSIGN(BlockStatus bs, (*img)->GetBlockStatus(0, cs));
    EXPECT_TRUE(bs.compressed);
    ASSERT_OK_AND_ASSIGN(bs, (*img)->GetBlockStatus(2 * cs, cs));
    EXPECT_FALSE(bs.compressed);
  }
}

// Overwrites: compressed over compressed (ours and qemu's), over a plain
// cluster, plain over compressed, and over a cluster an internal snapshot
// shares; refcounts stay exact (no leak), the snapshot keeps its data.
TEST_P(CompressedWriteTest, OverwritesKeepRefcountsExact) {
  QemuImageSpec spec = GetParam();
  const uint64_t cs = spec.cluster_size;
  spec.size = 8 * cs;
  const std::string path = dir_.File("img.qcow2");
  ASSERT_OK(testing::QemuCreate(path, spec));
  ASSERT_OK(testing::QemuIo(
      path, {absl::StrCat("write -P 0x11 0 ", 2 * cs),
             absl::StrCat("write -c -P 0x12 ", 2 * cs, " ", 2 * cs)}));
  ASSERT_EQ(testing::Run({"qemu-img", "snapshot", "-c", "s1", path}).exit_code,
            0);
  ASSERT_OK_AND_ASSIGN(auto snap_before, testing::QemuReadAll(path));
  std::vector<uint8_t> model = snap_before;
  {
    auto img = OpenRw(path);
    ASSERT_NE(img, nullptr);
    auto put = [&](uint64_t c, const std::vector<uint8_t>& d, bool comp) {
      std::copy(d.begin(), d.end(), model.begin() + c * cs);
      return comp ? img->WriteCompressed(c * cs, d) : img->Write(c * cs, d);
    };
    // Clusters 0 (plain) and 2 (compressed) are shared with s1.
    ASSERT_OK(put(0, testing::CompressibleBytes(1, cs), true));
    ASSERT_OK(put(2, testing::CompressibleBytes(2, cs), true));
    ASSERT_OK(put(4, testing::CompressibleBytes(3, cs), true));
    ASSERT_OK(put(4, testing::CompressibleBytes(4, cs), true));
    ASSERT_OK(put(5, testing::CompressibleBytes(5, cs), true));
    ASSERT_OK(put(5, RandomBytes(6, cs), false));
    ASSERT_OK(put(6, testing::CompressibleBytes(7, cs), false));
    ASSERT_OK(put(6, testing::CompressibleBytes(8, cs), true));
    ASSERT_OK(img->Flush());
    // Every stream packed so far, then overwritten again: the host
    // clusters they shared are freed only when the last one goes.
    for (uint64_t c : {0, 2, 4, 6}) {
      ASSERT_OK(put(c, testing::CompressibleBytes(c + 50, cs), true));
    }
    ASSERT_OK(img->Close());
  }
  CommandResult check = testing::QemuCheck(path);
  ASSERT_EQ(check.exit_code, 0) << check.out << check.err;
  ASSERT_OK_AND_ASSIGN(auto got, testing::QemuReadAll(path));
  EXPECT_TRUE(got == model);
  const std::string snap = dir_.File("snap.raw");
  CommandResult conv = testing::Run(
      {"qemu-img", "convert", "-l", "snapshot.name=s1", "-O", "raw", path,
       snap});
  ASSERT_EQ(conv.exit_code, 0) << conv.err;
  ASSERT_OK_AND_ASSIGN(auto snap_data, testing::ReadFileBytes(snap));
  EXPECT_TRUE(snap_data == snap_before) << "the snapshot lost its data";
}

// Many compressed writes in flight on a queue, and from several threads at
// once: every stream gets its own bytes, refcounts exact.
TEST_P(CompressedWriteTest, ConcurrentWritesPackSafely) {
  QemuImageSpec spec = GetParam();
  const uint64_t cs = spec.cluster_size;
  const uint64_t clusters = cs >= (1 << 20) ? 8 : 64;
  spec.size = clusters * cs;
  const std::string path = dir_.File("img.qcow2");
  ASSERT_OK(testing::QemuCreate(path, spec));
  std::vector<std::vector<uint8_t>> data(clusters);
  std::vector<uint8_t> model;
  for (uint64_t c = 0; c < clusters; ++c) {
    data[c] = testing::CompressibleBytes(c * 7 + 1, cs);
    model.insert(model.end(), data[c].begin(), data[c].end());
  }
  {
    auto img = OpenRw(path);
    ASSERT_NE(img, nullptr);
    ASSERT_OK_AND_ASSIGN(auto q, img->CreateQueue());
    int done = 0;
    for (uint64_t c = 0; c < clusters / 2; ++c) {
      ASSERT_OK(q->SubmitWriteCompressed(c * cs, data[c],
                                         [&](absl::Status s) {
                                           EXPECT_OK(s);
                                           ++done;
                                         }));
    }
    q->Drain();
    EXPECT_EQ(done, static_cast<int>(clusters / 2));
    q.reset();
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (uint64_t c = clusters / 2 + t; c < clusters; c += 4) {
          EXPECT_OK(img->WriteCompressed(c * cs, data[c]));
        }
      });
    }
    for (auto& th : threads) th.join();
    ASSERT_OK(img->Close());
  }
  ASSERT_OK_AND_ASSIGN(auto check, CheckJson(path));
  EXPECT_EQ(check["compressed-clusters"].as_int64(),
            static_cast<int64_t>(clusters));
  ASSERT_OK_AND_ASSIGN(auto got, testing::QemuReadAll(path));
  EXPECT_TRUE(got == model);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, CompressedWriteTest,
    ::testing::Values(Qcow2Spec("1.1", 512), Qcow2Spec("1.1", 4096),
                      Qcow2Spec("0.10", 65536),
                      With(Qcow2Spec("1.1", 65536), "zstd"),
                      With(Qcow2Spec("1.1", 2 << 20), "zstd"),
                      Qcow2Spec("1.1", 2 << 20),
                      Qcow2Spec("1.1", 32768, true),
                      With(Qcow2Spec("1.1", 65536, true), "zstd")),
    [](const auto& info) { return info.param.Token(); });

class CompressedWriteRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_QEMU(); }
  testing::TempDir dir_;
};

TEST_F(CompressedWriteRefusalTest, RefusesWhatQemuRefuses) {
  const std::string raw = dir_.File("disk.raw");
  QemuImageSpec rs;
  rs.format = "raw";
  rs.size = 1 << 20;
  ASSERT_OK(testing::QemuCreate(raw, rs));
  {
    OpenOptions oo;
    oo.read_write = true;
    oo.format = "raw";
    ASSERT_OK_AND_ASSIGN(auto img, Image::Open(raw, oo));
    std::vector<uint8_t> buf(65536, 1);
    absl::Status s = img->WriteCompressed(0, buf);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_NE(s.message().find("raw"), std::string::npos) << s;
  }
  QemuImageSpec spec = Qcow2Spec("1.1", 65536);
  spec.size = (1 << 20) + 4096;
  const std::string path = dir_.File("img.qcow2");
  ASSERT_OK(testing::QemuCreate(path, spec));
  {
    auto img = OpenRw(path);
    ASSERT_NE(img, nullptr);
    std::vector<uint8_t> buf(65536, 1);
    // Not aligned; not a whole cluster; past the end.
    EXPECT_EQ(img->WriteCompressed(512, buf).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(img->WriteCompressed(0, absl::MakeConstSpan(buf.data(), 4096))
                  .code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(img->WriteCompressed(1 << 20, buf).code(),
              absl::StatusCode::kOutOfRange);
    // The last, partial cluster is fine.
    EXPECT_OK(img->WriteCompressed(1 << 20,
                                   absl::MakeConstSpan(buf.data(), 4096)));
    // C API: the same through qcow2/c.h.
    ASSERT_OK(img->Close());
  }
  char* err = nullptr;
  qcow2_image_t* c = qcow2_image_open(path.c_str(), 1, &err);
  ASSERT_NE(c, nullptr) << err;
  std::vector<uint8_t> z(65536);
  for (size_t i = 0; i < z.size(); ++i) z[i] = static_cast<uint8_t>(i / 512);
  EXPECT_EQ(qcow2_image_write_compressed(c, 65536, z.data(), z.size(), &err),
            0)
      << err;
  EXPECT_EQ(qcow2_image_write_compressed(c, 100, z.data(), z.size(), &err),
            -EINVAL);
  EXPECT_NE(err, nullptr);
  qcow2_free(err);
  err = nullptr;
  EXPECT_EQ(qcow2_image_close(c, &err), 0) << err;
  ASSERT_OK_AND_ASSIGN(auto check, CheckJson(path));
  EXPECT_EQ(check["compressed-clusters"].as_int64(), 2);
  ASSERT_OK_AND_ASSIGN(auto got, testing::QemuReadAll(path));
  EXPECT_TRUE(std::equal(z.begin(), z.end(), got.begin() + 65536));
  EXPECT_EQ(got[(1 << 20) + 10], 1);
}

}  // namespace
}  // namespace qcow2
