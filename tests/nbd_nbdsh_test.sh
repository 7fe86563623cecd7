#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# nbdsh scripts (tests/nbdsh/*.py, python3-libnbd's shell) against
# `qcowtool serve` and qemu-nbd, each on its own copy of one qcow2 chain;
# every script's output must be equal between the two servers:
#   options.py   (nbdsh --opt-mode -u) LIST, LIST_META_CONTEXT, INFO with
#                block sizes, GO with an unknown context, the flags, DISC
#   abort.py     (nbdsh --opt-mode -u) ABORT
#   commands.py  (nbdsh -c) every command, strict mode, structured replies
#                on and then off; CACHE's copy-on-read shows in
#                qemu:allocation-depth
#   errors.py    (nbdsh -c) past the end, unknown flags, an unknown meta
#                context, strict and not
#   readonly.py  (nbdsh -u) on a read-only export (-r on both servers)
# Lines "P name got expected" are where the protocol document prescribes
# an errno that qemu-nbd 7.2 does not give (ENOSPC, EPERM): ours must give
# `expected`, qemu-nbd an error. Lines "D name got expected" are known
# differences (docs/serving.md): ours must give `expected`.
# Then qemu-io: one seeded script of random I/O through ours, the same
# script on a copy of the image; the outputs (timings dropped) and the
# images (qemu-img compare) must be equal, and qemu-img check clean.
# Usage: nbd_nbdsh_test.sh QCOWTOOL   (exit 77: a tool is missing)
set -eu
qcowtool=$(realpath "$1")
here=$(dirname "$(realpath "$0")")
# python3-libnbd is in the system Python, not in a pyenv.
export PATH=/usr/bin:$PATH
for tool in nbdsh nbdinfo qemu-nbd qemu-img qemu-io; do
  command -v $tool >/dev/null || { echo "$tool is not installed: skipped"; exit 77; }
done
python3 -c 'import nbd' 2>/dev/null || { echo "python3-libnbd is not installed: skipped"; exit 77; }

d=$(mktemp -d "${TMPDIR:-/tmp}/qcow2-nbdsh.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$d"
}
trap cleanup EXIT
export NBDSH_COMMON=$here/nbdsh/common.py
MiB=$((1 << 20))
SIZE=$((16 * MiB))

make_chain() {  # DIR
  qemu-img create -q -f qcow2 "$1/base.qcow2" $SIZE
  qemu-io -f qcow2 -c "write -P 0x11 0 1M" -c "write -P 0x22 4M 256k" \
    "$1/base.qcow2" >/dev/null
  qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$1/top.qcow2"
  qemu-io -f qcow2 -c "write -P 0x33 512k 1M" -c "write -z 8M 1M" \
    -c "write -P 0x44 12M 64k" "$1/top.qcow2" >/dev/null
}

pid=
start() {  # KIND DIR [-r]
  local sock=$2/nbd.sock
  if [ "$1" = ours ]; then
    "$qcowtool" serve --socket "$sock" --export-name disk ${3:-} \
      "$2/top.qcow2" 2>"$2/server.log" &
  else
    qemu-nbd -k "$sock" -f qcow2 -t -e 8 -x disk -A --cache=writeback \
      --discard=unmap ${3:-} "$2/top.qcow2" 2>"$2/server.log" &
  fi
  pid=$!
  pids+=($pid)
  for _ in $(seq 6000); do
    [ -S "$sock" ] && nbdinfo --size "nbd+unix:///disk?socket=$sock" \
      >/dev/null 2>&1 && return 0
    kill -0 $pid 2>/dev/null || { cat "$2/server.log"; return 1; }
    sleep 0.01
  done
  echo "no server on $sock"; return 1
}

stop() {  # DIR: SIGTERM, a clean exit, qemu-img check clean
  kill -TERM $pid
  local rc=0
  wait $pid || rc=$?
  if [ $rc -ne 0 ] && [ "$kind" = ours ]; then
    echo "qcowtool serve exited $rc:"; cat "$1/server.log"; return 1
  fi
  qemu-img check -q "$1/top.qcow2"
}

# One nbdsh run: its output, and its exit status if it failed (a Python
# exception is part of what is compared).
script() {  # LABEL SCRIPT NBDSH-ARGS...
  local label=$1 file=$here/nbdsh/$2
  shift 2
  echo "== $label"
  nbdsh "$@" -c - <"$file" 2>&1 || echo "nbdsh exited $?"
}

# A fresh copy of the chain on a fresh server for each group of scripts.
serve_and_run() {  # KIND NAME SERVER-FLAG -- script calls...
  local w=$d/$1-$2 flag=$3
  mkdir -p "$w"; make_chain "$w"
  start "$1" "$w" $flag
  export NBD_URI="nbd+unix:///disk?socket=$w/nbd.sock"
  shift 4
  "$@"
  stop "$w"
}

rw_scripts() {
  script options options.py --opt-mode -u "$NBD_URI"
  script abort abort.py --opt-mode -u "$NBD_URI"
  script errors errors.py
  NBDSH_STRUCTURED=1 script "commands, structured replies" commands.py
}
simple_scripts() {
  NBDSH_STRUCTURED=0 script "commands, simple replies" commands.py
}
ro_scripts() {
  script read-only readonly.py -u "$NBD_URI"
}

run_scripts() {  # KIND -> $d/KIND.out
  kind=$1
  {
    serve_and_run "$kind" rw "" -- rw_scripts
    serve_and_run "$kind" simple "" -- simple_scripts
    serve_and_run "$kind" ro -r -- ro_scripts
  } >"$d/$kind.out"
}

fail=0
run_scripts ours
run_scripts qemu
# The prescribed errno lines: ours exactly, qemu-nbd some error.
while read -r _ name got expected; do
  if [ "$got" != "$expected" ]; then
    echo "ours: $name: $got, expected $expected"; fail=1
  fi
done < <(grep '^[PD] ' "$d/ours.out")
while read -r _ name got expected; do
  [ "$got" = ok ] && { echo "qemu-nbd: $name: no error"; fail=1; }
done < <(grep '^P ' "$d/qemu.out")
if ! diff -u <(grep -v '^[PD] ' "$d/qemu.out") <(grep -v '^[PD] ' "$d/ours.out"); then
  echo "FAILED: the nbdsh outputs differ (- qemu-nbd, + ours)"; fail=1
fi
if grep -q 'nbdsh exited' "$d/ours.out"; then
  cat "$d/ours.out"; fail=1
fi
echo "nbdsh: $(grep -vc '^==' "$d/ours.out") lines compared with qemu-nbd"

# qemu-io random I/O through the export, and the same on a copy.
w=$d/qemu-io; mkdir -p "$w"; make_chain "$w"
cp "$w/top.qcow2" "$w/copy.qcow2"
python3 "$here/nbdsh/qemu_io_script.py" $SIZE 200 43 >"$w/script"
kind=ours
start ours "$w"
filter() { grep -v 'ops/sec' | sed 's/ (.*//'; }
qemu-io -f raw "nbd+unix:///disk?socket=$w/nbd.sock" <"$w/script" 2>&1 |
  filter >"$w/nbd.out"
stop "$w"
qemu-io -f qcow2 "$w/copy.qcow2" <"$w/script" 2>&1 | filter >"$w/local.out"
if ! diff -q "$w/nbd.out" "$w/local.out" >/dev/null; then
  diff -u "$w/local.out" "$w/nbd.out" | head -40
  echo "FAILED: qemu-io through the export differs from qemu-io on a copy"
  fail=1
fi
qemu-img check -q "$w/copy.qcow2"
qemu-img compare -q "$w/copy.qcow2" "$w/top.qcow2" ||
  { echo "FAILED: qemu-img compare: the images differ"; fail=1; }
echo "qemu-io: $(grep -c . "$w/nbd.out") lines and the images equal"
[ $fail -eq 0 ] && echo "all equal to qemu-nbd"
exit $fail
