#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the library and qcowtool with clang's thread-safety analysis
# (-Wthread-safety), which checks the lock annotations (ABSL_GUARDED_BY,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED, ... on lib/base/mutex.h's Mutex) at compile
# time. Only clang has the analysis; tests, benchmarks and fuzzers are not
# built (the annotations that matter are in lib/).
#
# Exits non-zero when the build fails: the targets it covers compile with
# -Werror (QCOW2_THREAD_SAFETY), so a thread-safety finding or any other
# warning there fails every run until fixed. scripts/sanitize.sh asan does
# the same analysis in its clang tree; this script is the quick standalone
# check.
#   QCOW2_TSAFETY_BUILD_DIR  build directory (default: build-tsafety)
#   QCOW2_TSAFETY_JOBS       build parallelism (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir="${QCOW2_TSAFETY_BUILD_DIR:-build-tsafety}"
jobs="${QCOW2_TSAFETY_JOBS:-$(nproc)}"
command -v clang++ >/dev/null 2>&1 ||
  { echo "thread_safety.sh: clang++ not found" >&2; exit 2; }
cxx=$(command -v clang++)
cc=$(command -v clang)
if [ -f "$build_dir/CMakeCache.txt" ] &&
   ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$cxx" "$build_dir/CMakeCache.txt"; then
  echo "thread_safety.sh: $build_dir was configured with another compiler: starting it afresh"
  rm -rf "$build_dir"
fi

start=$SECONDS
echo "thread_safety.sh: configuring $build_dir ($cxx)"
CC="$cc" CXX="$cxx" cmake -S . -B "$build_dir" \
  -DQCOW2_THREAD_SAFETY=ON \
  -DQCOW2_BUILD_TESTS=OFF -DQCOW2_BUILD_BENCH=OFF -DQCOW2_BUILD_FUZZ=OFF \
  >/dev/null

echo "thread_safety.sh: building qcow2_objects and qcowtool (-j$jobs)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
nice -n 10 cmake --build "$build_dir" -j"$jobs" --target qcow2_objects qcowtool \
  2>&1 | tee "$log" || rc=$?
warnings=$(grep -c 'warning:' "$log" || true)
echo "thread_safety.sh: done in $((SECONDS - start)) s" \
  "(build exit $rc, $warnings warnings)"
if [ "$rc" -ne 0 ] || [ "$warnings" -ne 0 ]; then
  echo "thread_safety.sh: FAILED" >&2
  exit 1
fi
