// SPDX-License-Identifier: Apache-2.0
// SHA-256 (FIPS 180-4) for the hardening tests: proves that opening,
// reading or checking a malformed image leaves its bytes alone.
//
//   std::string before = Sha256Hex(bytes);
//   auto digests = HashFiles({"a.qcow2", "b.qcow2"});  // path -> hex digest
#ifndef QCOW2_TESTS_UTIL_HARDEN_SHA256_H_
#define QCOW2_TESTS_UTIL_HARDEN_SHA256_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace qcow2::testing {

// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  void Update(absl::Span<const uint8_t> data);
  // The digest of everything passed to Update. The object is spent after.
  std::array<uint8_t, 32> Finish();

 private:
  void Block(const uint8_t* p);

  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

// Lower-case hex digest of `data`.
std::string Sha256Hex(absl::Span<const uint8_t> data);

// Digest of every file in `paths` (read whole). Errors name the file.
absl::StatusOr<std::map<std::string, std::string>> HashFiles(
    const std::vector<std::string>& paths);

}  // namespace qcow2::testing

#endif  // QCOW2_TESTS_UTIL_HARDEN_SHA256_H_
