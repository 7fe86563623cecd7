#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks libqcow2 as a package, the way a hypervisor would consume it:
#
#   install     the project installed with `cmake --install` into a
#               temporary prefix: headers (with the generated
#               qcow2/version.h and the C API's qcow2/c.h), libqcow2.so.0 and
#               libqcow2.a, the CMake package, qcow2.pc (and qcowtool when
#               the build has it)
#   symbols     `nm -D --defined-only` of the installed libqcow2.so exports
#               only qcow2:: and the C API's qcow2_* (nothing in
#               qcow2::internal, no test doubles MemoryFile/FaultFile/
#               GateFile/Model, no Abseil, no std::)
#   cmake       examples/consumer built with find_package(qcow2) against
#               qcow2::qcow2 (shared) and qcow2::qcow2_static, and run
#   pkg-config  examples/consumer built with
#               g++ $(pkg-config --cflags --libs qcow2), and run
#   pkg-static  the same linking libqcow2.a (pkg-config --static), and run
#   c_epoll, cpp_epoll
#               examples/c_epoll (C11, qcow2/c.h) and examples/cpp_epoll
#               (C++17, qcow2::Queue): each built with its own
#               CMakeLists.txt through find_package(qcow2) and with a
#               pkg-config command line, and run (a chain, 2000 random
#               vectored requests served from an epoll loop over the
#               queue's eventfd, data verified; qemu-img check of the
#               overlay when qemu-img is there)
#   subdir      a parent project that add_subdirectory()s the repository
#               configures only the library (no qcowtool, tests,
#               benchmarks), without touching its build type or compile
#               flags; in a full run its program linked to qcow2::qcow2 is
#               built and runs
#
# The consumer creates an image, writes and reads back 4 KiB and prints
# qcow2::VersionString(). One line per check; exits 1 if any failed.
#
#   scripts/package_test.sh [--build DIR]
#   --build DIR  install from an existing build tree of this repository
#                (brought up to date: the library targets only) instead of
#                configuring and building a fresh one, and only configure
#                the subdir parent: a couple of minutes on 2 cores (CI).
#                Without it the library is built twice (fresh tree and
#                subdir; about 25 min on 2 busy cores).
#   QCOW2_PACKAGE_BUILD  same as --build
#   QCOW2_PACKAGE_JOBS  build parallelism (default: nproc)
#   QCOW2_PACKAGE_KEEP  1: keep the temporary directory (printed) for a look
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
jobs="${QCOW2_PACKAGE_JOBS:-$(nproc)}"
cxx="${CXX:-g++}"
cc="${CC:-gcc}"
reuse="${QCOW2_PACKAGE_BUILD:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) reuse="${2:?--build needs a directory}"; shift 2 ;;
    *) echo "package_test: unknown argument '$1' (usage: $0 [--build DIR])" >&2; exit 2 ;;
  esac
done
if [ -n "$reuse" ]; then
  reuse=$(cd "$reuse" && pwd)
  [ -f "$reuse/CMakeCache.txt" ] || {
    echo "package_test: --build $reuse is not a CMake build tree" >&2; exit 2; }
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/qcow2-package.XXXXXX")
if [ "${QCOW2_PACKAGE_KEEP:-0}" = 1 ]; then
  echo "package_test: keeping $tmp"
else
  trap 'rm -rf "$tmp"' EXIT
fi
logs="$tmp/logs"
prefix="$tmp/prefix"
mkdir -p "$logs"

failed=0
pass() { printf 'PASS %-10s %s\n' "$1" "$2"; }
fail() {
  printf 'FAIL %-10s %s\n' "$1" "$2"
  failed=$((failed + 1))
  if [ -n "${3:-}" ] && [ -f "$3" ]; then
    tail -30 "$3" | sed 's/^/    | /'
  fi
}
# run LOG CMD...: runs CMD with its output in $logs/LOG.
run() {
  local log="$logs/$1"
  shift
  "$@" >>"$log" 2>&1
}

start=$SECONDS

# --- install -----------------------------------------------------------------
install_ok=0
# install_from BUILD: the library's components (and qcowtool's when built).
install_from() {
  local b="$1" comp
  for comp in qcow2_runtime qcow2_development; do
    cmake --install "$b" --prefix "$prefix" --component "$comp" || return 1
  done
  if [ -x "$b/qcowtool" ]; then
    cmake --install "$b" --prefix "$prefix" --component qcow2_tools || return 1
  fi
}
if [ -n "$reuse" ]; then
  build="$reuse"
  # Up to date: the library only (tests, tools, benches are not needed).
  build_cmd=(nice -n 10 cmake --build "$build" -j"$jobs" --target qcow2_shared qcow2_static)
else
  build="$tmp/build"
  build_cmd=(nice -n 10 cmake --build "$build" -j"$jobs")
  run install.log cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DQCOW2_BUILD_TESTS=OFF -DQCOW2_BUILD_BENCH=OFF -DQCOW2_BUILD_FUZZ=OFF ||
    build_cmd=(false)
fi
if run install.log "${build_cmd[@]}" && run install.log install_from "$build"; then
  missing=()
  want_files=(include/qcow2/image.h include/qcow2/file.h include/qcow2/export.h
              include/qcow2/queue.h include/qcow2/c.h include/qcow2/version.h
              share/doc/libqcow2/LICENSE)
  [ -z "$reuse" ] || [ -x "$build/qcowtool" ] && want_files+=(bin/qcowtool)
  for f in "${want_files[@]}"; do
    [ -f "$prefix/$f" ] || missing+=("$f")
  done
  libdir=$(dirname "$(find "$prefix" -name 'libqcow2.so.0' | head -1)")
  for f in libqcow2.so libqcow2.so.0 libqcow2.a cmake/qcow2/qcow2Config.cmake \
           cmake/qcow2/qcow2ConfigVersion.cmake cmake/qcow2/qcow2Targets.cmake \
           pkgconfig/qcow2.pc; do
    [ -e "$libdir/$f" ] || missing+=("<libdir>/$f")
  done
  soname=$(readelf -d "$libdir/libqcow2.so" 2>/dev/null |
           sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
  if [ ${#missing[@]} -eq 0 ] && [ "$soname" = libqcow2.so.0 ]; then
    install_ok=1
    pass install "into ${prefix#"$tmp/"}: libdir ${libdir#"$prefix/"}, SONAME $soname, $(cd "$libdir" && echo libqcow2.so.*.*)"
  else
    fail install "missing: ${missing[*]:-none}; SONAME '${soname}'"
  fi
else
  fail install "configure/build/install failed" "$logs/install.log"
fi

if [ "$install_ok" = 1 ]; then
  export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

  # --- symbols ---------------------------------------------------------------
  # The entity a symbol names: demangled, without the "typeinfo for " (...)
  # prefix and without the parameter list.
  nm -D --defined-only -C "$libdir/libqcow2.so" | cut -d' ' -f3- >"$tmp/syms"
  sed -E 's/^(typeinfo name for|typeinfo for|vtable for|VTT for|construction vtable for|guard variable for) //; s/\(.*//' \
    "$tmp/syms" >"$tmp/names"
  total=$(wc -l <"$tmp/syms")
  bad=$( (grep -E '^qcow2::internal::' "$tmp/names" || true
          grep -E 'MemoryFile|FaultFile|GateFile|\bModel\b|qcow2::testing' "$tmp/syms" || true
          grep -vE '^qcow2::|^qcow2_[a-z0-9_]+$' "$tmp/names" || true) | sort -u)
  c_calls=$(grep -cE '^qcow2_' "$tmp/names" || true)
  if [ "$total" -gt 0 ] && [ -z "$bad" ] && [ "$c_calls" -gt 0 ]; then
    mention=$(grep -c 'qcow2::internal' "$tmp/syms" || true)
    pass symbols "$total exported, all public API: $c_calls C calls qcow2_*, the rest qcow2:: ($mention take an opaque qcow2::internal pointer: Image/Queue's private constructors)"
  else
    fail symbols "$total exported ($c_calls C calls); not public API: $(echo "$bad" | head -5 | tr '\n' ';')"
  fi

  # --- cmake -----------------------------------------------------------------
  cmake_out=""
  for kind in shared static; do
    b="$tmp/consumer-cmake-$kind"
    static=OFF
    [ "$kind" = static ] && static=ON
    if run "cmake-$kind.log" cmake -S "$src/examples/consumer" -B "$b" \
         -DCMAKE_PREFIX_PATH="$prefix" -DQCOW2_CONSUMER_STATIC=$static \
         -DCMAKE_CXX_COMPILER="$cxx" &&
       run "cmake-$kind.log" cmake --build "$b" &&
       run "cmake-$kind.log" "$b/consumer" "$tmp/cmake-$kind.qcow2"; then
      needs_so=0
      readelf -d "$b/consumer" | grep -q 'NEEDED.*libqcow2\.so\.0' && needs_so=1
      want=0
      [ "$kind" = shared ] && want=1
      if [ "$needs_so" = "$want" ]; then
        cmake_out="$cmake_out $kind ok;"
      else
        fail cmake "$kind: the consumer needs libqcow2.so.0: $needs_so, expected $want"
        cmake_out=""
        break
      fi
    else
      fail cmake "$kind: find_package(qcow2) consumer failed" "$logs/cmake-$kind.log"
      cmake_out=""
      break
    fi
  done
  if [ -n "$cmake_out" ]; then
    pass cmake "find_package(qcow2):$cmake_out $(tail -1 "$logs/cmake-shared.log")"
  fi

  # --- pkg-config (shared) ---------------------------------------------------
  exe="$tmp/consumer-pc"
  # shellcheck disable=SC2046
  if run pc.log "$cxx" -o "$exe" "$src/examples/consumer/main.cc" \
       $(pkg-config --cflags --libs qcow2) &&
     readelf -d "$exe" | grep -q 'NEEDED.*libqcow2\.so\.0' &&
     LD_LIBRARY_PATH="$libdir" run pc.log "$exe" "$tmp/pc.qcow2"; then
    pass pkg-config "g++ \$(pkg-config --cflags --libs qcow2) [$(pkg-config --modversion qcow2)]: $(tail -1 "$logs/pc.log")"
  else
    fail pkg-config "shared consumer failed (pkg-config: $(pkg-config --cflags --libs qcow2 2>&1))" "$logs/pc.log"
  fi

  # --- pkg-config (static) ---------------------------------------------------
  # -lqcow2 would pick libqcow2.so, installed next to libqcow2.a: ask for the
  # archive by name (what a static-only install would not need).
  exe="$tmp/consumer-pc-static"
  static_libs=$(pkg-config --static --libs qcow2 |
                sed -E 's/(^| )-lqcow2( |$)/\1-l:libqcow2.a\2/')
  # shellcheck disable=SC2046,SC2086
  if run pc-static.log "$cxx" -o "$exe" "$src/examples/consumer/main.cc" \
       $(pkg-config --cflags qcow2) $static_libs &&
     ! readelf -d "$exe" | grep -q 'NEEDED.*libqcow2' &&
     run pc-static.log "$exe" "$tmp/pc-static.qcow2"; then
    pass pkg-static "g++ ... \$(pkg-config --static --libs qcow2), libqcow2.a: $(tail -1 "$logs/pc-static.log")"
  else
    fail pkg-static "static consumer failed (libs: $static_libs)" "$logs/pc-static.log"
  fi

  # --- the epoll examples ----------------------------------------------------
  # Each with its own CMakeLists.txt (find_package) and with a pkg-config
  # command line, run from the installed prefix only.
  for ex in c_epoll cpp_epoll; do
    if [ "$ex" = c_epoll ]; then
      pc_build=("$cc" -std=c11 -Wall -Wextra -Werror -pedantic -O2 -o "$tmp/$ex-pc"
                "$src/examples/$ex/main.c")
    else
      pc_build=("$cxx" -std=c++17 -O2 -o "$tmp/$ex-pc" "$src/examples/$ex/main.cc")
    fi
    b="$tmp/$ex-cmake"
    mkdir -p "$tmp/$ex-cmake-run" "$tmp/$ex-pc-run"
    # shellcheck disable=SC2046
    if run "$ex.log" cmake -S "$src/examples/$ex" -B "$b" -DCMAKE_PREFIX_PATH="$prefix" \
         -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" &&
       run "$ex.log" cmake --build "$b" &&
       run "$ex.log" "$b/$ex" "$tmp/$ex-cmake-run" &&
       run "$ex.log" "${pc_build[@]}" $(pkg-config --cflags --libs qcow2) &&
       LD_LIBRARY_PATH="$libdir" run "$ex.log" "$tmp/$ex-pc" "$tmp/$ex-pc-run"; then
      checked=""
      if command -v qemu-img >/dev/null; then
        if run "$ex.log" qemu-img check -q "$tmp/$ex-cmake-run/overlay.qcow2" &&
           run "$ex.log" qemu-img check -q "$tmp/$ex-pc-run/overlay.qcow2"; then
          checked=", qemu-img check clean"
        else
          fail "$ex" "qemu-img check of the example's overlay failed" "$logs/$ex.log"
          continue
        fi
      fi
      pass "$ex" "find_package and pkg-config builds ran$checked: $(tail -1 "$logs/$ex.log" | grep -o 'libqcow2.*' || true)"
    else
      fail "$ex" "build or run from the installed prefix failed" "$logs/$ex.log"
    fi
  done
fi

# --- subdir --------------------------------------------------------------------
parent="$tmp/parent"
mkdir -p "$parent"
cp "$src/examples/consumer/main.cc" "$parent/main.cc"
cat >"$parent/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(parent LANGUAGES CXX)
add_subdirectory("$src" libqcow2)
add_executable(app main.cc)
target_link_libraries(app PRIVATE qcow2::qcow2)
EOF
pb="$parent/build"
# With --build: configured only (building would compile the library again).
subdir_full=1
[ -n "$reuse" ] && subdir_full=0
if run subdir.log cmake -S "$parent" -B "$pb" -DCMAKE_CXX_COMPILER="$cxx" &&
   { [ "$subdir_full" = 0 ] ||
     { run subdir.log nice -n 10 cmake --build "$pb" -j"$jobs" &&
       run subdir.log "$pb/app" "$tmp/subdir.qcow2"; }; }; then
  problems=()
  targets=$(cmake --build "$pb" --target help 2>/dev/null | sed -n 's/^\.\.\. //p')
  for t in qcowtool qcow2_testing qcow2_test_util qcow2_micro_bench; do
    echo "$targets" | grep -qx "$t" && problems+=("target $t exists")
  done
  echo "$targets" | grep -q '_test$' && problems+=("test targets exist")
  [ -n "$(find "$pb" -name qcowtool -type f)" ] && problems+=("qcowtool was built")
  [ -f "$pb/CTestTestfile.cmake" ] && grep -q 'libqcow2' "$pb/CTestTestfile.cmake" &&
    problems+=("tests registered")
  grep -q '^CMAKE_BUILD_TYPE:STRING=$' "$pb/CMakeCache.txt" ||
    problems+=("parent's CMAKE_BUILD_TYPE set: $(grep '^CMAKE_BUILD_TYPE:' "$pb/CMakeCache.txt")")
  grep -Eq '^QCOW2_BUILD_(TESTS|BENCH|TOOLS):BOOL=ON' "$pb/CMakeCache.txt" &&
    problems+=("QCOW2_BUILD_* ON")
  flags=$(cat "$pb/CMakeFiles/app.dir/flags.make")
  echo "$flags" | grep -Eq -- '-Wextra|-std=c\+\+2' &&
    problems+=("libqcow2's flags reached the parent's target: $(grep CXX_FLAGS "$pb/CMakeFiles/app.dir/flags.make")")
  if [ "$subdir_full" = 1 ]; then
    readelf -d "$pb/app" | grep -q 'NEEDED.*libqcow2\.so\.0' ||
      problems+=("app does not link libqcow2.so.0")
    ran="app: $(tail -1 "$logs/subdir.log")"
  else
    ran="configured only (--build)"
  fi
  if [ ${#problems[@]} -eq 0 ]; then
    pass subdir "add_subdirectory(): library only, parent's cache and flags untouched; $ran"
  else
    fail subdir "$(IFS=';'; echo "${problems[*]}")"
  fi
else
  fail subdir "parent project with add_subdirectory() failed" "$logs/subdir.log"
fi

if [ "$failed" -eq 0 ]; then
  echo "package_test: all checks passed in $((SECONDS - start)) s"
else
  echo "package_test: $failed check(s) FAILED ($((SECONDS - start)) s)"
  exit 1
fi
