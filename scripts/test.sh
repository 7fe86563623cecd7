#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the whole default test suite:
#   1. ctest in the build tree (unit, interop against QEMU's tools, the
#      servers with real clients, the guest test), the fuzz label excepted;
#   2. scripts/sanitize.sh asan: the unit and concurrency tests under
#      ASan+UBSan, the fuzz smoke run and clang's thread-safety analysis, all
#      from one clang tree (build-asan);
#   3. scripts/sanitize.sh tsan: the concurrency tests under TSan.
# With arguments, only step 1, with the arguments passed to ctest (fuzz
# label included), e.g. `scripts/test.sh -R Overlay`.
# Longer fuzzing and soak runs: QCOW2_LONG_TESTS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${QCOW2_BUILD_DIR:-build}"
if [ $# -gt 0 ]; then
  exec ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" --timeout 900 "$@"
fi
start=$SECONDS
rc=0
# fuzz_smoke would build a clang tree of its own; step 2 runs the same
# smoke run on the ASan tree's fuzzers.
ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" --timeout 900 -LE '^fuzz$' || rc=1
echo "test.sh: ctest done in $((SECONDS - start)) s"
bash scripts/sanitize.sh asan || rc=1
bash scripts/sanitize.sh tsan || rc=1
echo "test.sh: done in $((SECONDS - start)) s (exit $rc)"
exit "$rc"
