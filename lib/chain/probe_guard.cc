// SPDX-License-Identifier: Apache-2.0
#include "lib/chain/probe_guard.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/io/forwarding_file.h"

namespace qcow2::internal {

namespace {

bool StartsWith(absl::Span<const uint8_t> head, size_t at,
                std::string_view magic) {
  return head.size() >= at + magic.size() &&
         std::memcmp(head.data() + at, magic.data(), magic.size()) == 0;
}

// A first sector each format's probe recognises: a magic at an offset.
struct Magic {
  const char* format;
  size_t offset;
  std::string_view bytes;
};

using namespace std::string_view_literals;

constexpr Magic kMagics[] = {
    {"qcow2", 0, "QFI\xfb"sv},  // qcow (version 1) too
    {"qed", 0, "QED\0"sv},
    {"vmdk", 0, "KDMV"sv},
    {"vmdk", 0, "COWD"sv},
    {"vmdk", 0, "# Disk DescriptorFile"sv},
    {"vdi", 64, "\x7f\x10\xda\xbe"sv},
    {"vhdx", 0, "vhdxfile"sv},
    {"vpc", 0, "conectix"sv},
    {"parallels", 0, "WithoutFreeSpace"sv},
    {"parallels", 0, "WithouFreSpacExt"sv},
    {"bochs", 0, "Bochs Virtual HD Image"sv},
    {"cloop", 0, "#!/bin/sh\n#V2.0 Format\n"sv},
    {"luks", 0, "LUKS\xba\xbe"sv},
};

// Reads and every call but the writes pass straight through.
class ProbeGuardFile final : public ForwardingFile {
 public:
  explicit ProbeGuardFile(std::unique_ptr<File> base)
      : ForwardingFile(std::move(base)), base_(inner()) {}

  absl::Status WriteAt(uint64_t offset,
                       absl::Span<const uint8_t> data) override {
    if (offset >= kProbeBytes) return base_->WriteAt(offset, data);
    std::lock_guard<std::mutex> lock(head_mu_);
    RETURN_IF_ERROR(Check(offset, data.size(), [&](uint8_t* head, size_t n) {
      std::memcpy(head, data.data(), n);
    }));
    return base_->WriteAt(offset, data);
  }
  absl::Status WritevAt(uint64_t offset,
                        absl::Span<const iovec> iov) override {
    if (offset >= kProbeBytes) return base_->WritevAt(offset, iov);
    uint64_t len = 0;
    for (const iovec& v : iov) len += v.iov_len;
    std::lock_guard<std::mutex> lock(head_mu_);
    RETURN_IF_ERROR(Check(offset, len, [&](uint8_t* head, size_t n) {
      for (const iovec& v : iov) {
        const size_t k = std::min(n, v.iov_len);
        std::memcpy(head, v.iov_base, k);
        head += k;
        n -= k;
      }
    }));
    return base_->WritevAt(offset, iov);
  }
  absl::Status WriteZeroes(uint64_t offset, uint64_t len) override {
    if (offset >= kProbeBytes) return base_->WriteZeroes(offset, len);
    std::lock_guard<std::mutex> lock(head_mu_);
    RETURN_IF_ERROR(CheckZeros(offset, len));
    return base_->WriteZeroes(offset, len);
  }
  absl::Status Discard(uint64_t offset, uint64_t len) override {
    // A discarded range may read as zeros afterwards.
    if (offset >= kProbeBytes) return base_->Discard(offset, len);
    std::lock_guard<std::mutex> lock(head_mu_);
    RETURN_IF_ERROR(CheckZeros(offset, len));
    return base_->Discard(offset, len);
  }
  File* base() const { return base_; }

 private:
  // The first sector as it would be after a change of `len` bytes at
  // `offset` (< kProbeBytes) that `fill` writes into the buffer (given the
  // place and the byte count inside the sector): refused if it probes as
  // another format. REQUIRES: head_mu_ held.
  template <typename Fill>
  absl::Status Check(uint64_t offset, uint64_t len, Fill fill) {
    uint8_t head[kProbeBytes];
    RETURN_IF_ERROR(base_->ReadAt(0, absl::MakeSpan(head, kProbeBytes)));
    fill(head + offset, std::min<uint64_t>(len, kProbeBytes - offset));
    const char* format = ProbeNonRaw(absl::MakeConstSpan(head, kProbeBytes));
    if (format == nullptr) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        base_->name(), ": write of ", len, " bytes at offset ", offset,
        " refused: the image was probed as raw and the write would make "
        "it probe as ",
        format,
        "; name the format (raw) explicitly to allow writes to the first "
        "512 bytes"));
  }
  absl::Status CheckZeros(uint64_t offset, uint64_t len) {
    return Check(offset, len,
                 [](uint8_t* head, size_t n) { std::memset(head, 0, n); });
  }

  File* const base_;  // inner(), for the guard's own calls
  std::mutex head_mu_;
};

}  // namespace

const char* ProbeNonRaw(absl::Span<const uint8_t> head) {
  for (const Magic& m : kMagics) {
    if (StartsWith(head, m.offset, m.bytes)) return m.format;
  }
  return nullptr;
}

std::unique_ptr<File> GuardProbedRaw(std::unique_ptr<File> file) {
  return std::make_unique<ProbeGuardFile>(std::move(file));
}

File* GuardedFile(File* file) {
  auto* guard = dynamic_cast<ProbeGuardFile*>(file);
  return guard != nullptr ? guard->base() : nullptr;
}

}  // namespace qcow2::internal
