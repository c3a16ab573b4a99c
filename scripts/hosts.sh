#!/usr/bin/env bash
# Several "hosts" on this machine over real links: each host is a network namespace (and,
# for the commands run in it, a UTS namespace with its own hostname), joined by a veth pair
# to a bridge in a switch namespace. Traffic between hosts crosses the kernel's TCP stack,
# the veth links and whatever `tc` shaping is set on them; ranks of one host still share
# memory (Open MPI's vader). Needs root (CAP_NET_ADMIN); everything it makes carries the
# prefix $PENTAD_HOSTS (default "pentad"), and `down` removes all of it.
#
#   hosts.sh up K [RATE] [--ttl S]  make hosts h0..h(K-1) on 10.213.0.0/24; RATE (tc units,
#                                   e.g. 1gbit, 200mbit) caps each host's link both ways;
#                                   --ttl: a reaper runs `down` after S seconds (default 900)
#   hosts.sh down                   kill every process in the hosts, remove namespaces, state
#   hosts.sh exec HOST CMD...       run CMD on HOST (its network, hostname HOST)
#   hosts.sh mpirun ARGS...         mpirun on h0 across the hosts (hostfile, remote agent,
#                                   TCP between hosts), e.g. hosts.sh mpirun -np 8 build/pentad ...
#   hosts.sh shape HOST RATE|none   cap (or uncap) HOST's link, both directions, now
#   hosts.sh cut HOST | heal HOST   take HOST's link down (a pulled cable) or up again
#   hosts.sh kill HOST              SIGKILL every process on HOST (a host that dies)
#   hosts.sh state                  print the state directory (hostfile, agent, hosts)
#   hosts.sh check                  self-test: up 2, reach, shape, cut, heal, down
set -euo pipefail

prefix=${PENTAD_HOSTS:-pentad}
subnet=${PENTAD_HOSTS_SUBNET:-10.213.0}
state=/run/pentad-hosts/$prefix
sw=$prefix-sw

die() {
  echo "hosts.sh: $*" >&2
  exit 1
}

need_root() {
  if [[ $(id -u) != 0 ]] || ! ip netns list >/dev/null 2>&1; then
    die "needs root with CAP_NET_ADMIN (network namespaces); skipping"
  fi
}

ns_of() { echo "$prefix-$1"; }
ip_of() { echo "$subnet.$((${1#h} + 1))"; }
hosts() { [[ -f $state/hosts ]] && awk '{print $2}' "$state/hosts" || true; }
known() { hosts | grep -qx "$1" || die "no host $1 (hosts: $(hosts | tr '\n' ' '))"; }

# tbf on one interface's egress: RATE, a burst of 64 KiB (a GSO segment passes whole) and a
# queue that holds 20 ms at that rate (delay between hosts comes from the rate and this queue:
# the kernel here has no netem).
shape_dev() {
  local ns=$1 dev=$2 rate=$3
  ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
  [[ $rate == none ]] && return 0
  ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst 64kb latency 20ms
}

cmd_up() {
  local k=$1 rate=${2:-none} ttl=900
  [[ ${3:-} == --ttl ]] && ttl=$4
  [[ $k =~ ^[0-9]+$ && $k -ge 1 && $k -le 32 ]] || die "up K: K hosts, 1 to 32"
  need_root
  [[ -d $state ]] && die "hosts '$prefix' are up already ($state); run down first"
  mkdir -p "$state"
  ip netns add "$sw"
  ip netns exec "$sw" ip link set lo up
  ip netns exec "$sw" ip link add br0 type bridge
  ip netns exec "$sw" ip link set br0 up
  : >"$state/hosts"
  for ((i = 0; i < k; i++)); do
    local h=h$i ns
    ns=$(ns_of $h)
    ip netns add "$ns"
    ip link add "$h" netns "$sw" type veth peer name eth0 netns "$ns"
    ip netns exec "$sw" ip link set "$h" master br0 up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip addr add "$(ip_of $h)/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    echo "$(ip_of $h) $h" >>"$state/hosts"
  done
  # Names resolve in every host: `ip netns exec` binds /etc/netns/<ns>/hosts over /etc/hosts.
  for h in $(hosts); do
    mkdir -p "/etc/netns/$(ns_of $h)"
    { echo "127.0.0.1 localhost"; cat "$state/hosts"; } >"/etc/netns/$(ns_of $h)/hosts"
    [[ $rate != none ]] && cmd_shape "$h" "$rate"
  done
  # Open MPI's remote agent: it is given the host and a shell command line, as ssh would be.
  cat >"$state/agent" <<EOF
#!/bin/sh
host=\$1
shift
exec "$(readlink -f "$0")" exec "\$host" sh -c "\$*"
EOF
  chmod +x "$state/agent"
  for h in $(hosts); do echo "$h slots=64"; done >"$state/hostfile"
  # A new bridge port takes a moment to forward; the hosts are up when h0 reaches each.
  for h in $(hosts); do
    for ((t = 0; t < 50; t++)); do reaches "$h" && break || sleep 0.1; done
    reaches "$h" || die "h0 does not reach $h after 5 s"
  done
  # The reaper: whatever happens to the caller, the hosts go after the ttl.
  setsid bash -c "sleep $ttl; PENTAD_HOSTS=$prefix '$(readlink -f "$0")' down" \
    </dev/null >/dev/null 2>&1 &
  echo $! >"$state/reaper"
  echo "hosts.sh: $k hosts up ($(hosts | tr '\n' ' ')on $subnet.0/24, links ${rate}; removed in ${ttl} s)"
}

cmd_down() {
  need_root
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$prefix-(h[0-9]+|sw)$" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  if [[ -f $state/reaper ]]; then
    local reaper
    reaper=$(cat "$state/reaper")
    [[ $reaper != "$PPID" && $reaper != "$$" ]] && kill "$reaper" 2>/dev/null || true
  fi
  rm -rf "$state"
}

cmd_exec() {
  local h=$1
  shift
  known "$h"
  exec ip netns exec "$(ns_of "$h")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$h" "$@"
}

cmd_mpirun() {
  [[ -d $state ]] || die "no hosts are up ($state)"
  cmd_exec h0 mpirun --hostfile "$state/hostfile" --mca plm_rsh_agent "$state/agent" \
    --mca btl self,vader,tcp --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
    "$@"
}

cmd_shape() {
  known "$1"
  shape_dev "$(ns_of "$1")" eth0 "$2"
  shape_dev "$sw" "$1" "$2"
}

cmd_link() {
  known "$2"
  ip netns exec "$sw" ip link set "$2" "$1"
}

cmd_kill() {
  known "$1"
  ip netns pids "$(ns_of "$1")" | xargs -r kill -9
}

# Reach HOST from h0 within 1 s: a TCP connect to a closed port answers "refused" at once
# when the link carries, and times out when it does not.
reaches() {
  local said
  said=$(ip netns exec "$(ns_of h0)" timeout 1 bash -c "exec 3<>/dev/tcp/$(ip_of "$1")/9" 2>&1) || true
  [[ $said == *refused* ]]
}

# The self-test runs on hosts of its own ("<prefix>ck"), so it never touches a testbed in use.
cmd_check() {
  need_root
  local t0=$SECONDS
  "$0" down
  trap '"$0" down' EXIT
  "$0" up 2 100mbit --ttl 60 >/dev/null
  [[ $("$0" exec h1 hostname) == h1 ]] || die "check: h1's hostname"
  reaches h1 || die "check: h0 does not reach h1"
  "$0" cut h1
  ! reaches h1 || die "check: h0 reaches h1 through a cut link"
  "$0" heal h1
  for ((t = 0; t < 50; t++)); do reaches h1 && break || sleep 0.1; done
  reaches h1 || die "check: h0 does not reach h1 after heal"
  ip netns exec "$sw" tc qdisc show dev h1 | grep -q "rate 100Mbit" ||
    die "check: h1's link is not shaped"
  "$0" down
  trap - EXIT
  ! ip netns list | grep -q "^$prefix-" || die "check: namespaces left after down"
  [[ ! -e $state ]] || die "check: $state left after down"
  echo "hosts.sh: check passed in $((SECONDS - t0)) s"
}

case ${1:-} in
  up) shift && [[ $# -ge 1 ]] || die "up K [RATE] [--ttl S]" && cmd_up "$@" ;;
  down) cmd_down ;;
  exec) shift && [[ $# -ge 2 ]] || die "exec HOST CMD..." && cmd_exec "$@" ;;
  mpirun) shift && cmd_mpirun "$@" ;;
  shape) [[ $# -eq 3 ]] || die "shape HOST RATE|none" && cmd_shape "$2" "$3" ;;
  cut) [[ $# -eq 2 ]] || die "cut HOST" && cmd_link down "$2" ;;
  heal) [[ $# -eq 2 ]] || die "heal HOST" && cmd_link up "$2" ;;
  kill) [[ $# -eq 2 ]] || die "kill HOST" && cmd_kill "$2" ;;
  state) echo "$state" ;;
  check) [[ ${PENTAD_HOSTS_CHECK:-} ]] && cmd_check ||
    PENTAD_HOSTS=${prefix}ck PENTAD_HOSTS_CHECK=1 exec "$(readlink -f "$0")" check ;;
  *) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' && exit 2 ;;
esac
