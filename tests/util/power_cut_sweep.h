// SPDX-License-Identifier: Apache-2.0
// The power-cut sweep the crash tests share: for every cut point over an
// operation's file operations (each one near both ends, about `points` in
// between) and each way a cut drops the volatile writes of simulated disks
// (testing/fault_file.h: all, a random half, all but the newest), runs the
// operation dying at that point, cuts the power, and checks what is left.
#ifndef QCOW2_TESTS_UTIL_POWER_CUT_SWEEP_H_
#define QCOW2_TESTS_UTIL_POWER_CUT_SWEEP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "testing/fault_file.h"

namespace qcow2::testing {

struct SweepOptions {
  uint64_t dense_ends = 10;  // cut at each of the first and last N ops
  uint64_t points = 60;      // about this many cuts in between
  uint32_t seed = 7;         // for the "random half kept" cuts
};

// `run(cut)` runs the operation on fresh disks, the machine dying at its
// operation `cut`; it must fail (a non-fatal failure if it does not).
// `check(where, with_qemu)` looks at the disks after the cut; with_qemu is
// set for "all dropped" cuts and every fourth cut point (qemu-img is
// slow). Stops at the first fatal failure. Returns the cuts checked.
int SweepPowerCuts(
    const std::string& name, uint64_t total,
    const std::vector<std::shared_ptr<internal::FaultDisk>>& disks,
    const std::function<absl::Status(uint64_t cut)>& run,
    const std::function<void(const std::string& where, bool with_qemu)>& check,
    const SweepOptions& opts = {});

// The sweeps that cut at every file operation (snapshots, amend,
// compressed writes): whether the cut at `cut` of `total` also tries the
// "random half kept" and "only the newest write kept" power cuts, beside
// "all dropped". Always with QCOW2_LONG_TESTS, and within 10 operations of
// either end; elsewhere at every other cut, to keep the default suite
// short.
bool CutAllVariants(uint64_t cut, uint64_t total);

// After a cut: the top, read afresh through libqcow2 (`ours`) and, with
// `with_qemu`, through qemu-img from `real_top` (the disk exported to a
// real file), reads `model`. Fatal failures name `where`.
void ExpectTopReads(const std::string& where,
                    const absl::StatusOr<std::vector<uint8_t>>& ours,
                    const std::string& real_top, bool with_qemu,
                    const std::vector<uint8_t>& model);

}  // namespace qcow2::testing

#endif  // QCOW2_TESTS_UTIL_POWER_CUT_SWEEP_H_
