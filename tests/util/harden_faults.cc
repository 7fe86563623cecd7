// SPDX-License-Identifier: Apache-2.0
#include "tests/util/harden_faults.h"

#include <errno.h>

#include "absl/strings/str_cat.h"
#include "lib/io/posix_file.h"
#include "testing/forwarding_file.h"

namespace qcow2::testing {
namespace {

// Counts (and may fail) reads; everything else goes straight to the
// FaultFile, whose own operations the disk hook counts.
class ReadCountingFile : public ForwardingFile {
 public:
  ReadCountingFile(std::unique_ptr<File> inner, FaultPlan* plan,
                   std::string path)
      : ForwardingFile(std::move(inner)), plan_(plan), path_(std::move(path)) {}

  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) override {
    if (plan_->enabled && plan_->count_reads) {
      const uint64_t op = ++plan_->ops;
      if (plan_->record) plan_->log.push_back(absl::StrCat("read ", path_));
      if (op == plan_->fail_at) {
        plan_->fired = true;
        plan_->failed_kind = "read";
        plan_->failed_file = path_;
        return internal::ErrnoError(plan_->err, "read (injected fault) of",
                                    name());
      }
    }
    return ForwardingFile::ReadAt(offset, buf);
  }
  // Vectored reads segment by segment through ReadAt, so each is counted;
  // growth by File's defaults (Extend truncates, no Reserve), as the
  // FaultFile beneath expects.
  absl::Status ReadvAt(uint64_t offset, absl::Span<const iovec> iov) override {
    return File::ReadvAt(offset, iov);
  }
  absl::Status Extend(uint64_t old_size, uint64_t new_size) override {
    return File::Extend(old_size, new_size);
  }
  absl::Status Reserve(uint64_t offset, uint64_t len) override {
    return File::Reserve(offset, len);
  }

 private:
  FaultPlan* plan_;
  std::string path_;
};

}  // namespace

void InjectingFileSystem::AddFile(const std::string& path,
                                  const std::vector<uint8_t>& bytes) {
  std::shared_ptr<internal::FaultDisk> d = fs_.Disk(path);
  {
    std::lock_guard<std::mutex> lock(d->mu);
    d->durable = bytes;
    d->current = bytes;
    d->pending.clear();
  }
  Hook(path);
}

void InjectingFileSystem::Hook(const std::string& path) {
  if (hooked_[path]) return;
  hooked_[path] = true;
  std::shared_ptr<internal::FaultDisk> d = fs_.Disk(path);
  internal::FaultDisk* raw = d.get();
  FaultPlan* plan = plan_;
  // Runs with the disk's lock held, before the disk decides whether the
  // operation fails: arming fail_once_at here fails exactly this one.
  d->on_op = [plan, raw, path](uint64_t op, const char* kind) {
    if (!plan->enabled || !plan->count_mutations) return;
    const uint64_t n = ++plan->ops;
    if (plan->record) plan->log.push_back(absl::StrCat(kind, " ", path));
    if (n == plan->fail_at) {
      raw->fail_once_at = op;
      raw->fail_once_errno = plan->err;
      plan->fired = true;
      plan->failed_kind = kind;
      plan->failed_file = path;
    }
  };
}

absl::StatusOr<std::unique_ptr<File>> InjectingFileSystem::Open(
    const std::string& path, const FileOptions& opts) {
  absl::StatusOr<std::unique_ptr<File>> f = fs_.Open(path, opts);
  if (!f.ok()) return f.status();
  Hook(path);
  return std::unique_ptr<File>(
      new ReadCountingFile(std::move(f).value(), plan_, path));
}

std::map<std::string, std::vector<uint8_t>>
InjectingFileSystem::DurableFiles() {
  std::map<std::string, std::vector<uint8_t>> out;
  for (const auto& [path, unused] : hooked_) {
    std::shared_ptr<internal::FaultDisk> d = fs_.Disk(path);
    std::lock_guard<std::mutex> lock(d->mu);
    out[path] = d->durable;
  }
  return out;
}

}  // namespace qcow2::testing
