// SPDX-License-Identifier: Apache-2.0
// What the CLI tests of LUKS-encrypted images share: a small encrypted
// image with fixed low PBKDF2 counts (cheap to open), and stopping a
// server that --fork left running.
#ifndef QCOW2_TESTS_UTIL_LUKS_CLI_H_
#define QCOW2_TESTS_UTIL_LUKS_CLI_H_

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "qcow2/options.h"

namespace qcow2::testing {

// A 4 MiB encrypted image with `secret` (over `backing` when not empty)
// whose first cluster holds 0x5a.
inline void MakeEncrypted(const std::string& path, const std::string& secret,
                          const std::string& backing = "") {
  CreateOptions o;
  o.size = 4 << 20;
  o.encrypt.format = "luks";
  o.encrypt.key_secret = secret;
  o.encrypt.iterations = 1000;
  o.backing_file = backing;
  if (!backing.empty()) o.backing_format = "qcow2";
  ASSERT_TRUE(CreateImage(path, o).ok());
  OpenOptions oo;
  oo.read_write = true;
  oo.key_secret = secret;
  oo.open_backing = false;
  auto img = Image::Open(path, oo);
  ASSERT_TRUE(img.ok()) << img.status();
  ASSERT_TRUE((*img)->Write(0, std::vector<uint8_t>(65536, 0x5a)).ok());
  ASSERT_TRUE((*img)->Close().ok());
}

// Sends SIGTERM to `pid` and waits until it is gone, or a zombie nobody
// reaps (its parent exited at --fork): the image's locks go with it.
inline void StopServer(pid_t pid) {
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  for (int i = 0; i < 500; ++i) {
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string pid_field, comm, state;
    if (!(stat >> pid_field >> comm >> state) || state == "Z") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace qcow2::testing

#endif  // QCOW2_TESTS_UTIL_LUKS_CLI_H_
