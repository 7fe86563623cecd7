// SPDX-License-Identifier: Apache-2.0
#include "lib/io/file_lock.h"

#include <errno.h>
#include <fcntl.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace qcow2::internal {

namespace {

constexpr const char* kPermNames[kPermCount] = {"consistent read", "write",
                                                "write unchanged", "resize"};

// One OFD lock call on `byte` (retried on EINTR): F_OFD_SETLK with F_RDLCK
// takes it shared, with F_UNLCK releases it; F_OFD_GETLK with F_WRLCK
// tests it and leaves in `type` what another holder has (F_UNLCK: none).
// Returns errno (0 on success).
int LockCall(int fd, int cmd, int byte, short* type) {
  struct flock fl;
  std::memset(&fl, 0, sizeof(fl));
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  fl.l_type = *type;
  while (::fcntl(fd, cmd, &fl) != 0) {
    if (errno != EINTR) return errno;
  }
  *type = fl.l_type;
  return 0;
}

int SetByte(int fd, int byte, short type) {
  return LockCall(fd, F_OFD_SETLK, byte, &type);
}

// Whether another open file description holds `byte` (tested as an
// exclusive lock would be); an error counts as not held.
bool ByteTaken(int fd, int byte) {
  short type = F_WRLCK;
  return LockCall(fd, F_OFD_GETLK, byte, &type) == 0 && type != F_UNLCK;
}

bool NoLockSupport(int err) {
  return err == EINVAL || err == ENOLCK || err == EOPNOTSUPP ||
         err == ENOSYS;
}

void ReleaseAll(int fd) {
  DropImageLocks(fd, LockPerms{kPermAll, 0}, LockPerms{});
}

absl::Status Locked(const std::string& name, bool shared, int bit) {
  return absl::UnavailableError(absl::StrCat(
      name, ": image is locked by another process (failed to get ",
      shared ? "shared " : "", "\"", kPermNames[bit],
      "\" lock); is another process using the image?"));
}

}  // namespace

void DropImageLocks(int fd, LockPerms from, LockPerms to) {
  for (int i = 0; i < kPermCount; ++i) {
    const uint32_t bit = 1u << i;
    if ((from.perm & bit) && !(to.perm & bit)) {
      SetByte(fd, kLockPermBase + i, F_UNLCK);
    }
    if (!(from.shared & bit) && (to.shared & bit)) {
      SetByte(fd, kLockSharedBase + i, F_UNLCK);
    }
  }
}

LockPerms ImageLockPerms(bool read_write, bool force_share) {
  LockPerms p;
  if (read_write) {
    p.perm = kPermConsistentRead | kPermWrite | kPermResize;
    p.shared = kPermConsistentRead | kPermWriteUnchanged;
  } else {
    p.perm = kPermConsistentRead;
    p.shared = force_share ? kPermAll : kPermAll & ~(kPermWrite | kPermResize);
  }
  return p;
}

absl::Status LockImageFile(int fd, const std::string& name, LockPerms want) {
  bool first = true;
  for (int i = 0; i < kPermCount; ++i) {
    const uint32_t bit = 1u << i;
    for (auto [held, byte] : {std::pair{(want.perm & bit) != 0,
                                        kLockPermBase + i},
                              std::pair{(want.shared & bit) == 0,
                                        kLockSharedBase + i}}) {
      if (!held) continue;
      if (int err = SetByte(fd, byte, F_RDLCK); err != 0) {
        if (first && NoLockSupport(err)) return absl::OkStatus();
        ReleaseAll(fd);
        if (err == EAGAIN || err == EACCES) return Locked(name, false, i);
        return absl::ErrnoToStatus(
            err, absl::StrCat(name, ": cannot lock byte ", byte));
      }
      first = false;
    }
  }
  // Nobody may forbid what we hold, nor hold what we forbid.
  for (int i = 0; i < kPermCount; ++i) {
    const uint32_t bit = 1u << i;
    if ((want.perm & bit) && ByteTaken(fd, kLockSharedBase + i)) {
      ReleaseAll(fd);
      return Locked(name, false, i);
    }
  }
  for (int i = 0; i < kPermCount; ++i) {
    const uint32_t bit = 1u << i;
    if (!(want.shared & bit) && ByteTaken(fd, kLockPermBase + i)) {
      ReleaseAll(fd);
      return Locked(name, true, i);
    }
  }
  return absl::OkStatus();
}

}  // namespace qcow2::internal
