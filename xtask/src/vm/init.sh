#!/bin/sh
# PID 1 of the `cargo xtask vm` guest: busybox sh in the initramfs.
#
# Contract: /config (written per run by xtask) sets WORKSPACE, RUN_DIR and
# MODULES_ROOT. This script mounts the host root read-only at /newroot (9p
# tag hostroot), the guest's own pseudo file systems and tmpfs inside it, then
# the workspace read-write at its host path (9p tag workspace). It runs
# $RUN_DIR/job.sh (after creating $RUN_DIR/started, which tells xtask that the
# boot succeeded) chrooted into /newroot with a clean environment, stdout and
# stderr on the virtio-serial ports named shaper.stdout and shaper.stderr,
# writes the job's exit status to $RUN_DIR/exit-code and powers off.
# A setup failure is reported on the console (ttyS0) and powers off without
# an exit-code file; xtask then shows the end of the console.
#
# PID 1 itself never chroots: the kernel starts its module helper with the
# root of PID 1 (they share init's fs_struct), so /vm-modprobe must stay at
# the initramfs root.

/bin/busybox mount -t devtmpfs devtmpfs /dev
exec </dev/null >/dev/console 2>&1
/bin/busybox --install -s /bin
export PATH=/bin

die() {
    echo "vm-init: $*"
    echo "vm-init: powering off without an exit code"
    poweroff -f
    sleep 10
    exit 1
}

mount -t proc proc /proc || die "cannot mount /proc"
mount -t sysfs sysfs /sys || die "cannot mount /sys"
. /config || die "cannot read /config"

while read -r module; do
    insmod "/modules/$module" || die "cannot load the module $module"
done </modules/order

# 9p2000.L over virtio; 512 KiB messages (the virtio transport's maximum in
# these kernels) cut round trips for big reads. cache=loose is safe for the
# root, which nothing changes under the guest; the workspace uses cache=mmap,
# which keeps reads and writes coherent with the host and still allows
# shared writable mappings.
opts=trans=virtio,version=9p2000.L,msize=512000
r=/newroot
mount -t 9p -o "$opts,ro,cache=loose" hostroot "$r" || die "cannot mount the host root (9p tag hostroot)"

mount -t proc proc "$r/proc" || die "cannot mount proc in the new root"
mount -t sysfs sysfs "$r/sys" || die "cannot mount sysfs in the new root"
mount -t devtmpfs devtmpfs "$r/dev" || die "cannot mount devtmpfs in the new root"
mkdir -p "$r/dev/pts" "$r/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$r/dev/pts" || die "cannot mount devpts"
mount -t tmpfs -o mode=1777 tmpfs "$r/dev/shm" || die "cannot mount /dev/shm"
ln -sf /proc/self/fd "$r/dev/fd"
ln -sf /proc/self/fd/0 "$r/dev/stdin"
ln -sf /proc/self/fd/1 "$r/dev/stdout"
ln -sf /proc/self/fd/2 "$r/dev/stderr"
for spec in tmp:1777 run:755 var/tmp:1777 root:700; do
    dir=${spec%:*}
    mount -t tmpfs -o "mode=${spec#*:}" tmpfs "$r/$dir" || die "cannot mount a tmpfs on /$dir"
done
mkdir -p "$r/run/lock"
mount -t bpf -o mode=700 bpf "$r/sys/fs/bpf" || die "cannot mount bpffs"
mount -t debugfs debugfs "$r/sys/kernel/debug" || die "cannot mount debugfs"
mount -t tracefs tracefs "$r/sys/kernel/tracing" || die "cannot mount tracefs"
mount -t cgroup2 cgroup2 "$r/sys/fs/cgroup" || die "cannot mount cgroup2"

# After the tmpfs mounts, so that a workspace under /tmp stays visible.
[ -d "$r$WORKSPACE" ] || mkdir -p "$r$WORKSPACE" || die "cannot create the mount point $WORKSPACE"
mount -t 9p -o "$opts,cache=mmap" workspace "$r$WORKSPACE" || die "cannot mount the workspace (9p tag workspace)"
[ -f "$r$RUN_DIR/job.sh" ] || die "the job script $RUN_DIR/job.sh is not visible in the guest"

ip link set lo up || die "cannot bring up lo"
echo /vm-modprobe >/proc/sys/kernel/modprobe || die "cannot install the modprobe helper"

# The ports' device names (/dev/vportNpM) depend on probe order; their
# names are in sysfs.
port() {
    for p in /sys/class/virtio-ports/*; do
        [ "$(cat "$p/name" 2>/dev/null)" = "$1" ] && echo "/dev/${p##*/}" && return 0
    done
    return 1
}
out=$(port shaper.stdout) && err=$(port shaper.stderr) || die "the virtio-serial ports for the job's output are missing"

# A virtio port can be open in only one process at a time, and jobs reopen
# /dev/stdout (tee /dev/stderr). So the job writes into FIFOs and two cats
# copy them to the ports; to the job its output looks like a pipe, as in CI.
mkfifo /job-out /job-err || die "cannot create the output FIFOs"
cat /job-out >"$out" &
cat_out=$!
cat /job-err >"$err" &
cat_err=$!

# Hold the static keys that tests would otherwise flip on and off while
# traffic flows: under multi-threaded TCG a vCPU can still run code that
# text_poke_bp has just patched back, hit the transient int3 and oops (seen
# in netif_rx_internal's net_timestamp_check when a ping started under
# load). A ping to loopback keeps netstamp_needed_key on (iputils ping asks
# for SO_TIMESTAMP); a clsact qdisc on a spare veth keeps the TC
# ingress/egress keys on. Best effort: a failure only loses the guard.
# The ping is started by the job script (see job.rs): started here, its
# socket became fd 0 and it did not hold the key.
# The host's ip and tc by absolute path: busybox prefers its own applets
# for bare names, and its ip and tc know neither `peer name` nor clsact (the
# guard was silently missing: the peer came up as veth0, and tc said
# "invalid argument 'clsact'").
if chroot "$r" /sbin/ip link add vmkeys0 type veth peer name vmkeys1; then
    chroot "$r" /sbin/tc qdisc add dev vmkeys0 clsact || echo "vm-init: no clsact guard"
else
    echo "vm-init: no veth for the clsact guard"
fi
# The same for the tracepoints `shaper trace` attaches to. A tracepoint's
# call site is a static call: it points straight at the probe while there is
# one, and at the iterator from two on, so attaching a probe rewrites it by
# text_poke_bp on 0->1 and 1->2, and detaching on 2->1 (kernel/tracepoint.c,
# tracepoint_add_func and tracepoint_remove_func). One held probe was not
# enough: a guest oopsed on the int3 at dev_hard_start_xmit's
# net_dev_start_xmit call while the lab's tracer attached under load, and a
# kprobe on arch_static_call_transform counted 8 rewrites per `shaper trace`
# run with one held probe and 0 with two. Each tracefs instance registers
# its own probe (its trace_event_file is the probe's data), so the events
# are enabled in the top instance and in one more. Recording is off and the
# buffers tiny, so nothing is kept.
t="$r/sys/kernel/tracing"
guard_events() {
    echo 0 >"$1/tracing_on" && echo 4 >"$1/buffer_size_kb" || return 1
    for ev in qdisc/qdisc_enqueue net/net_dev_start_xmit; do
        echo 1 >"$1/events/$ev/enable" 2>/dev/null || echo "vm-init: no $ev key guard in $1"
    done
}
if guard_events "$t" && mkdir "$t/instances/vmkeys" && guard_events "$t/instances/vmkeys"; then
    :
else
    echo "vm-init: no tracefs control for the tracepoint call guard"
fi

: >"$r$RUN_DIR/started" || die "cannot write to the run directory $RUN_DIR"
env -i chroot "$r" /bin/sh "$RUN_DIR/job.sh" </dev/null >/job-out 2>/job-err
code=$?

# Background processes the job left behind (daemons, sleeps) would keep the
# FIFOs open and the cats waiting: stop everything but PID 1 and the cats.
for proc in /proc/[0-9]*; do
    pid=${proc#/proc/}
    case $pid in 1 | "$cat_out" | "$cat_err") ;; *) kill -KILL "$pid" 2>/dev/null ;; esac
done
wait "$cat_out" "$cat_err"

echo "$code" >"$r$RUN_DIR/exit-code" || die "cannot write the exit code to $RUN_DIR"
sync
poweroff -f
