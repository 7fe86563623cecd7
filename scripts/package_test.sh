#!/usr/bin/env bash
# Checks libqcow2 as a package, the way a hypervisor would consume it:
#
#   install     a fresh build (tests, benchmarks, fuzzers off) installed with
#               `cmake --install` into a temporary prefix: headers (with the
#               generated qcow2/version.h), libqcow2.so.0 and libqcow2.a, the
#               CMake package, qcow2.pc, qcowtool
#   symbols     `nm -D --defined-only` of the installed libqcow2.so exports
#               only qcow2:: (nothing in qcow2::internal, no test doubles
#               MemoryFile/FaultFile/GateFile, no Abseil, no std::)
#   cmake       examples/consumer built with find_package(qcow2) against
#               qcow2::qcow2 (shared) and qcow2::qcow2_static, and run
#   pkg-config  examples/consumer built with
#               g++ $(pkg-config --cflags --libs qcow2), and run
#   pkg-static  the same linking libqcow2.a (pkg-config --static), and run
#   subdir      a parent project that add_subdirectory()s the repository
#               builds only the library (no qcowtool, tests, benchmarks),
#               without touching its build type or compile flags, and its
#               program linked to qcow2::qcow2 runs
#
# The consumer creates an image, writes and reads back 4 KiB and prints
# qcow2::VersionString(). One line per check; exits 1 if any failed.
# Builds the library twice (about 25 min on 2 busy cores).
#   QCOW2_PACKAGE_JOBS  build parallelism (default: nproc)
#   QCOW2_PACKAGE_KEEP  1: keep the temporary directory (printed) for a look
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
jobs="${QCOW2_PACKAGE_JOBS:-$(nproc)}"
cxx="${CXX:-g++}"

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
build="$tmp/build"
if run install.log cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
     -DQCOW2_BUILD_TESTS=OFF -DQCOW2_BUILD_BENCH=OFF -DQCOW2_BUILD_FUZZ=OFF &&
   run install.log nice -n 10 cmake --build "$build" -j"$jobs" &&
   run install.log cmake --install "$build" --prefix "$prefix"; then
  missing=()
  for f in include/qcow2/image.h include/qcow2/file.h include/qcow2/export.h \
           include/qcow2/version.h bin/qcowtool share/doc/libqcow2/LICENSE; do
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
          grep -E 'MemoryFile|FaultFile|GateFile' "$tmp/syms" || true
          grep -vE '^qcow2::' "$tmp/names" || true) | sort -u)
  if [ "$total" -gt 0 ] && [ -z "$bad" ]; then
    mention=$(grep -c 'qcow2::internal' "$tmp/syms" || true)
    pass symbols "$total exported, all qcow2:: public API ($mention take an opaque qcow2::internal pointer: Image/Queue's private constructors)"
  else
    fail symbols "$total exported; not public API: $(echo "$bad" | head -5 | tr '\n' ';')"
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
if run subdir.log cmake -S "$parent" -B "$pb" -DCMAKE_CXX_COMPILER="$cxx" &&
   run subdir.log nice -n 10 cmake --build "$pb" -j"$jobs" &&
   run subdir.log "$pb/app" "$tmp/subdir.qcow2"; then
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
  readelf -d "$pb/app" | grep -q 'NEEDED.*libqcow2\.so\.0' ||
    problems+=("app does not link libqcow2.so.0")
  if [ ${#problems[@]} -eq 0 ]; then
    pass subdir "add_subdirectory(): library only, parent's cache and flags untouched; app: $(tail -1 "$logs/subdir.log")"
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
