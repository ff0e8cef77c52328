#!/usr/bin/env bash
# Compare causeway's DNS server and proxy over IPv6 with the same over
# IPv4, in one process and one run: queries answered and connections
# proxied per second and per CPU-second of causeway, v6 as a ratio of v4.
#
#   bench/compare-families.sh [--quick] [--rounds N] [--write docs/benchmarks.md] [--targets dns,proxy] [--no-build]
#
# One `causeway appliance` serves DNS on 127.0.0.1 and ::1 (the cluster's
# names, local answers only) and proxies one port on both to an echo
# upstream on 127.0.0.1 (`causeway-bench proxy upstream`). Each round
# measures each family in turn, the order alternating between rounds,
# with `causeway-bench dns --mix local=100` and `causeway-bench proxy conn`
# (64-byte echo, 32 connections at once); causeway's CPU time is read
# from /proc around each measurement, while nothing else loads it. All
# traffic stays on loopback; every process started is stopped on exit.
#
# Builds causeway and causeway-bench (cargo build --release) unless
# --no-build uses target/release. Each measurement takes 10 s (3 s with
# --quick) under a global bound (COMPARE_FAMILIES_LIMIT=<seconds>).
set -euo pipefail

NAME=compare-families
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
REPO=$(cd "$BENCH_DIR/.." && pwd)
TARGETS="dns,proxy"
ORIG_ARGS=("$@")
parse_args targets "dns proxy" 18 "$@"

if [[ -z ${FAMILIES_TIMED:-} ]]; then
    need python3
    need curl
    build_bench_and_causeway causeway
    [[ -x $CAUSEWAY_BIN ]] || die "causeway binary not found: $CAUSEWAY_BIN"
    run_timed FAMILIES COMPARE_FAMILIES_LIMIT
fi

if ((QUICK)); then SECS=3; else SECS=10; fi
TICKS=$(getconf CLK_TCK)
make_lab
PIDS=()
cleanup() {
    ((${#PIDS[@]})) && stop_pids "${PIDS[@]}"
    rm -rf "$TMP"
}
trap_exits "$FAMILIES_LIMIT"

free_port() {
    python3 -c 'import socket
s = socket.socket(socket.AF_INET6)
s.bind(("::1", 0))
print(s.getsockname()[1])'
}
ADMIN=$(free_port)
DNS_PORT=$(free_port)
PROXY_PORT=$(free_port)
ECHO_PORT=$(free_port)

"$BENCH_BIN" proxy upstream --listen "127.0.0.1:$ECHO_PORT" >"$TMP/echo.log" 2>&1 &
PIDS+=($!)
cat >"$TMP/causeway.yaml" <<EOF
log: {level: warn}
admin: {listen: "127.0.0.1:$ADMIN"}
cluster: {name: hc1, baseDomain: example.com}
dns:
  listen: ["127.0.0.1:$DNS_PORT", "[::1]:$DNS_PORT"]
  proxyAddress: 127.0.0.1
  proxyAddressV6: "::1"
  upstreams: ["127.0.0.1:9"]
proxy:
  listenAddress: 127.0.0.1
  listenAddressV6: "::1"
  listeners:
    - {port: $PROXY_PORT, upstream: "127.0.0.1:$ECHO_PORT"}
EOF
"$CAUSEWAY_BIN" appliance --config "$TMP/causeway.yaml" >"$TMP/causeway.log" 2>&1 &
CAUSEWAY_PID=$!
PIDS+=("$CAUSEWAY_PID")
for _ in $(seq 100); do
    curl -fsS "http://127.0.0.1:$ADMIN/readyz" >/dev/null 2>&1 && break
    kill -0 "$CAUSEWAY_PID" 2>/dev/null || { cat "$TMP/causeway.log" >&2; die "causeway exited"; }
    sleep 0.1
done
curl -fsS "http://127.0.0.1:$ADMIN/readyz" >/dev/null || die "causeway was not ready"

# measure TARGET FAMILY ROUND : one measurement, its rows into $RESULTS.
measure() {
    local target=$1 family=$2 round=$3 addr out before after cpu rate done_n
    if [[ $family == v6 ]]; then addr="[::1]"; else addr=127.0.0.1; fi
    out=$TMP/$target-$family-$round.json
    before=$(cpu_ticks "$CAUSEWAY_PID")
    case $target in
        dns)
            "$BENCH_BIN" dns --server "$addr:$DNS_PORT" --mix local=100 \
                --duration "${SECS}s" --json >"$out" 2>/dev/null
            read -r done_n rate < <(jget "$out" responses qps)
            ;;
        proxy)
            "$BENCH_BIN" proxy conn --target "$addr:$PROXY_PORT" --concurrency 32 \
                --payload 64 --duration "${SECS}s" --json >"$out" 2>/dev/null
            read -r done_n rate < <(jget "$out" ok conn_per_s)
            ;;
    esac
    after=$(cpu_ticks "$CAUSEWAY_PID")
    cpu=$(python3 -c "print(($after - $before) / $TICKS)")
    res "$target-$family" rate "$rate"
    res "$target-$family" per_cpu "$(python3 -c "print($done_n / $cpu if $cpu > 0 else 0)")"
    printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$target" "$family" "$rate" "$cpu" >>"$TMP/rounds.tsv"
    log "round $round $target $family: $rate/s, causeway ${cpu} CPU-s for $done_n"
}

for ((round = 1; round <= ROUNDS; round++)); do
    for target in ${TARGETS//,/ }; do
        # shellcheck disable=SC2046 # the order is words
        for family in $(round_order "$round" v4,v6); do
            measure "$target" "$family" "$round"
        done
    done
done

python3 - "$RESULTS" "$TMP/report.md" "$FAMILIES_CMD" "$ROUNDS" "$SECS" <<'PY'
import statistics, sys
from collections import defaultdict
rows = defaultdict(list)
for line in open(sys.argv[1]):
    name, key, value = line.rstrip("\n").split("\t")
    rows[(name, key)].append(float(value))
cmd, rounds, secs = sys.argv[3], sys.argv[4], sys.argv[5]
out = [f"`{cmd}` ({rounds} round(s), {secs} s each; medians)", "",
       "| target | v4 /s | v6 /s | v4 per CPU-s | v6 per CPU-s | v6/v4 per CPU-s (per round) |",
       "|---|---|---|---|---|---|"]
for target in ("dns", "proxy"):
    if (f"{target}-v4", "rate") not in rows:
        continue
    med = lambda fam, key: statistics.median(rows[(f"{target}-{fam}", key)])
    ratios = [b / a for a, b in zip(rows[(f"{target}-v4", "per_cpu")], rows[(f"{target}-v6", "per_cpu")]) if a]
    span = ", ".join(f"{r:.2f}" for r in ratios)
    out.append(f"| {target} | {med('v4', 'rate'):,.0f} | {med('v6', 'rate'):,.0f} | "
               f"{med('v4', 'per_cpu'):,.0f} | {med('v6', 'per_cpu'):,.0f} | "
               f"{statistics.median(ratios):.2f} ({span}) |")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
PY
show_report "$TMP/report.md" compare-families
