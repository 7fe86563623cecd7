// SPDX-License-Identifier: Apache-2.0
// Compressed writes before planning: the checks, then the compression of
// the cluster with no lock held (so that callers on several threads
// compress in parallel; planning then only packs the stream).
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/engine/engine.h"
#include "lib/format/compress.h"
#include "lib/driver/qcow2_layer.h"

namespace qcow2::internal {

absl::Status Engine::PrepareCompressed(Request* r) {
  uint64_t cluster_size = 0;
  CompressionType type = CompressionType::kZlib;
  {
    EngineLock lock(&mu_);
    if (chain_->closed()) return chain_->ClosedError();
    RETURN_IF_ERROR(chain_->CheckWritable());
    RETURN_IF_ERROR(chain_->CheckRange(r->offset, r->len));
    Qcow2Layer* top = chain_->top_qcow2();
    if (top == nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          chain_->layer(0)->filename(),
          ": compression is not supported for this file format (raw)"));
    }
    if (top->luks() != nullptr) {
      // QEMU 7.2 would store the cluster unencrypted (qemu-io write -c);
      // its qemu-img convert refuses compression with encryption, as we do.
      return absl::FailedPreconditionError(absl::StrCat(
          top->filename(), ": compressed writes to an encrypted image are "
          "refused (the cluster would be stored unencrypted)"));
    }
    cluster_size = top->header().cluster_size();
    type = static_cast<CompressionType>(top->header().compression_type);
    r->compressed_for = top;
    if (r->offset % cluster_size != 0 ||
        (r->len != cluster_size && r->offset + r->len != chain_->size()) ||
        r->len > cluster_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          top->filename(), ": a compressed write must cover one whole ",
          cluster_size, "-byte cluster (or the end of the disk): ", r->len,
          " bytes at offset ", r->offset));
    }
  }
  if (r->len == 0) {
    r->compressed = false;
    return absl::OkStatus();
  }
  // The disk's last cluster, in part: padded with zeros, as QEMU does.
  std::vector<uint8_t> padded;
  const uint8_t* in = r->wbuf;
  if (r->len < cluster_size) {
    padded.assign(cluster_size, 0);
    std::memcpy(padded.data(), r->wbuf, r->len);
    in = padded.data();
  }
  r->stream.resize(cluster_size - 1);
  ASSIGN_OR_RETURN(size_t n,
                   CompressCluster(type, absl::MakeConstSpan(in, cluster_size),
                                   absl::MakeSpan(r->stream)));
  if (n == 0) {
    // Saves nothing: a plain write of the guest's bytes.
    r->compressed = false;
    r->stream.clear();
    return absl::OkStatus();
  }
  r->stream.resize(n);
  r->compressed = true;
  return absl::OkStatus();
}

}  // namespace qcow2::internal
