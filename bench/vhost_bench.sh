#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# `qcowtool serve --vhost-user-blk` against qemu-storage-daemon's
# vhost-user-blk export, in the same run, with vhost_bench (no VMM, no
# KVM): 4 KiB random reads and writes, 1 MiB sequential reads and writes,
# on an allocated image and on a fresh overlay over it. The front-end is
# first validated against QSD: a pattern written through every queue
# reads back, and qemu-img reads it from the image.
#   bench/vhost_bench.sh BUILD_DIR [SECONDS] [QUEUES] [DEPTH]
# Prints a markdown table: IOPS, and the back-end's CPU microseconds per
# request (all its threads), ours and QSD's.
set -euo pipefail
build=$1 secs=${2:-5} queues=${3:-2} depth=${4:-32}
qcowtool=$build/qcowtool bench=$build/tests/vhost_bench
work=$(mktemp -d /tmp/vhost_bench.XXXXXX)
server_pid=
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

start() {  # ours|qsd IMAGE
  rm -f "$work/sock"
  if [ "$1" = ours ]; then
    "$qcowtool" serve --vhost-user-blk "$work/sock" --num-queues "$queues" "$2" 2>>"$work/server.log" &
  else
    qemu-storage-daemon \
      --blockdev "driver=qcow2,node-name=disk,file.driver=file,file.filename=$2,file.aio=io_uring" \
      --export "type=vhost-user-blk,id=e,node-name=disk,addr.type=unix,addr.path=$work/sock,writable=on,num-queues=$queues" 2>>"$work/server.log" &
  fi
  server_pid=$!
  for _ in $(seq 100); do [ -S "$work/sock" ] && return; sleep 0.1; done
  echo "no socket from $1" >&2; exit 1
}
stop() { kill "$server_pid"; wait "$server_pid" || true; server_pid=; }

# --- validation against QSD ---------------------------------------------
qemu-img create -q -f qcow2 "$work/v.qcow2" 64M
start qsd "$work/v.qcow2"
"$bench" --socket "$work/sock" --queues "$queues" --verify --bs 65536
stop
python3 - "$work/v.qcow2" <<'PY'
import subprocess, sys
subprocess.run(["qemu-img", "convert", "-O", "raw", sys.argv[1], sys.argv[1] + ".raw"],
               check=True)
raw = open(sys.argv[1] + ".raw", "rb").read(8 << 20)
want = bytes((((o >> 9) * 7 + (o & 511)) & 255) for o in range(8 << 20))
sys.exit(0 if raw == want else "qemu-img reads another pattern than vhost_bench wrote")
PY
echo "front-end validated against qemu-storage-daemon"

# --- images --------------------------------------------------------------
size=256M
qemu-img create -q -f qcow2 "$work/base.qcow2" $size
qemu-io -f qcow2 -c "write -P 0x33 0 $size" "$work/base.qcow2" >/dev/null

row() {  # label rw bs image-kind
  local label=$1 rw=$2 bs=$3 kind=$4 out=()
  for s in ours qsd; do
    if [ "$kind" = allocated ]; then
      cp "$work/base.qcow2" "$work/img.qcow2"
    else
      cp "$work/base.qcow2" "$work/b2.qcow2"
      rm -f "$work/img.qcow2"
      qemu-img create -q -f qcow2 -b b2.qcow2 -F qcow2 "$work/img.qcow2"
    fi
    start $s "$work/img.qcow2"
    out+=("$("$bench" --socket "$work/sock" --pid "$server_pid" --queues "$queues" \
             --depth "$depth" --bs "$bs" --rw "$rw" --seconds "$secs")")
    stop
  done
  local oi oc qi qc
  oi=$(sed 's/.*iops=\([0-9]*\).*/\1/' <<<"${out[0]}")
  oc=$(sed 's/.*cpu_us_per_req=\([0-9.]*\).*/\1/' <<<"${out[0]}")
  qi=$(sed 's/.*iops=\([0-9]*\).*/\1/' <<<"${out[1]}")
  qc=$(sed 's/.*cpu_us_per_req=\([0-9.]*\).*/\1/' <<<"${out[1]}")
  printf "| %s | %s | %s | %s | %s | %s | %.2f |\n" "$label" "$kind" "$oi" "$qi" "$oc" "$qc" \
    "$(python3 -c "print($oi / max($qi, 1))")"
}

echo
echo "$queues queues, depth $depth each, $secs s per run"
echo
echo "| workload | image | ours IOPS | QSD IOPS | ours CPU us/req | QSD CPU us/req | IOPS ours/QSD |"
echo "|---|---|---|---|---|---|---|"
for kind in allocated overlay; do
  row "4 KiB random read" randread 4096 $kind
  row "4 KiB random write" randwrite 4096 $kind
  row "1 MiB sequential read" read 1048576 $kind
  row "1 MiB sequential write" write 1048576 $kind
done
