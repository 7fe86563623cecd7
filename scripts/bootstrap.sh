#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs whatever build and test dependencies are missing (Debian 12
# packages only), then configures and builds into ./build.
#   QCOW2_BUILD_DIR   build directory (default: build)
#   QCOW2_CMAKE_ARGS  extra arguments for cmake (e.g. -DQCOW2_SANITIZE=thread)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake make pkg-config liburing-dev zlib1g-dev libzstd-dev
          libabsl-dev libgtest-dev libbenchmark-dev qemu-utils python3
          clang libclang-rt-14-dev nbdkit nbdkit-plugin-dev libnbd-bin fio
          dpkg-dev fakeroot file lintian man-db cargo
          libgnutls28-dev gnutls-bin python3-libnbd nettle-dev
          qemu-system-x86 qemu-system-common busybox-static cpio e2fsprogs)
if [ -n "${QCOW2_EXTRA_PACKAGES:-}" ]; then
  read -r -a extra <<<"$QCOW2_EXTRA_PACKAGES"
  packages+=("${extra[@]}")
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build_dir="${QCOW2_BUILD_DIR:-build}"
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${QCOW2_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
