// SPDX-License-Identifier: Apache-2.0
// What the C API's source files share (lib/api/c*.cc): the handles behind
// c.h's opaque types, and how a Status becomes a negative errno plus a
// malloc'd message.
#ifndef QCOW2_LIB_API_C_INTERNAL_H_
#define QCOW2_LIB_API_C_INTERNAL_H_

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "qcow2/c.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"

struct qcow2_image_t {
  std::unique_ptr<qcow2::Image> image;
};

struct qcow2_queue_t {
  std::unique_ptr<qcow2::Queue> queue;
  // Completions whose callback ran but that poll has not returned yet.
  std::deque<qcow2_completion_t> ready;
  int event_fd = -1;  // the queue's notifier, once asked for
};

struct qcow2_live_control_t {
  qcow2::LiveJobControl control;
};

namespace qcow2::c_api {

inline int ToErrno(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk: return 0;
    case absl::StatusCode::kInvalidArgument: return EINVAL;
    case absl::StatusCode::kNotFound: return ENOENT;
    case absl::StatusCode::kAlreadyExists: return EEXIST;
    case absl::StatusCode::kPermissionDenied: return EACCES;
    case absl::StatusCode::kFailedPrecondition: return EPERM;
    case absl::StatusCode::kResourceExhausted: return ENOSPC;
    case absl::StatusCode::kUnimplemented: return ENOTSUP;
    case absl::StatusCode::kUnavailable: return EBUSY;
    case absl::StatusCode::kCancelled: return ECANCELED;
    case absl::StatusCode::kDeadlineExceeded: return ETIMEDOUT;
    default: return EIO;  // kOutOfRange (as QEMU), kDataLoss, kInternal ...
  }
}

// Stores `message` in *errptr (freeing what was there).
inline void SetError(char** errptr, absl::string_view message) {
  if (errptr == nullptr) return;
  std::free(*errptr);
  *errptr = static_cast<char*>(std::malloc(message.size() + 1));
  if (*errptr == nullptr) return;
  std::memcpy(*errptr, message.data(), message.size());
  (*errptr)[message.size()] = '\0';
}

// 0, or the negative errno of `s` with its message in *errptr.
inline int Report(const absl::Status& s, char** errptr) {
  if (s.ok()) return 0;
  SetError(errptr, s.message());
  return -ToErrno(s);
}

inline int Invalid(char** errptr, absl::string_view message) {
  return Report(absl::InvalidArgumentError(message), errptr);
}

// Copies `full` to the caller's `out`, as much of it as out->size says
// (an older caller's struct is shorter), keeping out->size.
template <typename T>
void CopyOut(T full, T* out) {
  full.size = out->size;
  std::memcpy(out, &full, std::min(out->size, sizeof(T)));
}

// Checks the caller's struct size; -EINVAL when it cannot even hold it.
template <typename T>
int CheckSize(const T* out, const char* what, char** errptr) {
  if (out->size >= sizeof(out->size)) return 0;
  return Invalid(errptr, absl::StrCat(what, ": out->size ", out->size,
                                      " is too small"));
}

inline bool NullArg(const void* p, const char* what, char** errptr) {
  if (p != nullptr) return false;
  Invalid(errptr, absl::StrCat(what, " is NULL"));
  return true;
}

// Option strings (c.h's key=value lists, see qcow2_image_open_opts and
// qcow2_image_create) into options; kInvalidArgument naming the key and
// `what`.
absl::Status ParseOpenOptions(const char* options, absl::string_view what,
                              OpenOptions* out);
absl::Status ParseCreateOptions(const char* options, absl::string_view what,
                                CreateOptions* out);

// Wipes the secrets an option string read (key-secret-file= and its
// backing.* forms).
void WipeOpenSecrets(OpenOptions* o);

// Wipes them when the call that used them returns, however it returns.
class ScopedSecretWipe {
 public:
  explicit ScopedSecretWipe(OpenOptions* o) : o_(o) {}
  ~ScopedSecretWipe() { WipeOpenSecrets(o_); }
  ScopedSecretWipe(const ScopedSecretWipe&) = delete;
  ScopedSecretWipe& operator=(const ScopedSecretWipe&) = delete;

 private:
  OpenOptions* o_;
};

}  // namespace qcow2::c_api

#endif  // QCOW2_LIB_API_C_INTERNAL_H_
