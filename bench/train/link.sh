#!/usr/bin/env bash
# An emulated network link that behaves like a NIC: every emulated node gets
# an address of its own, and Linux traffic control caps the traffic into
# each address at one rate, so all of a node's connections share that rate
# as they would share a real NIC. Without it the ranks of two emulated nodes
# talk over loopback sockets, where every extra connection (a second NCCL
# communicator, more socket threads) adds bandwidth: a property of the
# emulation, not of a network (bench/RESULTS.md, "What the socket link does").
#
#   bash bench/train/link.sh up RATE NODES   e.g. up 25gbit 2; needs root
#   bash bench/train/link.sh down            removes what `up` made
#   bash bench/train/link.sh stats           bytes and drops per node class
#   bash bench/train/link.sh env NODE        the NCCL setting a rank of NODE needs
#   bash bench/train/link.sh rank CMD...     exports that setting for the launcher's
#                                            rank (node = rank / LINK_RANKS_PER_NODE,
#                                            default 1), then runs CMD
#
# How: node k gets 10.77.0.(k+1) on an interface of its own (a dummy device
# zppn<k>; where the kernel has no dummy devices, an address labelled
# lozppn<k> on lo). NCCL's sockets bind to the interface NCCL_SOCKET_IFNAME
# names, so a rank of node k sends and listens on node k's address. Traffic
# between local addresses always crosses lo, so the shaping sits on lo: an
# HTB qdisc with one class per node at RATE, and a u32 filter that puts every
# packet addressed to node k into node k's class. NCCL's data flows from the
# connecting side to the listening side, so a node's class carries what the
# other nodes send it: its incoming traffic is
# capped at RATE, which for the symmetric collectives of training (ring
# all-gather, reduce-scatter, all-to-all) is also what it sends. Everything
# else on lo (MPI, the launchers' stores) goes through the default class,
# unshaped. Seen on this kind of kernel (Firecracker 6.18): htb, tbf and u32
# exist, prio, fq and netem do not, nor dummy devices (then the labels).
#
# Needs iproute2 (tc, ip). A machine without it (the GPU machines' image) gets
# Debian's packages carried in .deps/iproute/ (apt-get download iproute2 libbpf1
# libbsd0 libcap2 libelf1 libmd0 libmnl0 libxtables12 zlib1g), unpacked into
# /tmp/zpp-iproute and run from there.
set -uo pipefail
PREFIX=10.77.0
HERE=$(cd "$(dirname "$0")" && pwd)
if ! command -v tc > /dev/null || ! command -v ip > /dev/null; then
  IPR=/tmp/zpp-iproute
  if ! [ -x $IPR/sbin/tc ] && ls "$HERE"/../../.deps/iproute/*.deb > /dev/null 2>&1; then
    mkdir -p $IPR && for f in "$HERE"/../../.deps/iproute/*.deb; do dpkg -x "$f" $IPR; done
  fi
  if [ -x $IPR/sbin/tc ]; then
    tc() { LD_LIBRARY_PATH=$IPR/lib/x86_64-linux-gnu:$IPR/usr/lib/x86_64-linux-gnu $IPR/sbin/tc "$@"; }
    ip() { LD_LIBRARY_PATH=$IPR/lib/x86_64-linux-gnu:$IPR/usr/lib/x86_64-linux-gnu $IPR/bin/ip "$@"; }  # (sbin/ip links to /bin/ip)
  fi
fi
die() { echo "link.sh: $*" >&2; exit 1; }
addr() { echo "$PREFIX.$(( $1 + 1 ))"; }

up() {
  local rate=$1 nodes=$2
  [[ $rate =~ ^[0-9]+(\.[0-9]+)?[kmg]?bit$ ]] || die "rate '$rate' is not like 25gbit"
  [[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 2 ] && [ "$nodes" -le 12 ] || die "nodes must be 2..12"
  command -v tc > /dev/null && command -v ip > /dev/null ||
    die "no tc/ip here: install iproute2, or carry its packages in .deps/iproute/ (see the header)"
  down 2> /dev/null
  local k kind=dummy
  for ((k = 0; k < nodes; k++)); do
    if [ $kind = dummy ] && ip link add "zppn$k" type dummy 2> /tmp/link-dummy.err; then
      ip link set "zppn$k" up && ip addr add "$(addr $k)/32" dev "zppn$k" || die "cannot address zppn$k"
    else
      kind=label
      ip addr add "$(addr $k)/32" dev lo label "lozppn$k" ||
        die "cannot add $(addr $k) to lo (no dummy devices either: $(cat /tmp/link-dummy.err))"
    fi
  done
  # HTB: class 1:1, the default, is everything else on lo, at a rate no
  # loopback reaches; class 1:(10+k) is node k's, at RATE with no borrowing
  # (ceil = rate). A class's burst must hold one loopback GSO packet (64 KiB);
  # 4 MiB is 1.3 ms at 25 Gb/s, nothing against collectives of hundreds of
  # megabytes. r2q and quantum only silence HTB's warnings at these rates
  # (a quantum shares spare rate between classes, and none is shared).
  tc qdisc add dev lo root handle 1: htb default 1 r2q 100000 ||
    die "tc refused an htb qdisc on lo (is this root, and does the kernel have sch_htb?)"
  tc class add dev lo parent 1: classid 1:1 htb rate 400gbit burst 64mb cburst 64mb quantum 1500000 ||
    die "tc refused the default class"
  for ((k = 0; k < nodes; k++)); do
    tc class add dev lo parent 1: classid "1:$(( 10 + k ))" htb rate "$rate" ceil "$rate" \
      burst 4mb cburst 4mb quantum 200000 || die "tc refused the class of node $k at $rate"
    tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst "$(addr $k)/32" \
      flowid "1:$(( 10 + k ))" || die "tc refused the u32 filter of node $k"
  done
  echo "link: $nodes nodes at $rate each (incoming), addresses $PREFIX.1..$nodes on ${kind} interfaces"
}

down() {
  tc qdisc del dev lo root 2> /dev/null
  local k
  for ((k = 0; k < 12; k++)); do
    ip link del "zppn$k" 2> /dev/null
    ip addr del "$(addr $k)/32" dev lo 2> /dev/null
  done
  return 0
}

ifname() { # the interface NCCL must use on node $1
  if ip link show "zppn$1" > /dev/null 2>&1; then echo "zppn$1"; else echo "lozppn$1"; fi
}

case ${1:-} in
  up) [ $# -eq 3 ] || die "usage: link.sh up RATE NODES"; up "$2" "$3" ;;
  down) down ;;
  stats) tc -s class show dev lo ;;
  env) [ $# -eq 2 ] || die "usage: link.sh env NODE"; echo "NCCL_SOCKET_IFNAME==$(ifname "$2")" ;;
  rank)
    shift
    r=${OMPI_COMM_WORLD_RANK:-${RANK:-0}}
    export NCCL_SOCKET_IFNAME="=$(ifname $(( r / ${LINK_RANKS_PER_NODE:-1} )))"
    exec "$@" ;;
  *) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;;
esac
