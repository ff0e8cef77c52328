#!/usr/bin/env bash
# Compare causeway's L4 proxy with HAProxy (mode tcp) and nginx (stream),
# and with no proxy at all, on one machine, on loopback, against the same
# upstream, measured with causeway-bench and iperf3.
#
#   bench/compare-proxy.sh [--quick] [--rounds N] [--write docs/benchmarks.md] [--targets direct,haproxy,nginx,causeway] [--no-build]
#
# Needs root (it apt-get installs haproxy, nginx with libnginx-mod-stream
# and iperf3 when missing, with a policy-rc.d that keeps their services
# from starting, which it then disables), python3 and ss. Every proxy runs
# in the foreground from its own config in a temp dir; no system service
# or system config is touched. Every process the script started and its
# temp dir are removed on exit, including on error, Ctrl-C or timeout.
#
# Lab (loopback only): the upstream on 127.0.0.1:9000 is, in turn,
# `causeway-bench proxy upstream` in echo mode (connection rate, latency,
# idle connections), in sink and source mode (bulk throughput up and down)
# and `iperf3 -s`. Each proxy, one at a time, listens on 127.0.0.1:18443
# and forwards every connection to 127.0.0.1:9000; "direct" is the same
# load straight to 127.0.0.1:9000. HAProxy and nginx get one thread or
# worker per core and no logging; causeway runs `causeway proxy` with
# RUST_LOG=warn (its per-connection access line is at info).
#
# Measured per path: throughput over 1 and 4 streams (causeway-bench and
# iperf3 -P 1 / -P 4), short connections per second, HTTP requests per
# second and per proxy CPU-second under wrk (a 1 KB response from an nginx
# HTTP backend on 127.0.0.1:9080 through a second listener on :18444,
# once with `Connection: close`, once keep-alive), round-trip latency at
# a fixed 1000 requests/s, and the proxy's RSS before and while it holds
# 10000 idle connections (fewer when the open-files hard limit cannot fit
# two descriptors per connection in one process; the report says so).
#
# Builds causeway-bench and causeway (cargo build --release) unless
# BENCH_BIN and CAUSEWAY_BIN are given, or --no-build uses target/release.
# causeway is skipped, with a note, when its binary is missing or its
# `proxy` subcommand does not start. Measurements run under a global time
# bound (full ~9.5 min, --quick 2 min, times the rounds;
# COMPARE_PROXY_LIMIT=<seconds> overrides).
#
# --rounds N measures every target N times, alternating the order from
# round to round; the report gives the median of each figure and, for the
# ratios the targets are judged by, the median and range over the rounds.
set -euo pipefail

NAME=compare-proxy
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# ---------------------------------------------------------------- arguments
TARGETS="direct,haproxy,nginx,causeway"
ORIG_ARGS=("$@")
parse_args targets "direct haproxy nginx causeway" 35 "$@"

[[ $(id -u) -eq 0 ]] || die "must run as root (missing packages are apt-get installed, and the open-files limit is raised); try: sudo $0 ${ORIG_ARGS[*]}"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

need timeout coreutils
need python3
need ss iproute2
# Optional: system calls per connection are counted when strace is here.
STRACE=$(command -v strace || true)

NGINX_STREAM_SO=/usr/lib/nginx/modules/ngx_stream_module.so

# ------------------------------------------------------- install & build
# Both run once, before the timed part (the re-exec below sets CWP_TIMED=1
# so the child skips them).
install_missing() {
    local pkgs=()
    command -v haproxy >/dev/null || pkgs+=(haproxy)
    command -v nginx >/dev/null || pkgs+=(nginx)
    [[ -f $NGINX_STREAM_SO ]] || pkgs+=(libnginx-mod-stream)
    command -v iperf3 >/dev/null || pkgs+=(iperf3)
    command -v wrk >/dev/null || pkgs+=(wrk)
    apt_install "haproxy.service nginx.service iperf3.service" "${pkgs[@]}"
}

if [[ -z ${CWP_TIMED:-} ]]; then
    install_missing
    build_bench_and_causeway "$TARGETS"
    "$BENCH_BIN" proxy --help >/dev/null 2>&1 || die "$BENCH_BIN has no 'proxy' subcommand (rebuild it)"
    run_timed CWP COMPARE_PROXY_LIMIT
fi

need haproxy "apt-get install haproxy"
need nginx "apt-get install nginx libnginx-mod-stream"
need iperf3 "apt-get install iperf3"
need wrk "apt-get install wrk"
[[ -f $NGINX_STREAM_SO ]] || die "$NGINX_STREAM_SO missing (apt-get install libnginx-mod-stream)"

# ------------------------------------------------------------ lab & cleanup
UP_PORT=9000 PROXY_PORT=18443 ADMIN_PORT=19898
# The HTTP backend for wrk, and each proxy's listener in front of it.
HTTP_UP_PORT=9080 HTTP_PROXY_PORT=18444
make_lab
UP_PID="" SRV_PIDS="" BENCH_PID="" HTTP_PID=""


cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    # shellcheck disable=SC2046,SC2086
    stop_pids $BENCH_PID $SRV_PIDS $UP_PID $HTTP_PID $(jobs -p)
    if [[ -n ${KEEP_TMP:-} ]]; then
        echo "compare-proxy: kept $TMP" >&2
    else
        rm -rf "$TMP"
    fi
    exit "$rc"
}
trap_exits "$CWP_LIMIT"

listening() { [[ -n $(ss -Hltn "sport = :$1" 2>/dev/null) ]]; }
for p in $UP_PORT $PROXY_PORT $ADMIN_PORT $HTTP_UP_PORT $HTTP_PROXY_PORT; do
    if listening "$p"; then die "port $p is already in use: $(ss -Hltnp "sport = :$p" | head -1)"; fi
done

# Open files: every proxy holds two descriptors per idle proxied
# connection (client and upstream socket), in one process (HAProxy,
# causeway) or spread over workers (nginx); causeway's splice pipes (two
# more) exist only on a direction past its first 64 KB, which an idle
# connection never reaches. Raise the soft limit to the hard one (and the hard one when
# allowed), then size the idle test so every proxy gets the same number
# of connections and the hungriest still fits.
NOFILE=$(ulimit -Hn)
if [[ $NOFILE != unlimited ]] && ((NOFILE < 65536)); then
    ulimit -Hn 65536 2>/dev/null || true
    NOFILE=$(ulimit -Hn)
fi
[[ $NOFILE == unlimited ]] && NOFILE=65536
ulimit -n "$NOFILE"
FDS_PER_CONN=2
IDLE_N=10000
# causeway keeps a tenth of the limit (at least 256) back from its proxied
# connections; leave every proxy that much and a little more.
RESERVE=$((NOFILE / 10 > 400 ? NOFILE / 10 : 400))
if ((IDLE_N * FDS_PER_CONN + RESERVE + 200 > NOFILE)); then
    IDLE_N=$(((NOFILE - RESERVE - 200) / FDS_PER_CONN / 100 * 100))
    log "note: the open-files hard limit is $NOFILE here and cannot be raised; holding $IDLE_N idle connections instead of 10000 ($FDS_PER_CONN descriptors each)"
fi
((IDLE_N >= 100)) || die "open-files limit $NOFILE is too low for the idle test"

if ((QUICK)); then
    RUN_S=2 IPERF_S=2 HOLD_S=2 DIRECTIONS="up"
else
    RUN_S=8 IPERF_S=8 HOLD_S=5 DIRECTIONS="up down"
fi
CONC=64 PAYLOAD=64 LAT_RATE=1000 LAT_CONNS=4
CLK_TCK=$(getconf CLK_TCK)
NPROC=$(nproc)



ticks_to_s() { python3 -c "print(round($1 / $CLK_TCK, 2))"; }

# Open descriptors of processes, summed.
fd_count() {
    local p t=0 v
    for p in "$@"; do
        v=$(find "/proc/$p/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
        t=$((t + v))
    done
    echo "$t"
}

# VmRSS of processes, summed, in KiB.
rss_kib() {
    local p t=0 v
    for p in "$@"; do
        v=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null)
        t=$((t + ${v:-0}))
    done
    echo "$t"
}

# A process and its children (nginx's master and workers).
with_children() {
    local p=$1
    echo "$p"
    cat "/proc/$p/task/"*/children 2>/dev/null | tr ' ' '\n' | grep -v '^$' || true
}

# wait_port PORT SECONDS PID : until something listens on PORT; fail
# early if PID died.
wait_port() {
    local deadline=$((SECONDS + $2))
    while ((SECONDS < deadline)); do
        kill -0 "$3" 2>/dev/null || return 1
        listening "$1" && return 0
        sleep 0.05
    done
    return 1
}

# ------------------------------------------------------------- upstreams
# start_upstream echo|sink|source|iperf3 [ARGS...] : replaces whatever
# runs on UP_PORT.
start_upstream() {
    local mode=$1
    shift
    if [[ -n $UP_PID ]]; then stop_pids "$UP_PID"; UP_PID=""; fi
    if [[ $mode == iperf3 ]]; then
        iperf3 -s -B 127.0.0.1 -p "$UP_PORT" >>"$TMP/iperf3-server.log" 2>&1 &
    else
        "$BENCH_BIN" proxy upstream --listen "127.0.0.1:$UP_PORT" --mode "$mode" "$@" \
            >>"$TMP/upstream.out" 2>>"$TMP/upstream.log" &
    fi
    UP_PID=$!
    wait_port "$UP_PORT" 10 "$UP_PID" ||
        { tail -5 "$TMP/upstream.log" "$TMP/iperf3-server.log" >&2 2>/dev/null; die "the $mode upstream did not listen on 127.0.0.1:$UP_PORT within 10 s"; }
}

# probe PORT : true when one echo exchange through PORT succeeds (the echo
# upstream runs with --close-after PAYLOAD at that point).
probe() {
    local out
    out=$(timeout -k 2 5 "$BENCH_BIN" proxy conn --target "127.0.0.1:$1" --duration 200ms \
        --concurrency 1 --timeout 500ms --payload "$PAYLOAD" --expect-close --json 2>/dev/null) || return 1
    [[ $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ok"] > 0)' "$out" 2>/dev/null) == True ]]
}

# wait_ready PORT SECONDS PID... : probe until an exchange goes through;
# fail early if a proxy process died.
wait_ready() {
    local port=$1 deadline=$((SECONDS + $2)) p
    shift 2
    while ((SECONDS < deadline)); do
        for p in "$@"; do kill -0 "$p" 2>/dev/null || return 1; done
        probe "$port" && return 0
        sleep 0.2
    done
    return 1
}

# ---------------------------------------------------------------- proxies
# start_NAME DIR : write the config, start in the foreground as our child,
# set SRV_PIDS. Every proxy: 127.0.0.1:$PROXY_PORT -> 127.0.0.1:$UP_PORT.

start_haproxy() {
    local dir=$1
    # maxconn: HAProxy refuses connections past it; the idle test needs
    # IDLE_N at once. No log directive anywhere, so nothing is logged.
    cat >"$dir/haproxy.cfg" <<EOF
global
    nbthread $NPROC
    maxconn $((IDLE_N + 100))

defaults
    mode tcp
    maxconn $((IDLE_N + 100))
    timeout connect 5s
    timeout client 5m
    timeout server 5m

frontend fe
    bind 127.0.0.1:$PROXY_PORT
    default_backend be

backend be
    server up 127.0.0.1:$UP_PORT

# The wrk listener, with what HAProxy's manual gives for a TCP proxy
# whose clients speak first: accept once the request is there
# (TCP_DEFER_ACCEPT), and connect with quick ACKs off so the handshake's
# last ACK rides on the request.
frontend fe_http
    bind 127.0.0.1:$HTTP_PROXY_PORT
    option tcp-smart-accept
    default_backend be_http

backend be_http
    option tcp-smart-connect
    server http 127.0.0.1:$HTTP_UP_PORT
EOF
    haproxy -c -q -f "$dir/haproxy.cfg" >"$dir/check.out" 2>&1 || { cat "$dir/check.out" >&2; return 1; }
    # -db: foreground, no master-worker; one process, $NPROC threads.
    haproxy -db -f "$dir/haproxy.cfg" >"$dir/out" 2>&1 &
    SRV_PIDS=$!
}

start_nginx() {
    local dir=$1
    # worker_connections counts both sides of a proxied connection and is
    # per worker; sized so one worker could take every idle connection.
    cat >"$dir/nginx.conf" <<EOF
load_module $NGINX_STREAM_SO;
daemon off;
master_process on;
worker_processes $NPROC;
worker_rlimit_nofile $NOFILE;
pid $dir/nginx.pid;
error_log $dir/error.log crit;

events {
    worker_connections $((IDLE_N * 2 + 200));
}

stream {
    server {
        listen 127.0.0.1:$PROXY_PORT reuseport;
        proxy_pass 127.0.0.1:$UP_PORT;
        proxy_timeout 5m;
        # Off by default: a client's half-close would end the session
        # before the sink's count (or any reply) could come back. HAProxy
        # and causeway pass it on by default.
        proxy_half_close on;
    }
    server {
        listen 127.0.0.1:$HTTP_PROXY_PORT reuseport;
        proxy_pass 127.0.0.1:$HTTP_UP_PORT;
        proxy_timeout 5m;
    }
}
EOF
    nginx -t -q -e "$dir/error.log" -p "$dir" -c "$dir/nginx.conf" >"$dir/check.out" 2>&1 ||
        { cat "$dir/check.out" "$dir/error.log" >&2 2>/dev/null; return 1; }
    nginx -e "$dir/error.log" -p "$dir" -c "$dir/nginx.conf" >"$dir/out" 2>&1 &
    SRV_PIDS=$!
}

CAUSEWAY_NOTE=""
start_causeway() {
    local dir=$1
    cat >"$dir/causeway.yaml" <<EOF
admin: {listen: "127.0.0.1:$ADMIN_PORT"}
proxy:
  listenAddress: 127.0.0.1
  # Every test connection comes from 127.0.0.1; like HAProxy's maxconn,
  # the limits are set to fit the idle test.
  maxConnections: $((IDLE_N + 100))
  maxConnectionsPerSource: $((IDLE_N + 100))
  listeners:
    - {port: $PROXY_PORT, upstream: "127.0.0.1:$UP_PORT"}
    # HTTP: the client speaks first, as HAProxy's tcp-smart-* options
    # assume on its listener for wrk.
    - {port: $HTTP_PROXY_PORT, upstream: "127.0.0.1:$HTTP_UP_PORT", clientSpeaksFirst: true}
EOF
    if [[ ! -x $CAUSEWAY_BIN ]]; then
        CAUSEWAY_NOTE="binary $CAUSEWAY_BIN not found"
        return 2
    fi
    # Its access log line per connection is at info; HAProxy and nginx
    # log nothing here either.
    RUST_LOG=warn "$CAUSEWAY_BIN" proxy --config "$dir/causeway.yaml" >"$dir/out" 2>&1 &
    SRV_PIDS=$!
}

version_of() {
    case $1 in
        haproxy) haproxy -v 2>/dev/null | awk 'NR == 1 {print "HAProxy " $3}' ;;
        nginx) nginx -v 2>&1 | awk -F/ '{print "nginx " $2}' ;;
        causeway) echo "causeway $("$CAUSEWAY_BIN" --version 2>/dev/null | awk '{print $NF}') ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?'))" ;;
        direct) echo "-" ;;
    esac
}

# ----------------------------------------------------------- measurements
# bench NAME KEY TIMEOUT ARGS... : one causeway-bench client run to a JSON
# file, with the proxy's CPU around it.
bench() {
    local name=$1 key=$2 limit=$3 out t0 t1
    shift 3
    out=$TMP/$name/$key.json
    # shellcheck disable=SC2086
    t0=$(cpu_ticks $SRV_PIDS)
    timeout -k 5 "$limit" "$BENCH_BIN" proxy "$@" --json >"$out" 2>>"$TMP/$name/bench.log" || true
    # shellcheck disable=SC2086
    t1=$(cpu_ticks $SRV_PIDS)
    [[ -s $out ]] || { tail -5 "$TMP/$name/bench.log" >&2; die "causeway-bench proxy $1 produced no result against $name"; }
    res "$name" "${key}_cpu" "$(ticks_to_s $((t1 - t0)))"
}

# The upstream closes each connection right after its echo and the client
# waits for that: with the client closing first, every leg's TIME_WAIT
# would land on its connecting side, and on loopback, connecting from one
# address to one port, the proxy's upstream connects then run out of
# ephemeral ports near 15 000 conn/s (nginx logged EADDRNOTAVAIL) and all
# proxies measure the kernel's port search instead of themselves.
measure_conn() {
    local name=$1 port=$2 f
    bench "$name" conn $((RUN_S + 15)) conn --target "127.0.0.1:$port" --duration "${RUN_S}s" \
        --concurrency "$CONC" --payload "$PAYLOAD" --expect-close
    read -r -a f <<<"$(jget "$TMP/$name/conn.json" conn_per_s ok failed latency_ms.p50 latency_ms.p99 bench_cpu_pct)"
    res "$name" conn_rate "${f[0]}"
    res "$name" conn_ok "${f[1]}"
    res "$name" conn_failed "${f[2]}"
    res "$name" conn_p50 "${f[3]}"
    res "$name" conn_p99 "${f[4]}"
    res "$name" conn_benchcpu "${f[5]}"
    log "  conn: $(printf '%.0f' "${f[0]}") conn/s, failed ${f[2]}, exchange p99 ${f[4]} ms, bench CPU ${f[5]}%"
}

# System calls per short connection: the same connection load for 3 s with
# every proxy process under `strace -c -f`, each call's count over the
# connections completed in that run. strace slows the proxy down; the
# counts per connection are what it makes, the rate of that run is not a
# figure. Keys: sys_total and sys_<call> per connection.
measure_syscalls() {
    local name=$1 port=$2 p tracers=() out
    [[ -n $STRACE && $name != direct ]] || return 0
    out=$TMP/$name/strace
    # This round's tracers only: an earlier round's files name other pids.
    rm -rf "$out"
    mkdir -p "$out"
    for p in $SRV_PIDS; do
        "$STRACE" -c -f -q -o "$out/$p.txt" -p "$p" &
        tracers+=($!)
    done
    # strace attaches within a moment; the run starts once it has.
    sleep 1
    timeout -k 5 20 "$BENCH_BIN" proxy conn --target "127.0.0.1:$port" --duration 3s \
        --concurrency "$CONC" --payload "$PAYLOAD" --expect-close --json >"$out/conn.json" 2>>"$TMP/$name/bench.log" || true
    kill -INT "${tracers[@]}" 2>/dev/null || true
    wait "${tracers[@]}" 2>/dev/null || true
    python3 - "$out" "$name" >>"$RESULTS" <<'PY'
import glob, json, os, sys
out, name = sys.argv[1], sys.argv[2]
try:
    ok = json.load(open(os.path.join(out, "conn.json")))["ok"]
except Exception:
    sys.exit(0)
calls = {}
for path in glob.glob(os.path.join(out, "*.txt")):
    for line in open(path):
        f = line.split()
        # "% time seconds usecs/call calls [errors] syscall"
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            calls[f[-1]] = calls.get(f[-1], 0) + int(f[3])
if not ok or not calls:
    sys.exit(0)
print(f"{name}\tsys_total\t{sum(calls.values()) / ok}")
for call, n in calls.items():
    print(f"{name}\tsys_{call}\t{n / ok}")
PY
    log "  system calls per short connection: $(res_last "$name" sys_total %.1f)"
}

# The HTTP backend: nginx serving a 1 KB file on HTTP_UP_PORT for the
# whole run, one worker, no access log; it closes after each response when
# the request says `Connection: close`, so the TIME_WAIT sockets of that
# run sit on the backend's side, as with the echo upstream.
start_http_backend() {
    local dir=$TMP/http-backend
    mkdir -p "$dir/root"
    head -c 1024 /dev/zero | tr '\0' 'x' >"$dir/root/1k"
    cat >"$dir/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log crit;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 10000000;
    server {
        listen 127.0.0.1:$HTTP_UP_PORT reuseport backlog=4096;
        root $dir/root;
    }
}
EOF
    nginx -e "$dir/error.log" -p "$dir" -c "$dir/nginx.conf" >"$dir/out" 2>&1 &
    HTTP_PID=$!
    wait_port "$HTTP_UP_PORT" 10 "$HTTP_PID" ||
        { cat "$dir/out" "$dir/error.log" >&2 2>/dev/null; die "the nginx HTTP backend did not listen on 127.0.0.1:$HTTP_UP_PORT"; }
    HTTP_PID=$(with_children "$HTTP_PID" | tr '\n' ' ')
}

# wrk through PORT for RUN_S seconds, 2 threads and CONC connections, with
# the proxy's CPU around it. MODE close adds `Connection: close`; keep
# leaves the connections open. Keys: http_MODE_{rate,p99,percpu,errors}.
measure_http() {
    local name=$1 port=$2 mode=$3 out t0 t1 hdr=()
    out=$TMP/$name/wrk_$mode.txt
    [[ $mode == close ]] && hdr=(-H "Connection: close")
    # shellcheck disable=SC2086
    t0=$(cpu_ticks $SRV_PIDS)
    timeout -k 5 $((RUN_S + 20)) wrk -t 2 -c "$CONC" -d "${RUN_S}s" --latency "${hdr[@]}" \
        "http://127.0.0.1:$port/1k" >"$out" 2>&1 || true
    # shellcheck disable=SC2086
    t1=$(cpu_ticks $SRV_PIDS)
    python3 - "$out" "$name" "$mode" "$((t1 - t0))" "$CLK_TCK" >>"$RESULTS" <<'PY'
import re, sys
path, name, mode, ticks, hz = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
text = open(path).read()
rate = re.search(r"Requests/sec:\s+([0-9.]+)", text)
done = re.search(r"(\d+) requests in", text)
p99 = re.search(r"^\s+99%\s+([0-9.]+)(us|ms|s)\s*$", text, re.M)
errors = sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", text))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
errors += int(non2xx.group(1)) if non2xx else 0
if rate and done:
    print(f"{name}\thttp_{mode}_rate\t{rate.group(1)}")
    print(f"{name}\thttp_{mode}_errors\t{errors}")
    if p99:
        v, unit = p99.groups()
        print(f"{name}\thttp_{mode}_p99\t{float(v) * {'us': 0.001, 'ms': 1.0, 's': 1000.0}[unit]}")
    if name != "direct" and ticks > 0:
        print(f"{name}\thttp_{mode}_percpu\t{int(done.group(1)) / (ticks / hz)}")
PY
    local key=http_${mode}
    log "  wrk $mode: $(res_last "$name" "${key}_rate" %.0f) req/s, per proxy CPU-s $(res_last "$name" "${key}_percpu" %.0f), p99 $(res_last "$name" "${key}_p99") ms, errors $(res_last "$name" "${key}_errors")"
}

measure_latency() {
    local name=$1 port=$2 f
    bench "$name" lat $((RUN_S + 15)) latency --target "127.0.0.1:$port" --duration "${RUN_S}s" \
        --rate "$LAT_RATE" --connections "$LAT_CONNS" --payload "$PAYLOAD"
    read -r -a f <<<"$(jget "$TMP/$name/lat.json" req_per_s ok failed latency_ms.p50 latency_ms.p99 latency_ms.p999)"
    res "$name" lat_rate "${f[0]}"
    res "$name" lat_failed "${f[2]}"
    res "$name" lat_p50 "${f[3]}"
    res "$name" lat_p99 "${f[4]}"
    res "$name" lat_p999 "${f[5]}"
    log "  latency at $LAT_RATE/s: p50 ${f[3]} ms, p99 ${f[4]} ms, p99.9 ${f[5]} ms, failed ${f[2]}"
}

# RSS of the proxy before and while the idle client holds IDLE_N
# connections through it (each has carried one echoed byte).
measure_idle() {
    local name=$1 port=$2 dir=$TMP/$1 pids before held fds0 fds1 deadline f
    # shellcheck disable=SC2086
    pids=$(for p in $SRV_PIDS; do with_children "$p"; done | sort -u | tr '\n' ' ')
    # shellcheck disable=SC2086
    before=$(rss_kib $pids)
    # shellcheck disable=SC2086
    fds0=$(fd_count $pids)
    "$BENCH_BIN" proxy idle --target "127.0.0.1:$port" --connections "$IDLE_N" --hold "${HOLD_S}s" \
        --open-within 20s --json >"$dir/idle.json" 2>"$dir/idle.log" &
    BENCH_PID=$!
    deadline=$((SECONDS + 45))
    while ! grep -q '^holding ' "$dir/idle.log" 2>/dev/null; do
        kill -0 "$BENCH_PID" 2>/dev/null || break
        ((SECONDS < deadline)) || break
        sleep 0.1
    done
    # Let the proxy finish its bookkeeping for the last connections.
    sleep 0.5
    # shellcheck disable=SC2086
    held=$(rss_kib $pids)
    # shellcheck disable=SC2086
    fds1=$(fd_count $pids)
    timeout -k 2 $((HOLD_S + 20)) tail --pid="$BENCH_PID" -f /dev/null || true
    wait "$BENCH_PID" 2>/dev/null || true
    BENCH_PID=""
    read -r -a f <<<"$(jget "$dir/idle.json" opened held_open failed)"
    [[ ${f[0]} != - ]] || { tail -5 "$dir/idle.log" >&2; die "causeway-bench proxy idle produced no result against $name"; }
    res "$name" idle_opened "${f[0]}"
    res "$name" idle_held "${f[1]}"
    res "$name" idle_failed "${f[2]}"
    res "$name" rss_before "$before"
    res "$name" rss_held "$held"
    res "$name" fds_before "$fds0"
    res "$name" fds_held "$fds1"
    log "  idle: ${f[0]} of $IDLE_N open (${f[1]} still open after ${HOLD_S} s), RSS $((before / 1024)) -> $((held / 1024)) MiB, descriptors $fds0 -> $fds1"
}

measure_tput() {
    local name=$1 port=$2 dir=$3 streams=$4 key f
    key=tput_${dir}_$streams
    bench "$name" "$key" $((RUN_S + 25)) throughput --target "127.0.0.1:$port" --duration "${RUN_S}s" \
        --streams "$streams" --direction "$dir"
    read -r -a f <<<"$(jget "$TMP/$name/$key.json" gbit_s unconfirmed failed_streams bench_cpu_pct)"
    res "$name" "$key" "${f[0]}"
    res "$name" "${key}_bad" "$((${f[1]/-/0} + ${f[2]/-/0}))"
    log "  throughput $dir x$streams: ${f[0]} Gbit/s (unconfirmed ${f[1]}, failed ${f[2]}, bench CPU ${f[3]}%)"
}

measure_iperf() {
    local name=$1 port=$2 streams=$3 out=$TMP/$1/iperf_$3.json gbps
    for _ in 1 2; do
        timeout -k 2 $((IPERF_S + 15)) iperf3 -c 127.0.0.1 -p "$port" -t "$IPERF_S" -P "$streams" -J \
            >"$out" 2>>"$TMP/$name/iperf.log" && break
        # The server may still be tearing the last test down ("busy").
        sleep 1
    done
    gbps=$(python3 -c '
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(round(d["end"]["sum_received"]["bits_per_second"] / 1e9, 3))
except Exception:
    print("-")' "$out")
    res "$name" "iperf_$streams" "$gbps"
    log "  iperf3 -P $streams: $gbps Gbit/s (received)"
}

measure() {
    local name=$1 dir=$TMP/$1 port rc=0 d
    mkdir -p "$dir"
    start_upstream echo --close-after "$PAYLOAD"
    SRV_PIDS=""
    port=$PROXY_PORT
    if [[ $name == direct ]]; then
        port=$UP_PORT
    else
        "start_$name" "$dir" || rc=$?
        if ((rc == 2)); then
            echo "causeway: proxy not available in this build, skipped ($CAUSEWAY_NOTE)" >&2
            res "$name" skipped "$CAUSEWAY_NOTE"
            return 0
        fi
        ((rc == 0)) || die "$name: config rejected (see above)"
        # shellcheck disable=SC2086
        if ! wait_ready "$port" 15 $SRV_PIDS; then
            tail -5 "$dir"/out "$dir"/error.log >&2 2>/dev/null || true
            # shellcheck disable=SC2086
            stop_pids $SRV_PIDS
            SRV_PIDS=""
            if [[ $name == causeway ]]; then
                if grep -q "unrecognized subcommand" "$dir/out" 2>/dev/null; then
                    CAUSEWAY_NOTE="this causeway binary has no \`proxy\` subcommand"
                else
                    CAUSEWAY_NOTE="\`causeway proxy\` did not relay on 127.0.0.1:$PROXY_PORT within 15 s: $(head -c 200 "$dir/out" 2>/dev/null | tr '\n' ' ')"
                fi
                echo "causeway: proxy not available in this build, skipped" >&2
                res "$name" skipped "$CAUSEWAY_NOTE"
                return 0
            fi
            die "$name did not relay on 127.0.0.1:$port within 15 s"
        fi
        # nginx's workers too, for CPU, RSS and cleanup.
        # shellcheck disable=SC2086
        SRV_PIDS=$(for p in $SRV_PIDS; do with_children "$p"; done | sort -u | tr '\n' ' ')
    fi
    res "$name" version "$(version_of "$name")"
    log "$name: 127.0.0.1:$port${SRV_PIDS:+ (pids ${SRV_PIDS% })} — $(version_of "$name")"

    measure_conn "$name" "$port"
    measure_syscalls "$name" "$port"
    local http_port=$HTTP_PROXY_PORT
    [[ $name == direct ]] && http_port=$HTTP_UP_PORT
    measure_http "$name" "$http_port" close
    measure_http "$name" "$http_port" keep
    # Persistent connections from here on.
    start_upstream echo
    measure_latency "$name" "$port"
    [[ $name == direct ]] || measure_idle "$name" "$port"
    for d in $DIRECTIONS; do
        if [[ $d == up ]]; then start_upstream sink; else start_upstream source; fi
        measure_tput "$name" "$port" "$d" 1
        measure_tput "$name" "$port" "$d" 4
    done
    start_upstream iperf3
    measure_iperf "$name" "$port" 1
    measure_iperf "$name" "$port" 4
    # shellcheck disable=SC2086
    stop_pids $SRV_PIDS
    SRV_PIDS=""
}

# CPU time the hypervisor gave to others ("steal") while we measured: on a
# shared VM it is the first suspect when figures move between runs.
cpu_steal() { awk '/^cpu / {t = 0; for (i = 2; i <= 9; i++) t += $i; print $9, t}' /proc/stat; }
read -r STEAL0 TOTAL0 <<<"$(cpu_steal)"
log "temp $TMP; idle test: $IDLE_N connections (open-files limit $NOFILE); runs of ${RUN_S} s"
start_http_backend
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    ((ROUNDS == 1)) || log "round $ROUND of $ROUNDS"
    for t in $(round_order "$ROUND" "$TARGETS"); do measure "$t"; done
done
read -r STEAL1 TOTAL1 <<<"$(cpu_steal)"
CWP_STEAL=$(python3 -c "print(round(100 * ($STEAL1 - $STEAL0) / max(1, $TOTAL1 - $TOTAL0), 1))")
log "CPU steal during the measurements: $CWP_STEAL%"
stop_pids $UP_PID
UP_PID=""

# ------------------------------------------------------------------ report
export CWP_DATE CWP_NPROC CWP_KERNEL CWP_CPU CWP_QUICK=$QUICK CWP_IPERF CWP_STEAL
CWP_DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
CWP_NPROC=$NPROC
CWP_KERNEL=$(uname -r)
CWP_CPU=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
CWP_IPERF=$(iperf3 --version 2>/dev/null | awk 'NR == 1 {print $2}')
export RUN_S IPERF_S HOLD_S CONC PAYLOAD LAT_RATE LAT_CONNS IDLE_N NOFILE FDS_PER_CONN TARGETS DIRECTIONS UP_PORT PROXY_PORT ROUNDS

REPORT=$TMP/report.md
python3 - "$RESULTS" >"$REPORT" <<'PY'
import os, sys
E = os.environ
sys.path.insert(0, E["BENCH_DIR"])
from rounds import fmt_int, load, num, round_ratios, spread
r, by_round = load(sys.argv[1])
rounds = int(E["ROUNDS"])
targets = E["TARGETS"].split(",")
ran = [t for t in targets if "skipped" not in r[t]]
down = "down" in E["DIRECTIONS"].split()
proxies = [t for t in ran if t != "direct"]

def fmt(x, nd=2):
    v = num(x)
    return "-" if v is None else f"{v:.{nd}f}"
def ratio(t, ref, key):
    if ref not in ran: return "-"
    a, b = num(r[t].get(key)), num(r[ref].get(key))
    return "-" if a is None or not b else f"{a / b:.2f}×"
def pair(*xs): return " / ".join(xs)

names = {"direct": "direct (no proxy)", "haproxy": "HAProxy", "nginx": "nginx stream", "causeway": "causeway"}
print("### TCP proxy: causeway vs HAProxy vs nginx (stream)\n")
print(f"- Run: {E['CWP_DATE']}, `nproc` = {E['CWP_NPROC']} ({E['CWP_CPU']}), kernel {E['CWP_KERNEL']}, CPU steal {E['CWP_STEAL']}% over the measurements"
      + (" — **quick mode** (short runs; not for publication)" if E["CWP_QUICK"] == "1" else ""))
print(f"- Command: `{E['CWP_CMD']}`")
print("- Versions: " + ", ".join([r[t]["version"] for t in proxies if "version" in r[t]] + [f"iperf3 {E['CWP_IPERF']}"]))
print(f"- Lab: loopback only, one path at a time, sharing the {E['CWP_NPROC']} cores with the load generator and the upstream (nothing pinned). "
      f"Each proxy listens on 127.0.0.1:{E['PROXY_PORT']} and forwards to 127.0.0.1:{E['UP_PORT']}; *direct* is the same load straight to :{E['UP_PORT']}. "
      f"The upstream is `causeway-bench proxy upstream` (echo for connections, latency and idle; sink and source for throughput), or `iperf3 -s` for the iperf3 runs.")
print(f"- Config: HAProxy 2 threads (`nbthread {E['CWP_NPROC']}`), `mode tcp`, no `log`, `maxconn {int(E['IDLE_N']) + 100}`, run with `-db`; "
      f"nginx `worker_processes {E['CWP_NPROC']}`, `stream` module, `listen ... reuseport`, `worker_connections {int(E['IDLE_N']) * 2 + 200}`, "
      "`error_log ... crit` (stream has no access log unless configured), `proxy_half_close on` (HAProxy and causeway pass a half-close on by default); "
      "causeway `causeway proxy` with `RUST_LOG=warn` (its access line per connection is at info). "
      "Each proxy's own defaults otherwise: HAProxy and nginx copy through user space, causeway relays with splice(2). No kernel tuning.")
print(f"- Throughput: {E['RUN_S']} s per run, `causeway-bench proxy throughput --streams 1|4 --direction up` (128 KiB writes; sender-side rate, every byte confirmed by the sink's count)"
      + (" and `--direction down` (receiver-side)" if down else "")
      + f"; `iperf3 -c 127.0.0.1 -p <port> -t {E['IPERF_S']} -P 1|4` (receiver-side sum). Ratios: higher is better.")
print(f"- Connections: `causeway-bench proxy conn --concurrency {E['CONC']} --payload {E['PAYLOAD']} --expect-close` for {E['RUN_S']} s "
      f"against `proxy upstream --mode echo --close-after {E['PAYLOAD']}` (connect, {E['PAYLOAD']} bytes echoed, the upstream closes, then the client; see below). "
      f"Latency: `causeway-bench proxy latency --rate {E['LAT_RATE']} --connections {E['LAT_CONNS']} --payload {E['PAYLOAD']}` for {E['RUN_S']} s; "
      "added p99 = the path's p99 minus direct's.")
print(f"- Memory: VmRSS of the proxy's processes (nginx: master + workers) just before and while `causeway-bench proxy idle --connections {E['IDLE_N']}` "
      "holds its connections (each has carried one echoed byte, so both sides are open); per connection = the difference / connections open. "
      "Kernel memory (socket buffers, pipes) is not in VmRSS; descriptors per connection show who holds more kernel objects."
      + (f" {E['IDLE_N']} rather than 10000 connections for every proxy: the open-files hard limit here is {E['NOFILE']} and cannot be raised, and "
         + ("causeway may hold six descriptors per connection (two sockets, and two pipes for its splice relay)." if E["FDS_PER_CONN"] == "6"
            else "a proxy holds two descriptors per connection.")
         if int(E["IDLE_N"]) < 10000 else ""))
for t in targets:
    if "skipped" in r[t]:
        print(f"- **{t}: proxy not available in this build, skipped** ({r[t]['skipped']}).")
print()

if rounds > 1:
    print(f"- Rounds: {rounds}, each measuring every path, in reverse order every other round. Every figure below is the median over the rounds "
          "(per-connection memory from the medians of its parts); the ratios causeway is judged by are also given round by round, "
          "as median (lowest–highest):\n")
    judged = [("1 stream vs HAProxy (bench / iperf3)", "haproxy", ("tput_up_1", "iperf_1")),
              ("4 streams vs HAProxy", "haproxy", ("tput_up_4", "iperf_4")),
              ("1 stream vs direct", "direct", ("tput_up_1", "iperf_1")),
              ("4 streams vs direct", "direct", ("tput_up_4", "iperf_4")),
              ("conn/s vs HAProxy", "haproxy", ("conn_rate",)),
              ("wrk close req/s vs HAProxy", "haproxy", ("http_close_rate",)),
              ("wrk close per proxy CPU-s vs HAProxy", "haproxy", ("http_close_percpu",)),
              ("wrk keep-alive req/s vs HAProxy", "haproxy", ("http_keep_rate",))]
    print("| causeway | " + " | ".join(j[0] for j in judged) + " |")
    print("|---|" + "---:|" * len(judged))
    print("| over the rounds | " + " | ".join(" / ".join(spread(round_ratios(by_round, "causeway", ref, k)) for k in keys)
                                           for _, ref, keys in judged) + " |")
    print()
print("| path | bench 1 stream Gbit/s | bench 4 streams | iperf3 -P 1 | iperf3 -P 4 |"
      + (" bench down 1 / 4 |" if down else "")
      + " 1 stream vs HAProxy (bench / iperf3) | 4 streams vs HAProxy | 1 stream vs direct | 4 streams vs direct |")
print("|---|---:|---:|---:|---:|" + ("---:|" if down else "") + "---:|---:|---:|---:|")
notes = []
for t in ran:
    d = r[t]
    cells = [names[t], fmt(d.get("tput_up_1")), fmt(d.get("tput_up_4")), fmt(d.get("iperf_1")), fmt(d.get("iperf_4"))]
    if down:
        cells.append(pair(fmt(d.get("tput_down_1")), fmt(d.get("tput_down_4"))))
    cells += [pair(ratio(t, "haproxy", "tput_up_1"), ratio(t, "haproxy", "iperf_1")),
              pair(ratio(t, "haproxy", "tput_up_4"), ratio(t, "haproxy", "iperf_4")),
              pair(ratio(t, "direct", "tput_up_1"), ratio(t, "direct", "iperf_1")),
              pair(ratio(t, "direct", "tput_up_4"), ratio(t, "direct", "iperf_4"))]
    print("| " + " | ".join(cells) + " |")
    for k, v in d.items():
        if k.startswith("tput_") and k.endswith("_bad") and num(v):
            notes.append(f"{names[t]} {k[5:-4].replace('_', ' x')}: {fmt_int(v)} stream(s) failed or were not fully confirmed by the sink")
print()

def per_conn(t):
    b, h, n = num(r[t].get("rss_before")), num(r[t].get("rss_held")), num(r[t].get("idle_opened"))
    return (h - b) / n if None not in (b, h, n) and n else None
def fds_per_conn(t):
    b, h, n = num(r[t].get("fds_before")), num(r[t].get("fds_held")), num(r[t].get("idle_opened"))
    return (h - b) / n if None not in (b, h, n) and n else None
def added(t, key):
    a, b = num(r[t].get(key)), num(r.get("direct", {}).get(key))
    if a is None or b is None or "direct" not in ran: return "-"
    return f"{a - b:+.3f}"
def conn_per_cpu(t):
    ok, cpu = num(r[t].get("conn_ok")), num(r[t].get("conn_cpu"))
    return ok / cpu if ok is not None and cpu else None

print(f"| path | conn/s ({E['CONC']} in flight) | vs HAProxy | failed | conn per proxy CPU-s | latency p50 / p99 / p99.9 ms at {E['LAT_RATE']}/s | added p99 vs direct ms | idle connections open / after hold | proxy RSS before → holding MiB | RSS per idle connection KiB | descriptors per connection |")
print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
for t in ran:
    d = r[t]
    pc = per_conn(t)
    cells = [names[t], fmt_int(d.get("conn_rate")), ratio(t, "haproxy", "conn_rate"), fmt_int(d.get("conn_failed")),
             fmt_int(conn_per_cpu(t)) if t != "direct" else "-",
             pair(fmt(d.get("lat_p50"), 3), fmt(d.get("lat_p99"), 3), fmt(d.get("lat_p999"), 3)),
             added(t, "lat_p99") if t != "direct" else "-",
             (f"{fmt_int(d.get('idle_opened'))} / {fmt_int(d.get('idle_held'))}" if "idle_opened" in d else "-"),
             (f"{num(d['rss_before']) / 1024:.1f} → {num(d['rss_held']) / 1024:.1f}" if "rss_held" in d else "-"),
             ("-" if pc is None else f"{pc:.1f}"),
             ("-" if fds_per_conn(t) is None else f"{fds_per_conn(t):.1f}")]
    print("| " + " | ".join(cells) + " |")
    if num(d.get("lat_failed")):
        notes.append(f"{names[t]} latency run: {fmt_int(d['lat_failed'])} round trips failed")
    if num(d.get("idle_failed")):
        notes.append(f"{names[t]} idle run: {fmt_int(d['idle_failed'])} connections failed to open")
print()
if any("http_close_rate" in r[t] for t in ran):
    print(f"HTTP through each proxy's second listener (127.0.0.1:18444, to an nginx HTTP backend serving 1 KB): "
          f"`wrk -t 2 -c {E['CONC']} -d {E['RUN_S']}s --latency [-H 'Connection: close'] http://127.0.0.1:18444/1k`; "
          "HAProxy's listener has `option tcp-smart-accept` and its backend `option tcp-smart-connect` (its manual's tuning for clients that speak first), causeway's `clientSpeaksFirst: true`; "
          "per proxy CPU-s = requests completed / the proxy's utime+stime over the run; errors = wrk's socket errors and non-2xx answers:\n")
    print("| path | close req/s | vs HAProxy | per proxy CPU-s | vs HAProxy | p99 ms | keep-alive req/s | vs HAProxy | per proxy CPU-s | vs HAProxy | p99 ms | errors close / keep-alive |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in ran:
        d = r[t]
        cells = [names[t]]
        for mode in ("close", "keep"):
            cells += [fmt_int(d.get(f"http_{mode}_rate")), ratio(t, "haproxy", f"http_{mode}_rate"),
                      fmt_int(d.get(f"http_{mode}_percpu")) if t != "direct" else "-",
                      ratio(t, "haproxy", f"http_{mode}_percpu") if t != "direct" else "-",
                      fmt(d.get(f"http_{mode}_p99"), 3)]
        cells.append(pair(fmt_int(d.get("http_close_errors")), fmt_int(d.get("http_keep_errors"))))
        print("| " + " | ".join(cells) + " |")
    print()
traced = [t for t in proxies if num(r[t].get("sys_total"))]
if traced:
    print("System calls per short connection (`strace -c -f` on every proxy process over a separate 3 s run of the same connection load; "
          "each call's count over the connections that run completed, most frequent first; calls made less than once in 20 connections are summed as *others*):\n")
    print("| proxy | per connection | by call |")
    print("|---|---:|---|")
    for t in traced:
        d = r[t]
        calls = sorted(((k[4:], num(v)) for k, v in d.items() if k.startswith("sys_") and k != "sys_total" and num(v)),
                       key=lambda kv: -kv[1])
        top = ", ".join(f"{k} {v:.2f}" for k, v in calls if v >= 0.05)
        rest = sum(v for _, v in calls if v < 0.05)
        print(f"| {names[t]} | {num(d['sys_total']):.1f} | {top}{f', others {rest:.2f}' if rest else ''} |")
    print()
print("Why the upstream closes first: TIME_WAIT stays with whichever side closes first. Were it the client, each proxy's connects to the upstream "
      "(all from 127.0.0.1 to one port) would leave TIME_WAIT sockets on the proxy's side, and on loopback every new connect then searches the ephemeral "
      "ports past them: in trial runs every proxy hit the same ceiling and nginx logged `connect() failed (99: Cannot assign requested "
      "address)`, the kernel's limit rather than the proxies'. With the upstream closing first the TIME_WAIT sockets sit on the listening sides, "
      "where they cost no ports. conn per proxy CPU-s = exchanges / the proxy's utime+stime over the run.")
if notes:
    print()
    for n in notes:
        print(f"- Note: {n}.")
PY

show_report "$REPORT" compare-proxy
