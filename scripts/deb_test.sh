#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks the Debian packages as a user of a second machine gets them:
#
#   build      a clean clone of the committed HEAD (in a temporary
#              directory) builds libqcow2-0, libqcow2-dev and qcowtool with
#              scripts/package.sh
#   lintian    reports no errors on them (when lintian is installed)
#   install    `apt-get install ./*.deb` of the three succeeds with their
#              declared dependencies
#   tool       with only what the packages installed (a clean environment,
#              no build tree on any path): qcowtool --version, create, io
#              (write, then read back the pattern), check; qemu-img check of
#              the image and qemu-io's reading of the data; dd; serve
#              (the installed nbdkit plugin) read by nbdinfo
#   man        `man qcowtool` renders and has every command's section;
#              `man 3 libqcow2` renders
#   pkg-config examples/c_epoll (C11, the C API) built with
#              `pkg-config --cflags --libs qcow2` and run
#   cmake      examples/consumer built with find_package(qcow2) (shared and
#              static) and run
#   remove     the packages are purged again, with any package their
#              installation pulled in; this happens on failure too (trap),
#              so the machine is left as it was found
#
# Refuses to run (exit 2) when any of the three packages is installed
# already: it would not know what state to leave behind. Needs root or
# sudo. About 3-4 minutes on 2 cores (mostly the package build).
#   QCOW2_DEB_KEEP=1  keep the temporary directory (printed)
#   QCOW2_PACKAGE_JOBS, QCOW2_CMAKE_ARGS  as for scripts/package.sh
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
packages=(qcowtool libqcow2-dev libqcow2-0)
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
apt_get() {
  # Waits for another apt or dpkg run (e.g. bootstrap elsewhere) to finish.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 \
    -y -qq --no-install-recommends "$@"
}
installed_packages() {
  dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" { print $2 }' | sort
}

for p in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    echo "deb_test: $p is installed already; remove it first (apt-get purge ${packages[*]})" >&2
    exit 2
  fi
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/deb_test.XXXXXX")
logs="$tmp/logs"
mkdir -p "$logs"
before="$tmp/packages-before"
installed_packages >"$before"
installing=0
cleanup() {
  local rc=$?
  if [ "$installing" = 1 ]; then
    apt_get purge "${packages[@]}" >"$logs/purge.log" 2>&1 || true
    # Whatever the installation pulled in goes too.
    mapfile -t extra < <(comm -13 "$before" <(installed_packages))
    if [ ${#extra[@]} -gt 0 ]; then
      apt_get purge "${extra[@]}" >>"$logs/purge.log" 2>&1 || true
    fi
    if comm -3 "$before" <(installed_packages) | grep -q .; then
      echo "deb_test: FAIL remove: the installed packages differ from before:" >&2
      comm -3 "$before" <(installed_packages) >&2
      rc=1
    else
      echo "ok remove: the packages and what they pulled in are purged"
    fi
  fi
  if [ "${QCOW2_DEB_KEEP:-0}" = 1 ]; then
    echo "deb_test: kept $tmp"
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT

failures=0
pass() { echo "ok $1: $2"; }
fail() {
  echo "FAIL $1: $2"
  [ -n "${3:-}" ] && [ -f "$3" ] && sed 's/^/    /' "$3" | tail -30
  failures=$((failures + 1))
}

# --- build ---------------------------------------------------------------
git clone -q --no-hardlinks "$src" "$tmp/src"
if ! bash "$tmp/src/scripts/package.sh" --out "$tmp/debs" \
     >"$logs/build.log" 2>&1; then
  fail build "scripts/package.sh failed from a clean clone" "$logs/build.log"
  exit 1
fi
debs=("$tmp"/debs/*.deb)
pass build "$(cd "$tmp/debs" && echo *.deb)"
for p in "${packages[@]}"; do
  [ -f "$(echo "$tmp"/debs/"${p}"_*.deb)" ] || fail build "no $p package"
done
for deb in "${debs[@]}"; do
  echo "   $(dpkg-deb -f "$deb" Package): Depends: $(dpkg-deb -f "$deb" Depends)"
done

# --- lintian -------------------------------------------------------------
if command -v lintian >/dev/null; then
  # Its own TMPDIR: lintian 2.116 leaves mldbm-elf-* directories behind.
  mkdir -p "$tmp/lintian-tmp"
  TMPDIR="$tmp/lintian-tmp" lintian --fail-on error --tag-display-limit 0 "${debs[@]}" \
    >"$logs/lintian.log" 2>&1 &&
    lintian_rc=0 || lintian_rc=$?
  if [ "$lintian_rc" = 0 ]; then
    pass lintian "no errors ($(grep -c '^W:' "$logs/lintian.log" || true) warnings)"
  else
    fail lintian "errors reported" "$logs/lintian.log"
  fi
else
  echo "skip lintian: not installed"
fi

# --- install -------------------------------------------------------------
installing=1
if apt_get install "${debs[@]}" >"$logs/install.log" 2>&1; then
  pass install "apt-get install of the three packages"
else
  fail install "apt-get install failed" "$logs/install.log"
  exit 1
fi

# Only what the packages installed: a clean environment and a directory
# far from the build.
work="$tmp/work"
mkdir -p "$work"
clean() { (cd "$work" && exec env -i PATH=/usr/bin:/bin HOME="$work" LC_ALL=C.UTF-8 "$@"); }

# --- tool ----------------------------------------------------------------
# Each step logged, the first failure ends the check (set -e does not
# work inside a function called from an && list).
step() { echo "+ $*"; "$@"; }
tool_check() {
  step test "$(clean sh -c 'command -v qcowtool')" = /usr/bin/qcowtool || return 1
  step sh -c "! ldd /usr/bin/qcowtool | grep -e 'not found' -e '$tmp' -e '$src'" || return 1
  clean qcowtool --version | step grep -x "qcowtool version .* (libqcow2 .*)" || return 1
  step clean qcowtool create -q -f qcow2 disk.qcow2 64M || return 1
  step clean qcowtool io -c "write -P 0x5a 1M 3M" -c "write -z 8M 1M" disk.qcow2 || return 1
  step clean qcowtool io -r -c "read -P 0x5a 1M 3M" -c "read -P 0 8M 1M" disk.qcow2 || return 1
  step clean qcowtool check disk.qcow2 || return 1
  step clean qemu-img check disk.qcow2 || return 1
  clean qemu-io -r -c "read -P 0x5a 1M 3M" disk.qcow2 | step grep "read 3145728/3145728" || return 1
  step clean qcowtool dd -O raw if=disk.qcow2 of=copy.raw bs=1M count=4 || return 1
  step test "$(stat -c %s "$work/copy.raw")" = 4194304 || return 1
  step clean qemu-img convert -O raw disk.qcow2 full.raw || return 1
  step cmp -n 4194304 "$work/full.raw" "$work/copy.raw" || return 1
  step ls /usr/lib/*/nbdkit/plugins/nbdkit-libqcow2-plugin.so || return 1
  serve_check
}
# qcowtool serve finds the installed plugin: nbdinfo reads the size.
serve_check() {
  local sock="$work/nbd.sock" pid size i
  clean qcowtool serve --socket "$sock" -r disk.qcow2 >"$logs/serve.log" 2>&1 &
  pid=$!
  for i in $(seq 100); do
    [ -S "$sock" ] && break
    sleep 0.1
  done
  size=$(clean nbdinfo --size "nbd+unix:///?socket=$sock")
  echo "+ nbdinfo --size: $size"
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  step test "$size" = 67108864
}
if tool_check >"$logs/tool.log" 2>&1; then
  pass tool "create, io, check, dd, serve from /usr/bin/qcowtool; qemu-img check clean, qemu-io and nbdinfo read it"
else
  fail tool "a step failed (the last one in the log)" "$logs/tool.log"
fi

# --- man -----------------------------------------------------------------
verbs=$(clean qcowtool --help | sed -n '/^Commands:/,/^$/s/^  \([a-z]*\) .*/\1/p')
if clean env MANWIDTH=100 man qcowtool >"$logs/man.txt" 2>"$logs/man.err" &&
   clean env MANWIDTH=100 man 3 libqcow2 >"$logs/man3.txt" 2>>"$logs/man.err" &&
   grep -q "qcow2_image_open" "$logs/man3.txt"; then
  missing=""
  for v in $verbs; do
    grep -q "^qcowtool ${v^^}\$" "$logs/man.txt" || missing="$missing $v"
  done
  if [ -z "$missing" ] && [ ! -s "$logs/man.err" ]; then
    pass man "man qcowtool ($(wc -l <"$logs/man.txt") lines, $(echo $verbs | wc -w) command sections) and man 3 libqcow2 render"
  else
    fail man "sections missing:${missing:- none}; stderr: $(cat "$logs/man.err")"
  fi
else
  fail man "man qcowtool or man 3 libqcow2 failed" "$logs/man.err"
fi

# --- pkg-config ----------------------------------------------------------
mkdir -p "$work/c_epoll-run"
cp "$src/examples/c_epoll/main.c" "$work/c_epoll.c"
# shellcheck disable=SC2016
if clean sh -c 'cc -std=c11 -Wall -Wextra -Werror -pedantic -O2 -o c_epoll c_epoll.c $(pkg-config --cflags --libs qcow2)' \
     >"$logs/pc.log" 2>&1 &&
   clean ./c_epoll "$work/c_epoll-run" >>"$logs/pc.log" 2>&1 &&
   clean qemu-img check -q "$work/c_epoll-run/overlay.qcow2" >>"$logs/pc.log" 2>&1; then
  pass pkg-config "C program built with pkg-config --cflags --libs qcow2 ran; qemu-img check clean"
else
  fail pkg-config "build or run failed" "$logs/pc.log"
fi

# --- cmake ---------------------------------------------------------------
cp -r "$src/examples/consumer" "$work/consumer"
for kind in shared static; do
  static=OFF
  [ "$kind" = static ] && static=ON
  if clean cmake -S consumer -B "consumer-$kind" -DQCOW2_CONSUMER_STATIC=$static \
       >"$logs/cmake-$kind.log" 2>&1 &&
     clean cmake --build "consumer-$kind" >>"$logs/cmake-$kind.log" 2>&1 &&
     clean "./consumer-$kind/consumer" "$kind.qcow2" >>"$logs/cmake-$kind.log" 2>&1 &&
     grep -q "from /usr/lib/.*/cmake/qcow2" "$logs/cmake-$kind.log"; then
    pass "cmake-$kind" "find_package(qcow2) consumer built and ran"
  else
    fail "cmake-$kind" "build or run failed" "$logs/cmake-$kind.log"
  fi
done

echo "deb_test: $failures failures (${SECONDS} s)"
[ "$failures" -eq 0 ]
