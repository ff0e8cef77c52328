#!/usr/bin/env bash
# Compare causeway's stateful DHCPv6 with Kea's kea-dhcp6 (multi-threaded,
# and single-threaded when asked) in one run, on one machine, in a
# throwaway two-namespace lab: Solicit/Advertise/Request/Reply exchanges
# completed per second and per CPU-second of the server.
#
#   bench/compare-dhcp6.sh [--quick] [--rounds N] [--write docs/benchmarks.md] [--servers kea-mt,causeway] [--no-build]
#
# Needs root (network namespaces, port 547) and kea-dhcp6 (Debian:
# kea-dhcp6-server), python3, iproute2. Traffic stays inside the two
# namespaces this script creates; they, every process it started and its
# temp dir are removed on exit, including on error, Ctrl-C or timeout.
#
# Lab: ns "server" (veth fd00:250::1/64) <-> ns "client" (fd00:250::2/64).
# `causeway-bench dhcp6` in the client namespace is the relay: every
# message is a Relay-Forward from [fd00:250::2]:547 with link address
# fd00:250::2, 256 exchanges in flight, 20,000 clients (DUID-LL each),
# rapid commit off. Each measurement starts a fresh server with an empty
# lease file; the servers take turns, the order alternating by round.
# causeway makes each Reply's lease durable (fdatasync per batch) before
# sending it; Kea's memfile writes its CSV without an fsync.
set -euo pipefail

NAME=compare-dhcp6
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
REPO=$(cd "$BENCH_DIR/.." && pwd)
SERVERS="kea-mt,causeway"
ORIG_ARGS=("$@")
parse_args servers "kea-st kea-mt causeway" 21 "$@"

[[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces, port 547); try: sudo $0 ${ORIG_ARGS[*]}"
KEA6=${KEA6_BIN:-$(command -v kea-dhcp6 || echo /usr/sbin/kea-dhcp6)}
if [[ -z ${DHCP6_TIMED:-} ]]; then
    need ip iproute2
    need ss iproute2
    need python3
    [[ ,$SERVERS, != *,kea-* || -x $KEA6 ]] || apt_install kea-dhcp6-server kea-dhcp6-server
    build_bench_and_causeway "$SERVERS"
    run_timed DHCP6 COMPARE_DHCP6_LIMIT
fi

if ((QUICK)); then SECS=3; else SECS=10; fi
TICKS=$(getconf CLK_TCK)
make_lab
ID=$$
NS_S="cw6-srv-$ID" NS_C="cw6-cli-$ID"
VS="cw6s$ID" VC="cw6c$ID"
SRV_IP=fd00:250::1 CLI_IP=fd00:250::2
SRV_PID=""
cleanup() {
    set +e
    [[ -n $SRV_PID ]] && stop_pids "$SRV_PID"
    for ns in "$NS_S" "$NS_C"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    done
    ip netns del "$NS_S" 2>/dev/null
    ip netns del "$NS_C" 2>/dev/null
    ip link del "$VS" 2>/dev/null
    rm -rf "$TMP"
}
trap_exits "$DHCP6_LIMIT"

log "lab: $NS_S ($VS $SRV_IP) <-> $NS_C ($VC $CLI_IP), temp $TMP"
ip netns add "$NS_S"
ip netns add "$NS_C"
ip link add "$VS" type veth peer name "$VC"
ip link set "$VS" netns "$NS_S"
ip link set "$VC" netns "$NS_C"
ip -n "$NS_S" addr add "$SRV_IP/64" dev "$VS" nodad
ip -n "$NS_S" addr add 10.251.0.1/24 dev "$VS"
ip -n "$NS_C" addr add "$CLI_IP/64" dev "$VC" nodad
for ns in "$NS_S" "$NS_C"; do ip -n "$ns" link set lo up; done
ip -n "$NS_S" link set "$VS" up
ip -n "$NS_C" link set "$VC" up

write_config() { # NAME DIR
    local name=$1 dir=$2 mt=false
    case $name in
        kea-st | kea-mt)
            [[ $name == kea-mt ]] && mt=true
            # Kea's own multi-threading settings for the memfile backend.
            cat >"$dir/kea.json" <<EOF
{"Dhcp6": {
  "interfaces-config": {"interfaces": ["$VS/$SRV_IP"]},
  "data-directory": "$dir",
  "lease-database": {"type": "memfile", "persist": true, "name": "$dir/kea-leases6.csv", "lfc-interval": 0},
  "multi-threading": {"enable-multi-threading": $mt, "thread-pool-size": 4, "packet-queue-size": 28},
  "preferred-lifetime": 3000, "valid-lifetime": 4000, "renew-timer": 1500, "rebind-timer": 2400,
  "option-data": [{"name": "dns-servers", "data": "fd00:250::53"}],
  "subnet6": [{"id": 1, "subnet": "fd00:250::/64",
               "pools": [{"pool": "fd00:250::1:0:0/96"}]}],
  "loggers": [{"name": "kea-dhcp6", "severity": "WARN", "output_options": [{"output": "$dir/kea.log"}]}]
}}
EOF
            ;;
        causeway)
            cat >"$dir/causeway.yaml" <<EOF
log: {level: warn}
admin: {listen: "127.0.0.1:9099"}
network: {interface: $VS, cidr: 10.251.0.0/24, gateway: 10.251.0.254, address: 10.251.0.1}
dhcp:
  leaseFile: $dir/leases.jsonl
  subnets: [{pools: [{start: 10.251.0.100, end: 10.251.0.200}]}]
dhcp6:
  interface: $VS
  dnsServers: ['fd00:250::53']
  prefix: fd00:250::/64
  pools: [{start: 'fd00:250::1:0:0', end: 'fd00:250::1:ffff:ffff'}]
  preferredLifetime: 50m
  validLifetime: 66m
EOF
            ;;
    esac
}

start_server() { # NAME DIR
    local name=$1 dir=$2 cmd
    case $name in
        kea-*) cmd=(env "KEA_PIDFILE_DIR=$dir" "KEA_LOCKFILE_DIR=$dir" "$KEA6" -c "$dir/kea.json") ;;
        causeway) cmd=("$CAUSEWAY_BIN" appliance --config "$dir/causeway.yaml") ;;
    esac
    ip netns exec "$NS_S" "${cmd[@]}" >"$dir/out" 2>&1 &
    SRV_PID=$!
    local deadline=$((SECONDS + 15))
    until [[ -n $(ip netns exec "$NS_S" ss -Hlun 'sport = :547') ]]; do
        kill -0 "$SRV_PID" 2>/dev/null || { tail -20 "$dir/out" >&2; die "$name exited at start"; }
        ((SECONDS < deadline)) || die "$name did not listen on port 547 within 15 s"
        sleep 0.1
    done
}

SEED=0
measure() { # NAME ROUND
    local name=$1 round=$2 dir out before after cpu rate done_n lost clients_done
    dir=$TMP/$name-$round
    mkdir -p "$dir"
    write_config "$name" "$dir"
    start_server "$name" "$dir"
    SEED=$((SEED + 1))
    out=$dir/bench.json
    before=$(cpu_ticks "$SRV_PID")
    timeout -k 5 $((SECS + 20)) ip netns exec "$NS_C" "$BENCH_BIN" dhcp6 \
        --server "[$SRV_IP]:547" --bind "[$CLI_IP]:547" --link-address "$CLI_IP" \
        --clients 20000 --max-outstanding 256 --duration "${SECS}s" --mac-seed "$SEED" \
        --json >"$out" 2>>"$TMP/bench.log" || true
    after=$(cpu_ticks "$SRV_PID")
    stop_pids "$SRV_PID"
    SRV_PID=""
    [[ -s $out ]] || { tail -5 "$TMP/bench.log" >&2; tail -20 "$dir/out" >&2; die "causeway-bench produced no result against $name"; }
    read -r done_n rate lost clients_done < <(jget "$out" completed exchanges_per_s lost clients_completed)
    cpu=$(python3 -c "print(($after - $before) / $TICKS)")
    res "$name" rate "$rate"
    res "$name" cpu "$cpu"
    res "$name" per_cpu "$(python3 -c "print($done_n / $cpu if $cpu > 0 else 0)")"
    res "$name" lost "$lost"
    if [[ $name == causeway ]]; then
        # Every client given an address holds it in the log: its Reply
        # waited for the record. (Compaction keeps the newest record per
        # address, so the log is counted by address, not by exchange.)
        local on_disk
        on_disk=$(python3 - "$dir/leases.jsonl" <<'PY'
import json, sys
newest = {}
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if ":" in r["ip"]:
        newest[r["ip"]] = r["state"]
print(sum(1 for s in newest.values() if s == "active"))
PY
)
        res "$name" on_disk "$on_disk"
        ((on_disk >= clients_done)) || die "causeway gave $clients_done clients an address but its log holds $on_disk active v6 leases"
    fi
    log "round $round $name: $rate exchanges/s, ${cpu} CPU-s for $done_n, lost $lost"
}

for ((round = 1; round <= ROUNDS; round++)); do
    # shellcheck disable=SC2046 # the order is words
    for name in $(round_order "$round" "$SERVERS"); do
        measure "$name" "$round"
    done
done

python3 - "$RESULTS" "$TMP/report.md" "$DHCP6_CMD" "$ROUNDS" "$SECS" "$SERVERS" <<'PY'
import statistics, sys
from collections import defaultdict
rows = defaultdict(list)
for line in open(sys.argv[1]):
    name, key, value = line.rstrip("\n").split("\t")
    rows[(name, key)].append(float(value))
cmd, rounds, secs, servers = sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6].split(",")
med = lambda n, k: statistics.median(rows[(n, k)]) if rows[(n, k)] else 0.0
out = [f"`{cmd}` ({rounds} round(s), {secs} s each, 256 in flight, 20,000 clients; medians)", "",
       "| server | exchanges/s | server CPU-s | exchanges per CPU-s | lost |",
       "|---|---|---|---|---|"]
for n in servers:
    out.append(f"| {n} | {med(n, 'rate'):,.0f} | {med(n, 'cpu'):.2f} | {med(n, 'per_cpu'):,.0f} | {med(n, 'lost'):,.0f} |")
if "causeway" in servers:
    for kea in (s for s in servers if s.startswith("kea")):
        by_rate = [c / k for c, k in zip(rows[("causeway", "rate")], rows[(kea, "rate")]) if k]
        by_cpu = [c / k for c, k in zip(rows[("causeway", "per_cpu")], rows[(kea, "per_cpu")]) if k]
        if by_rate:
            out.append("")
            out.append(f"causeway / {kea}: {statistics.median(by_rate):.2f}x by rate "
                       f"({', '.join(f'{r:.2f}' for r in by_rate)}), "
                       f"{statistics.median(by_cpu):.2f}x per CPU-second "
                       f"({', '.join(f'{r:.2f}' for r in by_cpu)})")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
PY
show_report "$TMP/report.md" compare-dhcp6
