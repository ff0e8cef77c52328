# shellcheck shell=bash
# What the compare scripts share; sourced, never run. The sourcing script
# sets NAME (its own name, for messages) first.

die() { printf '%s: error: %s\n' "$NAME" "$*" >&2; exit 1; }
log() { printf '[%5ss] %s\n' "$SECONDS" "$*" >&2; }
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found${2:+ ($2)}"; }

# Where the bench scripts and their report helper (rounds.py) live.
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export BENCH_DIR

# parse_args LIST_OPTION CHOICES HELP_LINES ARGS... : the options every
# compare script takes (--quick, --rounds N, --write FILE, --no-build, -h) and one
# comma-separated list option (--servers or --targets), whose value goes
# into the upper-case variable of that name (its default set beforehand)
# and must name only CHOICES (space-separated). Sets QUICK, WRITE (made
# absolute), ROUNDS (1 unless given) and NO_BUILD.
# shellcheck disable=SC2034 # the sourcing script reads QUICK and NO_BUILD
parse_args() {
    local opt=$1 choices=$2 help=$3 var
    var=${opt^^}
    shift 3
    QUICK=0 WRITE="" NO_BUILD=0 ROUNDS=1
    while (($#)); do
        case $1 in
            --quick) QUICK=1 ;;
            --write) [[ $# -ge 2 ]] || die "--write needs a file"; WRITE=$2; shift ;;
            --write=*) WRITE=${1#--write=} ;;
            "--$opt") [[ $# -ge 2 ]] || die "--$opt needs a list"; printf -v "$var" '%s' "$2"; shift ;;
            "--$opt="*) printf -v "$var" '%s' "${1#--"$opt"=}" ;;
            --no-build) NO_BUILD=1 ;;
            --rounds) [[ $# -ge 2 ]] || die "--rounds needs a number"; ROUNDS=$2; shift ;;
            --rounds=*) ROUNDS=${1#--rounds=} ;;
            -h | --help) sed -n "2,${help}p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
            *) die "unknown argument: $1 (see --help)" ;;
        esac
        shift
    done
    [[ $ROUNDS =~ ^[1-9]$ ]] || die "--rounds takes 1 to 9, not '$ROUNDS'"
    local item
    for item in ${!var//,/ }; do
        [[ " $choices " == *" $item "* ]] || die "unknown ${opt%s} '$item' (${choices// /, })"
    done
    if [[ -n $WRITE && $WRITE != /* ]]; then WRITE="$PWD/$WRITE"; fi
}

# apt_install SERVICES PACKAGE... : installs the packages (when any is
# given) without letting their services start, now or at boot. SERVICES
# is a space-separated list of systemd units to keep disabled.
apt_install() {
    local services=$1 p
    shift
    (($#)) || return 0
    need apt-get "install $* by hand"
    log "installing $* (their services kept from starting)"
    # policy-rc.d exit 101 = "action forbidden": invoke-rc.d and
    # deb-systemd-invoke then start nothing during the install.
    local prc=/usr/sbin/policy-rc.d backup=""
    if [[ -e $prc ]]; then backup=$(mktemp); cp -p "$prc" "$backup"; fi
    printf '#!/bin/sh\nexit 101\n' >"$prc"
    chmod 755 "$prc"
    local resolv_before
    resolv_before=$(cat /etc/resolv.conf 2>/dev/null || true)
    local rc=0
    {
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends "$@"
    } >&2 || rc=$?
    if [[ -n $backup ]]; then mv "$backup" "$prc"; else rm -f "$prc"; fi
    ((rc == 0)) || die "apt-get install $* failed"
    if command -v systemctl >/dev/null; then
        for p in $services; do
            systemctl disable --now "$p" >/dev/null 2>&1 || true
        done
    fi
    [[ $(cat /etc/resolv.conf 2>/dev/null || true) == "$resolv_before" ]] ||
        log "warning: /etc/resolv.conf changed during the install; check it"
}

# stop_pids PID... : TERM, up to 3 s grace, then KILL; only our own children.
stop_pids() {
    local p deadline=$((SECONDS + 3)) alive
    for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
    while ((SECONDS < deadline)); do
        alive=0
        for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for p in "$@"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "$@"; do wait "$p" 2>/dev/null || true; done
}

# res NAME KEY VALUE : one result row, into $RESULTS.
# Every round appends its own line; the report takes the median per key.
res() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$RESULTS"; }

# res_last NAME KEY [FORMAT] : the last value recorded for NAME and KEY, as
# printf FORMAT gives it (default %s), or nothing.
res_last() {
    awk -F'\t' -v n="$1" -v k="$2" -v f="${3:-%s}" '$1 == n && $2 == k {v = $3; seen = 1} END {if (seen) printf f, v}' "$RESULTS"
}

# round_order ROUND LIST : the comma-separated LIST in order on odd rounds
# and reversed on even ones, so no target always runs first or last.
round_order() {
    local items i
    IFS=, read -r -a items <<<"$2"
    if (($1 % 2)); then
        echo "${items[*]}"
    else
        for ((i = ${#items[@]} - 1; i >= 0; i--)); do printf '%s ' "${items[i]}"; done
        echo
    fi
}

# jget FILE KEY... : fields of a JSON summary ("-" if null or missing;
# dotted keys reach into objects).
jget() {
    python3 - "$@" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception:
    d = {}
out = []
for k in sys.argv[2:]:
    v = d
    for part in k.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    out.append("-" if v is None else str(v))
print(" ".join(out))
PY
}

# cpu_ticks PID... : utime+stime of processes (all their threads), in
# clock ticks; a process that is gone counts 0.
cpu_ticks() {
    local p t=0 v
    for p in "$@"; do
        v=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}')
        t=$((t + ${v:-0}))
    done
    echo "$t"
}

# build_bench_and_causeway LIST : sets BENCH_BIN and CAUSEWAY_BIN (each
# kept when given) and exports them. Without --no-build, causeway-bench is
# built (a failure is fatal), and causeway too when the comma-separated
# LIST names it (a failure only warns: causeway is then skipped); with
# --no-build both come from target/release.
build_bench_and_causeway() {
    local list=$1
    if [[ -n ${BENCH_BIN:-} ]]; then
        :
    elif ((NO_BUILD)); then
        BENCH_BIN=$REPO/target/release/causeway-bench
    else
        need cargo
        log "building: cargo build --release -p causeway-bench"
        (cd "$REPO" && timeout -k 10 900 cargo build --release -q -p causeway-bench) >&2 ||
            die "cargo build -p causeway-bench failed or took over 15 min"
        BENCH_BIN=$REPO/target/release/causeway-bench
    fi
    if [[ -z ${CAUSEWAY_BIN:-} ]]; then
        CAUSEWAY_BIN=$REPO/target/release/causeway
        if ((!NO_BUILD)) && [[ ,$list, == *,causeway* ]]; then
            log "building: cargo build --release -p causeway"
            (cd "$REPO" && timeout -k 10 900 cargo build --release -q -p causeway) >&2 ||
                log "warning: cargo build -p causeway failed; causeway will be skipped"
        fi
    fi
    [[ -x $BENCH_BIN ]] || die "causeway-bench binary not found: $BENCH_BIN"
    export BENCH_BIN CAUSEWAY_BIN
}

# run_timed PREFIX LIMIT_OVERRIDE : runs this script again under the global
# time bound: 120 s with --quick, else 570 s, times the rounds, unless the
# variable named LIMIT_OVERRIDE gives seconds. timeout signals the script
# with TERM, its trap cleans up, and KILL follows 20 s later if anything
# hangs. The child finds PREFIX_TIMED=1 (and skips installing and
# building), PREFIX_LIMIT and PREFIX_CMD (the command line, for the
# report). exec: it stays in the caller's foreground process group, so
# Ctrl-C reaches it.
run_timed() {
    local prefix=$1 override=$2 limit
    if ((QUICK)); then limit=120; else limit=570; fi
    limit=$((limit * ROUNDS))
    limit=${!override:-$limit}
    export "${prefix}_TIMED=1" "${prefix}_LIMIT=$limit" \
        "${prefix}_CMD=bench/$NAME.sh${ORIG_ARGS[*]:+ ${ORIG_ARGS[*]}}"
    exec timeout -k 20 "$limit" "${BASH:-bash}" "$0" "${ORIG_ARGS[@]}"
}

# make_lab : the run's temp dir, TMP (readable by servers that drop
# privileges), and its empty results file, RESULTS.
# shellcheck disable=SC2034 # the sourcing script reads TMP and RESULTS
make_lab() {
    TMP=$(mktemp -d "/tmp/$NAME.$$.XXXXXX")
    chmod 755 "$TMP"
    RESULTS=$TMP/results.tsv
    : >"$RESULTS"
}

# trap_exits LIMIT : on exit the sourcing script's cleanup runs; Ctrl-C
# and TERM (sent by the global time bound of LIMIT seconds) are logged and
# end the script with 130 and 143.
trap_exits() {
    trap cleanup EXIT
    trap 'log "interrupted"; exit 130' INT
    # shellcheck disable=SC2064 # the bound is fixed now
    trap "log \"terminated (SIGTERM; the global time bound is ${1}s)\"; exit 143" TERM
}

# show_report REPORT TAG : prints the report file REPORT and, with --write,
# puts it into $WRITE between the lines <!-- TAG:begin --> and
# <!-- TAG:end -->, replacing what an earlier run put there (or appending
# it), so a results page keeps one current copy of each comparison.
show_report() {
    local report=$1 tag=$2
    cat "$report"
    [[ -n $WRITE ]] || return 0
    python3 - "$WRITE" "$report" "$tag" <<'PY'
import os, sys
path, report, tag = sys.argv[1], open(sys.argv[2]).read().rstrip("\n"), sys.argv[3]
begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
text = open(path).read() if os.path.exists(path) else ""
block = f"{begin}\n{report}\n{end}"
if begin in text and end in text and text.index(begin) < text.index(end):
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    text = head + block + tail
else:
    text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + block + "\n"
open(path, "w").write(text)
PY
    log "wrote the report into $WRITE"
}
