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
