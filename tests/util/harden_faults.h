// SPDX-License-Identifier: Apache-2.0
// Error injection across every file of a chain, reads included.
//
// testing/fault_file.h counts the operations of one simulated disk (writes,
// flushes, truncates, discards; reads are not counted) and can fail one of
// them. InjectingFileSystem puts one counter over all the disks of a run
// (backing files and overlays created on the way included) and also counts
// reads, through a decorator, so that a sweep can say "fail the Nth
// operation of the workload, wherever it lands":
//
//   FaultPlan plan;
//   plan.fail_at = 17;          // the 17th counted operation fails...
//   plan.err = ENOSPC;          // ...with this errno
//   InjectingFileSystem fs(&plan);
//   fs.AddFile("/t/base.qcow2", base_bytes);
//   OpenOptions o; o.opener = &fs; o.read_write = true;
//   auto img = Image::Open("/t/top.qcow2", o);
//   ...
//   if (plan.fired) ... plan.failed_kind, plan.failed_file ...
//
// Not thread-safe (the workloads are single-threaded).
#ifndef QCOW2_TESTS_UTIL_HARDEN_FAULTS_H_
#define QCOW2_TESTS_UTIL_HARDEN_FAULTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "testing/fault_file.h"
#include "qcow2/file.h"

namespace qcow2::testing {

struct FaultPlan {
  // Which operations are counted: the FaultDisk ones ("write", "flush",
  // "truncate", "discard") and/or reads ("read").
  bool count_mutations = true;
  bool count_reads = false;
  // Counting stops while false (the test's own verification reads).
  bool enabled = true;
  // The counted operation that fails (1-based); 0: none.
  uint64_t fail_at = 0;
  int err = 0;  // EIO or ENOSPC

  // Filled in as the run goes.
  uint64_t ops = 0;
  bool fired = false;
  std::string failed_kind;  // "write", "flush", "read", ...
  std::string failed_file;  // path of the file whose operation failed
  // With `record`, one "kind path" line per counted operation.
  bool record = false;
  std::vector<std::string> log;
};

class InjectingFileSystem : public FileOpener {
 public:
  explicit InjectingFileSystem(FaultPlan* plan) : plan_(plan) {}

  // Registers a file whose durable contents are `bytes`.
  void AddFile(const std::string& path, const std::vector<uint8_t>& bytes);

  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const FileOptions& opts) override;

  // Every file (registered or created), with its durable bytes: what a
  // power cut right now would leave.
  std::map<std::string, std::vector<uint8_t>> DurableFiles();

  std::shared_ptr<internal::FaultDisk> Disk(const std::string& path) {
    return fs_.Disk(path);
  }

 private:
  void Hook(const std::string& path);

  FaultPlan* plan_;
  internal::FaultFileSystem fs_;
  std::map<std::string, bool> hooked_;
};

}  // namespace qcow2::testing

#endif  // QCOW2_TESTS_UTIL_HARDEN_FAULTS_H_
