#!/usr/bin/env bash
# .ci/cluster.sh - a multi-node SLURM cluster on one machine: 4 compute nodes, each a
# `slurmd -N mnK` in its own network (and UTS) namespace with its own address on a bridge
# this script creates, so that "between nodes" is a real network hop that `tc` can slow.
#
#   bash .ci/cluster.sh [start]          create namespaces + bridge, start slurmctld and the
#                                        4 slurmds (idempotent: a second call is a no-op,
#                                        a node whose slurmd died is restarted and resumed)
#   bash .ci/cluster.sh stop             stop the daemons, delete namespaces and bridge
#   bash .ci/cluster.sh status           daemons, namespaces, sinfo, link shaping
#   bash .ci/cluster.sh slow RATE [DELAY] shape every node's link, both directions
#                                        (tbf RATE, e.g. 100mbit; netem DELAY, e.g. 2ms,
#                                        where the kernel has sch_netem: the CI VM's has not)
#   bash .ci/cluster.sh unslow           remove the shaping
#   bash .ci/cluster.sh kill-node mnK    kill mnK's slurmd and every process of its namespace
#                                        (what a node crash looks like to SLURM)
#   source /tmp/autotune-mn/env          AUTOTUNE_MN_SLURM_CONF, AUTOTUNE_MN_PG_URL, ...
#
# It runs beside the single-node cluster of .ci/services.sh and shares only munged and
# slurmdbd with it (slurmdbd serves several clusters: this one is ClusterName=mn); its own
# conf dir, state dirs, pid files and ports (slurmctld 6917 on the bridge address; each
# slurmd 6818 inside its own namespace). Tests select it with SLURM_CONF=$AUTOTUNE_MN_SLURM_CONF.
#
# Facts this relies on (Debian 12, SLURM 22.05.8, iproute2, measured on a 2-core VM):
#   - slurmd 22.05 fails to start without a cgroup file system under /sys/fs/cgroup, even
#     with proctrack/linuxproc; `ip netns exec` remounts /sys (hiding it), so a node is
#     started with `nsenter --net` + `unshare --uts --mount`, its /etc/hosts bound from
#     /etc/netns/NS/hosts by hand; the nodes track processes with proctrack/linuxproc
#     (4 slurmds of a build without multiple-slurmd would collide in one cgroup tree);
#   - gloo binds to the address its host name resolves to: each node gets its own host
#     name (unshare --uts) and a hosts file naming every node, so rank 0 on mn1 listens on
#     10.77.0.11, not on 127.0.0.1;
#   - a batch script runs inside its first node's namespace, where 127.0.0.1 is that
#     namespace's loopback: socat forwards the bridge address's 5432 to the host's
#     PostgreSQL (AUTOTUNE_MN_PG_URL) so that a campaign job reaches the database;
#   - SlurmdTimeout=10 lets slurmctld mark a killed node DOWN (and its job steps NODE_FAIL)
#     within ~10-20 s instead of the default 300 s; ReturnToService=2 brings it back when
#     its slurmd registers again.
# Only addresses inside namespaces this script created are used (10.77.0.0/24 by default).
set -euo pipefail

MN_DIR=${MN_DIR:-/tmp/autotune-mn}
MN_NODES=${MN_NODES:-4}
MN_CPUS=${MN_CPUS:-4}              # CPUs each node advertises (config_overrides: 2 real cores)
MN_NET=${MN_NET:-10.77.0}          # /24; .1 is the controller's bridge address, .1K node K
MN_BRIDGE=${MN_BRIDGE:-atmn0}
MN_CTLD_PORT=${MN_CTLD_PORT:-6917}
PG_HOST=${PG_HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
CONF="$MN_DIR/etc/slurm.conf"
LOG="$MN_DIR/log"
RUN="$MN_DIR/run"
CTL_ADDR="$MN_NET.1"
export SLURM_CONF="$CONF"

t0=$(date +%s%N)
say() { local ds=$(( ($(date +%s%N) - t0) / 100000000 )); printf '[cluster %3d.%ds] %s\n' $((ds / 10)) $((ds % 10)) "$*"; }
die() { say "ERROR: $*"; exit 1; }
wait_for() { # wait_for SECONDS CMD...: poll every 0.2 s
  local n=$(( $1 * 5 )); shift
  for _ in $(seq 1 "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}
alive() { [ -s "$1" ] && kill -0 "$(head -1 "$1")" 2>/dev/null; }
node() { echo "mn$1"; }
ns() { echo "autotune-mn$1"; }
addr() { echo "$MN_NET.$((10 + $1))"; }
nodes_idle() { [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -Ec ' (idle|mix|alloc)$')" -ge "$MN_NODES" ]; }

render_conf() { # render_conf FILE: the slurm.conf this script wants
  local out=$1 range="mn[1-$MN_NODES]" i
  cat >"$out" <<EOF
# Written by autotune .ci/cluster.sh - multi-node CI cluster (one namespace per node).
ClusterName=mn
SlurmctldHost=$(hostname -s)($CTL_ADDR)
SlurmctldPort=$MN_CTLD_PORT
SlurmdPort=6818
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
StateSaveLocation=$MN_DIR/ctld
SlurmdSpoolDir=$MN_DIR/d/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
SlurmdTimeout=10
MessageTimeout=5
KillWait=5
MinJobAge=300
ReturnToService=2
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SlurmdParameters=config_overrides
EOF
  for i in $(seq 1 "$MN_NODES"); do
    echo "NodeName=$(node "$i") NodeAddr=$(addr "$i") CPUs=$MN_CPUS RealMemory=4096 State=UNKNOWN" >>"$out"
  done
  echo "PartitionName=mn Nodes=$range Default=YES MaxTime=INFINITE State=UP" >>"$out"
}

write_conf() { # true when slurm.conf changed (then written)
  mkdir -p "$MN_DIR/etc"
  render_conf "$CONF.tmp"
  if cmp -s "$CONF.tmp" "$CONF"; then rm -f "$CONF.tmp"; return 1; fi
  mv "$CONF.tmp" "$CONF"
  return 0
}

conf_differs() { # true when slurm.conf would change; writes nothing
  local tmp rc=1
  tmp=$(mktemp)
  render_conf "$tmp"
  cmp -s "$tmp" "$CONF" || rc=0
  rm -f "$tmp"
  return $rc
}

hosts_file() {
  local i
  printf '127.0.0.1 localhost\n%s %s mnctl\n' "$CTL_ADDR" "$(hostname -s)"
  for i in $(seq 1 "$MN_NODES"); do printf '%s %s\n' "$(addr "$i")" "$(node "$i")"; done
}

make_network() {
  if ! ip link show "$MN_BRIDGE" >/dev/null 2>&1; then
    ip link add "$MN_BRIDGE" type bridge
    ip addr add "$CTL_ADDR/24" dev "$MN_BRIDGE"
  fi
  ip link set "$MN_BRIDGE" up
  local i n v
  for i in $(seq 1 "$MN_NODES"); do
    n=$(ns "$i"); v="atmn-v$i"
    mkdir -p "/etc/netns/$n"
    hosts_file >"/etc/netns/$n/hosts"
    ip netns list | grep -qw "^$n" || ip netns add "$n"
    if ! ip link show "$v" >/dev/null 2>&1; then
      ip link add "$v" type veth peer name eth0 netns "$n"
      ip link set "$v" master "$MN_BRIDGE" up
      ip -n "$n" addr add "$(addr "$i")/24" dev eth0
      ip -n "$n" link set eth0 up
      ip -n "$n" link set lo up
    fi
  done
  say "network up: bridge $MN_BRIDGE $CTL_ADDR/24, nodes $(addr 1)..$(addr "$MN_NODES")"
}

start_pg_forward() { # the bridge address's 5432 -> the host's PostgreSQL (for batch jobs)
  alive "$RUN/pgfwd.pid" && return 0
  setsid socat "TCP-LISTEN:$PG_PORT,bind=$CTL_ADDR,reuseaddr,fork" "TCP:$PG_HOST:$PG_PORT" \
    >>"$LOG/pgfwd.log" 2>&1 </dev/null &
  echo $! >"$RUN/pgfwd.pid"
}

start_node() { # start_node K: slurmd -N mnK inside its namespace, with its own host name
  local i=$1 name
  name=$(node "$i")
  alive "$RUN/slurmd-$name.pid" && return 0
  mkdir -p "$MN_DIR/d/$name"
  # nsenter --net, not `ip netns exec`: the latter remounts /sys, hiding the cgroup tree
  # that slurmd 22.05 insists on finding even with proctrack/linuxproc.
  nsenter --net="/run/netns/$(ns "$i")" unshare --uts --mount -- sh -c \
    "mount --bind /etc/netns/$(ns "$i")/hosts /etc/hosts && hostname $name &&
     exec slurmd -f '$CONF' -N $name" </dev/null
}

start_all() {
  mkdir -p "$MN_DIR"/{run,log,ctld,d}
  if ! command -v socat >/dev/null || ! command -v ip >/dev/null; then
    say "installing socat iproute2 (log: $LOG/apt.log)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends socat iproute2; } >>"$LOG/apt.log" 2>&1 \
      || die "apt-get install socat iproute2 failed (see $LOG/apt.log)"
  fi
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || die "munged is not running (run .ci/services.sh first)"
  wait_for 10 bash -c 'exec 3<>/dev/tcp/127.0.0.1/6819' || die "slurmdbd is not listening on 6819 (run .ci/services.sh first)"
  make_network
  local changed=0 i
  write_conf && changed=1
  sacctmgr -i -Q add cluster mn >/dev/null 2>&1 || true   # "already exists" is fine
  if [ "$changed" = 1 ]; then
    for f in "$RUN"/slurmd-*.pid "$RUN/slurmctld.pid"; do
      if alive "$f"; then kill "$(head -1 "$f")"; fi
    done
    sleep 1
  fi
  alive "$RUN/slurmctld.pid" || slurmctld -f "$CONF"
  for i in $(seq 1 "$MN_NODES"); do start_node "$i"; done
  start_pg_forward
  if ! wait_for 30 nodes_idle; then
    scontrol update nodename="mn[1-$MN_NODES]" state=resume >/dev/null 2>&1 || true
    wait_for 30 nodes_idle || { tail -20 "$LOG/slurmctld.log"; sinfo -N; die "nodes not idle"; }
  fi
  write_env
  say "slurm up: $(sinfo -h -o '%P %D %t %N %c cpus')"
}

write_env() {
  cat >"$MN_DIR/env.tmp" <<EOF
export AUTOTUNE_MN_SLURM_CONF=$CONF
export AUTOTUNE_MN_NODES=$MN_NODES
export AUTOTUNE_MN_PG_URL=postgresql+psycopg://postgres@$CTL_ADDR:$PG_PORT
EOF
  mv "$MN_DIR/env.tmp" "$MN_DIR/env"
}

smoke() {
  local names
  names=$(srun -N "$MN_NODES" --ntasks-per-node=1 -t 1 hostname | sort -u | tr '\n' ' ')
  [ "$(echo "$names" | wc -w)" = "$MN_NODES" ] || die "srun -N$MN_NODES hostname gave: $names"
  say "smoke test passed: srun -N$MN_NODES hostname -> $names"
}

do_start() {
  if [ -s "$MN_DIR/env" ] && [ -f "$CONF" ] && alive "$RUN/slurmctld.pid" && nodes_idle \
      && alive "$RUN/pgfwd.pid" && ! conf_differs; then
    local i ok=1
    for i in $(seq 1 "$MN_NODES"); do alive "$RUN/slurmd-$(node "$i").pid" || ok=0; done
    if [ "$ok" = 1 ]; then say "already running (env in $MN_DIR/env)"; return 0; fi
  fi
  start_all
  smoke
}

kill_node() { # kill_node mnK: slurmd and everything in the node's namespace, SIGKILL
  local name=$1 i=${1#mn} p
  [ -n "$i" ] && [ "$i" -ge 1 ] 2>/dev/null && [ "$i" -le "$MN_NODES" ] || die "no node $name"
  if alive "$RUN/slurmd-$name.pid"; then kill -9 "$(head -1 "$RUN/slurmd-$name.pid")" || true; fi
  for p in $(ip netns pids "$(ns "$i")" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  say "killed $name (slurmd and its namespace's processes)"
}

shape_one() { # shape_one DEV RATE DELAY [netns]: tbf RATE at the root, netem DELAY under it
  local dev=$1 rate=$2 delay=$3 tcx=(tc)
  [ -n "${4:-}" ] && tcx=(ip netns exec "$4" tc)
  # burst: a few ms of the rate (tbf drops what exceeds it); latency: queueing allowed.
  "${tcx[@]}" qdisc replace dev "$dev" root handle 1: tbf rate "$rate" burst 64kb latency 200ms
  if [ -n "$delay" ]; then
    "${tcx[@]}" qdisc replace dev "$dev" parent 1:1 handle 10: netem delay "$delay" 2>/dev/null \
      || die "netem is not in this kernel (tc: qdisc kind unknown): shape with a rate only"
  fi
}

shape() { # shape RATE [DELAY]: tbf (+ netem) on both ends of every node's veth
  local rate=$1 delay=${2:-} i
  for i in $(seq 1 "$MN_NODES"); do
    shape_one "atmn-v$i" "$rate" "$delay"
    shape_one eth0 "$rate" "$delay" "$(ns "$i")"
  done
  say "links between nodes: $rate${delay:+, +$delay per shaped end}"
}

unshape() {
  local i
  for i in $(seq 1 "$MN_NODES"); do
    tc qdisc del dev "atmn-v$i" root 2>/dev/null || true
    ip netns exec "$(ns "$i")" tc qdisc del dev eth0 root 2>/dev/null || true
  done
  say "links between nodes unshaped"
}

do_stop() {
  local f i
  for f in "$RUN"/slurmd-*.pid "$RUN/slurmctld.pid" "$RUN/pgfwd.pid"; do
    if alive "$f"; then kill "$(head -1 "$f")"; fi
    rm -f "$f"
  done
  sleep 1
  for i in $(seq 1 "$MN_NODES"); do
    for p in $(ip netns pids "$(ns "$i")" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$(ns "$i")" 2>/dev/null || true
    rm -rf "/etc/netns/$(ns "$i")"
  done
  ip link del "$MN_BRIDGE" 2>/dev/null || true
  rm -f "$MN_DIR/env"
  say "stopped"
}

do_status() {
  local f
  for f in "$RUN"/*.pid; do
    [ -e "$f" ] || continue
    if alive "$f"; then echo "up   $(basename "$f" .pid) (pid $(head -1 "$f"))"; else echo "down $(basename "$f" .pid)"; fi
  done
  ip netns list | grep autotune-mn || true
  sinfo -N -o '%N %t %c' 2>/dev/null || echo "slurmctld not answering"
  tc qdisc show dev atmn-v1 2>/dev/null | head -1 || true
}

case "${1:-start}" in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  slow) shape "${2:?rate, e.g. 100mbit}" "${3:-}" ;;
  unslow) unshape ;;
  kill-node) kill_node "${2:?node name, e.g. mn2}" ;;
  *) echo "usage: $0 [start|stop|status|slow RATE [DELAY]|unslow|kill-node mnK]" >&2; exit 2 ;;
esac
