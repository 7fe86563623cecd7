/* SPDX-License-Identifier: Apache-2.0 */
/* The checks of the C API's tests (tests/c_api*_test.c): each failed
 * check is printed with its line and counted in `failures`. */
#ifndef QCOW2_TESTS_C_API_CHECK_H_
#define QCOW2_TESTS_C_API_CHECK_H_

#include <stdio.h>

#include "qcow2/c.h"

static int failures;

#define CHECK(cond)                                                       \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,    \
              #cond);                                                     \
      ++failures;                                                         \
    }                                                                     \
  } while (0)

/* rc must be 0 and err NULL; prints the message otherwise. */
#define CHECK_OK(rc, err)                                                 \
  do {                                                                    \
    int check_rc_ = (rc);                                                 \
    if (check_rc_ != 0 || (err) != NULL) {                                \
      fprintf(stderr, "%s:%d: %s = %d: %s\n", __FILE__, __LINE__, #rc,    \
              check_rc_, (err) != NULL ? (err) : "(no message)");         \
      ++failures;                                                         \
      qcow2_free(err);                                                    \
      (err) = NULL;                                                       \
    }                                                                     \
  } while (0)

#endif /* QCOW2_TESTS_C_API_CHECK_H_ */
