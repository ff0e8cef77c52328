#!/usr/bin/env bash
# Compare causeway's DNS server with unbound, knot-resolver (kresd) and
# dnsmasq on one machine, on loopback, with the same zone data and the same
# local upstream, measured with dnsperf and causeway-bench. A reference
# responder with no DNS logic (`causeway-bench dns-floor`) is measured the
# same way, as the floor of what the kernel's UDP path costs per query.
#
#   bench/compare-dns.sh [--quick] [--rounds N] [--write docs/benchmarks.md] [--servers unbound,kresd,dnsmasq,causeway,causeway-pinned,floor] [--threads N] [--no-build]
#
# Needs root (port 53), python3, and unbound, knot-resolver, dnsmasq and
# dnsperf, which it apt-get installs when missing (with a policy-rc.d that
# keeps the packages' services from starting, which it then disables).
# Every server runs in the foreground from its own config in a temp dir, on
# its own loopback address; nothing touches /etc/resolv.conf and no query
# leaves loopback (the upstream refuses anything outside its own zone).
# Every process the script started and its temp dir are removed on exit,
# including on error, Ctrl-C or timeout.
#
# Lab (all port 53): upstream 127.0.0.53 (DNS_UPSTREAM overrides), an
# unbound auth-zone serving example.net (h0..h999 and a wildcard), TTL 3600.
# Servers under test, one at a time: causeway 127.0.0.11, unbound
# 127.0.0.12, kresd 127.0.0.13, dnsmasq 127.0.0.14, and causeway again
# with its UDP threads pinned (`pinUdpThreads: true`) 127.0.0.15, each answering
# hc1.example.com locally (api, api-int, oauth, ignition, konnectivity and
# *.apps -> 192.168.100.2, anything else NXDOMAIN) and forwarding the rest
# to the upstream. The floor, 127.0.0.16, answers every A question with one
# A record, forwards nothing, and serves its sockets as causeway does.
#
# Builds causeway-bench and causeway (cargo build --release) unless
# BENCH_BIN and CAUSEWAY_BIN are given, or --no-build uses target/release.
# causeway is skipped, with a note, when its binary is missing or does not
# serve DNS yet. Measurements run under a global time bound (full ~9.5 min,
# --quick 2 min, times the rounds; COMPARE_DNS_LIMIT=<seconds> overrides).
#
# --rounds N measures every server N times, alternating the order from
# round to round; the report gives the median of each figure and, for the
# ratios causeway is judged by, the median and range over the rounds.
#
# --threads N gives every server that can spread over threads N of them
# (unbound num-threads, N kresd processes, causeway udpSockets); the
# default is one per core. dnsmasq has one thread whatever N is. A run with
# N other than one per core writes its own block in the --write file.
set -euo pipefail

NAME=compare-dns
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# ---------------------------------------------------------------- arguments
SERVERS="unbound,kresd,dnsmasq,causeway,causeway-pinned,floor"
ORIG_ARGS=("$@")
THREADS=$(nproc)
SHARED_ARGS=()
while (($#)); do
    case $1 in
        --threads) [[ $# -ge 2 ]] || die "--threads needs a number"; THREADS=$2; shift ;;
        --threads=*) THREADS=${1#--threads=} ;;
        *) SHARED_ARGS+=("$1") ;;
    esac
    shift
done
[[ $THREADS =~ ^[1-9][0-9]?$ ]] || die "--threads takes 1 to 99, not '$THREADS'"
parse_args servers "unbound kresd dnsmasq causeway causeway-pinned floor" 39 ${SHARED_ARGS[@]+"${SHARED_ARGS[@]}"}

[[ $(id -u) -eq 0 ]] || die "must run as root (servers bind port 53; missing packages are apt-get installed); try: sudo $0 ${ORIG_ARGS[*]}"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

need timeout coreutils
need python3
need ss iproute2

# ------------------------------------------------------- install & build
# Both run once, before the timed part (the re-exec below sets CWD_TIMED=1
# so the child skips them).
install_missing() {
    local pkgs=()
    command -v unbound >/dev/null || pkgs+=(unbound)
    command -v kresd >/dev/null || pkgs+=(knot-resolver)
    command -v dnsmasq >/dev/null || pkgs+=(dnsmasq)
    command -v dnsperf >/dev/null || pkgs+=(dnsperf)
    apt_install "unbound.service unbound-resolvconf.service dnsmasq.service kresd@1.service kres-cache-gc.service" "${pkgs[@]}"
}

if [[ -z ${CWD_TIMED:-} ]]; then
    install_missing
    build_bench_and_causeway "$SERVERS"
    run_timed CWD COMPARE_DNS_LIMIT
fi

need unbound "apt-get install unbound"
need kresd "apt-get install knot-resolver"
need dnsmasq "apt-get install dnsmasq"
need dnsperf "apt-get install dnsperf"
need getconf

# ------------------------------------------------------------ lab & cleanup
UPSTREAM=${DNS_UPSTREAM:-127.0.0.53}
declare -A ADDR=([causeway]=127.0.0.11 [unbound]=127.0.0.12 [kresd]=127.0.0.13 [dnsmasq]=127.0.0.14 [causeway-pinned]=127.0.0.15 [floor]=127.0.0.16)
make_lab
UP_PID="" SRV_PIDS=""


cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    # shellcheck disable=SC2046,SC2086
    stop_pids $SRV_PIDS $UP_PID $(jobs -p)
    if ((rc != 0)) && [[ -n ${KEEP_TMP:-} ]]; then
        echo "compare-dns: kept $TMP" >&2
    else
        rm -rf "$TMP"
    fi
    exit "$rc"
}
trap_exits "$CWD_LIMIT"

# Nothing may already listen where we are about to.
port_owner() { ss -Hlunp "sport = :53" 2>/dev/null | awk -v a="$1:53" '$4 == a || $4 == "0.0.0.0:53" || $4 == "*:53" {print $0; exit}'; }
for a in "$UPSTREAM" "${ADDR[@]}"; do
    owner=$(port_owner "$a")
    [[ -z $owner ]] || die "$a:53 is already in use: $owner (set DNS_UPSTREAM=127.0.0.x for the upstream, or stop that server)"
done

if ((QUICK)); then RUN_S=3 LAT_S=3; else RUN_S=10 LAT_S=10; fi
OUTSTANDING=200 SOCKETS=4 LAT_RATE=5000 CACHED_NAMES=100
ZONE=hc1.example.com FWD=example.net PROXY=192.168.100.2
LOCAL_NAMES="api api-int oauth ignition konnectivity"
CLK_TCK=$(getconf CLK_TCK)
SLABS=1
while ((SLABS < THREADS)); do SLABS=$((SLABS * 2)); done



ticks_to_s() { python3 -c "print(round($1 / $CLK_TCK, 2))"; }

# Query files for dnsperf, the same names causeway-bench generates: local
# alternates the fixed names with x<N>.apps (half each), cached is h0..h99.
read -r -a LOCAL_ARR <<<"$LOCAL_NAMES"
for i in $(seq 0 999); do
    echo "${LOCAL_ARR[i % ${#LOCAL_ARR[@]}]}.$ZONE A"
    echo "x$i.apps.$ZONE A"
done >"$TMP/local.txt"
for i in $(seq 0 $((CACHED_NAMES - 1))); do echo "h$i.$FWD A"; done >"$TMP/cached.txt"
echo "api.$ZONE A" >"$TMP/probe-local.txt"
echo "h1.$FWD A" >"$TMP/probe-upstream.txt"

# answers ADDR FILE : true when ADDR answers the one query in FILE.
answers() {
    local out
    out=$(timeout -k 2 5 "$BENCH_BIN" dns --server "$1:53" --queries "$2" --count 1 \
        --timeout 300ms --json 2>/dev/null) || return 1
    [[ $(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["rcodes"]["noerror"] - d["nodata"])' "$out" 2>/dev/null) == 1 ]]
}

# wait_ready ADDR FILE SECONDS PID... : poll with a query until one is
# answered; fail early if the server died.
wait_ready() {
    local addr=$1 file=$2 deadline=$((SECONDS + $3)) p
    shift 3
    while ((SECONDS < deadline)); do
        for p in "$@"; do kill -0 "$p" 2>/dev/null || return 1; done
        answers "$addr" "$file" && return 0
        sleep 0.1
    done
    return 1
}

# --------------------------------------------------------------- upstream
mkdir -p "$TMP/upstream"
{
    echo "\$ORIGIN $FWD."
    echo "\$TTL 3600"
    echo "@ IN SOA ns.$FWD. hostmaster.$FWD. 1 3600 600 86400 3600"
    echo "@ IN NS ns.$FWD."
    echo "ns IN A $UPSTREAM"
    for i in $(seq 0 999); do echo "h$i IN A 10.0.$((i / 256)).$((i % 256))"; done
    echo "* IN A 10.255.255.254"
} >"$TMP/upstream/$FWD.zone"
cat >"$TMP/upstream/unbound.conf" <<EOF
# The stand-in for the internet: authoritative for $FWD only. It refuses
# every other name and may query no address, so no query leaves loopback.
server:
  username: ""
  chroot: ""
  directory: "$TMP/upstream"
  pidfile: ""
  use-syslog: no
  logfile: ""
  verbosity: 0
  interface: $UPSTREAM
  port: 53
  do-daemonize: no
  num-threads: 1
  so-rcvbuf: 4m
  do-ip6: no
  access-control: 127.0.0.0/8 allow
  module-config: "iterator"
  local-zone: "." refuse
  local-zone: "$FWD." transparent
  do-not-query-address: 0.0.0.0/0
  do-not-query-address: ::/0
auth-zone:
  name: "$FWD."
  zonefile: "$TMP/upstream/$FWD.zone"
  for-downstream: yes
  for-upstream: no
  fallback-enabled: no
EOF
unbound-checkconf "$TMP/upstream/unbound.conf" >/dev/null || die "upstream unbound config rejected"
unbound -d -c "$TMP/upstream/unbound.conf" >"$TMP/upstream/out" 2>&1 &
UP_PID=$!
wait_ready "$UPSTREAM" "$TMP/probe-upstream.txt" 10 "$UP_PID" ||
    { tail -20 "$TMP/upstream/out" >&2; die "upstream unbound on $UPSTREAM:53 did not answer within 10 s"; }
log "upstream: unbound auth-zone $FWD on $UPSTREAM:53 (pid $UP_PID), temp $TMP"

# ---------------------------------------------------------------- servers
# start_NAME DIR ADDR : write the config, start in the foreground (as our
# child), set SRV_PIDS. Every server: local zone $ZONE, the rest forwarded
# to the upstream, no DNSSEC validation, access for 127.0.0.0/8.

start_unbound() {
    local dir=$1 addr=$2 n
    {
        cat <<EOF
server:
  username: ""
  chroot: ""
  directory: "$dir"
  pidfile: ""
  use-syslog: no
  logfile: ""
  verbosity: 0
  interface: $addr
  port: 53
  do-daemonize: no
  num-threads: $THREADS
  so-reuseport: yes
  so-rcvbuf: 4m
  so-sndbuf: 4m
  msg-cache-size: 64m
  rrset-cache-size: 128m
  msg-cache-slabs: $SLABS
  rrset-cache-slabs: $SLABS
  infra-cache-slabs: $SLABS
  key-cache-slabs: $SLABS
  num-queries-per-thread: 4096
  outgoing-range: 8192
  do-ip6: no
  do-not-query-localhost: no
  access-control: 127.0.0.0/8 allow
  module-config: "iterator"
  local-zone: "$ZONE." static
  local-data: "$ZONE. 30 IN SOA ns.$ZONE. hostmaster.$ZONE. 1 3600 600 86400 30"
EOF
        for n in $LOCAL_NAMES; do echo "  local-data: \"$n.$ZONE. 30 IN A $PROXY\""; done
        cat <<EOF
  local-zone: "apps.$ZONE." redirect
  local-data: "apps.$ZONE. 30 IN A $PROXY"
forward-zone:
  name: "."
  forward-addr: $UPSTREAM@53
EOF
    } >"$dir/unbound.conf"
    unbound-checkconf "$dir/unbound.conf" >/dev/null || return 1
    unbound -d -c "$dir/unbound.conf" >"$dir/out" 2>&1 &
    SRV_PIDS=$!
}

# knot-resolver 5: one single-threaded process per core, sharing the port
# (SO_REUSEPORT) and the LMDB cache in the shared run dir. Local answers are
# policy rules; everything else is STUB-forwarded (no validation).
start_kresd() {
    local dir=$1 addr=$2 n names="" i
    for n in $LOCAL_NAMES; do names+="'$n.$ZONE.', "; done
    cat >"$dir/kresd.conf" <<EOF
-- knot-resolver 5.x benchmark instance; run dir $dir
net.ipv6 = false
net.listen('$addr', 53, { kind = 'dns' })
cache.open(256 * MB, 'lmdb://$dir/cache')
-- No DNSSEC and nothing that would ask the root servers.
trust_anchors.remove('.')
for _, m in ipairs({ 'ta_update', 'ta_signal_query', 'priming', 'detect_time_skew', 'detect_time_jump' }) do
  pcall(modules.unload, m)
end
local answer = policy.ANSWER({ [kres.type.A] = { rdata = kres.str2ip('$PROXY'), ttl = 30 } }, true)
policy.add(policy.suffix(answer, policy.todnames({ 'apps.$ZONE.' })))
policy.add(policy.domains(answer, policy.todnames({ ${names%, } })))
policy.add(policy.suffix(policy.DENY, policy.todnames({ '$ZONE.' })))
policy.add(policy.all(policy.STUB({ '$UPSTREAM@53' })))
EOF
    SRV_PIDS=""
    for i in $(seq 1 "$THREADS"); do
        (cd "$dir" && exec kresd -n -q -c "$dir/kresd.conf" "$dir") >"$dir/out.$i" 2>&1 &
        SRV_PIDS+="$! "
    done
}

# dnsmasq: single-threaded by design. host-record for the fixed names,
# address= for the wildcard (it also matches apps.<zone> itself), local= so
# the rest of the zone is NXDOMAIN instead of forwarded.
start_dnsmasq() {
    local dir=$1 addr=$2 n
    {
        cat <<EOF
port=53
listen-address=$addr
bind-interfaces
no-resolv
no-hosts
no-poll
user=root
group=root
pid-file=$dir/dnsmasq.pid
log-facility=$dir/dnsmasq.log
server=$UPSTREAM#53
cache-size=10000
dns-forward-max=1000
local-ttl=30
local=/$ZONE/
address=/apps.$ZONE/$PROXY
EOF
        for n in $LOCAL_NAMES; do echo "host-record=$n.$ZONE,$PROXY"; done
    } >"$dir/dnsmasq.conf"
    dnsmasq --test -C "$dir/dnsmasq.conf" >/dev/null 2>&1 || return 1
    dnsmasq -k -C "$dir/dnsmasq.conf" >"$dir/out" 2>&1 &
    SRV_PIDS=$!
}

CAUSEWAY_NOTE=""
# start_causeway DIR ADDR [EXTRA] : EXTRA is more of the dns block.
start_causeway() {
    local dir=$1 addr=$2 extra=${3:-} out
    cat >"$dir/causeway.yaml" <<EOF
admin: {listen: "127.0.0.1:19292"}
cluster: {name: hc1, baseDomain: example.com}
dns:
  listen: ["$addr:53"]
  proxyAddress: $PROXY
  # *.apps is answered locally only with an ingress to point it at (with
  # no proxy section here, none is derived); the other servers answer it.
  ingressAddress: $PROXY
  upstreams: ["$UPSTREAM:53"]
  recursionClients: [127.0.0.0/8]
  udpSockets: $THREADS
$extra
EOF
    if [[ ! -x $CAUSEWAY_BIN ]]; then
        CAUSEWAY_NOTE="binary $CAUSEWAY_BIN not found"
        return 2
    fi
    if ! out=$("$CAUSEWAY_BIN" check --config "$dir/causeway.yaml" 2>&1); then
        CAUSEWAY_NOTE="\`causeway check\` rejects the dns section: $(echo "$out" | head -3 | tr '\n' ' ')"
        return 2
    fi
    # `check` lists the services it would run, but builds differ in
    # whether it names dns; the readiness probe is the real test.
    "$CAUSEWAY_BIN" appliance --config "$dir/causeway.yaml" >"$dir/out" 2>&1 &
    SRV_PIDS=$!
}

start_causeway_pinned() { start_causeway "$1" "$2" "  pinUdpThreads: true"; }

# The floor: causeway-bench's responder with no DNS logic, as many sockets
# (and threads) as the other servers get.
start_floor() {
    "$BENCH_BIN" dns-floor --listen "$2:53" --sockets "$THREADS" --answer "$PROXY" >"$1/out" 2>&1 &
    SRV_PIDS=$!
}

version_of() {
    case $1 in
        unbound) unbound -V 2>/dev/null | awk 'NR == 1 {print "unbound " $2}' ;;
        kresd) kresd --version 2>/dev/null | awk '{print "kresd " $NF}' ;;
        dnsmasq) dnsmasq --version 2>/dev/null | awk 'NR == 1 {print "dnsmasq " $3}' ;;
        causeway-pinned) echo "$(version_of causeway), UDP threads pinned" ;;
        floor) echo "floor: causeway-bench dns-floor" ;;
        causeway) echo "causeway $("$CAUSEWAY_BIN" --version 2>/dev/null | awk '{print $NF}') ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?'))" ;;
    esac
}

# ----------------------------------------------------------- measurements
BENCH_COMMON=(--max-outstanding "$OUTSTANDING" --sockets "$SOCKETS" --timeout 2s --json)

# run_bench NAME KEY ARGS... : one causeway-bench run, server CPU around it.
run_bench() {
    local name=$1 key=$2 out
    shift 2
    out=$TMP/$name/$key.json
    local t0 t1
    # shellcheck disable=SC2086
    t0=$(cpu_ticks $SRV_PIDS)
    timeout -k 5 $((RUN_S + LAT_S + 20)) "$BENCH_BIN" dns --server "${ADDR[$name]}:53" \
        "${BENCH_COMMON[@]}" "$@" >"$out" 2>>"$TMP/$name/bench.log" || true
    # shellcheck disable=SC2086
    t1=$(cpu_ticks $SRV_PIDS)
    [[ -s $out ]] || { tail -5 "$TMP/$name/bench.log" >&2; die "causeway-bench produced no result against $name ($*)"; }
    local f
    read -r -a f <<<"$(jget "$out" qps lost responses latency_ms.p50 latency_ms.p99 latency_ms.p999 \
        rcodes.noerror nodata bench_cpu_pct)"
    res "$name" "${key}_qps" "${f[0]}"
    res "$name" "${key}_lost" "${f[1]}"
    res "$name" "${key}_resp" "${f[2]}"
    res "$name" "${key}_p50" "${f[3]}"
    res "$name" "${key}_p99" "${f[4]}"
    res "$name" "${key}_p999" "${f[5]}"
    res "$name" "${key}_bad" "$((f[2] - f[6] + f[7]))"
    res "$name" "${key}_benchcpu" "${f[8]}"
    res "$name" "${key}_cpu" "$(ticks_to_s $((t1 - t0)))"
    log "  $key: $(printf '%.0f' "${f[0]}") q/s, lost ${f[1]}, p99 ${f[4]} ms, server CPU $(ticks_to_s $((t1 - t0))) s, bench CPU ${f[8]}%"
}

# run_dnsperf NAME KEY FILE : one dnsperf run, same concurrency as the bench.
run_dnsperf() {
    local name=$1 key=$2 file=$3 out t0 t1
    out=$TMP/$name/$key.txt
    # shellcheck disable=SC2086
    t0=$(cpu_ticks $SRV_PIDS)
    timeout -k 5 $((RUN_S + 20)) dnsperf -s "${ADDR[$name]}" -p 53 -d "$file" -l "$RUN_S" \
        -q "$OUTSTANDING" -c "$SOCKETS" -t 2 >"$out" 2>&1 || true
    # shellcheck disable=SC2086
    t1=$(cpu_ticks $SRV_PIDS)
    local f
    read -r -a f <<<"$(awk '
        /Queries completed:/ {c = $3}
        /Queries lost:/ {l = $3}
        /Queries per second:/ {q = $4}
        /Average Latency \(s\):/ {a = $4 * 1000}
        /Response codes:/ {n = 0; for (i = 3; i <= NF; i += 3) if ($i == "NOERROR,"||$i == "NOERROR") n = $(i + 1); ok = n}
        END {print (q == "" ? "-" : q), (l == "" ? "-" : l), (c == "" ? "-" : c), (a == "" ? "-" : a), (ok == "" ? 0 : ok)}' "$out")"
    [[ ${f[0]} != - ]] || { tail -5 "$out" >&2; die "dnsperf produced no result against $name"; }
    res "$name" "${key}_qps" "${f[0]}"
    res "$name" "${key}_lost" "${f[1]}"
    res "$name" "${key}_resp" "${f[2]}"
    res "$name" "${key}_avg" "${f[3]}"
    res "$name" "${key}_bad" "$((f[2] - ${f[4]//,/}))"
    res "$name" "${key}_cpu" "$(ticks_to_s $((t1 - t0)))"
    log "  $key: $(printf '%.0f' "${f[0]}") q/s, lost ${f[1]}, avg ${f[3]} ms, server CPU $(ticks_to_s $((t1 - t0))) s"
}

measure() {
    local name=$1 dir=$TMP/$1 addr=${ADDR[$1]} rc=0
    mkdir -p "$dir"
    SRV_PIDS=""
    "start_${name//-/_}" "$dir" "$addr" || rc=$?
    if ((rc == 2)); then
        echo "$name: DNS not available in this build, skipped ($CAUSEWAY_NOTE)" >&2
        res "$name" skipped "$CAUSEWAY_NOTE"
        return 0
    fi
    ((rc == 0)) || die "$name: config rejected (see $dir)"
    # shellcheck disable=SC2086
    if ! wait_ready "$addr" "$TMP/probe-local.txt" 15 $SRV_PIDS; then
        tail -20 "$dir"/out* >&2 2>/dev/null || true
        # shellcheck disable=SC2086
        stop_pids $SRV_PIDS
        SRV_PIDS=""
        if [[ $name == causeway* ]]; then
            CAUSEWAY_NOTE="no answer from $addr:53 within 15 s"
            echo "$name: DNS not available in this build, skipped ($CAUSEWAY_NOTE)" >&2
            res "$name" skipped "$CAUSEWAY_NOTE"
            return 0
        fi
        die "$name did not answer on $addr:53 within 15 s"
    fi
    res "$name" version "$(version_of "$name")"
    log "$name on $addr:53 (pid $SRV_PIDS) — $(version_of "$name")"

    run_dnsperf "$name" local_dp "$TMP/local.txt"
    run_bench "$name" local_b --duration "${RUN_S}s" --mix local=100
    # Warm the cache once: every cached name asked at least twice.
    timeout -k 5 30 "$BENCH_BIN" dns --server "$addr:53" --mix cached=100 --cached-names "$CACHED_NAMES" \
        --count $((CACHED_NAMES * 3)) --max-outstanding 20 --json >"$dir/warm.json" 2>>"$dir/bench.log" || true
    run_dnsperf "$name" cached_dp "$TMP/cached.txt"
    run_bench "$name" cached_b --duration "${RUN_S}s" --mix cached=100 --cached-names "$CACHED_NAMES"
    run_bench "$name" lat --duration "${LAT_S}s" --rate "$LAT_RATE" \
        --mix local=70,cached=20,miss=10 --cached-names "$CACHED_NAMES"
    # shellcheck disable=SC2086
    stop_pids $SRV_PIDS
    SRV_PIDS=""
}

for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    ((ROUNDS == 1)) || log "round $ROUND of $ROUNDS"
    for s in $(round_order "$ROUND" "$SERVERS"); do measure "$s"; done
done

# ------------------------------------------------------------------ report
export CWD_DATE CWD_NPROC CWD_KERNEL CWD_CPU CWD_QUICK=$QUICK CWD_DNSPERF
CWD_DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
CWD_NPROC=$(nproc)
CWD_KERNEL=$(uname -r)
CWD_CPU=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
CWD_DNSPERF=$(dnsperf -h 2>&1 | awk '/^Version/ {print $2; exit}')
export RUN_S LAT_S OUTSTANDING SOCKETS LAT_RATE CACHED_NAMES SERVERS UPSTREAM ROUNDS THREADS

REPORT=$TMP/report.md
python3 - "$RESULTS" >"$REPORT" <<'PY'
import os, sys
E = os.environ
sys.path.insert(0, E["BENCH_DIR"])
from rounds import fmt_int, load, num, spread
r, by_round = load(sys.argv[1])
rounds = int(E["ROUNDS"])
servers = E["SERVERS"].split(",")
ran = [s for s in servers if "skipped" not in r[s]]

def fmt_ms(x):
    v = num(x)
    return "-" if v is None else f"{v:.2f}"
def per_cpu(s, key):
    resp, cpu = num(r[s].get(key + "_resp")), num(r[s].get(key + "_cpu"))
    return resp / cpu if resp is not None and cpu else None
def ratio(a, b, invert=False):
    if a is None or not b: return "-"
    return f"{(b / a if invert else a / b):.2f}×"

threads = int(E["THREADS"])
per_core = threads == int(E["CWD_NPROC"])
print("### DNS: causeway vs unbound vs knot-resolver vs dnsmasq"
      + ("" if per_core else f", {threads} thread{'s' if threads > 1 else ''} per server") + "\n")
print(f"- Run: {E['CWD_DATE']}, `nproc` = {E['CWD_NPROC']} ({E['CWD_CPU']}), kernel {E['CWD_KERNEL']}"
      + (" — **quick mode** (short runs; not for publication)" if E["CWD_QUICK"] == "1" else ""))
print(f"- Command: `{E['CWD_CMD']}`")
print("- Versions: " + ", ".join([r[s]["version"] for s in ran if "version" in r[s]] + [f"dnsperf {E['CWD_DNSPERF']}"]))
print(f"- Lab: loopback only; each server on its own 127.0.0.x:53, one at a time, sharing the {E['CWD_NPROC']} cores with the load generator (nothing pinned but causeway-pinned's UDP threads: `pinUdpThreads: true`, each on the CPU its socket is steered to). "
      f"Same data everywhere: zone hc1.example.com answered locally (api, api-int, oauth, ignition, konnectivity, *.apps → 192.168.100.2), "
      f"everything else forwarded to one upstream, an unbound auth-zone for example.net on {E['UPSTREAM']}:53 (h0–h999 + wildcard, TTL 3600). No DNSSEC validation anywhere.")
if "floor" in ran:
    print("- Floor: `causeway-bench dns-floor`, a responder with no DNS logic: every A question gets one A record, nothing is looked up, cached, counted "
          "or forwarded (so its *cached* rows are answered just like the local ones). Its sockets are served as causeway's are (a SO_REUSEPORT group of "
          "steered sockets, one blocking thread each, 32 datagrams per recvmmsg, replies by sendmmsg). Its queries per CPU-second are what the kernel's "
          "UDP path allows on this host; a server's against the floor's give the share of its cost that is the kernel's.")
print(f"- Load: {E['OUTSTANDING']} queries in flight over {E['SOCKETS']} client sockets (so servers that spread sockets over threads can), "
      f"{E['RUN_S']} s per run, 2 s timeout. dnsperf: `dnsperf -q {E['OUTSTANDING']} -c {E['SOCKETS']} -t 2 -l {E['RUN_S']}` (its default is -q 100). "
      f"causeway-bench: `causeway-bench dns --max-outstanding {E['OUTSTANDING']} --sockets {E['SOCKETS']} --mix local=100` (or `cached=100`). "
      f"*local*: the fixed names and x<N>.apps, half each; *cached*: h0–h{int(E['CACHED_NAMES'])-1}.example.net, warmed once before. "
      f"Latency: `--rate {E['LAT_RATE']} --mix local=70,cached=20,miss=10` for {E['LAT_S']} s (miss = a new name each time, forwarded).")
print("- Server CPU: utime+stime of the server's processes (all threads) over the run, from /proc/<pid>/stat; "
      "queries per CPU-second = responses / that. Ratios are to unbound: for q/s and q per CPU-s higher is better, for p99 lower is better. "
      + ("Threads: one per core, " if per_core else f"Threads: {threads} per server on {E['CWD_NPROC']} cores (`--threads {threads}`), ")
      + f"so unbound `num-threads: {threads}`, kresd {threads} process{'es' if threads > 1 else ''}, causeway `udpSockets: {threads}`; dnsmasq has one. "
      "Config: unbound `so-reuseport`, `so-rcvbuf: 4m`; kresd SO_REUSEPORT and a shared LMDB cache; dnsmasq `cache-size=10000`, `dns-forward-max=1000`.")
for s in servers:
    if "skipped" in r[s]:
        print(f"- **{s}: DNS not available in this build, skipped** ({r[s]['skipped']}).")
print()

def ref(key):
    return r.get("unbound", {}).get(key)

def per_cpu_rounds(s, key):
    resp = [num(v) for v in by_round.get(s, {}).get(key + "_resp", [])]
    cpu = [num(v) for v in by_round.get(s, {}).get(key + "_cpu", [])]
    return [a / b if a is not None and b else None for a, b in zip(resp, cpu)]
def vs_unbound(key, s="causeway"):
    return [a / b if a is not None and b else None
            for a, b in zip(per_cpu_rounds(s, key), per_cpu_rounds("unbound", key))]

if rounds > 1:
    print(f"- Rounds: {rounds}, each measuring every server, in reverse order every other round. Every figure below is the median over the rounds "
          "(queries per CPU-second from the medians of its parts); each causeway's queries per CPU-second against unbound's are also given round by round, "
          "as median (lowest–highest):\n")
    judged = [("local, dnsperf", "local_dp"), ("local, causeway-bench", "local_b"),
              ("cached, dnsperf", "cached_dp"), ("cached, causeway-bench", "cached_b"), (f"{E['LAT_RATE']} q/s mix", "lat")]
    print("| q per CPU-s vs unbound, over the rounds | " + " | ".join(j[0] for j in judged) + " |")
    print("|---|" + "---:|" * len(judged))
    for s in (c for c in ran if c.startswith("causeway") or c == "floor"):
        print(f"| {s} | " + " | ".join(spread(vs_unbound(k, s)) for _, k in judged) + " |")
    print()
    if "floor" in ran:
        def vs_floor(key, s):
            return [a / b if a is not None and b else None
                    for a, b in zip(per_cpu_rounds(s, key), per_cpu_rounds("floor", key))]
        print("Each server's queries per CPU-second as a share of the floor's, round by round, median (lowest–highest):\n")
        print("| q per CPU-s vs the floor, over the rounds | " + " | ".join(j[0] for j in judged) + " |")
        print("|---|" + "---:|" * len(judged))
        for s in (c for c in ran if c != "floor"):
            print(f"| {s} | " + " | ".join(spread(vs_floor(k, s)) for _, k in judged) + " |")
        print()
print("| server | workload | dnsperf q/s | lost | q per CPU-s | causeway-bench q/s | lost | p99 ms | q per CPU-s | bench CPU | q/s vs unbound (dnsperf / bench) | q per CPU-s vs unbound (dnsperf / bench) |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
notes = []
for wl in ("local", "cached"):
    for s in ran:
        d = r[s]
        dp, b = wl + "_dp", wl + "_b"
        u_dp = per_cpu("unbound", dp) if "unbound" in ran else None
        u_b = per_cpu("unbound", b) if "unbound" in ran else None
        cells = [s, wl,
                 fmt_int(d.get(dp + "_qps")), fmt_int(d.get(dp + "_lost")), fmt_int(per_cpu(s, dp)),
                 fmt_int(d.get(b + "_qps")), fmt_int(d.get(b + "_lost")), fmt_ms(d.get(b + "_p99")), fmt_int(per_cpu(s, b)),
                 (f"{num(d.get(b + '_benchcpu')):.0f}%" if num(d.get(b + "_benchcpu")) is not None else "-"),
                 f"{ratio(num(d.get(dp + '_qps')), num(ref(dp + '_qps')))} / {ratio(num(d.get(b + '_qps')), num(ref(b + '_qps')))}",
                 f"{ratio(per_cpu(s, dp), u_dp)} / {ratio(per_cpu(s, b), u_b)}"]
        print("| " + " | ".join(cells) + " |")
        for k, tool in ((dp, "dnsperf"), (b, "causeway-bench")):
            bad = num(d.get(k + "_bad"))
            if bad:
                notes.append(f"{s} {wl} ({tool}): {fmt_int(bad)} responses were not NOERROR with an answer")
print()
print(f"Latency at a fixed {E['LAT_RATE']} q/s (causeway-bench, mix local 70 / cached 20 / miss 10):\n")
print("| server | q/s | lost | p50 ms | p99 ms | p99.9 ms | server CPU s | q per CPU-s | p99 vs unbound | q per CPU-s vs unbound |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for s in ran:
    d = r[s]
    u = r.get("unbound", {})
    cells = [s, fmt_int(d.get("lat_qps")), fmt_int(d.get("lat_lost")), fmt_ms(d.get("lat_p50")),
             fmt_ms(d.get("lat_p99")), fmt_ms(d.get("lat_p999")), fmt_ms(d.get("lat_cpu")), fmt_int(per_cpu(s, "lat")),
             ratio(num(d.get("lat_p99")), num(u.get("lat_p99"))) if "unbound" in ran else "-",
             ratio(per_cpu(s, "lat"), per_cpu("unbound", "lat")) if "unbound" in ran else "-"]
    print("| " + " | ".join(cells) + " |")
    bad = num(d.get("lat_bad"))
    if bad:
        notes.append(f"{s} latency run: {fmt_int(bad)} responses were not NOERROR with an answer")
if notes:
    print()
    for n in notes:
        print(f"- Note: {n}.")
PY

# Runs with another --threads go into a block of their own.
if [[ $THREADS == "$CWD_NPROC" ]]; then
    show_report "$REPORT" compare-dns
else
    show_report "$REPORT" "compare-dns-threads$THREADS"
fi
