#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the whole default test suite (unit + interop against qemu-img).
# Longer fuzzing and soak runs: QCOW2_LONG_TESTS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${QCOW2_BUILD_DIR:-build}"
ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" --timeout 900 "$@"
