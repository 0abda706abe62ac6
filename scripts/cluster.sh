#!/usr/bin/env bash
# An emulated cluster on this machine: N "hosts" as Linux network namespaces, each with its own
# address on a private bridge, so that multi-node jobs (rendezvous, Gloo's sockets, failures) run
# over real network interfaces between hosts, not over loopback. Needs root (or CAP_NET_ADMIN).
#
#   scripts/cluster.sh up N [RATE]   N hosts tessera-h1..hN at 10.213.0.1..N on bridge tessera-br0;
#                                    RATE (e.g. 1gbit, 10gbit) shapes every host's outgoing link
#                                    with tc tbf (the interconnect's bandwidth); each host runs an
#                                    sshd (Debian's openssh-server) on its address, port 22, that
#                                    takes a throwaway key made for this cluster
#   scripts/cluster.sh ssh-config    the ssh client config that reaches the hosts with that key:
#                                    ssh -F "$(scripts/cluster.sh ssh-config)" 10.213.0.2 hostname
#   scripts/cluster.sh slurm         (after up) a SLURM cluster on the hosts: slurmctld on host 1,
#                                    slurmd on each (nodes h1..hN, partition "main"), with their
#                                    own munged and key; then SLURM_CONF="$(scripts/cluster.sh
#                                    slurm-conf)" srun -N 2 hostname (Debian's slurmd, slurmctld,
#                                    slurm-client and munge)
#   scripts/cluster.sh down          removes every host and the bridge (also what a killed run left)
#   scripts/cluster.sh hosts         the hosts' addresses, one per line
#   scripts/cluster.sh exec K CMD... runs CMD on host K (inside its namespace; GLOO_SOCKET_IFNAME set)
#   scripts/cluster.sh sshd K stop|start   host K's sshd stops (or starts) listening: new ssh
#                                    connections to it are refused, open ones go on (a host that
#                                    has gone away, for the elastic launch tests)
#   scripts/cluster.sh check         exits 0 when this machine can make namespaces, else says why
#
# It only ever touches the namespaces, links and addresses it names (tessera-h*, tessera-br0,
# tsv-h*, 10.213.0.0/24) and its own directory of keys and configs ($STATE). Processes inside
# share this machine's files, users and CPUs: a host is a network stack, not a container.
set -euo pipefail

PREFIX=tessera-h
BRIDGE=tessera-br0
SUBNET=10.213.0
IFACE=eth0  # each host's interface, inside its namespace
STATE=${TESSERA_CLUSTER_STATE:-/tmp/tessera-cluster}  # keys, sshd and ssh configs; remade by `up`
SSHD=/usr/sbin/sshd

die() { echo "scripts/cluster.sh: $*" >&2; exit 1; }

hosts_made() { ip netns list 2>/dev/null | awk '{print $1}' | grep "^${PREFIX}[0-9]*$" | sort -V || true; }

# Waits (up to 5 s) until none of the given pids is alive: a signalled process still runs for a
# moment, and one that writes on its way out (munged saves its seed file) would race `rm -rf`.
wait_gone() {
  local pid
  for _ in $(seq 1 50); do
    local alive=0
    for pid in "$@"; do [ -d "/proc/$pid" ] && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
}

down() {
  local pids=""
  for ns in $(hosts_made); do
    local in_ns
    in_ns=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$in_ns" ] && kill -9 $in_ns 2>/dev/null || true
    pids="$pids $in_ns"
    ip netns del "$ns"
  done
  # host-side veth ends go with their namespace's peer; a half-made one may be left
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^tsv-h' || true); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  # munged runs outside the hosts (its socket is a file every host reaches); the rest went with them
  if [ -f "$STATE/slurm/munged.pid" ]; then
    local munged
    munged=$(cat "$STATE/slurm/munged.pid" 2>/dev/null || true)
    [ -n "$munged" ] && kill "$munged" 2>/dev/null && pids="$pids $munged"
  fi
  # shellcheck disable=SC2086
  wait_gone $pids
  rm -rf "$STATE" 2>/dev/null || { sleep 0.5; rm -rf "$STATE"; }
}

# SLURM on the hosts: slurmctld on host 1 (its address is the controller's), slurmd on every host
# as node hK, proctrack/linuxproc and no cgroup constraints (the hosts share this machine's cgroups),
# munge with a key of its own on a socket in $STATE, so nothing of the machine's own is used.
slurm() {
  local n
  n=$(hosts_made | wc -l)
  [ "$n" -ge 1 ] || die "slurm: no hosts (scripts/cluster.sh up N first)"
  for tool in munged slurmctld slurmd; do
    command -v "$tool" >/dev/null || die "slurm: $tool is missing (apt-get install munge slurmctld slurmd slurm-client)"
  done
  local dir="$STATE/slurm"
  rm -rf "$dir"
  mkdir -p "$dir/state" "$dir/spool"
  chmod 700 "$dir"
  head -c 128 /dev/urandom > "$dir/munge.key"
  chmod 600 "$dir/munge.key"
  munged --key-file="$dir/munge.key" --socket="$dir/munge.sock" --log-file="$dir/munged.log" \
    --pid-file="$dir/munged.pid" --seed-file="$dir/munged.seed" --force
  local nodes=""
  {
    echo "ClusterName=tessera"
    echo "SlurmctldHost=$(hostname -s)($SUBNET.1)"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$dir/munge.sock"
    echo "CredType=cred/munge"
    echo "StateSaveLocation=$dir/state"
    echo "SlurmdSpoolDir=$dir/spool/%n"
    echo "SlurmctldPidFile=$dir/slurmctld.pid"
    echo "SlurmdPidFile=$dir/slurmd.%n.pid"
    echo "SlurmctldLogFile=$dir/slurmctld.log"
    echo "SlurmdLogFile=$dir/slurmd.%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "MpiDefault=none"
    echo "MailProg=/bin/true"
    echo "SchedulerType=sched/builtin"
    echo "SelectType=select/linear"
    echo "ReturnToService=2"
    for k in $(seq 1 "$n"); do
      echo "NodeName=h$k NodeAddr=$SUBNET.$k CPUs=$(nproc) State=UNKNOWN"
      nodes="$nodes${nodes:+,}h$k"
    done
    echo "PartitionName=main Nodes=$nodes Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
  } > "$dir/slurm.conf"
  printf 'CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n' > "$dir/cgroup.conf"
  ip netns exec "${PREFIX}1" slurmctld -f "$dir/slurm.conf"
  for k in $(seq 1 "$n"); do
    ip netns exec "$PREFIX$k" slurmd -f "$dir/slurm.conf" -N "h$k"
  done
  # Ready when every node is idle.
  for _ in $(seq 1 60); do
    if [ "$(SLURM_CONF="$dir/slurm.conf" sinfo -h -o '%T' -N 2>/dev/null | grep -c '^idle')" = "$n" ]; then
      echo "slurm: $n nodes h1..h$n idle; SLURM_CONF=$dir/slurm.conf"
      return 0
    fi
    sleep 0.5
  done
  die "slurm: the nodes did not come up (logs in $dir)"
}

# A host key and a client key made now, an sshd config that accepts only that client key (no
# passwords), and the client config that uses it; each host's sshd listens on its own address only.
make_ssh_files() {
  mkdir -p "$STATE" /run/sshd
  chmod 700 "$STATE"
  ssh-keygen -q -t ed25519 -N "" -C tessera-cluster-host -f "$STATE/host_key"
  ssh-keygen -q -t ed25519 -N "" -C tessera-cluster-client -f "$STATE/client_key"
  cp "$STATE/client_key.pub" "$STATE/authorized_keys"
  cat > "$STATE/sshd_config" <<EOF
HostKey $STATE/host_key
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
MaxStartups 100
EOF
  cat > "$STATE/ssh_config" <<EOF
Host *
  IdentityFile $STATE/client_key
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
EOF
}

check() {
  command -v ip >/dev/null || die "the ip command (Debian's iproute2) is missing"
  local probe="${PREFIX}probe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    die "cannot create network namespaces here (needs root or CAP_NET_ADMIN, and a kernel that allows them)"
  fi
  ip netns del "$probe"
}

up() {
  local n=$1 rate=${2:-}
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 250 ] || die "up: N must be 1..250, got '$n'"
  check
  down  # a fresh cluster: nothing left from a killed run
  trap 'down' ERR
  ip link add "$BRIDGE" type bridge
  ip addr add "$SUBNET.254/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for k in $(seq 1 "$n"); do
    local ns="$PREFIX$k" veth="tsv-h$k"
    ip netns add "$ns"
    ip link add "$veth" type veth peer name "$IFACE" netns "$ns"
    ip link set "$veth" master "$BRIDGE" up
    ip -n "$ns" addr add "$SUBNET.$k/24" dev "$IFACE"
    ip -n "$ns" link set "$IFACE" up
    ip -n "$ns" link set lo up
    if [ -n "$rate" ]; then
      ip netns exec "$ns" tc qdisc add dev "$IFACE" root tbf rate "$rate" burst 1mb latency 50ms
    fi
  done
  local ssh_note=", no sshd ($SSHD missing: apt-get install openssh-server)"
  if [ -x "$SSHD" ]; then
    make_ssh_files
    for k in $(seq 1 "$n"); do
      ip netns exec "$PREFIX$k" "$SSHD" -f "$STATE/sshd_config" -o "ListenAddress=$SUBNET.$k" \
        -o "PidFile=$STATE/sshd.$k.pid"
    done
    ssh_note=", sshd on each (ssh -F $STATE/ssh_config)"
  fi
  trap - ERR
  echo "cluster: $n hosts on $BRIDGE${rate:+, links shaped to $rate}$ssh_note"
  hosts
}

hosts() {
  for ns in $(hosts_made); do echo "$SUBNET.${ns#"$PREFIX"}"; done
}

host_sshd() {
  local k=$1 what=$2 pidfile="$STATE/sshd.$1.pid"
  ip netns list | awk '{print $1}' | grep -qx "$PREFIX$k" || die "sshd: no host $k (scripts/cluster.sh up N first)"
  case "$what" in
    stop) if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; rm -f "$pidfile"; fi ;;
    start) [ -f "$pidfile" ] || ip netns exec "$PREFIX$k" "$SSHD" -f "$STATE/sshd_config" \
             -o "ListenAddress=$SUBNET.$k" -o "PidFile=$pidfile" ;;
    *) die "sshd K stop|start" ;;
  esac
}

run_on() {
  local k=$1
  shift
  ip netns list | awk '{print $1}' | grep -qx "$PREFIX$k" || die "exec: no host $k (scripts/cluster.sh up N first)"
  exec ip netns exec "$PREFIX$k" env GLOO_SOCKET_IFNAME="$IFACE" "$@"
}

case "${1:-}" in
  up) shift; up "${1:-}" "${2:-}" ;;
  down) down ;;
  hosts) hosts ;;
  exec) shift; [ $# -ge 2 ] || die "exec K CMD..."; run_on "$@" ;;
  sshd) shift; [ $# -eq 2 ] || die "sshd K stop|start"; host_sshd "$@" ;;
  check) check ;;
  slurm) slurm ;;
  slurm-conf) [ -f "$STATE/slurm/slurm.conf" ] || die "slurm-conf: no SLURM cluster (scripts/cluster.sh slurm first)"
              echo "$STATE/slurm/slurm.conf" ;;
  ssh-config) [ -f "$STATE/ssh_config" ] || die "ssh-config: no cluster with sshd (scripts/cluster.sh up N first)"
              echo "$STATE/ssh_config" ;;
  *) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
