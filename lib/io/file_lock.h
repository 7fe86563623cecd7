// SPDX-License-Identifier: Apache-2.0
// Image locks that QEMU's file-posix driver understands: open file
// description (OFD) locks on single bytes, one per block-layer permission.
//
// For each permission bit i (0 "consistent read", 1 "write",
// 2 "write unchanged", 3 "resize"), a shared lock on byte 100+i says "this
// opener holds permission i", and a shared lock on byte 200+i says "this
// opener lets nobody else hold permission i". An opener first takes its own
// bytes, then tests (F_OFD_GETLK, as a writer would) that nobody forbids a
// permission it holds and nobody holds a permission it forbids. Taking
// before testing means two openers racing each other both see the other.
//
// The locks belong to the open file description: they go away when the
// last descriptor onto it is closed (or the process dies), and two opens
// of one file in the same process exclude each other like two processes.
#ifndef QCOW2_LIB_IO_FILE_LOCK_H_
#define QCOW2_LIB_IO_FILE_LOCK_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace qcow2::internal {

// QEMU's BLK_PERM_* bits (QEMU 6.1 and later; 7.2 on Debian 12).
inline constexpr uint32_t kPermConsistentRead = 1u << 0;
inline constexpr uint32_t kPermWrite = 1u << 1;
inline constexpr uint32_t kPermWriteUnchanged = 1u << 2;
inline constexpr uint32_t kPermResize = 1u << 3;
inline constexpr uint32_t kPermAll = 0xf;
inline constexpr int kPermCount = 4;

// First byte of the "holds" and of the "forbids" range.
inline constexpr int kLockPermBase = 100;
inline constexpr int kLockSharedBase = 200;

// What an opener holds (`perm`) and what it lets others hold (`shared`).
struct LockPerms {
  uint32_t perm = 0;
  uint32_t shared = kPermAll;
};

// The permissions QEMU takes for a qcow2 or raw image file:
//   read-write image:       holds read, write, resize; shares read and
//                           write-unchanged (so no other writer, and no
//                           reader that cannot stand a writer);
//   read-only (and every backing file): holds read; shares everything
//                           but write and resize;
//   read-only, force_share: holds read; shares everything (qemu-img -U).
LockPerms ImageLockPerms(bool read_write, bool force_share);

// Takes `want` on `fd` (an open file description no other lock of ours
// uses) and tests for conflicts. On a conflict, releases what it took and
// returns kUnavailable: "<name>: image is locked by another process
// (failed to get "write" lock)" or, for a permission another opener holds
// that we forbid, (failed to get shared "write" lock). A file system
// without OFD locks (EINVAL, ENOLCK, EOPNOTSUPP on the first lock) gets no
// locks and no error, as QEMU's locking=auto does.
absl::Status LockImageFile(int fd, const std::string& name, LockPerms want);

// Gives up what `from` locks and `to` does not: the image closed
// (to = LockPerms{}: nothing held, everything shared), or a read-write
// image kept as a read-only backing file. Never fails (releasing a lock
// cannot conflict).
void DropImageLocks(int fd, LockPerms from, LockPerms to);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_IO_FILE_LOCK_H_
