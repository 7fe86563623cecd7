// Write-side operations of the chain (temporary until the write path lands).
#include "lib/chain/chain.h"

namespace qcow2::internal {

absl::Status Chain::Write(uint64_t, absl::Span<const uint8_t>) {
  return absl::UnimplementedError("writing is not implemented yet");
}
absl::Status Chain::WriteZeroes(uint64_t, uint64_t, bool) {
  return absl::UnimplementedError("writing is not implemented yet");
}
absl::Status Chain::Discard(uint64_t, uint64_t) {
  return absl::UnimplementedError("writing is not implemented yet");
}
absl::Status Chain::Flush() { return absl::OkStatus(); }
absl::Status Chain::Close() {
  closed_ = true;
  return absl::OkStatus();
}

}  // namespace qcow2::internal

namespace qcow2 {
absl::Status CreateImage(const std::string&, const CreateOptions&) {
  return absl::UnimplementedError("create is not implemented yet");
}
}  // namespace qcow2
