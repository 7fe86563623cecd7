// SPDX-License-Identifier: Apache-2.0
// Live external snapshots: Image::CreateOverlay on an open writable chain.
#include <vector>

#include "qcow2/image.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

std::vector<uint8_t> ReadAll(Image& img) {
  std::vector<uint8_t> out(img.size());
  EXPECT_OK(img.Read(0, absl::MakeSpan(out)));
  return out;
}

TEST(OverlayTest, WritesMoveToTheOverlayAndBackingStaysIntact) {
  testing::TempDir dir;
  const std::string base = dir.File("base.qcow2");
  const std::string top = dir.File("top.qcow2");
  CreateOptions co;
  co.size = 4 << 20;
  ASSERT_OK(CreateImage(base, co));
  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(auto img, Image::Open(base, oo));
  std::vector<uint8_t> model(img->size(), 0);
  std::vector<uint8_t> a(100000, 0x11);
  ASSERT_OK(img->Write(1000, a));
  std::fill(model.begin() + 1000, model.begin() + 101000, 0x11);

  CreateOptions overlay;
  overlay.cluster_size = 16384;
  overlay.extended_l2 = true;
  overlay.compression_type = CompressionType::kZstd;
  ASSERT_OK(img->CreateOverlay(top, overlay));
  EXPECT_EQ(img->chain_length(), 2);
  EXPECT_EQ(ReadAll(*img), model);

  std::vector<uint8_t> b(5000, 0x22);
  ASSERT_OK(img->Write(50000, b));
  std::fill(model.begin() + 50000, model.begin() + 55000, 0x22);
  ASSERT_OK(img->WriteZeroes(200000, 70000));
  std::fill(model.begin() + 200000, model.begin() + 270000, 0);
  EXPECT_EQ(ReadAll(*img), model);
  auto info = img->GetChainInfo();
  ASSERT_EQ(info.size(), 2u);
  EXPECT_EQ(info[0].cluster_size, 16384u);
  EXPECT_TRUE(info[0].extended_l2);
  EXPECT_EQ(info[0].backing_file, "base.qcow2");
  ASSERT_OK(img->Close());

  // The overlay reopens with its chain; the base kept the old contents.
  ASSERT_OK_AND_ASSIGN(auto reopened, Image::Open(top, OpenOptions{}));
  EXPECT_EQ(ReadAll(*reopened), model);
  ASSERT_OK_AND_ASSIGN(auto old, Image::Open(base, OpenOptions{}));
  std::vector<uint8_t> base_model(old->size(), 0);
  std::fill(base_model.begin() + 1000, base_model.begin() + 101000, 0x11);
  EXPECT_EQ(ReadAll(*old), base_model);

  if (testing::HaveQemu()) {
    EXPECT_EQ(testing::QemuCheck(top).exit_code, 0);
    EXPECT_EQ(testing::QemuCheck(base).exit_code, 0);
    ASSERT_OK_AND_ASSIGN(auto raw, testing::QemuReadAll(top));
    EXPECT_EQ(raw, model);
  }
}

TEST(OverlayTest, RefusedOnReadOnlyChainAndExistingFile) {
  testing::TempDir dir;
  const std::string base = dir.File("base.qcow2");
  CreateOptions co;
  co.size = 1 << 20;
  ASSERT_OK(CreateImage(base, co));
  ASSERT_OK_AND_ASSIGN(auto ro, Image::Open(base, OpenOptions{}));
  EXPECT_EQ(ro->CreateOverlay(dir.File("t.qcow2"), {}).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_OK(ro->Close());  // its image lock keeps writers out until then
  OpenOptions oo;
  oo.read_write = true;
  ASSERT_OK_AND_ASSIGN(auto rw, Image::Open(base, oo));
  EXPECT_EQ(rw->CreateOverlay(base, {}).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(rw->chain_length(), 1);
}

}  // namespace
}  // namespace qcow2
