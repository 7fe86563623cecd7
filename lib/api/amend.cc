// SPDX-License-Identifier: Apache-2.0
// AmendImage: opens the file read-write with QEMU's image locks and hands
// it to the driver's amend (lib/driver/amend.h). A new size is set by an
// Image opened over the same (already locked) file, so that growing and
// shrinking go through Image::Resize.
#include <memory>

#include "absl/strings/str_cat.h"
#include "lib/base/endian.h"
#include "lib/base/status_macros.h"
#include "lib/driver/amend.h"
#include "lib/format/header.h"
#include "qcow2/amend.h"
#include "qcow2/image.h"

namespace qcow2 {
namespace {

// Every call to a File the caller keeps (and keeps locked).
class BorrowedFile : public File {
 public:
  explicit BorrowedFile(File* f) : f_(f) {}
  absl::Status ReadAt(uint64_t o, absl::Span<uint8_t> b) override {
    return f_->ReadAt(o, b);
  }
  absl::Status WriteAt(uint64_t o, absl::Span<const uint8_t> d) override {
    return f_->WriteAt(o, d);
  }
  absl::Status ReadvAt(uint64_t o, absl::Span<const iovec> v) override {
    return f_->ReadvAt(o, v);
  }
  absl::Status WritevAt(uint64_t o, absl::Span<const iovec> v) override {
    return f_->WritevAt(o, v);
  }
  absl::Status Flush() override { return f_->Flush(); }
  absl::StatusOr<uint64_t> Size() override { return f_->Size(); }
  absl::Status Truncate(uint64_t s) override { return f_->Truncate(s); }
  absl::Status Extend(uint64_t a, uint64_t b) override {
    return f_->Extend(a, b);
  }
  absl::Status Allocate(uint64_t o, uint64_t n) override {
    return f_->Allocate(o, n);
  }
  absl::Status WriteZeroes(uint64_t o, uint64_t n) override {
    return f_->WriteZeroes(o, n);
  }
  absl::Status Discard(uint64_t o, uint64_t n) override {
    return f_->Discard(o, n);
  }
  absl::StatusOr<bool> DataRun(uint64_t o, uint64_t m, uint64_t* n) override {
    return f_->DataRun(o, m, n);
  }
  const std::string& name() const override { return f_->name(); }
  uint32_t alignment() const override { return f_->alignment(); }

 private:
  File* const f_;
};

absl::Status ResizeThrough(File* file, uint64_t new_size) {
  OpenOptions oo;
  oo.read_write = true;
  oo.format = "qcow2";
  oo.open_backing = false;  // the size needs no backing data
  oo.lock = false;          // the caller's file holds the lock
  ASSIGN_OR_RETURN(std::unique_ptr<Image> image,
                   Image::Open(std::make_unique<BorrowedFile>(file), oo));
  RETURN_IF_ERROR(image->Resize(new_size));
  return image->Close();
}

}  // namespace

absl::Status AmendImage(const std::string& path, const AmendOptions& opts) {
  FileOpener* opener = opts.opener ? opts.opener : DefaultFileOpener();
  FileOptions fo;
  fo.read_only = false;
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, opener->Open(path, fo));
  uint8_t magic[4] = {};
  RETURN_IF_ERROR(file->ReadAt(0, absl::MakeSpan(magic)));
  if (internal::LoadBE32(magic) != internal::kQcowMagic) {
    return absl::UnimplementedError(
        "Format driver 'raw' does not support option amendment");
  }
  File* f = file.get();
  return internal::AmendQcow2(
      f, opts, [f](uint64_t size) { return ResizeThrough(f, size); });
}

}  // namespace qcow2
