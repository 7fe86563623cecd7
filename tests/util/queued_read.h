// SPDX-License-Identifier: Apache-2.0
// Reads a whole disk through an io_uring Queue of its own: the queued
// path's answer, for tests that compare it with the synchronous one and
// with QEMU's.
#ifndef QCOW2_TESTS_UTIL_QUEUED_READ_H_
#define QCOW2_TESTS_UTIL_QUEUED_READ_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"

namespace qcow2::testing {

// Bytes [0, size) of `img`, read as `chunk`-sized requests, eight in
// flight. Bytes a failed request should have filled stay 0xEE (and the
// failure is a test failure).
inline std::vector<uint8_t> ReadAllQueued(Image* img, uint64_t size,
                                          uint64_t chunk) {
  std::vector<uint8_t> got(size, 0xEE);
  QueueOptions qo;
  qo.depth = 8;
  auto q = img->CreateQueue(qo);
  EXPECT_TRUE(q.ok()) << q.status();
  if (!q.ok()) return got;
  int failed = 0;
  for (uint64_t off = 0; off < size; off += chunk) {
    while ((*q)->in_flight() >= 8) (*q)->Poll(1);
    const uint64_t n = std::min(chunk, size - off);
    absl::Status s = (*q)->SubmitRead(
        off, absl::MakeSpan(got.data() + off, n),
        [&failed](absl::Status st) { failed += !st.ok(); });
    EXPECT_TRUE(s.ok()) << s;
  }
  while ((*q)->in_flight() > 0) (*q)->Poll(1);
  EXPECT_EQ(failed, 0);
  return got;
}

}  // namespace qcow2::testing

#endif  // QCOW2_TESTS_UTIL_QUEUED_READ_H_
