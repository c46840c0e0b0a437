#!/bin/sh
# First process of the lab VM, run from its initramfs (busybox).
# It mounts the host's root read-only over 9p, puts a tmpfs-backed overlay on
# top so nothing the lab writes (/etc, /run, /var) reaches the host, binds the
# results share in, and hands over to the Python runner inside that tree.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod "/modules/$m" || echo "lab-init: insmod $m failed"; done
arg() { sed -n "s/.*\blbctl\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
RESULTS=$(arg results)
mkdir -p /lower /rw /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose,multidevs=remap hostroot /lower
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 results "/newroot$RESULTS"
exec switch_root /newroot "$(arg python)" -m lbctl.lab.guest_runner "$RESULTS"
