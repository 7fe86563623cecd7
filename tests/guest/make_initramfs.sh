#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Builds the test guest: Debian's kernel, unpacked (never installed) from
# the linux-image-*-amd64 package, and a busybox-static initramfs with the
# virtio, virtio-blk and ext4 modules and the host's e2fsprogs and
# blkdiscard (busybox's mke2fs makes no ext4, its blkdiscard no -z).
#   make_initramfs.sh CACHE_DIR   -> CACHE_DIR/vmlinuz, CACHE_DIR/initramfs.gz
#   make_initramfs.sh --kernel-only CACHE_DIR   -> CACHE_DIR/vmlinuz and
#                                   the modules (scripts/bootstrap.sh)
# The kernel package is fetched once (apt-get download, Debian's own
# package) into CACHE_DIR: by scripts/bootstrap.sh, or else by the first
# test run.
set -euo pipefail
kernel_only=
if [ "$1" = --kernel-only ]; then kernel_only=1; shift; fi
cache=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$cache"
cd "$cache"
if [ ! -f vmlinuz ] || [ ! -d kernel/lib/modules ]; then
  pkg=$(apt-cache depends linux-image-amd64 | sed -n 's/.*Depends: \(linux-image-[^ ]*\)/\1/p' | head -1)
  [ -n "$pkg" ] || { echo "make_initramfs: no linux-image-amd64 in apt" >&2; exit 1; }
  ls "$pkg"_*.deb >/dev/null 2>&1 || apt-get download "$pkg" >/dev/null 2>&1
  rm -rf kernel && mkdir kernel
  dpkg-deb -x "$pkg"_*.deb kernel
  cp kernel/boot/vmlinuz-* vmlinuz
fi
[ -z "$kernel_only" ] || exit 0
kmod=$(ls -d kernel/lib/modules/*/kernel)
rm -rf initramfs && mkdir -p initramfs/{bin,sbin,dev,proc,sys,tmp,modules,lib64,lib/x86_64-linux-gnu}
cp /bin/busybox initramfs/bin/busybox
ln -s busybox initramfs/bin/sh
# In load order (each after what it depends on).
mods=(drivers/virtio/virtio_ring drivers/virtio/virtio
      drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci_legacy_dev
      drivers/virtio/virtio_pci drivers/block/virtio_blk drivers/block/loop
      lib/crc16 crypto/crc32c_generic fs/mbcache fs/jbd2/jbd2 fs/ext4/ext4)
: > initramfs/modules.list
for m in "${mods[@]}"; do
  cp "$kmod/$m.ko" initramfs/modules/
  basename "$m" >> initramfs/modules.list
done
for b in /sbin/mke2fs /sbin/e2fsck /sbin/debugfs /sbin/blkdiscard /sbin/losetup; do
  cp "$b" initramfs/sbin/
  for lib in $(ldd "$b" | awk '/=>/ {print $3}'); do
    cp -n "$lib" initramfs/lib/x86_64-linux-gnu/
  done
done
cp /lib64/ld-linux-x86-64.so.2 initramfs/lib64/
cp "$here/init" "$here/guest.sh" initramfs/
(cd initramfs && find . | cpio -o -H newc 2>/dev/null | gzip -1) > initramfs.gz
