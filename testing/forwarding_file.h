// SPDX-License-Identifier: Apache-2.0
// Test doubles derive from the library's ForwardingFile (lib/io).
#ifndef QCOW2_TESTING_FORWARDING_FILE_H_
#define QCOW2_TESTING_FORWARDING_FILE_H_

#include "lib/io/forwarding_file.h"

namespace qcow2::testing {

using ForwardingFile = ::qcow2::internal::ForwardingFile;

}  // namespace qcow2::testing

#endif  // QCOW2_TESTING_FORWARDING_FILE_H_
