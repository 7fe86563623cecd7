#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# `qcowtool serve --vhost-user-blk` against qemu-storage-daemon's
# vhost-user-blk export, in the same run, with vhost_bench (no VMM, no
# KVM): 4 KiB random reads and writes, 1 MiB sequential reads and writes,
# on an allocated image and on a fresh overlay over it. The front-end is
# first validated against QSD: a pattern written through every queue
# reads back, and qemu-img reads it from the image.
#   bench/vhost_bench.sh BUILD_DIR [SECONDS] [QUEUES] [DEPTH] [REPEATS]
#     [ROWS] [IMAGES]
# ROWS picks workloads (comma-separated from randread, randwrite, read,
# write; default all), IMAGES the images (allocated, overlay; default
# both): `bench/vhost_bench.sh build 5 2 32 9 write` runs only the 1 MiB
# sequential writes, 9 times each.
# Every row runs REPEATS times (default 3), ours and QSD in turn, the
# order swapped each time, so that a busy spell of the machine lands on
# both alike. Both servers use the page cache (QSD's default
# cache.direct=off; ours without --direct), QSD's image file on io_uring.
# Prints a markdown table of medians: IOPS, and the back-end's CPU
# microseconds per request (all its threads, io_uring's workers
# included), ours and QSD's, and the ratios; then the ratios within each
# round (the two servers ran back to back: the fairer comparison on a
# shared machine), the load average, and every run's numbers.
set -euo pipefail
build=$1 secs=${2:-5} queues=${3:-2} depth=${4:-32} repeats=${5:-3}
pick_rows=${6:-randread,randwrite,read,write} pick_images=${7:-allocated,overlay}
qcowtool=$build/qcowtool bench=$build/tests/vhost_bench
rows=()
for row in "randread 4096" "randwrite 4096" "read 1048576" "write 1048576"; do
  if [[ ",$pick_rows," == *",${row% *},"* ]]; then rows+=("$row"); fi
done
images=()
for kind in allocated overlay; do
  if [[ ",$pick_images," == *",$kind,"* ]]; then images+=("$kind"); fi
done
if [ ${#rows[@]} = 0 ] || [ ${#images[@]} = 0 ]; then
  echo "no such rows or images: '$pick_rows' '$pick_images'" >&2; exit 2
fi
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

run() {  # server kind rw bs: appends "kind rw bs server iops cpu" to results
  local s=$1 kind=$2 rw=$3 bs=$4 out load
  if [ "$kind" = allocated ]; then
    cp "$work/base.qcow2" "$work/img.qcow2"
  else
    cp "$work/base.qcow2" "$work/b2.qcow2"
    rm -f "$work/img.qcow2"
    qemu-img create -q -f qcow2 -b b2.qcow2 -F qcow2 "$work/img.qcow2"
  fi
  # The copy on disk before the run, not written back during it.
  sync "$work"/*.qcow2
  start "$s" "$work/img.qcow2"
  load=$(cut -d' ' -f1 /proc/loadavg)
  out=$("$bench" --socket "$work/sock" --pid "$server_pid" --queues "$queues" \
          --depth "$depth" --bs "$bs" --rw "$rw" --seconds "$secs")
  stop
  echo "$kind $rw $bs $s $(sed 's/.*iops=\([0-9]*\).*cpu_us_per_req=\([0-9.]*\).*/\1 \2/' <<<"$out") $load" \
    >>"$work/results"
  echo "  $kind $rw $bs $s: $out load=$load" >&2
}

echo "$queues queues, depth $depth each, $secs s per run, $repeats runs per row" >&2
for ((r = 0; r < repeats; r++)); do
  order="ours qsd"
  ((r % 2)) && order="qsd ours"
  for kind in "${images[@]}"; do
    for row in "${rows[@]}"; do
      for s in $order; do run $s $kind $row; done
    done
  done
done

python3 - "$work/results" "$queues" "$depth" "$secs" "$repeats" <<'PY'
import statistics, sys
path, queues, depth, secs, repeats = sys.argv[1:]
runs = {}
loads = []
for line in open(path):
    kind, rw, bs, server, iops, cpu, load = line.split()
    runs.setdefault((kind, rw, int(bs)), {}).setdefault(server, []).append(
        (float(iops), float(cpu)))
    loads.append(float(load))
names = {"randread": "4 KiB random read", "randwrite": "4 KiB random write",
         "read": "1 MiB sequential read", "write": "1 MiB sequential write"}
print(f"\n{queues} queues, depth {depth} each, {secs} s per run, "
      f"median of {repeats} runs (ours and QSD in turn)\n")
print("| workload | image | ours IOPS | QSD IOPS | IOPS ours/QSD | "
      "ours CPU us/req | QSD CPU us/req | CPU ours/QSD |")
print("|---|---|---|---|---|---|---|---|")
def measured():  # (kind, rw, ours' runs, QSD's runs) in table order
    for kind in ("allocated", "overlay"):
        for rw in ("randread", "randwrite", "read", "write"):
            for key, by in runs.items():
                if key[:2] == (kind, rw):
                    yield kind, rw, by["ours"], by["qsd"]
for kind, rw, o, q in measured():
    oi = statistics.median(x[0] for x in o)
    qi = statistics.median(x[0] for x in q)
    oc = statistics.median(x[1] for x in o)
    qc = statistics.median(x[1] for x in q)
    print(f"| {names[rw]} | {kind} | {oi:.0f} | {qi:.0f} | {oi / max(qi, 1):.2f} "
          f"| {oc:.1f} | {qc:.1f} | {oc / max(qc, 1e-9):.2f} |")
# Ours and QSD ran back to back in each round: the ratio within a round
# leaves out most of what the machine's load does to both.
print("\nRatios within each round (ours/QSD): median (lowest-highest), "
      "and the rounds where ours is at or above QSD\n")
print("| workload | image | IOPS ours/QSD | CPU us/req ours/QSD | "
      "rounds ours IOPS >= QSD | rounds ours CPU <= QSD |")
print("|---|---|---|---|---|---|")
for kind, rw, o, q in measured():
    ri = [a[0] / max(b[0], 1) for a, b in zip(o, q)]
    rc = [a[1] / max(b[1], 1e-9) for a, b in zip(o, q)]
    print(f"| {names[rw]} | {kind} | {statistics.median(ri):.2f} "
          f"({min(ri):.2f}-{max(ri):.2f}) | {statistics.median(rc):.2f} "
          f"({min(rc):.2f}-{max(rc):.2f}) | {sum(r >= 1 for r in ri)} of "
          f"{len(ri)} | {sum(r <= 1 for r in rc)} of {len(rc)} |")
print(f"\nLoad average (1 min) at the runs' starts: {min(loads):.1f}-{max(loads):.1f}, "
      f"median {statistics.median(loads):.1f}")
print("\nEvery run (IOPS / CPU us per request):\n")
for key, by in sorted(runs.items()):
    for server in ("ours", "qsd"):
        cells = ", ".join(f"{i:.0f} / {c:.1f}" for i, c in by[server])
        print(f"- {key[0]} {names[key[1]]}, {server}: {cells}")
PY
