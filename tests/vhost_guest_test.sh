#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# A real VMM drives `qcowtool serve --vhost-user-blk`: QEMU (TCG, no KVM)
# boots Debian's kernel with a busybox initramfs (tests/guest/) on a
# vhost-user-blk-pci disk with two virtqueues, the guest memory a shared
# memfd. qemu-storage-daemon's vhost-user-blk export runs the same guest
# script as the oracle.
#   1. The guest's checksums equal QSD's; `qemu-img check` is clean and
#      `qemu-img compare` finds our image equal to QSD's.
#   2. QEMU killed (SIGKILL) while writing: the back-end keeps serving; a
#      new QEMU reconnects and reads every write flushed before the kill.
#   3. An overlay served: the backing file is untouched (hash before and
#      after), the guest sees the same disk as through QSD.
# Usage: vhost_guest_test.sh QCOWTOOL SOURCE_DIR CACHE_DIR
# Exits 77 (skipped) when QEMU's system emulator or QSD is missing.
set -euo pipefail
qcowtool=$1 src=$2 cache=$3
for tool in qemu-system-x86_64 qemu-storage-daemon qemu-img busybox cpio; do
  if ! command -v $tool >/dev/null; then
    echo "SKIP: $tool not installed (scripts/bootstrap.sh installs qemu-system-x86, qemu-system-common, busybox-static, cpio)"
    exit 77
  fi
done
bash "$src/tests/guest/make_initramfs.sh" "$cache"
work=$(mktemp -d /tmp/vhost_guest.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# boot SOCKET MODE LOG [extra qemu args]: runs the guest to its power-off.
boot() {
  local sock=$1 mode=$2 log=$3
  timeout 600 qemu-system-x86_64 -machine q35,accel=tcg,memory-backend=mem \
    -smp 2 -m 512 -nographic -no-reboot -kernel "$cache/vmlinuz" \
    -initrd "$cache/initramfs.gz" \
    -append "console=ttyS0 quiet panic=-1 vhost_mode=$mode" \
    -object memory-backend-memfd,id=mem,size=512M,share=on \
    -chardev socket,id=vu,path="$sock" \
    -device vhost-user-blk-pci,chardev=vu,num-queues=2 >"$log" 2>&1
}

wait_socket() {
  for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.1; done
  fail "no socket $1"
}

serve_ours() {  # IMAGE SOCKET LOG
  "$qcowtool" serve --vhost-user-blk "$2" --num-queues 2 "$1" 2>"$3" &
  ours_pid=$!
  pids+=($ours_pid)
  wait_socket "$2"
}

stop_ours() {
  kill -TERM "$ours_pid"
  wait "$ours_pid" || fail "the back-end exited with $?: $(cat "$1")"
}

serve_qsd() {  # IMAGE SOCKET
  qemu-storage-daemon \
    --blockdev "driver=qcow2,node-name=disk,discard=unmap,file.driver=file,file.filename=$1" \
    --export "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path=$2,writable=on,num-queues=2" &
  qsd_pid=$!
  pids+=($qsd_pid)
  wait_socket "$2"
}

sums() { grep -a '^SUM ' "$1" | tr -d '\r'; }

check_clean() {
  qemu-img check "$1" >"$work/check.log" 2>&1 || fail "qemu-img check $1: $(cat "$work/check.log")"
}

t0=$(date +%s)
# --- 1. the same guest script on ours and on QSD -------------------------
qemu-img create -q -f qcow2 "$work/ours.qcow2" 64M
qemu-img create -q -f qcow2 "$work/qsd.qcow2" 64M
serve_ours "$work/ours.qcow2" "$work/ours.sock" "$work/ours.err"
boot "$work/ours.sock" full "$work/ours.log"
stop_ours "$work/ours.err"
serve_qsd "$work/qsd.qcow2" "$work/qsd.sock"
boot "$work/qsd.sock" full "$work/qsd.log"
kill "$qsd_pid"; wait "$qsd_pid" || true
grep -aq "GUEST done" "$work/ours.log" || fail "guest on ours did not finish: $(tail -20 "$work/ours.log")"
grep -aq "GUEST fsck exit 0" "$work/ours.log" || fail "fsck in the guest: $(grep -a GUEST "$work/ours.log")"
grep -aq "queues 2" "$work/ours.log" || fail "the guest does not see 2 queues"
[ "$(sums "$work/ours.log" | wc -l)" -ge 6 ] || fail "too few checksums: $(sums "$work/ours.log")"
diff <(sums "$work/ours.log") <(sums "$work/qsd.log") || fail "checksums differ from QSD's"
check_clean "$work/ours.qcow2"
qemu-img compare "$work/ours.qcow2" "$work/qsd.qcow2" || fail "image differs from QSD's"
echo "ok: guest checksums and image equal to qemu-storage-daemon's ($(($(date +%s) - t0)) s)"

# --- 2. SIGKILL of QEMU mid-write, reconnect -------------------------------
t1=$(date +%s)
qemu-img create -q -f qcow2 "$work/kill.qcow2" 64M
serve_ours "$work/kill.qcow2" "$work/kill.sock" "$work/kill.err"
boot "$work/kill.sock" write "$work/write.log" 2>/dev/null &  # no "Killed" line
boot_pid=$!
for _ in $(seq 1200); do grep -aq "GUEST flushed" "$work/write.log" && break; sleep 0.25; done
grep -aq "GUEST flushed" "$work/write.log" || fail "the writing guest never flushed"
sleep 2  # writes in flight
# boot's subshell runs timeout, which runs QEMU.
timeout_pid=$(pgrep -P "$boot_pid" -x timeout)
qemu_pid=$(pgrep -P "$timeout_pid" -x qemu-system-x86)
[ -n "$qemu_pid" ] || fail "no QEMU process under $boot_pid"
kill -KILL "$qemu_pid"
wait "$boot_pid" 2>/dev/null || true  # killed, as meant
kill -0 "$ours_pid" || fail "the back-end died with its VMM"
boot "$work/kill.sock" verify "$work/verify.log"
grep -a "^SUM patterns" "$work/write.log" | tr -d '\r' >"$work/want"
grep -a "^SUM patterns" "$work/verify.log" | tr -d '\r' >"$work/got"
[ -s "$work/want" ] && diff "$work/want" "$work/got" || fail "flushed writes lost after the reconnect"
stop_ours "$work/kill.err"
check_clean "$work/kill.qcow2"
echo "ok: QEMU killed mid-write, a new QEMU reconnected and read the flushed writes ($(($(date +%s) - t1)) s)"

# --- 3. an overlay chain -------------------------------------------------
t2=$(date +%s)
qemu-img create -q -f qcow2 "$work/base.qcow2" 64M
qemu-io -f qcow2 -c "write -P 0x5a 0 64M" "$work/base.qcow2" >/dev/null
cp "$work/base.qcow2" "$work/base2.qcow2"
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$work/top.qcow2"
qemu-img create -q -f qcow2 -b base2.qcow2 -F qcow2 "$work/top2.qcow2"
before=$(sha256sum <"$work/base.qcow2")
serve_ours "$work/top.qcow2" "$work/top.sock" "$work/top.err"
boot "$work/top.sock" full "$work/top.log"
stop_ours "$work/top.err"
[ "$before" = "$(sha256sum <"$work/base.qcow2")" ] || fail "the backing file changed"
serve_qsd "$work/top2.qcow2" "$work/top2.sock"
boot "$work/top2.sock" full "$work/top2.log"
kill "$qsd_pid"; wait "$qsd_pid" || true
grep -aq "GUEST fsck exit 0" "$work/top.log" || fail "fsck on the overlay"
diff <(sums "$work/top.log") <(sums "$work/top2.log") || fail "overlay checksums differ from QSD's"
check_clean "$work/top.qcow2"
qemu-img compare "$work/top.qcow2" "$work/top2.qcow2" || fail "overlay differs from QSD's"
echo "ok: overlay served, backing file untouched ($(($(date +%s) - t2)) s)"
