// SPDX-License-Identifier: Apache-2.0
// qcow2::VersionString(): the version this library was built as.
#include "qcow2/version.h"  // generated from cmake/version.h.in

namespace qcow2 {

const char* VersionString() { return QCOW2_VERSION_STRING; }

}  // namespace qcow2
