// SPDX-License-Identifier: Apache-2.0
// A File for crash and error tests: writes land in a volatile layer until
// Flush() makes them durable; PowerCut() throws the volatile layer away
// (all of it, a random subset, or all but the newest write, as a disk
// cache might). Operations can be
// made to fail from the Nth one on ("the machine died") or just once (EIO,
// ENOSPC), to test that every step leaves a consistent image.
#ifndef QCOW2_TESTING_FAULT_FILE_H_
#define QCOW2_TESTING_FAULT_FILE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "qcow2/file.h"

namespace qcow2::internal {

// State shared by every FaultFile over the same simulated disk.
struct FaultDisk {
  std::mutex mu;
  std::vector<uint8_t> durable;
  // Writes since the last flush, in order: (offset, bytes). Truncates are
  // recorded as writes of size changes (kept simple: truncate is durable).
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> pending;
  std::vector<uint8_t> current;  // what reads see: durable + pending

  // Fault plan. Operations (reads excluded) are counted from 1.
  uint64_t ops = 0;
  uint64_t die_at = 0;        // from this op on, everything fails with EIO
  uint64_t fail_once_at = 0;  // only this op fails
  int fail_once_errno = 0;    // EIO or ENOSPC
  bool dead = false;
  // Called with the op number before each counted operation.
  std::function<void(uint64_t op, const char* kind)> on_op;

  // A fresh disk holding `bytes`, durable, with no fault planned but
  // death at op `die_at` (0: never) and the op count at 0.
  void Reset(const std::vector<uint8_t>& bytes, uint64_t die_at = 0);

  // Drops volatile writes. With a generator, each pending write survives
  // with probability 1/2 instead (a reordering disk cache).
  void PowerCut(std::mt19937* rng = nullptr);
  // Drops every volatile write but the newest (a cache that wrote its
  // last write first): whatever had to be durable before that write and
  // was not flushed is lost. Returns how many writes were pending.
  size_t PowerCutKeepingNewest();

 private:
  // Under mu: makes a pending write durable; ends the cut.
  void Land(uint64_t offset, const std::vector<uint8_t>& bytes);
  void Restart();
};

class FaultFile : public File {
 public:
  FaultFile(std::string name, std::shared_ptr<FaultDisk> disk, bool read_only);

  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) override;
  absl::Status WriteAt(uint64_t offset,
                       absl::Span<const uint8_t> data) override;
  absl::Status Flush() override;
  absl::StatusOr<uint64_t> Size() override;
  absl::Status Truncate(uint64_t size) override;
  // Punching a hole: modelled as zeros that are durable at once (the worst
  // case for anyone who still points at the bytes).
  absl::Status Discard(uint64_t offset, uint64_t len) override;
  const std::string& name() const override { return name_; }

 private:
  absl::Status Op(const char* kind);

  const std::string name_;
  const std::shared_ptr<FaultDisk> disk_;
  const bool read_only_;
};

// A FileOpener over named FaultDisks (files not registered open as
// ordinary in-memory disks without faults).
class FaultFileSystem : public FileOpener {
 public:
  std::shared_ptr<FaultDisk> Disk(const std::string& path);
  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const FileOptions& opts) override;

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<FaultDisk>> disks_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_TESTING_FAULT_FILE_H_
