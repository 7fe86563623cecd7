// The public Image: a thin facade over internal::Chain.
#include "qcow2/image.h"

#include "lib/chain/chain.h"
#include "lib/base/status_macros.h"

namespace qcow2 {

Image::Image(std::unique_ptr<internal::Chain> chain) : chain_(std::move(chain)) {}

Image::~Image() {
  if (chain_) chain_->Close().IgnoreError();
}

absl::StatusOr<std::unique_ptr<Image>> Image::Open(const std::string& path,
                                                   const OpenOptions& opts) {
  FileOpener* opener = opts.opener ? opts.opener : DefaultFileOpener();
  FileOptions fo;
  fo.read_only = !opts.read_write;
  fo.direct = opts.direct_io;
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, opener->Open(path, fo));
  return Open(std::move(file), opts);
}

absl::StatusOr<std::unique_ptr<Image>> Image::Open(std::unique_ptr<File> top,
                                                   const OpenOptions& opts) {
  ASSIGN_OR_RETURN(auto chain, internal::Chain::Open(std::move(top), opts));
  return std::unique_ptr<Image>(new Image(std::move(chain)));
}

uint64_t Image::size() const { return chain_->LockedSize(); }
int Image::chain_length() const { return chain_->LockedLength(); }
bool Image::writable() const { return chain_->writable(); }

absl::Status Image::Read(uint64_t offset, absl::Span<uint8_t> buf) {
  return chain_->Read(offset, buf);
}
absl::Status Image::Write(uint64_t offset, absl::Span<const uint8_t> data) {
  return chain_->Write(offset, data);
}
absl::Status Image::WriteZeroes(uint64_t offset, uint64_t len, bool unmap) {
  return chain_->WriteZeroes(offset, len, unmap);
}
absl::Status Image::Discard(uint64_t offset, uint64_t len) {
  return chain_->Discard(offset, len);
}
absl::Status Image::Resize(uint64_t new_size) {
  return chain_->Resize(new_size);
}
absl::Status Image::Flush() { return chain_->Flush(); }
absl::Status Image::Close() { return chain_->Close(); }

absl::StatusOr<BlockStatus> Image::GetBlockStatus(uint64_t offset,
                                                  uint64_t max_len) {
  return chain_->GetBlockStatus(offset, max_len);
}

absl::Status Image::CreateOverlay(const std::string& path,
                                  const CreateOptions& opts) {
  return chain_->CreateOverlay(path, opts);
}

std::vector<LayerInfo> Image::GetChainInfo() const {
  return chain_->GetChainInfo();
}

}  // namespace qcow2
