#!/usr/bin/env bash
# DHCP throughput with lease replication on and off: the same causeway build
# on the same lab, one server alone against an HA pair whose active sends
# every lease batch to the standby and waits for its confirmation before
# the ACKs leave. Reports ACKs/s of each and their ratio.
#
#   bench/ha-dhcp.sh [--quick] [--rounds N] [--write docs/benchmarks.md] [--no-build]
#
# Needs root (network namespaces), iproute2, curl and python3. The lab is
# throwaway and isolated: ns "vlan" (a bridge), ns "a" and "b" (the
# replicas: net1 on the bridge, peer0 between them for adverts and the
# lease stream), ns "client" (the load, relayed from 10.250.0.100). All of
# it, every process it started and its temp dir are removed on exit.
#
# Each round measures "off" then "on" (the order alternates by round), each
# against fresh servers with empty lease files: causeway-bench dhcp floods
# 20,000 relayed clients with 256 exchanges in flight for 10 s (4 s with
# --quick). The report gives the median of the rounds and the ratio on/off.
set -euo pipefail

NAME="ha-dhcp"
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TARGETS="off,on"
ORIG_ARGS=("$@")
parse_args targets "off on" 19 "$@"
[[ $ROUNDS != 1 || " ${ORIG_ARGS[*]} " == *" --rounds "* ]] || ROUNDS=3
[[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces); try: sudo $0 ${ORIG_ARGS[*]}"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
need ip iproute2
need curl curl
need python3
need timeout coreutils

if [[ -z ${HAB_TIMED:-} ]]; then
    build_bench_and_causeway causeway
    [[ -x $CAUSEWAY_BIN ]] || die "causeway binary not found: $CAUSEWAY_BIN"
    run_timed HAB HA_DHCP_LIMIT
fi

ID=$$
NS_VLAN=cwha$ID-vlan NS_A=cwha$ID-a NS_B=cwha$ID-b NS_C=cwha$ID-client
PIDS=()
cleanup() {
    ((${#PIDS[@]})) && stop_pids "${PIDS[@]}"
    for ns in "$NS_VLAN" "$NS_A" "$NS_B" "$NS_C"; do ip netns del "$ns" 2>/dev/null || true; done
    [[ -n ${TMP:-} ]] && rm -rf "$TMP"
}
trap_exits "$HAB_LIMIT"
make_lab

for ns in "$NS_VLAN" "$NS_A" "$NS_B" "$NS_C"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
done
ip -n "$NS_VLAN" link add br0 type bridge
ip -n "$NS_VLAN" link set br0 up
attach() { # NS IFACE PORT ADDRESS
    ip link add "$2" netns "$1" type veth peer name "$3" netns "$NS_VLAN"
    ip -n "$NS_VLAN" link set "$3" master br0 up
    ip -n "$1" link set "$2" up
    ip -n "$1" addr add "$4" dev "$2"
}
attach "$NS_A" net1 pa 10.250.0.11/16
attach "$NS_B" net1 pb 10.250.0.12/16
attach "$NS_C" eth0 pc 10.250.0.100/16
ip link add peer0 netns "$NS_A" type veth peer name peer0 netns "$NS_B"
ip -n "$NS_A" link set peer0 up
ip -n "$NS_B" link set peer0 up
ip -n "$NS_A" addr add 10.99.0.1/30 dev peer0
ip -n "$NS_B" addr add 10.99.0.2/30 dev peer0
printf 'bench-shared-key-0123456789abcdef\n' >"$TMP/ha.key"

# config NODE WITH_HA : one replica's config.
config() {
    local node=$1 ha=$2
    cat <<EOF
log: {level: warn}
admin: {listen: "127.0.0.1:9090"}
cluster: {name: hc1, baseDomain: example.com}
network: {interface: net1, cidr: 10.250.0.0/16, gateway: 10.250.0.1, address: 10.250.0.2}
dhcp:
  leaseFile: $TMP/$node/leases.jsonl
  leaseTime: 1h
  subnets:
    - pools: [{start: 10.250.1.0, end: 10.250.255.200}]
      relayAddresses: [10.250.0.100]
EOF
    if ((ha)); then
        cat <<EOF
ha:
  node: $node
  replicas:
    - {name: a, address: "10.99.0.1:7946", priority: 200}
    - {name: b, address: "10.99.0.2:7946", priority: 100}
  listenInterface: peer0
  keyFile: $TMP/ha.key
  interface: net1
  addresses: ["10.250.0.2/16"]
EOF
    fi
}

admin_get() { ip netns exec "$1" curl -sf --max-time 2 "http://127.0.0.1:9090$2" || true; }

# start NS NODE WITH_HA : a fresh appliance with an empty lease file.
start() {
    rm -rf "${TMP:?}/$2"
    mkdir -p "$TMP/$2"
    config "$2" "$3" >"$TMP/$2/causeway.yaml"
    ip netns exec "$1" "$CAUSEWAY_BIN" appliance --config "$TMP/$2/causeway.yaml" >"$TMP/$2.log" 2>&1 &
    PIDS+=($!)
}

wait_until() { # SECONDS DESCRIPTION COMMAND...
    local deadline=$((SECONDS + $1)) what=$2
    shift 2
    until "$@"; do
        ((SECONDS < deadline)) || die "timed out waiting for $what"
        sleep 0.1
    done
}
ready_single() { [[ $(admin_get "$NS_A" /readyz) == *'"dhcp":true'* ]]; }
pair_in_sync() {
    admin_get "$NS_A" /metrics | grep -q '^causeway_dhcp_replication_standby 2$'
}

measure() { # TARGET ROUND
    local target=$1 secs=10
    ((QUICK)) && secs=4
    if [[ $target == off ]]; then
        ip -n "$NS_A" addr add 10.250.0.2/16 dev net1
        start "$NS_A" a 0
        wait_until 20 "the single server" ready_single
    else
        start "$NS_A" a 1
        start "$NS_B" b 1
        wait_until 30 "the pair in sync" pair_in_sync
    fi
    local out=$TMP/$target-$2.json
    ip netns exec "$NS_C" "$BENCH_BIN" dhcp --server 10.250.0.2:67 --bind 10.250.0.100:0 \
        --clients 20000 --max-outstanding 256 --timeout 2s --duration "${secs}s" --json >"$out" 2>"$TMP/bench-$target.log"
    local acked started secs_run
    read -r acked started secs_run <<<"$(jget "$out" acked started duration_s)"
    local rate
    rate=$(python3 -c "print(round($acked / $secs_run))")
    log "$target round $2: $acked ACKs of $started in ${secs_run}s = $rate/s"
    res "$target" acks_per_s "$rate"
    res "$target" acks "$acked"
    if [[ $target == on ]]; then
        local waited
        waited=$(admin_get "$NS_A" /metrics | awk '/^causeway_dhcp_replication_batches_total\{result="confirmed"\}/ {print $2}')
        res on confirmed_batches "${waited:-0}"
    fi
    stop_pids "${PIDS[@]}"
    PIDS=()
    ip -n "$NS_A" addr del 10.250.0.2/16 dev net1 2>/dev/null || true
}

for ((round = 1; round <= ROUNDS; round++)); do
    for target in $(round_order "$round" "$TARGETS"); do
        measure "$target" "$round"
    done
done

REPORT=$TMP/report.md
python3 - "$RESULTS" "$HAB_CMD" "$ROUNDS" >"$REPORT" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
def values(name, key):
    return [float(v) for n, k, v in rows if n == name and k == key]
off = values("off", "acks_per_s")
on = values("on", "acks_per_s")
mo, mn = statistics.median(off), statistics.median(on)
print(f"Command: `sudo {sys.argv[2]}` ({sys.argv[3]} rounds, median; each run a fresh server or pair with empty lease files).")
print()
print("| DHCP flood, 20,000 relayed clients, 256 in flight | ACKs/s | rounds |")
print("|---|---:|---|")
print(f"| one server, no replication | {mo:,.0f} | {', '.join(f'{v:,.0f}' for v in off)} |")
print(f"| HA pair, every batch confirmed by the standby before its ACKs | {mn:,.0f} | {', '.join(f'{v:,.0f}' for v in on)} |")
print(f"| **ratio on/off** | **{mn / mo:.2f}×** | goal ≥ 0.85× (Kea HA hot-standby: 0.48×) |")
batches = values("on", "confirmed_batches")
acked = values("on", "acks")
print()
print(f"With replication on, the standby confirmed {statistics.median(batches):,.0f} batches per run (median), "
      f"about {statistics.median(a / b for a, b in zip(acked, batches)):,.0f} leases each: "
      "the group commit spans both replicas, one round trip per batch, not per lease.")
PY
show_report "$REPORT" ha-dhcp
