// SPDX-License-Identifier: Apache-2.0
// The public Image: a thin facade over internal::Engine.
#include "qcow2/image.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/chain/chain.h"
#include "lib/engine/engine.h"
#include "lib/engine/runner.h"

namespace qcow2 {

namespace {

using internal::Request;

absl::Status Run(internal::Engine* engine, Request::Kind kind,
                 uint64_t offset, uint64_t len) {
  Request r;
  r.kind = kind;
  r.offset = offset;
  r.len = len;
  return internal::RunSync(engine, &r);
}

}  // namespace

Image::Image(std::unique_ptr<internal::Engine> engine)
    : engine_(std::move(engine)) {}

Image::~Image() {
  if (engine_) engine_->Close().IgnoreError();
}

absl::StatusOr<std::unique_ptr<Image>> Image::Open(const std::string& path,
                                                   const OpenOptions& opts) {
  if (opts.force_share && opts.read_write) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": force_share can only be used with read-only images"));
  }
  FileOpener* opener = opts.opener ? opts.opener : DefaultFileOpener();
  ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                   opener->Open(path, internal::TopFileOptions(opts)));
  return Open(std::move(file), opts);
}

absl::StatusOr<std::unique_ptr<Image>> Image::Open(std::unique_ptr<File> top,
                                                   const OpenOptions& opts) {
  if (opts.metadata_only && opts.read_write) {
    return absl::InvalidArgumentError(absl::StrCat(
        top->name(), ": metadata_only can only be used with read-only images"));
  }
  ASSIGN_OR_RETURN(auto engine, internal::Engine::Open(std::move(top), opts));
  return std::unique_ptr<Image>(new Image(std::move(engine)));
}

uint64_t Image::size() const { return engine_->size(); }
int Image::chain_length() const { return engine_->length(); }
bool Image::writable() const { return engine_->writable(); }

absl::Status Image::Read(uint64_t offset, absl::Span<uint8_t> buf) {
  Request r;
  r.kind = Request::Kind::kRead;
  r.offset = offset;
  r.len = buf.size();
  r.rbuf = buf.data();
  return internal::RunSync(engine_.get(), &r);
}

absl::Status Image::Write(uint64_t offset, absl::Span<const uint8_t> data) {
  Request r;
  r.kind = Request::Kind::kWrite;
  r.offset = offset;
  r.len = data.size();
  r.wbuf = data.data();
  return internal::RunSync(engine_.get(), &r);
}

absl::Status Image::WriteCompressed(uint64_t offset,
                                    absl::Span<const uint8_t> data) {
  Request r;
  r.kind = Request::Kind::kWrite;
  r.offset = offset;
  r.len = data.size();
  r.wbuf = data.data();
  r.compressed = true;
  RETURN_IF_ERROR(engine_->PrepareCompressed(&r));
  return internal::RunSync(engine_.get(), &r);
}

absl::Status Image::WriteZeroes(uint64_t offset, uint64_t len, bool unmap) {
  Request r;
  r.kind = Request::Kind::kWriteZeroes;
  r.offset = offset;
  r.len = len;
  r.unmap = unmap;
  return internal::RunSync(engine_.get(), &r);
}

absl::Status Image::Discard(uint64_t offset, uint64_t len) {
  return Run(engine_.get(), Request::Kind::kDiscard, offset, len);
}

absl::Status Image::Flush() {
  return Run(engine_.get(), Request::Kind::kFlush, 0, 0);
}

absl::Status Image::Resize(uint64_t new_size) {
  return engine_->Resize(new_size);
}
absl::Status Image::Resize(uint64_t new_size, Preallocation prealloc) {
  return engine_->ResizePreallocated(new_size, prealloc);
}
absl::Status Image::Close() { return engine_->Close(); }

absl::StatusOr<BlockStatus> Image::GetBlockStatus(uint64_t offset,
                                                  uint64_t max_len) {
  return engine_->GetBlockStatus(offset, max_len);
}

absl::Status Image::CreateOverlay(const std::string& path,
                                  const CreateOptions& opts) {
  return engine_->CreateOverlay(path, opts, &CreateImage);
}

absl::Status Image::ChangeBackingFile(const std::string& name,
                                      const std::string& format) {
  return engine_->ChangeBackingFile(name, format);
}

std::vector<LayerInfo> Image::GetChainInfo() const {
  return engine_->GetChainInfo();
}

absl::StatusOr<std::vector<SnapshotInfo>> Image::ListSnapshots() const {
  ASSIGN_OR_RETURN(std::vector<internal::SnapshotEntry> entries,
                   engine_->ListSnapshots());
  std::vector<SnapshotInfo> out;
  for (const internal::SnapshotEntry& e : entries) {
    out.push_back(internal::ToSnapshotInfo(e));
  }
  return out;
}

absl::StatusOr<SnapshotInfo> Image::CreateSnapshot(const std::string& name,
                                                   const std::string& id) {
  // The date as qemu-img takes it: the real time to the microsecond.
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const int64_t usec =
      std::chrono::duration_cast<std::chrono::microseconds>(now).count();
  internal::NewSnapshot sn;
  sn.name = name;
  sn.id = id;
  sn.date_sec = static_cast<uint32_t>(usec / 1000000);
  sn.date_nsec = static_cast<uint32_t>(usec % 1000000 * 1000);
  ASSIGN_OR_RETURN(internal::SnapshotEntry e, engine_->CreateSnapshot(sn));
  return internal::ToSnapshotInfo(e);
}

absl::Status Image::ApplySnapshot(const std::string& name_or_id) {
  return engine_->ApplySnapshot(name_or_id);
}

absl::Status Image::DeleteSnapshot(const std::string& name_or_id) {
  return engine_->DeleteSnapshot(name_or_id);
}

}  // namespace qcow2
