#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# `qcowtool serve --vhost-user-blk` without a VMM (a few seconds): no
# format probing, the image lock held while served, --fork and
# --pid-file, a malformed message and a broken ring each closing only
# their connection with a log line (the server goes on serving the next
# front-end), vhost_bench's pattern read back through qemu-img, a clean
# image after SIGTERM.
# Usage: vhost_cli_test.sh QCOWTOOL VHOST_BENCH
set -euo pipefail
qcowtool=$1 bench=$2
work=$(mktemp -d /tmp/vhost_cli.XXXXXX)
trap '[ -f "$work/pid" ] && kill "$(cat "$work/pid")" 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

truncate -s 64M "$work/disk.raw"
if "$qcowtool" serve --vhost-user-blk "$work/s" "$work/disk.raw" 2>"$work/err"; then
  fail "a raw image was served without -f"
fi
grep -q "without -f the image must be qcow2" "$work/err" || fail "message: $(cat "$work/err")"

qemu-img create -q -f qcow2 "$work/disk.qcow2" 64M
"$qcowtool" serve --vhost-user-blk "$work/s" --num-queues 2 --fork \
  --pid-file "$work/pid" "$work/disk.qcow2" 2>"$work/server.log"
[ -S "$work/s" ] || fail "no socket after --fork returned"
if qemu-img info "$work/disk.qcow2" >/dev/null 2>&1; then
  fail "the image is not locked while served"
fi

# A message with a bad version: that connection is closed and logged.
python3 - "$work/s" <<'PY'
import socket, struct, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(struct.pack("<III", 1, 0x2, 0))
s.settimeout(10)
assert s.recv(16) == b"", "the connection stayed open"
PY
# A ring whose avail index runs ahead of the queue: closed and logged.
python3 - "$work/s" <<'PY'
import mmap, os, socket, struct, sys, array
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
fd = os.memfd_create("g"); os.ftruncate(fd, 1 << 20)
m = mmap.mmap(fd, 1 << 20)
va = 0x7f0000000000
def send(req, payload=b"", fds=()):
    msg = struct.pack("<III", req, 1, len(payload)) + payload
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    s.sendmsg([msg], anc)
send(2, struct.pack("<Q", 1 << 32))
send(5, struct.pack("<II", 1, 0) + struct.pack("<QQQQ", 0, 1 << 20, va, 0), [fd])
send(8, struct.pack("<II", 0, 8))
send(9, struct.pack("<IIQQQQ", 0, 0, va, va + 0x200, va + 0x100, 0))
struct.pack_into("<H", m, 0x102, 100)   # avail idx 100 in a queue of 8
kick = os.eventfd(1)
send(12, struct.pack("<Q", 0), [kick])
s.settimeout(10)
assert s.recv(16) == b"", "the connection stayed open"
PY
grep -q "protocol version 2" "$work/server.log" || fail "no log line: $(cat "$work/server.log")"
grep -q "avail index 100" "$work/server.log" || fail "no ring log line: $(cat "$work/server.log")"

# The server still serves: a pattern through both queues, read back.
"$bench" --socket "$work/s" --queues 2 --verify --bs 65536 >/dev/null ||
  fail "vhost_bench --verify"
kill -TERM "$(cat "$work/pid")"
for _ in $(seq 100); do kill -0 "$(cat "$work/pid")" 2>/dev/null || break; sleep 0.1; done
rm -f "$work/pid"
[ ! -e "$work/s" ] || fail "the socket was left behind"
qemu-img check -q "$work/disk.qcow2" || fail "qemu-img check"
python3 - "$work/disk.qcow2" <<'PY'
import subprocess, sys
subprocess.run(["qemu-img", "convert", "-O", "raw", sys.argv[1], sys.argv[1] + ".raw"], check=True)
raw = open(sys.argv[1] + ".raw", "rb").read(8 << 20)
want = bytes((((o >> 9) * 7 + (o & 511)) & 255) for o in range(8 << 20))
sys.exit(0 if raw == want else "qemu-img reads another pattern")
PY
echo "ok"
