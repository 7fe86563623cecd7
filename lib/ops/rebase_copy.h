// SPDX-License-Identifier: Apache-2.0
// The copy a safe rebase (and a stream) makes before the top takes its new
// backing name, shared by lib/ops/rebase.cc and lib/ops/stream.cc.
#ifndef QCOW2_LIB_OPS_REBASE_COPY_H_
#define QCOW2_LIB_OPS_REBASE_COPY_H_

#include <string>

#include "absl/status/status.h"
#include "qcow2/image.h"
#include "qcow2/maintenance.h"

namespace qcow2::ops {

// Writes into `top` (opened read-write over its old backing chain) every
// range it does not allocate where the old chain and `new_backing` (null:
// reads as zeros) read differently, with the old chain's data, compared
// by 512-byte sectors. Ranges whose contents come from the old chain's
// layer `shared_depth` or deeper are skipped unread: `new_backing` is
// that layer (pass a depth past the chain when it is not in it). Flushes
// the top at the end.
absl::Status CopyForRebase(Image* top, Image* new_backing, int shared_depth,
                           const ChainOpOptions& opts);

// "qcow2" or "raw".
std::string FormatName(ImageFormat f);

// The path as an absolute, lexically normal one with symlinks resolved
// where the path exists (std::filesystem::weakly_canonical), or as given
// when that fails.
std::string CanonicalPath(const std::string& path);

}  // namespace qcow2::ops

#endif  // QCOW2_LIB_OPS_REBASE_COPY_H_
