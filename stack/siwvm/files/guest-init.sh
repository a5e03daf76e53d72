#!/bin/sh
# PID 1 of the siw guest (/sbin/siwvm-init): no systemd, no udev.
# eth0 gets 10.0.2.15/24 on QEMU user networking with NO default route, so the guest reaches
# only the slirp subnet (10.0.2.2 is the host's loopback).  Mounts the 9p share "host" on
# /mnt/host, loads siw, adds the siw links, then serves the agent (siwvm.agent=PORT) or runs
# /mnt/host/guest.sh once (exit code to /mnt/host/guest.rc).  Powers off at the end.
# Kernel command line: siwvm.links=siw0:eth0[,NAME:NETDEV]  siwvm.agent=PORT  siw.KNOB=VALUE
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
hostname siwvm
cmdline_arg() { tr ' ' '\n' </proc/cmdline | sed -n "s/^$1=//p" | tail -1; }
fail() { echo "SIWVM FAIL: $*"; echo o >/proc/sysrq-trigger; sleep 10; }
LINKS=$(cmdline_arg siwvm.links)
LINKS=${LINKS:-siw0:eth0}
AGENT=$(cmdline_arg siwvm.agent)

modprobe virtio_rng 2>/dev/null
modprobe virtio_net || fail "modprobe virtio_net"
ip link set lo up
n=0
while [ ! -e /sys/class/net/eth0 ] && [ "$n" -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 || fail "eth0 setup"

modprobe 9pnet_virtio && modprobe 9p
mkdir -p /mnt/host
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 host /mnt/host || echo "siwvm: no 9p share"

modprobe siw && modprobe rdma_ucm && modprobe ib_uverbs || fail "modprobe siw/rdma_ucm/ib_uverbs"
for link in $(echo "$LINKS" | tr ',' ' '); do
  rdma link add "${link%%:*}" type siw netdev "${link#*:}" || echo "siwvm: rdma link add $link failed"
done
echo "SIWVM READY uptime=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r)"

if [ -n "$AGENT" ]; then
  python3 /sbin/siwvm-agent "$AGENT"
elif [ -e /mnt/host/guest.sh ]; then
  (cd /mnt/host && sh ./guest.sh)
  rc=$?
  echo "$rc" >/mnt/host/guest.rc
  echo "SIWVM SCRIPT EXIT rc=$rc"
else
  echo "siwvm: nothing to run (no siwvm.agent=, no /mnt/host/guest.sh)"
fi
sync
umount /mnt/host 2>/dev/null
echo o >/proc/sysrq-trigger
sleep 10
