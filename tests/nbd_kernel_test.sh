#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `qcowtool serve` under the kernel's block layer: nbdfuse makes the export
# a file, losetup a block device of it, and ext4 lives on it.
#  1. mkfs.ext4, a tree of files written, the filesystem unmounted and
#     mounted again, every file read back equal (sha256), fsck clean;
#  2. more files written and synced (flushed), then the server killed with
#     SIGKILL while a writer is busy; `qemu-img check` of the image clean
#     (no corruption; leaked clusters are allowed and counted, as after any
#     crash); the server restarted, the filesystem mounted (journal
#     replayed) and every synced file intact; fsck -fy (it may release the
#     orphan inodes of the interrupted writer), then fsck -fn clean.
# Needs root, /dev/fuse, loop devices and nbdfuse (libnbd-bin): exit 77
# (skipped) otherwise.
#
#   nbd_kernel_test.sh QCOWTOOL
set -euo pipefail
qcowtool=$1
skip() { echo "nbd_kernel_test: $*: skipped"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "not root"
[ -c /dev/fuse ] || skip "no /dev/fuse"
for t in nbdfuse losetup mkfs.ext4 fsck.ext4 qemu-img sha256sum mount; do
  command -v "$t" >/dev/null || skip "$t is not installed"
done

work=$(mktemp -d /tmp/qcow2-nbdkernel.XXXXXX)
img=$work/disk.qcow2 sock=$work/nbd.sock fuse=$work/fuse mnt=$work/mnt
mkdir -p "$fuse" "$mnt"
server_pid="" fuse_pid="" loop=""

cleanup() {
  set +e
  mountpoint -q "$mnt" && umount "$mnt"
  [ -n "$loop" ] && losetup -d "$loop"
  mountpoint -q "$fuse" && umount "$fuse"
  [ -n "$fuse_pid" ] && kill "$fuse_pid" 2>/dev/null
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid"
  rm -rf "$work"
}
trap cleanup EXIT

start_server() {
  "$qcowtool" serve --socket "$sock" "$img" 2>>"$work/serve.log" &
  server_pid=$!
  for _ in $(seq 600); do [ -S "$sock" ] && break; sleep 0.05; done
  [ -S "$sock" ] || { cat "$work/serve.log"; exit 1; }
}

attach() {
  nbdfuse "$fuse/disk" "nbd+unix:///?socket=$sock" &
  fuse_pid=$!
  for _ in $(seq 600); do [ -f "$fuse/disk" ] && break; sleep 0.05; done
  loop=$(losetup -f --show "$fuse/disk") || skip "losetup cannot attach"
}

detach() {
  mountpoint -q "$mnt" && umount "$mnt"
  losetup -d "$loop"; loop=""
  umount "$fuse"; wait "$fuse_pid" 2>/dev/null || true; fuse_pid=""
}

write_tree() {  # DIR COUNT SEED
  mkdir -p "$1"
  python3 - "$1" "$2" "$3" <<'PY'
import os, random, sys
d, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
for i in range(n):
    sub = os.path.join(d, "d%02d" % (i % 7))
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, "f%04d" % i), "wb") as f:
        f.write(r.randbytes(r.choice([100, 4096, 50000, 300000])))
PY
}

qemu-img create -q -f qcow2 "$img" 512M
start_server
attach
mkfs.ext4 -q "$loop"
mount "$loop" "$mnt" || skip "cannot mount ext4 here"

# 1. A tree, written, remounted, read back.
write_tree "$mnt/a" 300 1
(cd "$mnt" && find a -type f -exec sha256sum {} + | sort -k2) >"$work/a.sum"
umount "$mnt"
mount "$loop" "$mnt"
(cd "$mnt" && sha256sum --quiet -c "$work/a.sum")
umount "$mnt"
fsck.ext4 -fn "$loop" >"$work/fsck1.log" 2>&1 || { cat "$work/fsck1.log"; exit 1; }
echo "nbd_kernel_test: 300 files written, read back equal, fsck clean"

# 2. Synced files, then SIGKILL of the server mid-write.
mount "$loop" "$mnt"
write_tree "$mnt/b" 200 2
sync -f "$mnt"
(cd "$mnt" && find a b -type f -exec sha256sum {} + | sort -k2) >"$work/ab.sum"
( write_tree "$mnt/c" 100000 3 >/dev/null 2>&1 || true ) &
writer=$!
sleep 2
kill -9 "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""
wait "$writer" 2>/dev/null || true
umount -l "$mnt" 2>/dev/null || true
losetup -d "$loop" 2>/dev/null || true; loop=""
umount "$fuse" 2>/dev/null || umount -l "$fuse" 2>/dev/null || true
kill "$fuse_pid" 2>/dev/null || true; fuse_pid=""

set +e
qemu-img check "$img" >"$work/check.log" 2>&1
rc=$?
set -e
cat "$work/check.log" | tail -3
# 0: clean; 3: leaked clusters only (what a crash may leave).
if [ $rc -ne 0 ] && [ $rc -ne 3 ]; then
  echo "nbd_kernel_test: qemu-img check exit $rc after SIGKILL"; exit 1
fi

start_server
attach
mount "$loop" "$mnt"
(cd "$mnt" && sha256sum --quiet -c "$work/ab.sum")
umount "$mnt"
fsck.ext4 -fy "$loop" >"$work/fsck2.log" 2>&1 || true  # orphans of c/
fsck.ext4 -fn "$loop" >"$work/fsck3.log" 2>&1 || { cat "$work/fsck3.log"; exit 1; }
detach
kill "$server_pid"; wait "$server_pid"; server_pid=""
qemu-img check "$img" >"$work/check2.log" 2>&1 || [ $? -eq 3 ] || { cat "$work/check2.log"; exit 1; }
echo "nbd_kernel_test: after SIGKILL mid-write: qemu-img check exit $rc, 500 synced files intact, fsck clean"
