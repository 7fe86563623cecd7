#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# LUKS-encrypted qcow2 side by side with QEMU's block layer, in one run.
#
# qemu-img 7.2's `bench` takes no --object, so it cannot open an encrypted
# image. qemu-io can (--object, --image-opts) and has aio_read/aio_write/
# aio_flush: each row feeds it, on stdin, COUNT requests as batches of
# DEPTH aio_* commands each followed by aio_flush (which waits for the
# batch), so that up to DEPTH requests are in flight. `qcowtool bench
# pattern` runs the same COUNT requests of the same size at the same
# offsets (0, SIZE, 2*SIZE, ... one pass over the image) with DEPTH in
# flight, on the same image. Both are timed as whole processes (open,
# key-slot unlock and close included), best of ROUNDS by wall time.
#
# Validation: before the timed runs, each qemu-io script runs once
# without -q and the bytes of its "read N/N bytes" / "wrote N/N bytes"
# completion lines must add up to COUNT * SIZE; each qcowtool run must
# report COUNT * SIZE guest bytes.
#
# CPU cost per byte: user + system CPU time of the best run over the bytes
# moved, for the encrypted image and for an unencrypted one (same size,
# same fill), both tools; the difference is what the cipher costs.
#
# Calibration of the qemu-io harness: on the unencrypted image, which
# qemu-img bench can open, the same row through `qemu-img bench -c COUNT
# -d DEPTH -s SIZE [-w]` beside the qemu-io script (qemu-io parses one
# command per request and drains every DEPTH requests, so it is slower
# than qemu-img bench by what these two columns show). The "est" column
# takes that harness cost (qemu-io plain - qemu-img bench plain) off the
# qemu-io LUKS time: an estimate of what qemu-img bench would take on the
# encrypted image if it could open one, and "e/ours" compares it with us.
#
#   bench/luks_bench.sh [QCOWTOOL]
# Environment: DIR (default: a new directory in /dev/shm), MIB (image size,
# default 128), DEPTH (32), ROUNDS (3), QEMU_AIO (qemu-io -i: threads),
# KEEP=1 keeps DIR.
set -euo pipefail

QCOWTOOL=${1:-build/qcowtool}
MIB=${MIB:-128}
DEPTH=${DEPTH:-32}
ROUNDS=${ROUNDS:-3}
QEMU_AIO=${QEMU_AIO:-threads}
DIR=${DIR:-$(mktemp -d /dev/shm/luks-bench.XXXXXX)}
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$DIR"' EXIT

PASS=bench-pass
OBJ="secret,id=s0,data=$PASS"
ENC=$DIR/enc.qcow2
PLAIN=$DIR/plain.qcow2
opts() {  # --image-opts string of an image; the secret only if encrypted
  if [ "$1" = "$ENC" ]; then
    echo "driver=qcow2,file.filename=$1,encrypt.key-secret=s0"
  else
    echo "driver=qcow2,file.filename=$1"
  fi
}

echo "setting up $MIB MiB images in $DIR" >&2
# QEMU's PBKDF2 timing fails now and then on a busy machine ("Unable to
# get accurate CPU usage"): try again.
for try in 1 2 3 4 5; do
  qemu-img create -q -f qcow2 --object "$OBJ" \
    -o encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10 \
    "$ENC" "${MIB}M" && break
  [ "$try" = 5 ] && exit 1
done
qemu-img create -q -f qcow2 "$PLAIN" "${MIB}M"
for img in "$ENC" "$PLAIN"; do
  qemu-io --object "$OBJ" --image-opts "$(opts "$img")" \
    -c "write -P 1 0 ${MIB}M" >/dev/null
done

# The qemu-io script of one row: COUNT aio_* of SIZE bytes in batches of
# DEPTH, each batch followed by aio_flush. $4 is -q or empty.
script() {  # op size count quiet
  awk -v op="$1" -v size="$2" -v n="$3" -v d="$DEPTH" -v q="$4" 'BEGIN {
    for (i = 0; i < n; i++) {
      if (op == "read") printf "aio_read %s %d %d\n", q, i * size, size;
      else printf "aio_write %s -P 0 %d %d\n", q, i * size, size;
      if (i % d == d - 1 || i == n - 1) print "aio_flush";
    }
  }'
}

# Runs "$@" with stdin from $STDIN, prints "wall user sys" (seconds).
timed() {
  local t
  t=$( { TIMEFORMAT='%R %U %S'; time "$@" <"$STDIN" >"$DIR/out" 2>"$DIR/err"; } 2>&1 )
  echo "$t"
}

best() {  # prints the "wall user sys" of the fastest of ROUNDS runs
  local best_line="" line
  for _ in $(seq "$ROUNDS"); do
    line=$(timed "$@")
    if [ -z "$best_line" ] || awk -v a="${line%% *}" -v b="${best_line%% *}" \
        'BEGIN { exit !(a < b) }'; then
      best_line=$line
    fi
  done
  echo "$best_line"
}

qemu_row() {  # image op size count -> "wall user sys"
  local img=$1 op=$2 size=$3 count=$4
  script "$op" "$size" "$count" "" >"$DIR/check.txt"
  local want=$((size * count)) got
  got=$(qemu-io -i "$QEMU_AIO" --object "$OBJ" --image-opts "$(opts "$img")" \
          <"$DIR/check.txt" |
        grep -oE "(read|wrote) [0-9]+/[0-9]+ bytes" |
        awk '{ split($2, a, "/"); s += a[1] } END { print s + 0 }')
  if [ "$got" != "$want" ]; then
    echo "qemu-io moved $got bytes, not $want ($op $size)" >&2
    exit 1
  fi
  script "$op" "$size" "$count" -q >"$DIR/script.txt"
  STDIN=$DIR/script.txt best qemu-io -i "$QEMU_AIO" --object "$OBJ" \
    --image-opts "$(opts "$img")"
}

bench_row() {  # plain image op size count -> "wall user sys" of qemu-img bench
  local img=$1 op=$2 size=$3 count=$4 w=""
  [ "$op" = write ] && w=-w
  STDIN=/dev/null
  best qemu-img bench -q -f qcow2 -i "$QEMU_AIO" -t writeback -c "$count" \
    -d "$DEPTH" -s "$size" $w "$img"
}

ours_row() {  # image op size count -> "wall user sys"
  local img=$1 op=$2 size=$3 count=$4 w=""
  [ "$op" = write ] && w=-w
  STDIN=/dev/null
  local line
  line=$(best "$QCOWTOOL" bench pattern -q --output=json -c "$count" \
           -d "$DEPTH" -s "$size" $w -t writeback --object "$OBJ" \
           --image-opts "$(opts "$img")")
  local got
  got=$(grep -oE '"guest_bytes": [0-9]+' "$DIR/out" | grep -oE '[0-9]+$')
  if [ "$got" != "$((size * count))" ]; then
    echo "qcowtool moved $got guest bytes, not $((size * count))" >&2
    exit 1
  fi
  echo "$line"
}

printf '%-9s %9s %7s %7s %9s %9s %9s %9s %9s %9s %6s %6s\n' row \
  "qemu-io s" "ours s" "q/ours" "qemu ns/B" "ours ns/B" "q pl ns/B" \
  "o pl ns/B" "q-io pl s" "q-bench s" "est s" "e/ours"
for op in read write; do
  for kib in 4 64; do
    size=$((kib * 1024))
    count=$((MIB * 1024 / kib))
    q=$(qemu_row "$ENC" "$op" "$size" "$count")
    o=$(ours_row "$ENC" "$op" "$size" "$count")
    qp=$(qemu_row "$PLAIN" "$op" "$size" "$count")
    op_=$(ours_row "$PLAIN" "$op" "$size" "$count")
    qb=$(bench_row "$PLAIN" "$op" "$size" "$count")
    awk -v row="$op ${kib}k" -v q="$q" -v o="$o" -v qp="$qp" -v op="$op_" \
        -v qb="$qb" -v bytes="$((size * count))" 'BEGIN {
      split(q, a, " "); split(o, b, " "); split(qp, c, " "); split(op, d, " ");
      split(qb, e, " "); ns = 1e9 / bytes;
      est = a[1] - (c[1] - e[1]);
      printf "%-9s %9.3f %7.3f %7.2f %9.2f %9.2f %9.2f %9.2f %9.3f %9.3f %6.3f %6.2f\n",
        row, a[1], b[1], a[1] / b[1], (a[2] + a[3]) * ns, (b[2] + b[3]) * ns,
        (c[2] + c[3]) * ns, (d[2] + d[3]) * ns, c[1], e[1], est, est / b[1]
    }'
  done
done
cat <<'EOF'
q/ours: qemu-io's wall time over qcowtool's on the LUKS image (above 1:
we are faster). ns/B: CPU ns per byte moved, LUKS image (qemu-io, ours),
then the plain one (pl). q-io pl / q-bench: the plain image through the
qemu-io script and through qemu-img bench (the harness's own cost). est:
qemu-io's LUKS time less that harness cost; e/ours: est over ours.
EOF
