#!/usr/bin/env bash
# A real Slurm cluster on this one machine, a miniature of a real one: munge, MariaDB, slurmdbd,
# slurmctld and four slurmd "nodes" (node1..node4), each slurmd in its own UTS + mount namespace
# so that `hostname` inside a job prints the node name and node1..node4 resolve. Two more, gpu1
# and gpu2 in partition "gpu", have 4 GPUs each as Slurm sees them: gres on character devices
# made with mknod (no driver behind them), so Slurm allocates, binds and exports
# CUDA_VISIBLE_DEVICES as on a GPU cluster while torch finds no GPU and trains on the CPU.
#
# Each node also has a network and cores of its own (docs/local-cluster.md):
# - its own network namespace, with one interface hsn0 (the same name on every node, as on a
#   real cluster) on a veth whose other end joins the bridge hpcdp-br0, where slurmctld, slurmdbd
#   and the submitting shell live (addresses in 198.18.0.0/24, RFC 2544's benchmarking range;
#   no route leaves the machine);
# - a link shaped to a rate (tbf on both ends of its veth): `up --link RATE`, `link rate RATE`;
# - its own core: slurmd runs under taskset, and with TaskPlugin=task/none its jobs inherit it.
#   Nodes share cores only when there are more nodes than cores.
# Where namespaces cannot be made (no `ip`, no CAP_NET_ADMIN), the nodes share the loopback as
# 127.0.100.N and the machine's cores, and `up` says so in one line.
#
#   local-slurm.sh up [--link RATE]   start what is not running (a no-op when all is healthy);
#                                     --link sets every node's link (1gbit, 250mbit, none)
#   local-slurm.sh down [--purge]     stop every daemon and remove the network; --purge also
#                                     deletes the cluster directory
#   local-slurm.sh status             daemons, each node's address, cores and link, and sinfo
#   local-slurm.sh link rate RATE [NODE...]   change the links' rate on a running cluster
#   local-slurm.sh link NODE down|up          cut a node's link, or restore it
#   local-slurm.sh env                `export SLURM_CONF=...`, for eval "$(local-slurm.sh env)"
#
# Everything lives in ${HPCDP_CLUSTER_DIR:-/tmp/hpcdp-slurm}. Exit 3: cannot start here (not
# root, a command missing); the one line printed says what to do.
set -euo pipefail

DIR=${HPCDP_CLUSTER_DIR:-/tmp/hpcdp-slurm}
CLUSTER=hpcdp
NODES=(node1 node2 node3 node4)
GPU_NODES=(gpu1 gpu2)
GPUS_PER_NODE=4
CPUS_PER_NODE=4
PREEMPT_GRACE_S=30  # seconds a preempted job of partition "low" has to checkpoint
# Not Slurm's default ports (6817-6819), so a system Slurm on the same machine does not clash.
# slurmctld: PORT_BASE, slurmdbd: PORT_BASE + 1, node I (of ALL_NODES, from 1): PORT_BASE + 1 + I.
PORT_BASE=${HPCDP_SLURM_PORT_BASE:-41817}
[[ $PORT_BASE =~ ^[0-9]+$ ]] && ((PORT_BASE >= 1024 && PORT_BASE <= 65000)) || {
    echo "local-slurm: HPCDP_SLURM_PORT_BASE '$PORT_BASE' must be a number from 1024 to 65000" >&2
    exit 2
}
CTLD_PORT=$PORT_BASE
DBD_PORT=$((PORT_BASE + 1))
NODE_PORT_BASE=$((PORT_BASE + 1)) # node I listens on NODE_PORT_BASE + I
# The node network (namespace mode). One cluster a machine: the names below are the machine's.
NODE_IFACE=hsn0
BRIDGE=hpcdp-br0
NET_PREFIX=198.18.0 # node I is $NET_PREFIX.I, the bridge (the controller side) $NET_PREFIX.254
BRIDGE_ADDR=$NET_PREFIX.254
# The default link: on the smoke experiment, DDP's gradient all-reduce across 2 nodes costs
# between a quarter of a step's compute and all of it, as GPT-2's does on a GPU cluster
# (docs/local-cluster.md has the measurement).
DEFAULT_LINK=1gbit
GPU_DEVICES=$DIR/gpus
OCI=$DIR/oci
NO_GPU_MARKER=$DIR/.no-gpu-nodes # written when the GPU nodes did not start: later ups skip them
INSTALL_HINT="apt-get install slurm-wlm slurmdbd munge mariadb-server"

ETC=$DIR/etc
RUN=$DIR/run
LOG=$DIR/log
CONF=$ETC/slurm.conf
DBD_CONF=$ETC/slurmdbd.conf
DB_CNF=$ETC/my.cnf
DB_PASS_FILE=$ETC/db.pass
DB_DATA=$DIR/db
DB_SOCKET=$RUN/mysqld.sock
MUNGE_DIR=$DIR/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
STATE=$DIR/state
MARKER=$DIR/.hpcdp-local-slurm # only a directory holding this is ever deleted by --purge
# What `up` chose, for hpcdp (cluster.py) and for `status`: "namespaces" or "loopback", the
# node interface jobs should use, and each node's link rate and core.
NETWORK_FILE=$ETC/network
LINKS_DIR=$ETC/links

export SLURM_CONF=$CONF

# The GPU nodes exist where their device files can be made (mknod needs CAP_MKNOD: a root
# that lacks it gets the four CPU nodes, and the GPU tests skip saying why).
gpu_devices_ready() {
    local i
    mkdir -p "$GPU_DEVICES"
    for ((i = 0; i < GPUS_PER_NODE; i++)); do
        [[ -c $GPU_DEVICES/nvidia$i ]] || mknod "$GPU_DEVICES/nvidia$i" c 195 "$i" 2>/dev/null || return 1
    done
}
# Every slurmd this cluster runs: `up` adds the GPU nodes where it can make their devices;
# `down` and `status` add them where slurm.conf has them.
ALL_NODES=("${NODES[@]}")
gpu_nodes_configured() {
    [[ ! -e $NO_GPU_MARKER && -r $CONF ]] && grep -q "^NodeName=${GPU_NODES[0]} " "$CONF"
}
gpu_summary() {
    if ((${#ALL_NODES[@]} > ${#NODES[@]})); then
        echo ", ${#GPU_NODES[@]} with $GPUS_PER_NODE GPUs (device files only) in partition gpu"
    fi
}
# node_number NODE: its place in ALL_NODES from 1 (its address, its port, its core).
node_number() {
    local i
    for i in "${!ALL_NODES[@]}"; do [[ ${ALL_NODES[i]} == "$1" ]] && echo $((i + 1)) && return 0; done
    return 1
}

log() { printf 'local-slurm: %s\n' "$*"; }
fail() { printf 'local-slurm: %s\n' "$*" >&2; exit 1; }
cannot_start() { printf 'local-slurm: cannot start the local Slurm cluster: %s\n' "$*" >&2; exit 3; }

usage() {
    echo "usage: $0 {up [--link RATE]|down [--purge]|status|link rate RATE [NODE...]|link NODE down|up|env}" >&2
    exit 2
}

# --- processes ------------------------------------------------------------------------------

# pid_of NAME PIDFILE: print the pid when PIDFILE names a live process called NAME.
# The name check keeps a stale pid file from pointing at some unrelated, reused pid.
pid_of() {
    local name=$1 pidfile=$2 pid comm
    [[ -r $pidfile ]] || return 1
    read -r pid <"$pidfile" 2>/dev/null || return 1
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    [[ $comm == "$name" ]] || return 1
    # A daemon that died but is not reaped yet (a zombie) is dead.
    [[ $(cat "/proc/$pid/stat" 2>/dev/null) != *") Z "* ]] || return 1
    echo "$pid"
}

alive() { pid_of "$@" >/dev/null; }

munged_pidfile() { echo "$RUN/munged.pid"; }
db_pidfile() { echo "$RUN/mysqld.pid"; }
dbd_pidfile() { echo "$RUN/slurmdbd.pid"; }
ctld_pidfile() { echo "$RUN/slurmctld.pid"; }
node_pidfile() { echo "$RUN/slurmd-$1.pid"; }

# launch NAME CMD...: run CMD with stdin from /dev/null, output to $LOG/NAME.out, and no
# inherited descriptors above 2. Daemons inherit open descriptors: one holding our flock would
# make the next `up` wait forever, one holding a caller's pipe would keep it from seeing EOF.
launch() {
    local name=$1
    shift
    (
        for fd in /proc/self/fd/*; do
            fd=${fd##*/}
            if [[ $fd -gt 2 ]]; then { eval "exec $fd>&-"; } 2>/dev/null || true; fi
        done
        exec "$@" </dev/null >>"$LOG/$name.out" 2>&1
    )
}

# listening PORT: something listens on TCP PORT (read from /proc, so nobody gets a stray connection).
listening() {
    local hex
    hex=$(printf '%04X' "$1")
    awk -v port=":$hex" '$2 ~ port"$" && $4 == "0A" {found = 1} END {exit !found}' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# port_free PORT NAME: fail when something else already listens on PORT (only called while
# our own daemon for that port is not running).
port_free() {
    if listening "$1"; then
        fail "port $1 (for $2) is taken by another program; pick other ports with HPCDP_SLURM_PORT_BASE=<n> (uses n..n+$((1 + ${#NODES[@]} + ${#GPU_NODES[@]})))"
    fi
}

# wait_until SECONDS WHAT CMD...: poll CMD every 0.1 s; fail naming WHAT after SECONDS.
wait_until() {
    local seconds=$1 what=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            fail "timed out after ${seconds}s waiting for $what (logs: $LOG)"
        fi
        sleep 0.1
    done
}

# stop NAME:PIDFILE...: SIGTERM every live one at once (each takes 1-2 s to exit), wait up to
# 20 s for all, then SIGKILL what is left.
stop() {
    local pids=() names=() pid spec
    for spec in "$@"; do
        pid=$(pid_of "${spec%%:*}" "${spec#*:}") && pids+=("$pid") && names+=("${spec%%:*}")
    done
    ((${#pids[@]})) || return 0
    log "stopping $(printf '%s\n' "${names[@]}" | uniq | tr '\n' ' ')(pid ${pids[*]})"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    local deadline=$((SECONDS + 20))
    for pid in "${pids[@]}"; do
        while [[ -e /proc/$pid ]] && ((SECONDS < deadline)); do sleep 0.1; done
        if [[ -e /proc/$pid ]]; then
            log "pid $pid ignored SIGTERM for 20s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    for spec in "$@"; do rm -f "${spec#*:}"; done
}

# --- preconditions ---------------------------------------------------------------------------

check_can_start() {
    ((EUID == 0)) || cannot_start "it needs root (daemons run as root, slurmd needs namespaces); run as root"
    local missing=() cmd
    for cmd in munged slurmctld slurmd slurmdbd mariadbd mariadb-install-db mariadb mariadb-admin \
        unshare flock sinfo sacct sacctmgr scontrol squeue scancel; do
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
    done
    ((${#missing[@]} == 0)) || cannot_start "missing ${missing[*]}; install with: $INSTALL_HINT"
    # Unix socket paths (munge, MariaDB, srun's PMIx) must stay under 108 bytes.
    ((${#DIR} <= 40)) || cannot_start "HPCDP_CLUSTER_DIR '$DIR' is ${#DIR} characters; keep it under 40 (unix socket paths)"
    unshare --uts --mount true 2>/dev/null ||
        cannot_start "'unshare --uts --mount' is not permitted here (a container without CAP_SYS_ADMIN?)"
}

# --- the node network and cores ----------------------------------------------------------------

# The mode `up` chose (namespaces or loopback), as recorded; loopback before any `up`. Read
# once here; `up` sets it again when it decides.
# (Builtins only: this runs before `up` checks that the commands it needs exist.)
MODE=loopback
if [[ -r $NETWORK_FILE ]]; then
    while IFS='=' read -r key value; do
        if [[ $key == mode && -n $value ]]; then MODE=$value; fi
    done <"$NETWORK_FILE"
fi

# node_addr NODE: its address (the nodes resolve each other to it).
node_addr() {
    local n
    n=$(node_number "$1") || return 1
    if [[ $MODE == namespaces ]]; then echo "$NET_PREFIX.$n"; else echo "127.0.100.$n"; fi
}
netns_of() { echo "hpcdp-$1"; }
veth_of() { echo "hpv-$1"; } # the bridge-side end of NODE's link (its other end is hsn0)

# can_make_namespaces: the commands exist and the kernel lets us make a namespace and a bridge.
can_make_namespaces() {
    local cmd probe="hpcdp-probe-$$"
    for cmd in ip tc nsenter; do command -v "$cmd" >/dev/null 2>&1 || { echo "no '$cmd' command"; return 1; }; done
    if ! ip netns add "$probe" 2>/dev/null; then echo "'ip netns add' is not permitted"; return 1; fi
    ip netns del "$probe" 2>/dev/null || true
}

# The cores this script may use (its CPU affinity), one per line.
allowed_cores() {
    local list part
    list=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
    for part in ${list//,/ }; do
        if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
    done
}
# node_core NODE: the core its slurmd (and so each of its jobs) runs on: the nodes take the
# cores in turn, so nodes share a core only when there are more nodes than cores.
node_core() {
    local cores n
    mapfile -t cores < <(allowed_cores)
    n=$(node_number "$1") || return 1
    echo "${cores[$(((n - 1) % ${#cores[@]}))]}"
}

# rate_bits RATE: RATE (e.g. 1gbit, 250mbit, 1.5gbit, 800kbit) in bit/s; fails on anything else.
rate_bits() {
    [[ $1 =~ ^([0-9]+(\.[0-9]+)?)(kbit|mbit|gbit)$ ]] || return 1
    awk -v n="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" 'BEGIN {
        m = (u == "kbit") ? 1e3 : (u == "mbit") ? 1e6 : 1e9; b = n * m
        if (b < 8000) exit 1; printf "%.0f\n", b }'
}
# check_rate RATE: exit 2 naming RATE unless it is a rate, none, or default.
check_rate() {
    [[ $1 == none || $1 == default ]] || rate_bits "$1" >/dev/null || {
        echo "local-slurm: link rate '$1' is not valid: give a rate such as 1gbit, 250mbit or 800kbit (8kbit at least), none (unshaped) or default ($DEFAULT_LINK)" >&2
        exit 2
    }
}

# shape DEV RATE [NETNS]: a token bucket of RATE on DEV's egress (none: no shaping). Its burst is
# 2 ms of the rate, 256 KiB at least: the veths pass segments of up to 64 KiB, and a smaller
# bucket held a 250 Mbit/s stream to 68-80% of the rate (256 KiB: 94-96%).
shape() {
    local dev=$1 rate=$2 ns=${3:-} bits burst
    local tcmd=(tc)
    [[ -n $ns ]] && tcmd=(tc -n "$ns")
    if [[ $rate == none ]]; then
        "${tcmd[@]}" qdisc del dev "$dev" root 2>/dev/null || true
        return 0
    fi
    bits=$(rate_bits "$rate")
    burst=$((bits / 8 / 500))
    ((burst >= 262144)) || burst=262144
    "${tcmd[@]}" qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 100ms
}

# set_link NODE RATE: shape both ends of NODE's link, and record the rate.
set_link() {
    local node=$1 rate=${2/#default/$DEFAULT_LINK}
    shape "$(veth_of "$node")" "$rate" || fail "could not shape $node's link to $rate"
    shape "$NODE_IFACE" "$rate" "$(netns_of "$node")" || fail "could not shape $node's $NODE_IFACE to $rate"
    mkdir -p "$LINKS_DIR"
    echo "$rate" >"$LINKS_DIR/$node"
}
link_rate() { cat "$LINKS_DIR/$1" 2>/dev/null || echo none; }

# link_is_up NODE: the bridge side of NODE's link is administratively up.
link_is_up() {
    local flags
    flags=$(cat "/sys/class/net/$(veth_of "$1")/flags" 2>/dev/null) || return 1
    (((flags & 1) == 1))
}

# node_network NODE: its namespace, interface, address, and its end on the bridge, up. Safe to
# run again: what exists is kept, so a second `up` after a killed one finds what it needs.
node_network() {
    local node=$1 ns veth
    ns=$(netns_of "$node")
    veth=$(veth_of "$node")
    if [[ ! -e /run/netns/$ns ]]; then
        # A slurmd still running lives in a namespace that was removed: it must start anew.
        stop "slurmd:$(node_pidfile "$node")"
        ip netns add "$ns" || fail "could not make network namespace $ns"
    fi
    if ! ip link show "$veth" >/dev/null 2>&1; then
        # The node's end is made inside its namespace: hsn0 in every node, as on a real cluster.
        ip link add "$veth" type veth peer name "$NODE_IFACE" netns "$ns" ||
            fail "could not make $node's link ($veth <-> $NODE_IFACE)"
    fi
    ip link set "$veth" master "$BRIDGE" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr replace "$(node_addr "$node")/24" dev "$NODE_IFACE"
    ip -n "$ns" link set "$NODE_IFACE" up
}

bridge_up() {
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge ||
        fail "could not make the bridge $BRIDGE"
    ip addr replace "$BRIDGE_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
}

# network_up RATE: the bridge, then every node's namespace and link, shaped to RATE ("" keeps
# each node's recorded rate, or the default for a node without one).
network_up() {
    local rate=$1 node
    bridge_up
    for node in "${ALL_NODES[@]}"; do
        node_network "$node"
        set_link "$node" "${rate:-$(cat "$LINKS_DIR/$node" 2>/dev/null || echo "$DEFAULT_LINK")}"
    done
}

network_healthy() {
    [[ $MODE == namespaces ]] || return 0
    ip link show "$BRIDGE" >/dev/null 2>&1 || return 1
    local node
    for node in "${ALL_NODES[@]}"; do
        [[ -e /run/netns/$(netns_of "$node") ]] && link_is_up "$node" || return 1
    done
}

# network_down: every namespace, link and the bridge this cluster made (deleting a namespace
# deletes the link end inside it, and so its peer on the bridge).
network_down() {
    local ns removed=()
    while read -r ns _; do
        [[ $ns == hpcdp-* ]] || continue
        ip netns del "$ns" 2>/dev/null && removed+=("$ns")
    done < <(ip netns list 2>/dev/null)
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link del "$BRIDGE" 2>/dev/null && removed+=("$BRIDGE")
    fi
    ((${#removed[@]} == 0)) || log "removed the node network: ${removed[*]}"
    rm -rf "$LINKS_DIR"
}

# net_namespace_ids [NODE...]: the kernel's ids of these nodes' network namespaces (default:
# every one this cluster made), as /proc/PID/ns/net reads them.
net_namespace_ids() {
    local f files=(/run/netns/hpcdp-*) node
    if (($#)); then files=(); for node in "$@"; do files+=("/run/netns/$(netns_of "$node")"); done; fi
    for f in "${files[@]}"; do
        if [[ -e $f ]]; then echo "net:[$(stat -L -c %i "$f")]"; fi
    done
}

# pids_in_namespaces KEEP ID...: every process but pid KEEP whose UTS or network namespace is
# one of the IDs: what a node's jobs left behind.
pids_in_namespaces() {
    local keep=$1 p ns n
    shift
    for p in /proc/[0-9]*; do
        [[ ${p#/proc/} != "$keep" ]] || continue
        ns=" $(readlink "$p/ns/uts" 2>/dev/null || true) $(readlink "$p/ns/net" 2>/dev/null || true) "
        for n in "$@"; do
            if [[ $ns == *" $n "* ]]; then echo "${p#/proc/}" && break; fi
        done
    done
}

# --- configuration ---------------------------------------------------------------------------

# A fresh StateSaveLocation would restart job ids at 1, and a folder named by %j from an earlier
# run would hand back a stale result. So a fresh start takes its first id from the clock (seconds,
# folded below Slurm's MaxJobId of 67043328, repeating only every ~2 years); a start that keeps
# its state keeps its id (slurmctld continues from the saved counter).
first_job_id() {
    local kept
    if [[ -e $STATE/job_state && -r $CONF ]] &&
        kept=$(sed -n 's/^FirstJobId=\([0-9][0-9]*\)$/\1/p' "$CONF") && [[ -n $kept ]]; then
        echo "$kept"
    else
        echo $((1000 + $(date +%s) % 64000000))
    fi
}

write_configs() {
    local real_mem_mb first_id i
    # The nodes share this machine, and any one of them may use all of its memory: each
    # advertises the machine's memory less 2 GiB for the daemons, so a --mem that fits a node
    # fits the machine. Memory is a consumable resource (CR_Core_Memory) so that Slurm enforces
    # a job's --mem: without cgroups, jobacct_gather's OverMemoryKill ends a step above it, and
    # sacct records OUT_OF_MEMORY. A job without --mem gets DefMemPerCPU, its CPUs' share of
    # the node: jobs pack on CPUs as they did before memory was tracked.
    real_mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024) - 2048}' /proc/meminfo)
    # The controller side as the nodes reach it: the bridge, or the loopback.
    local ctld_addr=127.0.0.1
    [[ $MODE == namespaces ]] && ctld_addr=$BRIDGE_ADDR
    first_id=$(first_job_id)
    [[ -s $DB_PASS_FILE ]] || (umask 077 && od -An -N12 -tx1 /dev/urandom | tr -d ' \n' >"$DB_PASS_FILE")

    cat >"$CONF.new" <<EOF
# Written by scripts/local-slurm.sh (hpcdp); rewritten on every 'up'.
ClusterName=$CLUSTER
SlurmctldHost=localhost($ctld_addr)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A short credential lifetime lets a requeued job start again in ~12 s instead of ~150 s.
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$STATE
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdSpoolDir=$DIR/spool/%n
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmdLogFile=$LOG/slurmd-%n.log
# Per node, or srun --mpi=pmix on two nodes collides on one spmix_appdir.
TmpFS=$DIR/tmp/%n
FirstJobId=$first_id
# No cgroups here.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$((real_mem_mb / CPUS_PER_NODE))
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
# Nodes advertise the CPUs written below, not what slurmd detects (2 real cores, 4 nodes).
SlurmdParameters=config_overrides
SchedulerParameters=sched_interval=5,bf_interval=5
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
# A node that stops answering (its link cut) is declared DOWN after 30 s, not 300: on this
# miniature, a node failure and the requeue that follows are seen in a test's time.
SlurmdTimeout=30
KillWait=2
SlurmctldDebug=info
SlurmdDebug=info
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$ctld_addr
AccountingStoragePort=$DBD_PORT
# Without this, sacctmgr looks for munge at the system socket and fails.
AccountingStoragePass=$MUNGE_SOCKET
JobCompType=jobcomp/none
EOF
    local gres
    for i in "${!ALL_NODES[@]}"; do
        gres=""
        [[ ${ALL_NODES[i]} == gpu* ]] && gres=" Gres=gpu:$GPUS_PER_NODE"
        printf 'NodeName=%s NodeAddr=%s Port=%d CPUs=%d Sockets=1 CoresPerSocket=%d ThreadsPerCore=1 RealMemory=%d%s State=UNKNOWN\n' \
            "${ALL_NODES[i]}" "$(node_addr "${ALL_NODES[i]}")" $((NODE_PORT_BASE + i + 1)) "$CPUS_PER_NODE" "$CPUS_PER_NODE" \
            "$real_mem_mb" "$gres" >>"$CONF.new"
    done
    # Preemption, as a site configures it: a job in "high" (a higher PriorityTier) preempts
    # jobs in "low", which are requeued (PreemptMode=REQUEUE) after a grace time in which they
    # get SIGTERM and checkpoint. "debug", the default, is never preempted. It bills 2 units
    # per CPU (TRESBillingWeights, as sites weigh their partitions): hpcdp forecast's billing
    # is tested against what sacct bills its jobs.
    all_nodes="$(IFS=,; echo "${NODES[*]}")"
    {
        echo "PartitionName=debug Nodes=$all_nodes Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=OFF TRESBillingWeights=CPU=2.0"
        echo "PartitionName=low Nodes=$all_nodes MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=$PREEMPT_GRACE_S"
        echo "PartitionName=high Nodes=$all_nodes MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF"
        # GPU profiles' scripts run here: no CPU-only job lands on these nodes by default. Its
        # own billing weight, so that a forecast shows it reads the partition a job ran in.
        if ((${#ALL_NODES[@]} > ${#NODES[@]})); then
            echo "PartitionName=gpu Nodes=$(IFS=,; echo "${GPU_NODES[*]}") MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=OFF TRESBillingWeights=CPU=3.0"
        fi
    } >>"$CONF.new"
    if ((${#ALL_NODES[@]} > ${#NODES[@]})); then
        # slurmd reads gres.conf beside slurm.conf. No NVML here: the devices are listed.
        {
            echo "# Written by scripts/local-slurm.sh (hpcdp): character devices, no GPU behind them."
            echo "AutoDetect=off"
            echo "NodeName=$(IFS=,; echo "${GPU_NODES[*]}") Name=gpu File=$GPU_DEVICES/nvidia[0-$((GPUS_PER_NODE - 1))]"
        } >"$ETC/gres.conf"
        sed -i "0,/^SelectTypeParameters=/s//GresTypes=gpu\n&/" "$CONF.new"
    else
        rm -f "$ETC/gres.conf"
    fi
    write_oci_conf
    # Nodes are only added or removed by restarting slurmctld and the slurmds.
    CONFIG_CHANGED=0
    cmp -s "$CONF.new" "$CONF" || CONFIG_CHANGED=1
    mv -f "$CONF.new" "$CONF"

    # slurmdbd has no -f: it reads slurmdbd.conf beside $SLURM_CONF, mode 600, owned by SlurmUser.
    (
        umask 077
        cat >"$DBD_CONF" <<EOF
# Written by scripts/local-slurm.sh (hpcdp); rewritten on every 'up'.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
# With skip-networking MariaDB has only its socket; slurmdbd finds it through MYSQL_UNIX_PORT.
StorageHost=localhost
StorageUser=slurm
StoragePass=$(cat "$DB_PASS_FILE")
StorageLoc=slurm_acct_db
EOF
    )
    chmod 600 "$DBD_CONF"

    cat >"$DB_CNF" <<EOF
# Written by scripts/local-slurm.sh (hpcdp): a private MariaDB for slurmdbd, no TCP.
[mysqld]
user=root
datadir=$DB_DATA
socket=$DB_SOCKET
pid-file=$RUN/mysqld.pid
log-error=$LOG/mysqld.log
skip-networking
# What slurmdbd recommends (silences its warning); small increments keep the data dir small.
innodb_buffer_pool_size=512M
innodb_log_file_size=32M
innodb_lock_wait_timeout=900
innodb_autoextend_increment=8

[client]
user=root
socket=$DB_SOCKET
EOF

    for i in "${!ALL_NODES[@]}"; do
        mkdir -p "$DIR/nodes/${ALL_NODES[i]}" "$DIR/spool/${ALL_NODES[i]}" "$DIR/tmp/${ALL_NODES[i]}"
        # Mounted over /etc/hosts inside the node's namespace only.
        {
            echo "127.0.0.1 localhost"
            echo "::1 localhost ip6-localhost ip6-loopback"
            local j
            for j in "${!ALL_NODES[@]}"; do echo "$(node_addr "${ALL_NODES[j]}") ${ALL_NODES[j]}"; done
        } >"$DIR/nodes/${ALL_NODES[i]}/hosts"
    done
}

# --- starting --------------------------------------------------------------------------------

start_munged() {
    alive munged "$(munged_pidfile)" && return 0
    # munged refuses a socket directory others cannot enter, and a key others can read.
    mkdir -p "$MUNGE_DIR"
    chmod 755 "$MUNGE_DIR"
    if [[ ! -s $MUNGE_DIR/munge.key ]]; then
        (umask 077 && dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1 count=1024 status=none)
    fi
    chmod 400 "$MUNGE_DIR/munge.key"
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock" # left by an unclean stop; ours, since munged is not running
    launch munged munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
        --pid-file="$(munged_pidfile)" --log-file="$LOG/munged.log" --seed-file="$MUNGE_DIR/munge.seed" ||
        fail "munged did not start: $(tail -n 3 "$LOG/munged.log" "$LOG/munged.out" 2>/dev/null)"
    wait_until 10 munged test -S "$MUNGE_SOCKET"
    log "munged running"
}

db_sql() { mariadb --defaults-file="$DB_CNF" -e "$1"; }

start_mariadb() {
    if ! alive mariadbd "$(db_pidfile)"; then
        if [[ ! -d $DB_DATA/mysql ]]; then
            log "creating the MariaDB data directory (first start)"
            rm -rf "$DB_DATA"
            mariadb-install-db --defaults-file="$DB_CNF" --user=root --skip-test-db \
                --auth-root-authentication-method=socket >"$LOG/mariadb-install-db.out" 2>&1 ||
                fail "mariadb-install-db failed: see $LOG/mariadb-install-db.out"
        fi
        # mariadbd stays in the foreground: setsid -f detaches it from our session.
        launch mariadbd setsid -f mariadbd --defaults-file="$DB_CNF"
        wait_until 30 "MariaDB to answer (log: $LOG/mysqld.log)" mariadb-admin --defaults-file="$DB_CNF" ping
        log "mariadbd running"
    fi
    # Idempotent, so a kept data directory always matches slurmdbd.conf's password.
    db_sql "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$(cat "$DB_PASS_FILE")';
        ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$(cat "$DB_PASS_FILE")';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" ||
        fail "could not create the slurm database and user in MariaDB"
}

start_slurmdbd() {
    alive slurmdbd "$(dbd_pidfile)" && return 0
    port_free "$DBD_PORT" slurmdbd
    local dbd_log=$LOG/slurmdbd.log offset
    offset=$(stat -c %s "$dbd_log" 2>/dev/null || echo 0)
    MYSQL_UNIX_PORT=$DB_SOCKET launch slurmdbd slurmdbd
    # Its "started" line means it accepts connections; polling sacctmgr before that costs ~2 s
    # per failed try.
    wait_until 30 "slurmdbd's 'started' log line ($dbd_log)" \
        bash -c 'tail -c +$(($2 + 1)) "$1" | grep -q "slurmdbd version .* started"' _ "$dbd_log" "$offset"
    # It logs "started" just before binding its port, so a bind failure comes after that line.
    wait_until 10 "slurmdbd to listen on port $DBD_PORT ($dbd_log)" listening "$DBD_PORT"
    alive slurmdbd "$(dbd_pidfile)" || fail "slurmdbd exited: $(tail -n 3 "$dbd_log")"
    log "slurmdbd running"
}

register_cluster() {
    # Root needs no association of its own (AccountingStorageEnforce is off), but the cluster
    # and an account exist so sacct/sacctmgr show something sensible and -A hpcdp works.
    if ! sacctmgr -n -P show cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null || fail "sacctmgr could not add cluster $CLUSTER"
        log "registered cluster $CLUSTER with slurmdbd"
    fi
    if ! sacctmgr -n -P show account format=account 2>/dev/null | grep -qx "$CLUSTER"; then
        sacctmgr -i add account "$CLUSTER" cluster="$CLUSTER" description=local organization=hpcdp >/dev/null &&
            sacctmgr -i add user root account="$CLUSTER" cluster="$CLUSTER" >/dev/null ||
            fail "sacctmgr could not add account $CLUSTER"
    fi
}

start_slurmctld() {
    alive slurmctld "$(ctld_pidfile)" && return 0
    port_free "$CTLD_PORT" slurmctld
    launch slurmctld slurmctld -f "$CONF" || fail "slurmctld did not start: $(tail -n 5 "$LOG/slurmctld.log" 2>/dev/null)"
    wait_until 30 "slurmctld to answer (log: $LOG/slurmctld.log)" scontrol ping
    log "slurmctld running"
}

start_slurmd() {
    local node=$1
    alive slurmd "$(node_pidfile "$node")" && return 0
    port_free "$((NODE_PORT_BASE + $(node_number "$node")))" "slurmd $node"
    # Own UTS and mount namespace: `hostname` prints the node name inside its jobs, and a
    # private hosts file (bind-mounted over /etc/hosts there only) resolves every node.
    # In its own network namespace (nsenter, not `ip netns exec`, which remounts /sys and hides
    # /sys/fs/cgroup from slurmd) and on its own core (taskset: with TaskPlugin=task/none every
    # task of the node inherits it).
    local place=()
    [[ $MODE == namespaces ]] && place+=(nsenter "--net=/run/netns/$(netns_of "$node")")
    command -v taskset >/dev/null && place+=(taskset -c "$(node_core "$node")")
    launch "slurmd-$node" "${place[@]}" unshare --uts --mount --propagation private \
        bash -c 'hostname "$1" && mount --bind "$2" /etc/hosts && exec slurmd -f "$3" -N "$1"' \
        _ "$node" "$DIR/nodes/$node/hosts" "$CONF" ||
        fail "slurmd $node did not start: $(tail -n 5 "$LOG/slurmd-$node.log" "$LOG/slurmd-$node.out" 2>/dev/null)"
}

# nodes_ready [NODE...]: every node named (default: all) responds (no '*' suffix) and is usable.
nodes_ready() {
    local states node nodes=("$@")
    ((${#nodes[@]})) || nodes=("${ALL_NODES[@]}")
    states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u) || return 1
    for node in "${nodes[@]}"; do
        grep -qE "^$node (idle|mix|alloc)\$" <<<"$states" || return 1
    done
}

resume_stuck_nodes() {
    # A node drained or downed in an earlier life (saved in state) would stay so; a fresh `up`
    # means "give me a working cluster", so put it back.
    local node state
    while read -r node state; do
        case $state in
        down | drain | drng | drained | fail)
            log "resuming $node (was $state)"
            scontrol update nodename="$node" state=resume 2>/dev/null || true
            ;;
        esac
    done < <(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u | tr -d '*~#!%$@^-')
}

healthy() {
    alive munged "$(munged_pidfile)" && alive mariadbd "$(db_pidfile)" &&
        alive slurmdbd "$(dbd_pidfile)" && alive slurmctld "$(ctld_pidfile)" || return 1
    local node
    for node in "${ALL_NODES[@]}"; do alive slurmd "$(node_pidfile "$node")" || return 1; done
    nodes_ready
}

# drop_gpu_nodes REASON: the CPU nodes are what hpcdp needs; the GPU nodes are an extra, whose
# tests skip when partition gpu is not idle. Stop them and leave them out of later starts.
drop_gpu_nodes() {
    log "warning: no GPU nodes: $1 (logs: $LOG/slurmd-gpu*); going on without them (delete $NO_GPU_MARKER to try again)"
    touch "$NO_GPU_MARKER"
    local specs=() node
    for node in "${GPU_NODES[@]}"; do specs+=("slurmd:$(node_pidfile "$node")"); done
    stop "${specs[@]}"
    for node in "${GPU_NODES[@]}"; do rm -f "$(node_pidfile "$node")"; done
    ALL_NODES=("${NODES[@]}")
}

# Slurm's own OCI containers (srun --container=BUNDLE) where runc is installed: oci.conf runs
# each task with runc, through slurm-oci.py (which gives 22.05's container tasks their rank),
# and host-bundle/ is a bundle whose root file system is this machine's. slurmstepd reads
# oci.conf at every step: no restart needed.
write_oci_conf() {
    if ! command -v runc >/dev/null || ! command -v python3 >/dev/null; then
        rm -f "$ETC/oci.conf"
        return 0
    fi
    local helper
    helper="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/slurm-oci.py"
    mkdir -p "$OCI/state"
    python3 "$helper" host-bundle "$OCI/host-bundle"
    # runc needs namespaces and a cgroup set-up the machine may not allow: try one container.
    local probe="hpcdp-probe-$$" why
    if ! why="$(runc --root="$OCI/state" run --bundle "$OCI/host-bundle" "$probe" 2>&1 </dev/null)"; then
        runc --root="$OCI/state" delete --force "$probe" >/dev/null 2>&1 || true
        log "no containers: runc cannot start one here ($(echo "$why" | tail -n 1)); srun --container is off"
        rm -f "$ETC/oci.conf"
        return 0
    fi
    # Written aside and moved: a step starting now reads the old file or the new one whole.
    cat >"$ETC/oci.conf.new" <<EOF
# Written by scripts/local-slurm.sh (hpcdp): srun --container=BUNDLE runs each task with runc.
RunTimeQuery="runc --root=$OCI/state state %n.%u.%j.%s.%t"
RunTimeKill="runc --root=$OCI/state kill -a %n.%u.%j.%s.%t"
RunTimeDelete="runc --root=$OCI/state delete --force %n.%u.%j.%s.%t"
RunTimeRun="python3 $helper run $OCI/state %b %n.%u.%j.%s.%t"
EOF
    mv -f "$ETC/oci.conf.new" "$ETC/oci.conf"
}
network_summary() {
    local node rates
    if [[ $MODE != namespaces ]]; then
        echo "; nodes share the loopback"
        return 0
    fi
    rates=$(for node in "${ALL_NODES[@]}"; do link_rate "$node"; done | sort -u | paste -sd/)
    echo "; each node on $NODE_IFACE in its own network namespace, links $rates, cores in turn"
}
oci_summary() {
    if [[ -e $ETC/oci.conf ]]; then echo "; containers: srun --container (runc), host bundle $OCI/host-bundle"; fi
}

cmd_up() {
    local link=""
    case ${1:-} in
    --link) [[ $# == 2 ]] || usage; check_rate "$2"; link=$2 ;;
    "") ;;
    *) usage ;;
    esac
    check_can_start
    mkdir -p "$DIR" "$ETC" "$RUN" "$LOG" "$STATE"
    chmod 755 "$DIR" "$RUN" "$LOG"
    touch "$MARKER"
    exec 9>"$DIR/.lock"
    flock -w 300 9 || fail "another 'up' or 'down' held $DIR/.lock for 300 s"
    if [[ -e $NO_GPU_MARKER ]]; then
        log "no GPU nodes: they did not start before ($NO_GPU_MARKER)"
    elif gpu_devices_ready; then
        ALL_NODES+=("${GPU_NODES[@]}")
    else
        log "no GPU nodes: cannot make character devices in $GPU_DEVICES (mknod needs CAP_MKNOD)"
    fi
    if healthy && network_healthy; then
        write_oci_conf
        if [[ -n $link && $MODE == namespaces ]]; then
            local node
            for node in "${ALL_NODES[@]}"; do set_link "$node" "$link"; done
        fi
        log "already up: ${#NODES[@]} nodes in partition debug$(gpu_summary)$(network_summary)$(oci_summary) (SLURM_CONF=$CONF)"
        return 0
    fi
    local t0=$SECONDS why
    if why=$(can_make_namespaces); then
        MODE=namespaces
        # subnet: the nodes' addresses, which hpcdp knows for this machine's (shared_fs.py).
        printf 'mode=namespaces\ninterface=%s\nsubnet=%s.0/24\n' "$NODE_IFACE" "$NET_PREFIX" >"$NETWORK_FILE"
    else
        MODE=loopback
        # One line, and the cluster still starts: today's shared loopback.
        log "no node network: $why; the nodes share the loopback (127.0.100.N) instead of links of their own"
        printf 'mode=loopback\ninterface=lo\n' >"$NETWORK_FILE"
    fi
    write_configs
    local node
    if ((CONFIG_CHANGED)) && alive slurmctld "$(ctld_pidfile)"; then
        log "the nodes changed: restarting slurmctld and the slurmds with the new slurm.conf"
        local specs=()
        for node in "${NODES[@]}" "${GPU_NODES[@]}"; do specs+=("slurmd:$(node_pidfile "$node")"); done
        stop "${specs[@]}" "slurmctld:$(ctld_pidfile)"
    fi
    # The bridge first: slurmdbd and slurmctld are reached at its address.
    if [[ $MODE == namespaces ]]; then network_up "$link"; fi
    start_munged
    start_mariadb
    start_slurmdbd
    register_cluster
    start_slurmctld
    for node in "${NODES[@]}"; do start_slurmd "$node"; done
    if ((${#ALL_NODES[@]} > ${#NODES[@]})); then
        for node in "${GPU_NODES[@]}"; do
            # A subshell: fail() ends it, not `up`.
            (start_slurmd "$node") || { drop_gpu_nodes "slurmd $node did not start"; break; }
        done
    fi
    local deadline=$((SECONDS + 30)) resumed=0
    until nodes_ready; do
        if ((SECONDS >= deadline)) && nodes_ready "${NODES[@]}"; then
            drop_gpu_nodes "they are not idle after 30s"
            break
        fi
        if ((SECONDS >= deadline)); then
            sinfo -N >&2 || true
            fail "nodes not idle after 30s (logs: $LOG/slurmd-*.log)"
        fi
        if ((!resumed && SECONDS >= deadline - 27)); then
            resume_stuck_nodes
            resumed=1
        fi
        sleep 0.2
    done
    wait_until 30 "sacct to answer" sacct -n -X -S now-1minutes
    log "up in $((SECONDS - t0))s: ${#NODES[@]} nodes idle in partition debug$(gpu_summary)$(network_summary)$(oci_summary); export SLURM_CONF=$CONF"
}

# --- stopping --------------------------------------------------------------------------------

cancel_jobs() {
    alive slurmctld "$(ctld_pidfile)" || return 0
    local jobs
    jobs=$(squeue -h -o %i 2>/dev/null) || return 0
    [[ -n $jobs ]] || return 0
    log "cancelling jobs: $(echo $jobs)"
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null || true
    local deadline=$((SECONDS + 15))
    while [[ -n $(squeue -h -o %i 2>/dev/null) ]] && ((SECONDS < deadline)); do sleep 0.2; done
}

cmd_down() {
    local purge=0
    case ${1:-} in
    --purge) purge=1 ;;
    "") ;;
    *) usage ;;
    esac
    if [[ ! -d $DIR ]]; then
        log "already down ($DIR does not exist)"
        return 0
    fi
    exec 9>"$DIR/.lock"
    flock -w 300 9 || fail "another 'up' or 'down' held $DIR/.lock for 300 s"
    gpu_nodes_configured && ALL_NODES+=("${GPU_NODES[@]}")

    cancel_jobs
    # Job processes live in the nodes' UTS and network namespaces: remember them to clean up
    # leftovers (the network ones also when their slurmd was killed).
    local node pid namespaces=()
    for node in "${ALL_NODES[@]}"; do
        pid=$(pid_of slurmd "$(node_pidfile "$node")") &&
            namespaces+=("$(readlink "/proc/$pid/ns/uts" 2>/dev/null)")
    done
    mapfile -t -O "${#namespaces[@]}" namespaces < <(net_namespace_ids)
    local stop_nodes=()
    for node in "${ALL_NODES[@]}"; do stop_nodes+=("slurmd:$(node_pidfile "$node")"); done
    stop "${stop_nodes[@]}" "slurmctld:$(ctld_pidfile)"
    if ((${#namespaces[@]})); then
        local leftovers=()
        mapfile -t leftovers < <(pids_in_namespaces "" "${namespaces[@]}")
        if ((${#leftovers[@]})); then
            log "killing leftover job processes: ${leftovers[*]}"
            kill -KILL "${leftovers[@]}" 2>/dev/null || true
        fi
    fi
    # After slurmctld, so its last job records reach the database; munge is not needed after.
    stop "slurmdbd:$(dbd_pidfile)"
    stop "mariadbd:$(db_pidfile)" "munged:$(munged_pidfile)"
    # Only a cluster that made the node network removes it (one started on the loopback beside
    # it, as a test does, leaves it alone).
    if [[ $MODE == namespaces ]]; then network_down; fi

    if ((purge)); then
        if [[ -e $MARKER ]]; then
            rm -rf -- "$DIR"
            log "down; deleted $DIR"
        else
            fail "not deleting $DIR: it lacks $MARKER, so it is not a local-slurm.sh directory"
        fi
    else
        log "down (data kept in $DIR; 'down --purge' deletes it)"
    fi
}

# --- status ----------------------------------------------------------------------------------

cmd_status() {
    local all=0 pid name pidfile
    report() {
        if pid=$(pid_of "$1" "$2"); then
            printf '%-16s running (pid %s)\n' "$3" "$pid"
        else
            printf '%-16s stopped\n' "$3"
            all=1
        fi
    }
    report munged "$(munged_pidfile)" munged
    report mariadbd "$(db_pidfile)" mariadbd
    report slurmdbd "$(dbd_pidfile)" slurmdbd
    report slurmctld "$(ctld_pidfile)" slurmctld
    gpu_nodes_configured && ALL_NODES+=("${GPU_NODES[@]}")
    for name in "${ALL_NODES[@]}"; do report slurmd "$(node_pidfile "$name")" "slurmd $name"; done
    echo
    printf '%-8s %-12s %-9s %-6s %s\n' NODE ADDRESS INTERFACE CORES LINK
    local iface=lo link cores
    [[ $MODE == namespaces ]] && iface=$NODE_IFACE
    for name in "${ALL_NODES[@]}"; do
        link="-"
        if [[ $MODE == namespaces ]]; then
            link=$(link_rate "$name")
            if link_is_up "$name"; then link+=" up"; else link+=" DOWN"; fi
        fi
        cores="-"
        pid=$(pid_of slurmd "$(node_pidfile "$name")") &&
            cores=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "/proc/$pid/status" 2>/dev/null)
        printf '%-8s %-12s %-9s %-6s %s\n' "$name" "$(node_addr "$name")" "$iface" "$cores" "$link"
    done
    if alive slurmctld "$(ctld_pidfile)" && [[ -r $CONF ]]; then
        echo
        sinfo -N || all=1
        nodes_ready || all=1
    fi
    echo
    echo "SLURM_CONF=$CONF"
    return "$all"
}

# --- faults and rates on a running cluster -----------------------------------------------------

# known_node NODE: NODE is one of this cluster's nodes, or exit 2 naming them.
known_node() {
    local node
    for node in "${ALL_NODES[@]}"; do [[ $node == "$1" ]] && return 0; done
    echo "local-slurm: no node '$1' in this cluster; its nodes: ${ALL_NODES[*]}" >&2
    exit 2
}

# end_job_processes NODE: kill every process in NODE's network namespace but its slurmd.
end_job_processes() {
    local killed=()
    mapfile -t killed < <(pids_in_namespaces "$(pid_of slurmd "$(node_pidfile "$1")" || true)" \
        "$(net_namespace_ids "$1")")
    if ((${#killed[@]})); then
        kill -KILL "${killed[@]}" 2>/dev/null || true
        log "$1 was DOWN in Slurm: ended its job processes (${killed[*]}), as its reboot would"
    fi
}

cmd_link() {
    gpu_nodes_configured && ALL_NODES+=("${GPU_NODES[@]}")
    if [[ $MODE != namespaces || ! -e /run/netns/$(netns_of "${NODES[0]}") ]]; then
        echo "local-slurm: the nodes have no links of their own: start the cluster with 'up' as root where network namespaces can be made" >&2
        exit 2
    fi
    local node nodes=()
    case ${1:-} in
    rate)
        [[ $# -ge 2 ]] || usage
        check_rate "$2"
        nodes=("${@:3}")
        ((${#nodes[@]})) || nodes=("${ALL_NODES[@]}")
        for node in "${nodes[@]}"; do known_node "$node"; done
        for node in "${nodes[@]}"; do set_link "$node" "$2"; done
        log "link rate $2: ${nodes[*]}"
        ;;
    *)
        [[ $# == 2 && ($2 == down || $2 == up) ]] || usage
        known_node "$1"
        local was_down=0
        if [[ $2 == up ]] && sinfo -h -N -n "$1" -o '%t' 2>/dev/null | grep -q '^down'; then
            was_down=1
            # Slurm gave the node up and requeued its jobs elsewhere. A failed node is rebooted
            # before it returns: its job processes go (slurmd stays). Left alive, they would
            # come back with the job ids Slurm reuses for the requeued jobs, and Slurm's kill
            # of the old step would hit the new one.
            end_job_processes "$1"
        fi
        # The bridge side of the node's veth, as a cable pulled at the switch: the node keeps
        # its interface and address, and reaches nothing.
        ip link set "$(veth_of "$1")" "$2" || fail "could not set $1's link $2"
        log "$1's link is $2"
        if ((was_down)); then
            # As an admin does once the cable is back (slurmctld would, at a later ping).
            scontrol update nodename="$1" state=resume 2>/dev/null && log "$1 resumed in Slurm (it was DOWN)"
        fi
        ;;
    esac
}

case ${1:-} in
up) shift && cmd_up "$@" ;;
link) shift && cmd_link "$@" ;;
down) shift && cmd_down "$@" ;;
status) cmd_status ;;
env) printf 'export SLURM_CONF=%q\n' "$CONF" ;;
*) usage ;;
esac
