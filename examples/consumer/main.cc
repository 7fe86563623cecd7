// SPDX-License-Identifier: Apache-2.0
// A minimal program using an installed libqcow2 (scripts/package_test.sh
// builds it against the CMake package and against pkg-config): creates a
// qcow2 image, writes 4 KiB, reads them back, prints the library version.
//
//   consumer IMAGE_PATH
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "qcow2/file.h"
#include "qcow2/image.h"
#include "qcow2/version.h"

namespace {

int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s IMAGE_PATH\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];

  qcow2::CreateOptions create;
  create.size = 64 << 20;
  if (absl::Status s = qcow2::CreateImage(path, create); !s.ok()) {
    return Fail("CreateImage", s);
  }

  qcow2::OpenOptions open;
  open.read_write = true;
  auto image = qcow2::Image::Open(path, open);
  if (!image.ok()) return Fail("Image::Open", image.status());

  std::vector<uint8_t> data(4096), back(4096);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 7 + 3);
  const uint64_t offset = 1 << 20;
  if (absl::Status s = (*image)->Write(offset, data); !s.ok()) {
    return Fail("Write", s);
  }
  if (absl::Status s = (*image)->Flush(); !s.ok()) return Fail("Flush", s);
  if (absl::Status s = (*image)->Read(offset, absl::MakeSpan(back));
      !s.ok()) {
    return Fail("Read", s);
  }
  if (std::memcmp(data.data(), back.data(), data.size()) != 0) {
    std::fprintf(stderr, "consumer: read back differs from what was written\n");
    return 1;
  }
  const uint64_t size = (*image)->size();
  if (absl::Status s = (*image)->Close(); !s.ok()) return Fail("Close", s);

  if (std::strcmp(qcow2::VersionString(), QCOW2_VERSION_STRING) != 0) {
    std::fprintf(stderr, "consumer: library %s, headers %s\n",
                 qcow2::VersionString(), QCOW2_VERSION_STRING);
    return 1;
  }
  std::printf("libqcow2 %s: wrote and read back 4 KiB of %s (%llu MiB)\n",
              qcow2::VersionString(), path.c_str(),
              static_cast<unsigned long long>(size >> 20));
  return 0;
}
