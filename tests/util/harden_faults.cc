// SPDX-License-Identifier: Apache-2.0
#include "tests/util/harden_faults.h"

#include <errno.h>

#include "absl/strings/str_cat.h"
#include "lib/io/posix_file.h"

namespace qcow2::testing {
namespace {

// Counts (and may fail) reads; everything else goes straight to the
// FaultFile, whose own operations the disk hook counts.
class ReadCountingFile : public File {
 public:
  ReadCountingFile(std::unique_ptr<File> inner, FaultPlan* plan,
                   std::string path)
      : inner_(std::move(inner)), plan_(plan), path_(std::move(path)) {}

  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> buf) override {
    if (plan_->enabled && plan_->count_reads) {
      const uint64_t op = ++plan_->ops;
      if (plan_->record) plan_->log.push_back(absl::StrCat("read ", path_));
      if (op == plan_->fail_at) {
        plan_->fired = true;
        plan_->failed_kind = "read";
        plan_->failed_file = path_;
        return internal::ErrnoError(plan_->err, "read (injected fault) of",
                                    inner_->name());
      }
    }
    return inner_->ReadAt(offset, buf);
  }
  absl::Status WriteAt(uint64_t offset,
                       absl::Span<const uint8_t> data) override {
    return inner_->WriteAt(offset, data);
  }
  absl::Status WritevAt(uint64_t offset, absl::Span<const iovec> iov) override {
    return inner_->WritevAt(offset, iov);
  }
  absl::Status Flush() override { return inner_->Flush(); }
  absl::StatusOr<uint64_t> Size() override { return inner_->Size(); }
  absl::Status Truncate(uint64_t size) override {
    return inner_->Truncate(size);
  }
  absl::Status Allocate(uint64_t offset, uint64_t len) override {
    return inner_->Allocate(offset, len);
  }
  absl::Status WriteZeroes(uint64_t offset, uint64_t len) override {
    return inner_->WriteZeroes(offset, len);
  }
  absl::Status Discard(uint64_t offset, uint64_t len) override {
    return inner_->Discard(offset, len);
  }
  absl::StatusOr<bool> DataRun(uint64_t offset, uint64_t max_len,
                               uint64_t* len) override {
    return inner_->DataRun(offset, max_len, len);
  }
  const std::string& name() const override { return inner_->name(); }
  uint32_t alignment() const override { return inner_->alignment(); }

 private:
  std::unique_ptr<File> inner_;
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
