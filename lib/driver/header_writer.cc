// SPDX-License-Identifier: Apache-2.0
#include "lib/driver/header_writer.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/endian.h"
#include "lib/base/events.h"
#include "lib/base/io_context.h"
#include "lib/base/status_macros.h"

namespace qcow2::internal {

absl::Status HeaderWriter::WriteHeaderFields() {
  const Header& h = s_->header;
  ASSIGN_OR_RETURN(std::vector<uint8_t> enc, EncodeHeader(h));
  EmitEvent("header-update");
  size_t n = h.version >= 3 ? h.header_length : kV2HeaderLength;
  CountMetadata(&IoStats::header_write_bytes, n);
  CountMetadata(&IoStats::host_flushes, 1);
  RETURN_IF_ERROR(s_->meta->WriteAt(0, absl::MakeConstSpan(enc.data(), n)));
  return s_->meta->Flush();
}

absl::Status HeaderWriter::WriteWholeHeader() {
  ASSIGN_OR_RETURN(std::vector<uint8_t> enc, EncodeHeader(s_->header));
  // The whole cluster, as QEMU writes it: no bytes of a longer old
  // extension area or backing name stay behind the new one.
  enc.resize(s_->header.cluster_size(), 0);
  EmitEvent("header-update");
  CountMetadata(&IoStats::header_write_bytes, enc.size());
  CountMetadata(&IoStats::host_flushes, 1);
  RETURN_IF_ERROR(s_->meta->WriteAt(0, enc));
  return s_->meta->Flush();
}

absl::Status HeaderWriter::ChangeBackingFile(const std::string& name,
                                             const std::string& format) {
  const std::string& file = s_->file->name();
  if (s_->closed) {
    return absl::FailedPreconditionError(absl::StrCat(file, ": image is closed"));
  }
  if (!s_->writable) {
    return absl::FailedPreconditionError(
        absl::StrCat(file, " is not open for writing"));
  }
  if (name.empty() && !format.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": a backing format ('", format, "') needs a backing file"));
  }
  if (name.find('\0') != std::string::npos ||
      format.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": a backing file name or format may not hold a NUL byte"));
  }
  if (name.size() > kMaxBackingFileNameSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": backing file name is ", name.size(),
        " bytes, longer than the qcow2 limit of ", kMaxBackingFileNameSize));
  }
  const Header original = s_->header;
  Header& h = s_->header;
  h.backing_file = name;
  h.backing_format = format.empty() ? std::nullopt
                                    : std::optional<std::string>(format);
  if (name.empty()) {
    h.backing_file_offset = 0;
    h.backing_file_size = 0;
  }
  // Encoded first: a name that does not fit changes nothing on disk.
  if (absl::StatusOr<std::vector<uint8_t>> enc = EncodeHeader(h); !enc.ok()) {
    h = original;
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": backing file name '", name, "' (", name.size(),
        " bytes) does not fit in the first cluster (", h.cluster_size(),
        " bytes) after the header and its extensions"));
  }
  if (absl::Status s = WriteWholeHeader(); !s.ok()) {
    h = original;
    return s;
  }
  // The offset and size the encoder chose, as a reopen would read them.
  if (!name.empty()) {
    ASSIGN_OR_RETURN(std::vector<uint8_t> enc, EncodeHeader(h));
    h.backing_file_offset = LoadBE64(enc.data() + 8);
    h.backing_file_size = static_cast<uint32_t>(name.size());
  }
  return absl::OkStatus();
}

absl::Status HeaderWriter::PrepareWrite() {
  Header& header = s_->header;
  if (s_->closed) {
    return absl::FailedPreconditionError(
        absl::StrCat(s_->file->name(), ": image is closed"));
  }
  if (!s_->writable) {
    return absl::FailedPreconditionError(absl::StrCat(
        s_->file->name(), " is not open for writing",
        (header.incompatible_features & kIncompatCorrupt) ? " (marked corrupt)"
                                                          : ""));
  }
  if (prepared_) return absl::OkStatus();
  const Header original = header;
  bool changed = false;
  // Autoclear features we do not maintain (bitmaps we do not keep, bits
  // we do not know): clear the bits so readers know those structures may
  // be stale after our writes. A raw data file we keep raw (Zeroer).
  const uint64_t kept =
      kept_autoclear_ | (s_->has_data_file() ? kAutoclearDataFileRaw : 0);
  if ((header.autoclear_features & ~kept) != 0) {
    header.autoclear_features &= kept;
    changed = true;
  }
  if (s_->lazy_refcounts &&
      (header.incompatible_features & kIncompatDirty) == 0) {
    header.incompatible_features |= kIncompatDirty;
    changed = true;
  }
  if (changed) {
    // While a request is planned, its executor writes the update with no
    // lock held, before the request's own I/O (in a log of its own, or in
    // the one being recorded); otherwise it is written now.
    absl::Status s;
    {
      WriteBackFile::RecordScope record(s_->meta.get());
      s = WriteHeaderFields();
      if (s_->meta->recording()) header_ticket_ = s_->meta->recording_ticket();
    }
    if (!s.ok()) {
      header = original;  // try again on the next write
      return s;
    }
  }
  prepared_ = true;
  return absl::OkStatus();
}

uint64_t HeaderWriter::UnwrittenHeaderTicket() {
  if (header_ticket_ != 0 && s_->meta->Written(header_ticket_)) {
    header_ticket_ = 0;
  }
  return header_ticket_;
}

absl::Status HeaderWriter::Fail(absl::Status s) {
  if (s.code() == absl::StatusCode::kDataLoss && s_->writable &&
      (s_->header.incompatible_features & kIncompatCorrupt) == 0) {
    // Inconsistent metadata: stop writing, and say so in the image so that
    // nothing writes it again before a repair.
    s_->header.incompatible_features |= kIncompatCorrupt;
    WriteHeaderFields().IgnoreError();
    s_->writable = false;
    s_->marked_corrupt = true;
  }
  return s;
}

absl::Status HeaderWriter::MarkClean() {
  Header& header = s_->header;
  if (s_->writable && (header.incompatible_features & kIncompatDirty)) {
    header.incompatible_features &= ~kIncompatDirty;
    if (absl::Status s = WriteHeaderFields(); !s.ok()) {
      header.incompatible_features |= kIncompatDirty;
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace qcow2::internal
