// SPDX-License-Identifier: Apache-2.0
// Small helpers for absl::Status plumbing. Debian's Abseil (20220623) has no
// RETURN_IF_ERROR / ASSIGN_OR_RETURN, so the library carries its own.
#ifndef QCOW2_LIB_BASE_STATUS_MACROS_H_
#define QCOW2_LIB_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define QCOW2_CONCAT_INNER_(a, b) a##b
#define QCOW2_CONCAT_(a, b) QCOW2_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the current
// function when it is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status qcow2_status_ = (expr);             \
    if (!qcow2_status_.ok()) return qcow2_status_;     \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status,
// otherwise moves the value into `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  QCOW2_ASSIGN_OR_RETURN_IMPL_(QCOW2_CONCAT_(qcow2_sor_, __LINE__), lhs, rexpr)

#define QCOW2_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

#endif  // QCOW2_LIB_BASE_STATUS_MACROS_H_
