// SPDX-License-Identifier: Apache-2.0
// AmendImage: opens the file read-write with QEMU's image locks and hands
// it to amend's surgery (lib/ops/amend.h). A new size is set by an
// Image opened over the same (already locked) file, so that growing and
// shrinking go through Image::Resize.
#include <memory>

#include "absl/strings/str_cat.h"
#include "lib/base/endian.h"
#include "lib/base/status_macros.h"
#include "lib/chain/chain.h"
#include "lib/ops/amend.h"
#include "lib/format/header.h"
#include "lib/io/forwarding_file.h"
#include "qcow2/amend.h"
#include "qcow2/image.h"

namespace qcow2 {
namespace {

// Resizes through an Image over `file`, which the caller keeps (and
// keeps locked).
absl::Status ResizeThrough(File* file, uint64_t new_size,
                           const AmendOptions& opts) {
  OpenOptions oo;
  oo.key_secret = opts.key_secret;
  oo.opener = opts.opener;  // for a data file
  oo.read_write = true;
  oo.format = "qcow2";
  oo.open_backing = false;  // the size needs no backing data
  oo.lock = false;          // the caller's file holds the lock
  ASSIGN_OR_RETURN(
      std::unique_ptr<Image> image,
      Image::Open(std::make_unique<internal::ForwardingFile>(file), oo));
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
      f, opts,
      [f, &opts](uint64_t size) { return ResizeThrough(f, size, opts); },
      [&path, &opts](const std::string& stored) -> absl::Status {
        OpenOptions oo;
        oo.read_write = true;
        oo.opener = opts.opener;
        // Opened and closed again: a resize opens it on its own.
        return internal::OpenDataFile(path, stored, oo).status();
      });
}

}  // namespace qcow2
