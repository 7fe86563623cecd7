#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs inside the test guest (busybox, from the initramfs that
# make_initramfs.sh builds) against /dev/vda, a vhost-user-blk disk. Every
# step is deterministic, so two back-ends that behave alike leave equal
# images: writes on different CPUs (so different virtqueues) never
# overlap, and ext4 is made and filled with a fixed time, UUID and hash
# seed (E2FSPROGS_FAKE_TIME; files written with debugfs, read through a
# read-only mount). Lines starting "SUM " are compared between runs.
# The mode comes from the kernel command line: vhost_mode=full | write |
# verify (the reconnect test: write, then verify after a new boot).
set -u
export PATH=/bin
# The host's tools, by full path: busybox's shell runs its own applet of
# the same name before anything on PATH.
mke2fs=/sbin/mke2fs e2fsck=/sbin/e2fsck debugfs=/sbin/debugfs
blkdiscard=/sbin/blkdiscard losetup=/sbin/losetup
export E2FSPROGS_FAKE_TIME=1600000000
uuid=01234567-89ab-cdef-0123-456789abcdef
dev=/dev/vda
mode=$(sed -n 's/.*vhost_mode=\([a-z]*\).*/\1/p' /proc/cmdline)

# The pattern of block range I: a line naming it, repeated.
pattern() { yes "vhost pattern $1 $2" | head -c "$3"; }

# Writes N KiB of pattern at KiB offset OFF (O_DIRECT, so it reaches the
# device now).
put() {
  pattern "$1" "$2" $(($3 * 1024)) |
    dd of=$dev bs=1024 seek="$2" count="$3" oflag=direct conv=notrunc 2>/dev/null
}

sum() {  # label, KiB offset, KiB count
  echo "SUM $1 $(dd if=$dev bs=1024 skip="$2" count="$3" iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)"
}

echo "GUEST size $(blockdev --getsize64 $dev) ro $(blockdev --getro $dev) queues $(ls /sys/block/vda/mq | wc -l)"

# writer NAME SPECS: writes pattern NAME.i at each OFF:KIB of SPECS.
cat >/tmp/writer.sh <<'W'
i=0
for spec in $2; do
  off=${spec%:*}; n=${spec#*:}
  # One write of the whole range (the block layer splits it at 1 MiB).
  yes "vhost pattern $1$i $off" | head -c $((n * 1024)) |
    dd of=/dev/vda bs=$((n * 1024)) count=1 seek=$((off * 1024)) \
      iflag=fullblock oflag=direct,seek_bytes conv=notrunc 2>/dev/null
  i=$((i + 1))
done
W

write_patterns() {
  # CPU 0 writes the even ranges, CPU 1 the odd ones, at once: the two
  # virtqueues carry requests side by side. Sizes from 1 to 1024 KiB,
  # at offsets that are and are not cluster aligned.
  taskset -c 0 sh /tmp/writer.sh a "0:4 128:64 1000:1 2048:1000 5003:17 8192:256" &
  taskset -c 1 sh /tmp/writer.sh b "64:60 300:700 3100:33 4096:512 6000:8 9000:1024" &
  wait
}

case "$mode" in
write)
  # The reconnect test, first boot: patterns, a flush, then more writes
  # until the VMM is killed.
  write_patterns
  sync; blockdev --flushbufs $dev
  sum patterns 0 10240
  echo "GUEST flushed"
  i=0
  while :; do put "late$i" $((12288 + (i % 64) * 64)) 64; i=$((i + 1)); done
  ;;
verify)
  sum patterns 0 10240
  ;;
*)
  write_patterns
  sum after-writes 0 10240
  # Discards (one cluster-aligned 1 MiB, one partial) and write-zeroes,
  # by the block layer's ioctls: DISCARD and WRITE_ZEROES requests.
  $blkdiscard -o $((2048 * 1024)) -l $((1024 * 1024)) $dev
  $blkdiscard -o $((300 * 1024)) -l $((4 * 1024)) $dev
  $blkdiscard -z -o $((9000 * 1024)) -l $((512 * 1024)) $dev
  $blkdiscard -z -o $((5003 * 1024)) -l $((3 * 1024)) $dev
  sync; blockdev --flushbufs $dev
  sum after-discard 0 10240
  # A file system over the rest of the disk (after 16 MiB).
  $losetup -o $((16 << 20)) --sizelimit $((32 << 20)) /dev/loop0 $dev
  $mke2fs -q -F -t ext4 -U $uuid -E hash_seed=$uuid /dev/loop0 ||
    echo "GUEST mke2fs failed"
  for f in 1 2 3; do
    pattern file $f $((f * 300000)) > /tmp/f$f
    $debugfs -w -R "write /tmp/f$f f$f" /dev/loop0 >/dev/null 2>&1
  done
  $debugfs -w -R "mkdir dir" /dev/loop0 >/dev/null 2>&1
  sync; blockdev --flushbufs /dev/loop0
  $e2fsck -fn /dev/loop0 >/tmp/fsck.log 2>&1
  echo "GUEST fsck exit $?"
  mkdir -p /mnt && mount -t ext4 -o ro,noload /dev/loop0 /mnt &&
    for f in 1 2 3; do echo "SUM file$f $(md5sum < /mnt/f$f | cut -d' ' -f1)"; done
  umount /mnt
  $losetup -d /dev/loop0
  sum whole 0 $((48 << 10))
  ;;
esac
echo "GUEST done"
