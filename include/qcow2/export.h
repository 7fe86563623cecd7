// SPDX-License-Identifier: Apache-2.0
// QCOW2_EXPORT marks the public API of libqcow2.
//
// The library is compiled with -fvisibility=hidden and
// -fvisibility-inlines-hidden, so libqcow2.so exports only what carries this
// marker: the classes and free functions declared in include/qcow2/.
// Everything else (qcow2::internal, the Abseil and standard-library code
// instantiated inside the library) stays local to it.
#ifndef QCOW2_EXPORT_H_
#define QCOW2_EXPORT_H_

#if defined(__GNUC__) || defined(__clang__)
#define QCOW2_EXPORT __attribute__((visibility("default")))
#else
#define QCOW2_EXPORT
#endif

#endif  // QCOW2_EXPORT_H_
