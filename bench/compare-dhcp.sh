#!/usr/bin/env bash
# Compare causeway's DHCPv4 server with Kea 2.x (single- and multi-threaded)
# and ISC dhcpd on one machine, in a throwaway two-namespace lab.
#
#   bench/compare-dhcp.sh [--quick] [--write docs/benchmarks.md] [--servers kea-st,kea-mt,dhcpd,causeway] [--no-build]
#
# Needs root (network namespaces, port 67), python3 and iproute2; it
# apt-get installs kea-dhcp4 + perfdhcp (Debian: kea-dhcp4-server,
# kea-admin) and dhcpd (isc-dhcp-server) when missing, their services kept
# from starting and disabled (KEA_BIN, PERFDHCP_BIN, DHCPD_BIN name others).
# strace is optional (it verifies fsync behaviour). Traffic stays inside the
# two namespaces this script creates; they, every process it started and its
# temp dir are removed on exit, including on error, Ctrl-C or timeout.
#
# Builds causeway and causeway-bench (cargo build --release) unless
# CAUSEWAY_BIN and BENCH_BIN are given, or --no-build uses target/release.
# The measurements run under a global time bound (full ~9.5 min, --quick
# ~2 min; COMPARE_DHCP_LIMIT=<seconds> overrides); the build has its own bound.
#
# Lab: ns "server" (veth 10.250.0.1/16) <-> ns "client" (veth 10.250.0.2/16).
# All load is relayed: giaddr 10.250.0.2, the generator binds 10.250.0.2:67
# and every server answers the relay at giaddr:67. Served subnet
# 10.250.0.0/16, pool 10.250.1.0-10.250.255.200. Every measurement runs
# against a freshly started server with an empty lease file.
set -euo pipefail

NAME=compare-dhcp
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# ---------------------------------------------------------------- arguments
SERVERS="kea-st,kea-mt,dhcpd,causeway"
ORIG_ARGS=("$@")
parse_args servers "kea-st kea-mt dhcpd causeway" 22 "$@"
# Each of its measurements already starts a fresh server; repeated rounds
# are for the DNS and proxy comparisons only.
((ROUNDS == 1)) || die "--rounds is for compare-dns.sh and compare-proxy.sh; compare-dhcp.sh measures once"

[[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces, binding port 67); try: sudo $0 ${ORIG_ARGS[*]}"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# -------------------------------------------------------------------- tools
need ip iproute2
need ss iproute2
need timeout coreutils
need python3
need pgrep procps
need getconf
# Kea, perfdhcp and dhcpd are apt-get installed when missing (their
# services kept from starting, then disabled), once, before the timed part.
if [[ -z ${CWB_TIMED:-} ]]; then
    pkgs=()
    [[ -n ${KEA_BIN:-} ]] || command -v kea-dhcp4 >/dev/null || pkgs+=(kea-dhcp4-server)
    [[ -n ${PERFDHCP_BIN:-} ]] || command -v perfdhcp >/dev/null || pkgs+=(kea-admin)
    [[ -n ${DHCPD_BIN:-} ]] || command -v dhcpd >/dev/null || pkgs+=(isc-dhcp-server)
    apt_install "kea-dhcp4-server.service isc-dhcp-server.service" "${pkgs[@]}"
fi
KEA=${KEA_BIN:-$(command -v kea-dhcp4 || echo /usr/sbin/kea-dhcp4)}
PERFDHCP=${PERFDHCP_BIN:-$(command -v perfdhcp || echo /usr/sbin/perfdhcp)}
DHCPD=${DHCPD_BIN:-$(command -v dhcpd || echo /usr/sbin/dhcpd)}
[[ -x $KEA ]] || die "kea-dhcp4 not found (Debian: apt-get install kea-dhcp4-server)"
[[ -x $PERFDHCP ]] || die "perfdhcp not found (Debian: apt-get install kea-admin)"
[[ -x $DHCPD ]] || die "dhcpd not found (Debian: apt-get install isc-dhcp-server)"
STRACE=$(command -v strace || true)

# --------------------------------------------------------------------- build
# The build runs once, before the timed part (the re-exec below sets
# CWB_TIMED=1 so the child skips it).
if [[ -z ${CWB_TIMED:-} ]]; then
    if [[ -n ${CAUSEWAY_BIN:-} && -n ${BENCH_BIN:-} ]]; then
        :
    elif ((NO_BUILD)); then
        : "${CAUSEWAY_BIN:=$REPO/target/release/causeway}" "${BENCH_BIN:=$REPO/target/release/causeway-bench}"
    else
        need cargo
        log "building: cargo build --release -p causeway -p causeway-bench"
        (cd "$REPO" && timeout -k 10 900 cargo build --release -q -p causeway -p causeway-bench) >&2 ||
            die "cargo build failed or took over 15 min"
        : "${CAUSEWAY_BIN:=$REPO/target/release/causeway}" "${BENCH_BIN:=$REPO/target/release/causeway-bench}"
    fi
    [[ -x $CAUSEWAY_BIN ]] || die "causeway binary not found: $CAUSEWAY_BIN"
    [[ -x $BENCH_BIN ]] || die "causeway-bench binary not found: $BENCH_BIN"
    export CAUSEWAY_BIN BENCH_BIN
    # The bound's TERM reaches the whole process group: servers and
    # generators too.
    run_timed CWB COMPARE_DHCP_LIMIT
fi

# ------------------------------------------------------------ lab & cleanup
ID=$$
NS_S="cwb-srv-$ID" NS_C="cwb-cli-$ID"
VS="cwbs$ID" VC="cwbc$ID"
SRV_IP=10.250.0.1 CLI_IP=10.250.0.2
make_lab
SRV_PID="" TRACER_PID="" SRV_DIR="" SRV_NAME=""

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    local p
    for p in $SRV_PID $TRACER_PID $(jobs -p); do kill -TERM "$p" 2>/dev/null; done
    # Anything else still inside our namespaces was started by us.
    for ns in "$NS_S" "$NS_C"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$p" 2>/dev/null; done
    done
    local deadline=$((SECONDS + 3))
    while ((SECONDS < deadline)); do
        local alive=0
        for ns in "$NS_S" "$NS_C"; do [[ -n $(ip netns pids "$ns" 2>/dev/null) ]] && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for ns in "$NS_S" "$NS_C"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    done
    wait 2>/dev/null
    ip netns del "$NS_S" 2>/dev/null
    ip netns del "$NS_C" 2>/dev/null
    ip link del "$VS" 2>/dev/null
    if ((rc != 0)) && [[ -n ${KEEP_TMP:-} ]]; then
        echo "compare-dhcp: kept $TMP" >&2
    else
        rm -rf "$TMP"
    fi
    exit "$rc"
}
trap_exits "$CWB_LIMIT"

log "lab: namespaces $NS_S ($VS $SRV_IP/16) <-> $NS_C ($VC $CLI_IP/16), temp $TMP"
ip netns add "$NS_S"
ip netns add "$NS_C"
ip link add "$VS" type veth peer name "$VC"
ip link set "$VS" netns "$NS_S"
ip link set "$VC" netns "$NS_C"
ip -n "$NS_S" addr add "$SRV_IP/16" dev "$VS"
ip -n "$NS_C" addr add "$CLI_IP/16" dev "$VC"
for ns in "$NS_S" "$NS_C"; do ip -n "$ns" link set lo up; done
ip -n "$NS_S" link set "$VS" up
ip -n "$NS_C" link set "$VC" up

# ------------------------------------------------------------------ helpers
if ((QUICK)); then
    FLOOD_D=3 PROBE_D=2 LAT_D=2 PERF_P=2 MAX_PROBES=3 BISECT=0 RSS_CLIENTS=20000
else
    FLOOD_D=10 PROBE_D=5 LAT_D=5 PERF_P=5 MAX_PROBES=8 BISECT=1 RSS_CLIENTS=100000
fi
PERFDHCP_MODE=${PERFDHCP_MODE:-single}
CLK_TCK=$(getconf CLK_TCK)
SEED=0
RUN=0


calc() { python3 -c "import math; print($1)"; }

# bench OUT.json TIMEOUT_S ARGS... : one causeway-bench run from the client ns.
bench() {
    local out=$1 tmo=$2
    shift 2
    SEED=$((SEED + 1))
    timeout -k 5 "$tmo" ip netns exec "$NS_C" "$BENCH_BIN" dhcp \
        --server "$SRV_IP:67" --bind "$CLI_IP:67" --giaddr "$CLI_IP" \
        --timeout "${BENCH_TIMEOUT:-1s}" --json --mac-seed "$SEED" "$@" >"$out" 2>>"$TMP/bench.log" || true
    [[ -s $out ]] || { tail -5 "$TMP/bench.log" >&2; die "causeway-bench produced no result ($*)"; }
}

server_log_tail() { if [[ -n $SRV_DIR && -f $SRV_DIR/out ]]; then tail -20 "$SRV_DIR/out" >&2 || true; fi; }

write_config() { # NAME DIR
    local name=$1 dir=$2
    case $name in
    kea-st | kea-mt)
        local mt='{"enable-multi-threading": false}'
        # Kea's own recommendation for kea-dhcp4 on the memfile backend
        # (Kea ARM 2.2, "Multi-Threading Settings With Different Database
        # Backends"): 4 threads and a packet queue of 28, whatever the core
        # count. An earlier run used 2 threads (one per core) and a queue of
        # 64, which measured Kea MT below Kea single-threaded.
        [[ $name == kea-mt ]] && mt='{"enable-multi-threading": true, "thread-pool-size": 4, "packet-queue-size": 28}'
        cat >"$dir/kea.json" <<EOF
{"Dhcp4": {
  "interfaces-config": {"interfaces": ["$VS"], "dhcp-socket-type": "udp"},
  "lease-database": {"type": "memfile", "persist": true, "name": "$dir/kea-leases.csv", "lfc-interval": 0},
  "valid-lifetime": 3600,
  "multi-threading": $mt,
  "subnet4": [{"id": 1, "subnet": "10.250.0.0/16",
               "pools": [{"pool": "10.250.1.0 - 10.250.255.200"}],
               "option-data": [{"name": "routers", "data": "10.250.0.1"}]}],
  "loggers": [{"name": "kea-dhcp4", "severity": "WARN",
               "output_options": [{"output": "$dir/kea.log"}]}]
}}
EOF
        ;;
    dhcpd)
        # ping-check is on by default in dhcpd 4.4: it pings every new
        # address and waits 1 s before offering it. Neither Kea nor causeway
        # does that, so it is turned off here.
        cat >"$dir/dhcpd.conf" <<EOF
authoritative;
default-lease-time 3600;
max-lease-time 3600;
ping-check false;
subnet 10.250.0.0 netmask 255.255.0.0 {
  range 10.250.1.0 10.250.255.200;
  option routers 10.250.0.1;
}
EOF
        : >"$dir/dhcpd.leases"
        ;;
    causeway | causeway-rss)
        local cidr=10.250.0.0/16 end=10.250.255.200
        [[ $name == causeway-rss ]] && cidr=10.250.0.0/15 end=10.251.255.200
        cat >"$dir/causeway.yaml" <<EOF
admin: {listen: "127.0.0.1:19191"}
dhcp:
  listen: [{address: "$SRV_IP:67"}]
  leaseFile: $dir/causeway-leases.jsonl
  leaseTime: 1h
  rateLimitPerClient: 20
  subnets:
    - {cidr: $cidr, serverId: $SRV_IP, router: [$SRV_IP], pools: [{start: 10.250.1.0, end: $end}]}
EOF
        ;;
    esac
}

# start_server NAME [STRACE_OUT [soft]] : fresh state dir, start the server
# (under strace -f -c if STRACE_OUT is given), wait until a single DORA
# succeeds. Sets SRV_PID (the server) and TRACER_PID (strace). Failing to
# start is fatal, unless "soft": then it warns, stops it and returns 1.
start_failed() { # SOFT MESSAGE
    server_log_tail
    if [[ -n $SRV_PID ]] && [[ -r /proc/$SRV_PID/status ]]; then
        log "  $SRV_NAME pid $SRV_PID: $(grep '^State' "/proc/$SRV_PID/status"), wchan $(cat "/proc/$SRV_PID/wchan" 2>/dev/null)"
    fi
    if [[ $1 == soft ]]; then
        log "  warning: $2; skipping"
        stop_server
        return 1
    fi
    die "$2"
}

start_server() {
    local name=$1 trace=${2:-} soft=${3:-}
    RUN=$((RUN + 1))
    SRV_NAME=$name SRV_DIR="$TMP/run$RUN-$name"
    mkdir -p "$SRV_DIR"
    write_config "$name" "$SRV_DIR"
    # No server of ours runs now; anything still in the lab's namespace is
    # a straggler (dhcpd forks under strace), so end it and wait for :67.
    local deadline=$((SECONDS + 5))
    while [[ -n $(ip netns exec "$NS_S" ss -Hlun 'sport = :67') ]]; do
        ((SECONDS < deadline)) || die "port 67 still in use in $NS_S before starting $name"
        ip netns pids "$NS_S" | xargs -r kill -KILL 2>/dev/null || true
        sleep 0.1 # retry interval; the condition is the free port above
    done
    local -a cmd
    case $name in
    kea-*) cmd=(env "KEA_PIDFILE_DIR=$SRV_DIR" "KEA_LOCKFILE_DIR=$SRV_DIR" "$KEA" -c "$SRV_DIR/kea.json") ;;
    dhcpd) cmd=("$DHCPD" -f -4 -cf "$SRV_DIR/dhcpd.conf" -lf "$SRV_DIR/dhcpd.leases" -pf "$SRV_DIR/dhcpd.pid" "$VS") ;;
    causeway*) cmd=("$CAUSEWAY_BIN" appliance --config "$SRV_DIR/causeway.yaml") ;;
    esac
    local deadline
    if [[ -n $trace ]]; then
        ip netns exec "$NS_S" "$STRACE" -f -c -o "$trace" -e trace=fsync,fdatasync,sync_file_range -- "${cmd[@]}" \
            >"$SRV_DIR/out" 2>&1 &
        TRACER_PID=$!
        deadline=$((SECONDS + 5))
        SRV_PID=""
        until [[ -n $SRV_PID ]]; do
            SRV_PID=$(pgrep -P "$TRACER_PID" | head -1 || true)
            [[ -n $SRV_PID ]] && break
            kill -0 "$TRACER_PID" 2>/dev/null || { start_failed "$soft" "strace exited before starting $name"; return 1; }
            ((SECONDS < deadline)) || { start_failed "$soft" "strace did not start $name"; return 1; }
            sleep 0.05
        done
    else
        # ip netns exec (and env) exec the server, so $! is the server's pid.
        ip netns exec "$NS_S" "${cmd[@]}" >"$SRV_DIR/out" 2>&1 &
        SRV_PID=$! TRACER_PID=""
    fi
    local limit=20 tries=0
    [[ -n $soft ]] && limit=10
    deadline=$((SECONDS + limit))
    # First the socket (cheap to poll), then a full DORA.
    until [[ -n $(ip netns exec "$NS_S" ss -Hlun 'sport = :67') ]]; do
        kill -0 "$SRV_PID" 2>/dev/null || { start_failed "$soft" "$name exited during startup (log above)"; return 1; }
        ((SECONDS < deadline)) || { start_failed "$soft" "$name did not bind port 67 within $limit s"; return 1; }
        sleep 0.02
    done
    while :; do
        kill -0 "$SRV_PID" 2>/dev/null || { start_failed "$soft" "$name exited during startup (log above)"; return 1; }
        tries=$((tries + 1))
        bench "$TMP/ready.json" 10 --clients 1 --count 1 --duration 1s
        [[ $(jget "$TMP/ready.json" acked) == 1 ]] && break
        if ((SECONDS >= deadline)); then
            start_failed "$soft" "$name did not answer a DORA within $limit s ($tries tries)"
            return 1
        fi
        sleep 0.1 # retry interval; the condition is the DORA above
    done
}

stop_server() {
    [[ -n $SRV_PID ]] || return 0
    kill -TERM "$SRV_PID" 2>/dev/null || true
    local deadline=$((SECONDS + 5))
    while kill -0 "$SRV_PID" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
    kill -KILL "$SRV_PID" 2>/dev/null || true
    if [[ -n $TRACER_PID ]]; then
        deadline=$((SECONDS + 5))
        while kill -0 "$TRACER_PID" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
        kill -KILL "$TRACER_PID" 2>/dev/null || true
        wait "$TRACER_PID" 2>/dev/null || true
    else
        wait "$SRV_PID" 2>/dev/null || true
    fi
    SRV_PID="" TRACER_PID=""
    rm -rf "$SRV_DIR"
}

# probe NAME RATE : fresh server, paced run; sets PROBE_OK (pass|fail) and
# PROBE_GOT (achieved ACK/s). Pass = drops < 1% and >= 95% of the target rate.
probe() {
    local name=$1 rate=$2 j="$TMP/probe.json" drop
    start_server "$name"
    bench "$j" $((PROBE_D + 15)) --clients 60000 --rate "$rate" --max-outstanding 4096 --duration "${PROBE_D}s"
    stop_server
    read -r PROBE_GOT drop <<<"$(jget "$j" rate_per_s drop_pct)"
    PROBE_OK=$(calc "'pass' if $drop < 1.0 and $PROBE_GOT >= 0.95 * $rate else 'fail'")
    log "  probe --rate $rate: $PROBE_GOT ACK/s, drops $drop% -> $PROBE_OK"
}

measure() {
    local name=$1 j
    log "== $name"

    # a. flood, with e. server CPU over the same run
    j="$TMP/$name-flood.json"
    start_server "$name"
    local c0 c1
    c0=$(cpu_ticks "$SRV_PID")
    bench "$j" $((FLOOD_D + 15)) --clients 60000 --rate 0 --max-outstanding 256 --duration "${FLOOD_D}s"
    c1=$(cpu_ticks "$SRV_PID")
    stop_server
    local acked rate drop bench_cpu
    read -r acked rate drop bench_cpu <<<"$(jget "$j" acked rate_per_s drop_pct bench_cpu_pct)"
    local cpu_s
    cpu_s=$(calc "($c1 - $c0) / $CLK_TCK")
    res "$name" flood_rate "$rate"
    res "$name" flood_drop "$drop"
    res "$name" flood_acked "$acked"
    res "$name" cpu_s "$cpu_s"
    res "$name" ack_per_cpu "$(calc "round($acked / $cpu_s) if $cpu_s > 0 else '-'")"
    res "$name" flood_bench_cpu "$bench_cpu"
    log "  flood: $rate ACK/s, drops $drop%, server CPU ${cpu_s}s for $acked ACKs, bench CPU ${bench_cpu}% of one core"

    # b. highest paced rate with < 1% drops
    local r n=0 pass_r="" pass_got="" fail_r=""
    r=$(calc "max(10, int($rate // 10 * 10))")
    while ((n < MAX_PROBES)); do
        n=$((n + 1))
        probe "$name" "$r"
        if [[ $PROBE_OK == pass ]]; then
            pass_r=$r pass_got=$PROBE_GOT
            break
        fi
        fail_r=$r
        r=$(calc "max(10, int($r * 0.88 // 10 * 10))")
    done
    if ((BISECT)) && [[ -n $pass_r && -n $fail_r ]] && ((n < MAX_PROBES)); then
        r=$(calc "int(($pass_r + $fail_r) / 2 // 10 * 10)")
        if ((r > pass_r)); then
            n=$((n + 1))
            probe "$name" "$r"
            if [[ $PROBE_OK == pass ]]; then pass_r=$r pass_got=$PROBE_GOT; fi
        fi
    fi
    local sustained_target
    if [[ -n $pass_r ]]; then
        # Passing at the flood figure (where the search starts) makes it a lower bound.
        if [[ -z $fail_r ]]; then res "$name" sustained_lb 1; fi
        res "$name" sustained "$pass_got"
        res "$name" sustained_target "$pass_r"
        sustained_target=$pass_r
    else
        # Nothing passed within the probe budget: report "< lowest probe".
        res "$name" sustained "<$fail_r"
        res "$name" sustained_target "-"
        sustained_target=$(calc "max(10, int($fail_r * 0.88))")
    fi
    res "$name" probes "$n"

    # c. latency at half the sustained rate
    local half
    half=$(calc "max(5, $sustained_target // 2)")
    j="$TMP/$name-lat.json"
    start_server "$name"
    bench "$j" $((LAT_D + 15)) --clients 60000 --rate "$half" --max-outstanding 4096 --duration "${LAT_D}s"
    stop_server
    res "$name" lat_rate "$half"
    res "$name" lat "$(jget "$j" latency_ms.p50 latency_ms.p90 latency_ms.p99 drop_pct)"
    log "  latency @ $half/s: p50/p90/p99/drop% $(jget "$j" latency_ms.p50 latency_ms.p90 latency_ms.p99 drop_pct)"

    # d. perfdhcp at the sustained rate. With a unicast server address,
    # perfdhcp -4 acts as a relay: giaddr = the -l address, source port 67,
    # so the server answers it at 10.250.0.2:67 like causeway-bench.
    # -g single: perfdhcp's receiver thread (-g multi, its default on >1 CPU)
    # competes with the server for 2 cores and loses replies it was sent.
    start_server "$name"
    local pout="$TMP/$name-perfdhcp.txt"
    timeout -k 5 $((PERF_P + 15)) ip netns exec "$NS_C" "$PERFDHCP" -4 -g "$PERFDHCP_MODE" -l "$CLI_IP" \
        -r "$sustained_target" -R 60000 -p "$PERF_P" "$SRV_IP" >"$pout" 2>&1 || true
    stop_server
    local perf
    perf=$(python3 - "$pout" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"Rate: ([\d.]+) 4-way exchanges/second, expected rate: (\d+)", t)
def drops(section):
    s = re.search(r"Statistics for: " + section + r"\*+(.*?)(\*\*\*|\Z)", t, re.S)
    if not s: return "-"
    d = re.search(r"drops ratio: ([\d.]+) %", s.group(1))
    return ("%.2f" % float(d.group(1))) if d else "-"
if not m:
    print("- - - -")
else:
    print("%d %s %s %s" % (round(float(m.group(1))), m.group(2), drops("DISCOVER-OFFER"), drops("REQUEST-ACK")))
PY
)
    [[ $perf == "- - - -" ]] && { log "  perfdhcp gave no report:"; tail -5 "$pout" >&2; }
    res "$name" perf "$perf"
    log "  perfdhcp -r $sustained_target: rate/target/DO-drop%/RA-drop% $perf"

    # durability check: fsync-family calls per ACK over a short run under
    # strace (all servers in full mode; quick mode checks dhcpd only).
    res "$name" syncs_per_ack "-"
    if [[ -n $STRACE ]] && { ((!QUICK)) || [[ $name == dhcpd ]]; }; then
        local tr="$TMP/$name-strace.txt"
        if start_server "$name" "$tr" soft; then
            j="$TMP/$name-strace.json"
            # A 5 s exchange timeout, so late ACKs (whose lease was synced) still count.
            BENCH_TIMEOUT=5s bench "$j" 25 --clients 1000 --count 300 --rate 0 --max-outstanding 64 --duration 5s
            stop_server
            local syncs
            syncs=$(awk '$NF ~ /^(fsync|fdatasync|sync_file_range)$/ {n += $4} END {print n + 0}' "$tr")
            res "$name" syncs_per_ack "$(calc "'%.2f' % ($syncs / max(1, $(jget "$j" acked)))")"
            log "  strace: $syncs fsync/fdatasync calls for $(jget "$j" acked) ACKs (+1 startup DORA)"
        fi
    fi
}

measure_rss() {
    log "== causeway RSS with $RSS_CLIENTS leases (/15 pool)"
    start_server causeway-rss
    local idle_kb kb n j="$TMP/rss.json"
    idle_kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$SRV_PID/status")
    bench "$j" 60 --clients "$RSS_CLIENTS" --count "$RSS_CLIENTS" --rate 20000 --max-outstanding 4096 --duration 30s
    kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$SRV_PID/status")
    n=$(timeout 30 "$CAUSEWAY_BIN" leases --json --config "$SRV_DIR/causeway.yaml" |
        python3 -c 'import json, sys; print(len(json.load(sys.stdin)))')
    stop_server
    res causeway rss_idle_kb "$idle_kb"
    res causeway rss_kb "$kb"
    res causeway rss_leases "$n"
    res causeway rss_run "$(jget "$j" acked drop_pct)"
    log "  VmRSS ${idle_kb} kB idle -> ${kb} kB with $n leases"
}

# -------------------------------------------------------------- measurements
for s in ${SERVERS//,/ }; do measure "$s"; done
[[ ,$SERVERS, == *,causeway,* ]] && measure_rss

# ------------------------------------------------------------------- report
export CWB_DATE CWB_NPROC CWB_KERNEL CWB_VERSIONS CWB_QUICK=$QUICK
CWB_DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
CWB_NPROC=$(nproc)
CWB_KERNEL=$(uname -r)
CWB_VERSIONS="causeway $("$CAUSEWAY_BIN" --version | awk '{print $NF}') ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')), Kea $("$KEA" -v), ISC dhcpd $("$DHCPD" --version 2>&1 | sed 's/^isc-dhcpd-//'), perfdhcp $("$PERFDHCP" -v 2>&1 | head -1 | sed 's/^VERSION: //')"
export FLOOD_D PROBE_D LAT_D PERF_P MAX_PROBES BISECT RSS_CLIENTS SERVERS PERFDHCP_MODE

REPORT=$TMP/report.md
python3 - "$RESULTS" >"$REPORT" <<'PY'
import os, sys
from collections import defaultdict
r = defaultdict(dict)
for line in open(sys.argv[1]):
    s, k, v = line.rstrip("\n").split("\t")
    r[s][k] = v
E = os.environ
servers = E["SERVERS"].split(",")

def num(x):
    try: return float(x)
    except (TypeError, ValueError): return None
def fmt_rate(x):
    v = num(x)
    return x if v is None else f"{round(v):,}".replace(",", " ")
def ratio(s, key):
    a, b = num(r[s].get(key)), num(r.get("kea-mt", {}).get(key))
    return f"{a / b:.2f}×" if a is not None and b else "-"

durability = {
    "kea-st": "memfile: append, no fsync",
    "kea-mt": "memfile: append, no fsync",
    "dhcpd": "fsync per lease commit",
    "causeway": "fdatasync per group-commit batch, before the ACK",
}
print("### DHCPv4: causeway vs Kea vs ISC dhcpd\n")
print(f"- Run: {E['CWB_DATE']}, `nproc` = {E['CWB_NPROC']}, kernel {E['CWB_KERNEL']}"
      + (" — **quick mode** (short runs; not for publication)" if E["CWB_QUICK"] == "1" else ""))
print(f"- Command: `{E['CWB_CMD']}`")
print(f"- Versions: {E['CWB_VERSIONS']}")
print(f"- Lab: two network namespaces joined by a veth pair; all load relayed (giaddr 10.250.0.2 → server 10.250.0.1:67), "
      "subnet 10.250.0.0/16, pool 10.250.1.0–10.250.255.200; the load generator and the server share the same CPUs (not pinned). "
      "Every measurement starts a fresh server with an empty lease file.")
print(f"- Flood: `causeway-bench dhcp --rate 0 --max-outstanding 256 --clients 60000 --duration {E['FLOOD_D']}s`. "
      f"Sustained: highest `--rate` with < 1% drops and ≥ 95% of the target acknowledged over {E['PROBE_D']} s "
      f"(from the flood figure down in 12% steps{', then one bisection step up' if E['BISECT'] == '1' else ''}; at most {E['MAX_PROBES']} probes; ≥ when the flood figure itself passed). "
      f"Latency: `--rate` = half the sustained rate for {E['LAT_D']} s. "
      f"perfdhcp: `perfdhcp -4 -g {E['PERFDHCP_MODE']} -l 10.250.0.2 -r <sustained> -R 60000 -p {E['PERF_P']} 10.250.0.1` "
      "(a relay from 10.250.0.2:67; it counts exchanges still in flight when it stops as drops). "
      "ACKs per CPU-second: ACKs of the flood run / server utime+stime over it. "
      "Bench CPU: the load generator's own utime+stime over the flood, in % of one core (it is single-threaded: near 100% the flood measures the bench, not the server). "
      "fsync per ACK: fsync+fdatasync calls counted by `strace -f -c` over a separate run of up to 300 DORAs (5 s), 64 in flight"
      + (" (quick mode: dhcpd only)." if E["CWB_QUICK"] == "1" else "."))
print("- Config notes: Kea memfile `persist: true`, `lfc-interval: 0`, logging at WARN to a file; "
      "Kea MT as the Kea ARM recommends for kea-dhcp4 on memfile: `thread-pool-size: 4`, `packet-queue-size: 28`; "
      "dhcpd `ping-check false` (its default pings each new address and waits 1 s before offering); "
      "dhcpd logs every packet to syslog, which this lab does not run; causeway `rateLimitPerClient: 20`.")
print()
print("| server | flood ACK/s | vs kea-mt | flood drops | sustained ACK/s (<1% drops) | vs kea-mt | p50 / p90 / p99 ms at ½ sustained | perfdhcp 4-way/s (target) | perfdhcp drops DO / RA | ACKs per server CPU-s | bench CPU in the flood | fsync per ACK | durability |")
print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
def pct(x):
    v = num(x)
    return "-" if v is None else f"{v:.2f}%"
for s in servers:
    d = r.get(s, {})
    lat = (d.get("lat") or "- - - -").split()
    p = (d.get("perf") or "- - - -").split()
    sus = ("≥ " if d.get("sustained_lb") else "") + fmt_rate(d.get("sustained"))
    cells = [
        s,
        fmt_rate(d.get("flood_rate")), ratio(s, "flood_rate"), pct(d.get("flood_drop")),
        sus, ratio(s, "sustained"),
        f"{lat[0]} / {lat[1]} / {lat[2]} (at {fmt_rate(d.get('lat_rate'))}/s)",
        f"{fmt_rate(p[0])} ({fmt_rate(p[1])})", f"{pct(p[2])} / {pct(p[3])}",
        fmt_rate(d.get("ack_per_cpu")), pct(d.get("flood_bench_cpu")), d.get("syncs_per_ack", "-"), durability[s],
    ]
    print("| " + " | ".join(cells) + " |")
print()
print("Drops are exchanges (DISCOVER to ACK) not acknowledged within 1 s.")
c = r.get("causeway", {})
if "rss_kb" in c:
    mib = lambda kb: f"{int(kb) / 1024:.1f} MiB"
    acked, drop = c.get("rss_run", "- -").split()
    print()
    print(f"causeway RSS: **{mib(c['rss_kb'])}** (VmRSS) holding {c['rss_leases']} leases "
          f"(idle after start: {mib(c['rss_idle_kb'])}); /15 subnet, pool 10.250.1.0–10.251.255.200, "
          f"`--clients {E['RSS_CLIENTS']} --count {E['RSS_CLIENTS']} --rate 20000` ({acked} ACKs, {drop}% drops).")
PY

show_report "$REPORT" compare-dhcp
log "done in ${SECONDS}s"
