// SPDX-License-Identifier: Apache-2.0
#include "tests/util/power_cut_sweep.h"

#include <cstdlib>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/util/test_util.h"

namespace qcow2::testing {

int SweepPowerCuts(
    const std::string& name, uint64_t total,
    const std::vector<std::shared_ptr<internal::FaultDisk>>& disks,
    const std::function<absl::Status(uint64_t cut)>& run,
    const std::function<void(const std::string& where, bool with_qemu)>& check,
    const SweepOptions& opts) {
  std::mt19937 rng(opts.seed);
  const uint64_t stride =
      total > 2 * opts.points ? total / opts.points : 1;
  int cuts = 0;
  for (uint64_t cut = 1; cut <= total; ++cut) {
    if (cut % stride != 0 && cut > opts.dense_ends &&
        cut + opts.dense_ends < total) {
      continue;
    }
    static const char* const kVariants[] = {
        "all dropped", "random half kept", "only the newest write kept"};
    for (int variant = 0; variant < 3; ++variant) {
      const std::string where = absl::StrCat(name, " cut at op ", cut, " of ",
                                             total, ", ", kVariants[variant]);
      absl::Status s = run(cut);
      EXPECT_FALSE(s.ok()) << where << ": the operation did not notice";
      size_t pending = 0;
      for (auto& d : disks) {
        if (variant < 2) {
          d->PowerCut(variant ? &rng : nullptr);
        } else {
          pending += d->PowerCutKeepingNewest();
        }
      }
      if (variant == 2 && pending < 2) continue;
      ++cuts;
      check(where, variant == 0 || cut % 4 == 0);
      if (::testing::Test::HasFatalFailure()) return cuts;
    }
  }
  return cuts;
}

bool CutAllVariants(uint64_t cut, uint64_t total) {
  static const bool long_run = getenv("QCOW2_LONG_TESTS") != nullptr;
  constexpr uint64_t kDenseEnds = 10;
  return long_run || cut <= kDenseEnds || cut + kDenseEnds > total ||
         cut % 2 == 0;
}

void ExpectTopReads(const std::string& where,
                    const absl::StatusOr<std::vector<uint8_t>>& ours,
                    const std::string& real_top, bool with_qemu,
                    const std::vector<uint8_t>& model) {
  ASSERT_TRUE(ours.ok()) << where << ": " << ours.status();
  ASSERT_TRUE(*ours == model) << where << ": the top reads other contents";
  if (!with_qemu) return;
  absl::StatusOr<std::vector<uint8_t>> q = QemuReadAll(real_top);
  ASSERT_TRUE(q.ok()) << where << ": " << q.status();
  ASSERT_TRUE(*q == model) << where << ": qemu-img reads other contents";
}

}  // namespace qcow2::testing
