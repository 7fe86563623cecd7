#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the tests with sanitizers and runs them.
#
#   bash scripts/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer
#                                   (build-asan): ctest labels unit, concurrency;
#                                   with clang also the fuzz smoke run on
#                                   fuzzers built in the same tree, and the
#                                   thread-safety analysis as errors
#   bash scripts/sanitize.sh tsan   ThreadSanitizer (build-tsan): ctest label
#                                   concurrency (tests named concurrency_*)
#
# Both build RelWithDebInfo at -O1, without the benchmarks; tsan builds only
# the concurrency_* test binaries. The compiler is clang++ when
# it can link sanitized programs (it compiles the tests about 3x faster than
# g++ here), else g++; CXX=... overrides. Any sanitizer report fails the
# test that produced it, and the script exits non-zero.
#   QCOW2_SANITIZE_BUILD_DIR  build directory (default: build-asan / build-tsan)
#   QCOW2_SANITIZE_JOBS       build and ctest parallelism (default: nproc)
#   QCOW2_SANITIZE_FUZZ=0     asan: skip the fuzz smoke run (also skipped when
#                             ctest arguments are given)
#   extra arguments are passed to ctest (e.g. -R Overlay)
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
[ $# -gt 0 ] && shift
case "$mode" in
  asan) sanitize="address,undefined"; labels="unit|concurrency" ;;
  tsan) sanitize="thread"; labels="concurrency" ;;
  *) echo "usage: $0 asan|tsan [ctest arguments]" >&2; exit 2 ;;
esac
build_dir="${QCOW2_SANITIZE_BUILD_DIR:-build-$mode}"
jobs="${QCOW2_SANITIZE_JOBS:-$(nproc)}"

# Reports are fatal and come with stacks; leaks count.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:${TSAN_OPTIONS:-}"

# The test binaries are one target per tests/*_test.cc.
tests=()
for src in tests/*_test.cc; do
  [ -f "$src" ] || continue
  name=$(basename "$src" .cc)
  if [ "$mode" = tsan ]; then
    case "$name" in concurrency*) ;; *) continue ;; esac
  fi
  tests+=("$name")
done
if [ ${#tests[@]} -eq 0 ]; then
  echo "sanitize.sh: $mode: no concurrency tests (tests/concurrency*_test.cc): nothing to run"
  exit 0
fi

# Compiler: CXX if set, else clang++ if its sanitizer runtimes are installed
# (Debian: libclang-rt-14-dev), else g++.
probe() {
  local dir
  dir=$(mktemp -d)
  printf 'int main() { return 0; }\n' >"$dir/p.cc"
  "$1" -fsanitize="$sanitize" "$dir/p.cc" -o "$dir/p" >/dev/null 2>&1
  local rc=$?
  rm -rf "$dir"
  return $rc
}
cxx="${CXX:-}"
if [ -z "$cxx" ]; then
  for c in clang++ clang++-14 g++; do
    if command -v "$c" >/dev/null 2>&1 && probe "$c"; then cxx=$(command -v "$c"); break; fi
  done
fi
[ -n "$cxx" ] || { echo "sanitize.sh: no compiler links -fsanitize=$sanitize" >&2; exit 2; }
case "$cxx" in *clang++*) cc=${cxx/clang++/clang} ;; *) cc=${cxx/g++/gcc} ;; esac
if [ -f "$build_dir/CMakeCache.txt" ] &&
   ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$cxx" "$build_dir/CMakeCache.txt"; then
  echo "sanitize.sh: $build_dir was configured with another compiler: starting it afresh"
  rm -rf "$build_dir"
fi

# With clang, the ASan tree also carries the fuzzers (one compile of the
# library with coverage hooks serves the unit tests and the fuzz smoke run)
# and the thread-safety analysis of the library, servers and qcowtool.
fuzz=OFF
tsafety=OFF
if [ "$mode" = asan ]; then
  case "$cxx" in
    *clang++*)
      tsafety=ON
      pdir=$(mktemp -d)
      printf '%s\n' 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$pdir/f.cc"
      "$cxx" -fsanitize=fuzzer,address,undefined "$pdir/f.cc" -o "$pdir/f" >/dev/null 2>&1 && fuzz=ON
      rm -rf "$pdir" ;;
  esac
fi
start=$SECONDS
echo "sanitize.sh: $mode: configuring $build_dir ($cxx, -fsanitize=$sanitize, fuzzers $fuzz, thread-safety analysis $tsafety)"
CC="$cc" CXX="$cxx" cmake -S . -B "$build_dir" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DQCOW2_SANITIZE="$sanitize" -DQCOW2_THREAD_SAFETY="$tsafety" \
  -DQCOW2_BUILD_TESTS=ON -DQCOW2_BUILD_BENCH=OFF -DQCOW2_BUILD_FUZZ="$fuzz" >/dev/null

echo "sanitize.sh: $mode: building (-j$jobs)"
# One goal keeps -j effective (the Makefile generator builds several
# --target goals one after the other). asan: the default target, which in
# a sanitizer tree holds the library, qcowtool, the servers, the unit and
# concurrency tests and (clang) the fuzzers; tsan: the concurrency tests.
if [ "$mode" = asan ]; then
  nice -n 10 cmake --build "$build_dir" -j"$jobs"
else
  nice -n 10 cmake --build "$build_dir" -j"$jobs" --target concurrency_tests
fi
echo "sanitize.sh: $mode: built in $((SECONDS - start)) s"

# --no-tests=error: a label that no longer reaches the tests fails loudly.
rc=0
ctest --test-dir "$build_dir" -L "$labels" --no-tests=error --output-on-failure \
  -j"$jobs" --timeout 900 "$@" || rc=$?
echo "sanitize.sh: $mode: tests done in $((SECONDS - start)) s (ctest exit $rc)"
if [ "$fuzz" = ON ] && [ "${QCOW2_SANITIZE_FUZZ:-1}" = 1 ] && [ $# -eq 0 ]; then
  # The fuzz smoke run (scripts/fuzz.sh --smoke) on the fuzzers just built;
  # not when ctest arguments chose some tests.
  frc=0
  bash scripts/fuzz.sh --smoke --no-build --build-dir "$build_dir" || frc=$?
  [ "$rc" -eq 0 ] && rc=$frc
fi
echo "sanitize.sh: $mode: done in $((SECONDS - start)) s (exit $rc)"
exit "$rc"
