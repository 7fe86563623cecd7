// SPDX-License-Identifier: Apache-2.0
#include "lib/io/data_cipher.h"

#include <atomic>
#include <cstring>
#include <vector>

namespace qcow2::internal {

namespace {
std::atomic<int> attached{0};
constexpr size_t kSector = 512;
}  // namespace

void NoteCipherAttached(int delta) {
  attached.fetch_add(delta, std::memory_order_relaxed);
}

bool AnyCipherAttached() {
  return attached.load(std::memory_order_relaxed) != 0;
}

absl::Status DecryptIov(const DataCipher& c, uint64_t host_offset,
                        absl::Span<const iovec> iov) {
  bool whole = true;
  size_t total = 0;
  for (const iovec& v : iov) {
    whole = whole && v.iov_len % kSector == 0;
    total += v.iov_len;
  }
  if (whole) {
    for (const iovec& v : iov) {
      absl::Status s = c.Decrypt(
          host_offset,
          absl::MakeSpan(static_cast<uint8_t*>(v.iov_base), v.iov_len));
      if (!s.ok()) return s;
      host_offset += v.iov_len;
    }
    return absl::OkStatus();
  }
  // A sector split across iovecs (a vectored read's segments): through a
  // copy, wiped once scattered back (it holds plaintext).
  std::vector<uint8_t> buf(total);
  size_t at = 0;
  for (const iovec& v : iov) {
    std::memcpy(buf.data() + at, v.iov_base, v.iov_len);
    at += v.iov_len;
  }
  absl::Status s = c.Decrypt(host_offset, absl::MakeSpan(buf));
  if (s.ok()) {
    at = 0;
    for (const iovec& v : iov) {
      std::memcpy(v.iov_base, buf.data() + at, v.iov_len);
      at += v.iov_len;
    }
  }
  explicit_bzero(buf.data(), buf.size());
  return s;
}

}  // namespace qcow2::internal
