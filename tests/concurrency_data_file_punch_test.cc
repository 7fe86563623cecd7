// SPDX-License-Identifier: Apache-2.0
// A discard in an image whose data file is not raw punches the freed
// clusters out of the data file. QEMU puts a data cluster at its guest
// offset, so a write to the same guest cluster reuses the very range being
// punched: while the punch is held, a write to that cluster from another
// thread must wait for it, and its data must survive. (Without the wait,
// the punch would land after the write and the cluster would read zeros.)
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "qcow2/options.h"
#include "testing/gate_file.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::GateFile;
using testing::GateOpener;
using testing::TempDir;

constexpr uint64_t kCluster = 65536;

std::vector<uint8_t> Fill(uint8_t b) { return std::vector<uint8_t>(kCluster, b); }

TEST(DataFilePunch, WriteToAClusterBeingPunchedWaitsAndSurvives) {
  TempDir dir;
  const std::string path = dir.File("img.qcow2");
  const std::string data = dir.File("img.data");
  CreateOptions co;
  co.size = 1 << 20;
  co.data_file = data;
  ASSERT_OK(CreateImage(path, co));
  OpenOptions oo;
  oo.read_write = true;
  oo.data_file = data;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image, Image::Open(path, oo));
    ASSERT_OK(image->Write(0, Fill(0x11)));
    ASSERT_OK(image->Write(kCluster, Fill(0x22)));
    ASSERT_OK(image->Close());
  }
  GateOpener opener({.discard = true});
  oo.opener = &opener;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Image> image, Image::Open(path, oo));
  GateFile* gate = opener.last();  // the data file, opened after the image
  ASSERT_EQ(gate->name(), data);
  gate->Arm();
  std::thread discarder([&] { EXPECT_OK(image->Discard(0, kCluster)); });
  ASSERT_TRUE(gate->WaitBlocked()) << "the discard never punched";
  // The write is issued while the punch is held; it must not finish
  // before it (it would be punched away). A short pause lets it reach
  // the engine first; the outcome below does not depend on it.
  auto writer = std::async(std::launch::async, [&] {
    return image->Write(0, Fill(0x33));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  gate->Release();
  discarder.join();
  ASSERT_OK(writer.get());
  std::vector<uint8_t> got(2 * kCluster);
  ASSERT_OK(image->Read(0, absl::MakeSpan(got)));
  EXPECT_TRUE(std::vector<uint8_t>(got.begin(), got.begin() + kCluster) ==
              Fill(0x33));
  EXPECT_TRUE(std::vector<uint8_t>(got.begin() + kCluster, got.end()) ==
              Fill(0x22));
  ASSERT_OK(image->Close());
  // And on disk, as opened afresh.
  image.reset();
  oo.opener = nullptr;
  ASSERT_OK_AND_ASSIGN(image, Image::Open(path, oo));
  ASSERT_OK(image->Read(0, absl::MakeSpan(got)));
  EXPECT_TRUE(std::vector<uint8_t>(got.begin(), got.begin() + kCluster) ==
              Fill(0x33));
}

}  // namespace
}  // namespace qcow2
