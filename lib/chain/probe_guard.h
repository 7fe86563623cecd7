// SPDX-License-Identifier: Apache-2.0
// The guard on a writable image whose format was probed as raw: a guest
// must not write a header into its first sector that makes the next open
// probe the file as another format (a qcow2 header naming a host file as
// its backing file would expose that file to the guest). QEMU's raw driver
// refuses such writes the same way.
#ifndef QCOW2_LIB_CHAIN_PROBE_GUARD_H_
#define QCOW2_LIB_CHAIN_PROBE_GUARD_H_

#include <cstdint>
#include <memory>

#include "absl/types/span.h"
#include "qcow2/file.h"

namespace qcow2::internal {

// The bytes a format probe looks at, as QEMU's BLOCK_PROBE_BUF_SIZE.
inline constexpr uint64_t kProbeBytes = 512;

// The name of the image format other than raw that QEMU (or libqcow2)
// would probe `head` (the first bytes of a file, up to kProbeBytes) as,
// or nullptr when it probes as raw. Formats: qcow, qcow2, qed, vmdk, vdi,
// vhdx, vpc, parallels, bochs, cloop, luks.
const char* ProbeNonRaw(absl::Span<const uint8_t> head);

// `file` behind a guard: a write, vectored write, zeroing or discard that
// touches the first kProbeBytes and would make them probe as another
// format fails with kPermissionDenied naming the file and the format, and
// changes nothing. Every other call is forwarded unchanged. Writes into
// the first sector are checked and issued under one mutex, so two of them
// cannot together build a header neither would alone.
std::unique_ptr<File> GuardProbedRaw(std::unique_ptr<File> file);

// The file under the guard when `file` is one, else nullptr.
File* GuardedFile(File* file);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CHAIN_PROBE_GUARD_H_
