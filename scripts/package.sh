#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the Debian packages libqcow2-0, libqcow2-dev and qcowtool from this
# tree with CPack's DEB generator (cmake/packaging.cmake): a build tree of
# its own configured for /usr (library, qcowtool, nbdkit plugin, man pages;
# no tests or benchmarks), then `cpack -G DEB`.
#
#   scripts/package.sh [--build DIR] [--out DIR]
#   --build DIR  the build tree (default: build-deb; reused when there)
#   --out DIR    where the .deb files are copied (default: the build tree's
#                packages/ directory); their paths are printed, one a line
#   QCOW2_PACKAGE_JOBS  build parallelism (default: nproc)
#   QCOW2_CMAKE_ARGS    extra cmake arguments (e.g. a compiler launcher)
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-deb
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="${2:?--build needs a directory}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    *) echo "package.sh: unknown argument '$1' (usage: $0 [--build DIR] [--out DIR])" >&2
       exit 2 ;;
  esac
done
for tool in cpack dpkg-deb dpkg-shlibdeps fakeroot; do
  command -v "$tool" >/dev/null ||
    { echo "package.sh: $tool is missing (scripts/bootstrap.sh installs it)" >&2; exit 1; }
done

# shellcheck disable=SC2086
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_INSTALL_PREFIX=/usr -DQCOW2_DEB_LAYOUT=ON \
  -DQCOW2_BUILD_TESTS=OFF -DQCOW2_BUILD_BENCH=OFF -DQCOW2_BUILD_TOOLS=ON \
  ${QCOW2_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"${QCOW2_PACKAGE_JOBS:-$(nproc)}" >/dev/null
rm -rf "$build/packages"
# fakeroot: files owned by root in the packages whoever builds them.
(cd "$build" && fakeroot cpack -G DEB --config CPackConfig.cmake >/dev/null)
mkdir -p "${out:=$build/packages}"
for deb in "$build"/packages/*.deb; do
  [ "$out" -ef "$build/packages" ] || cp "$deb" "$out/"
  echo "$out/$(basename "$deb")"
done
