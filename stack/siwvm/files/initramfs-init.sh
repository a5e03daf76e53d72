#!/bin/sh
# /init of the busybox initramfs: load virtio and ext4, mount /dev/vda, hand over to the root.
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for mod in crc32c_generic virtio_pci virtio_blk ext4; do modprobe "$mod"; done
n=0
while [ ! -b /dev/vda ] && [ "$n" -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
if ! mount -t ext4 -o rw /dev/vda /newroot; then
  echo "SIWVM FAIL: cannot mount /dev/vda"
  poweroff -f
fi
mount --move /dev /newroot/dev
umount /sys /proc
exec switch_root /newroot /sbin/siwvm-init
