#!/bin/sh
# The guest kernel's module helper (/proc/sys/kernel/modprobe), run by the
# kernel with the initramfs as its root for every automatic module load
# (`tc qdisc add ... cake`, nftables expressions, ...). The guest's modules
# live in the xtask cache, not in the host's /lib/modules, so the host's
# modprobe is run in the shared root with that tree as its base directory.
. /config
exec /bin/busybox chroot /newroot /sbin/modprobe -d "$MODULES_ROOT" "$@"
