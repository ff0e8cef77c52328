#!/usr/bin/env bash
# The operator at scale against a real Kubernetes API server
# (kube-apiserver + kube-controller-manager 1.20 from tests/kube/cluster.sh,
# on loopback): creates N Infras and reports the time until all converge,
# reconciles and writes over a steady window, and the operator's RSS.
#
#   sudo bench/operator-scale.sh [--infras N] [--steady SECONDS] [--write FILE] [--no-build]
#
# Targets (2 cores): 1000 Infras converge in under 60 s; 0 writes in steady
# state; RSS under 64 MiB. --write FILE puts the report between the
# <!-- operator-scale:begin/end --> markers of FILE (docs/benchmarks.md).
set -euo pipefail
NAME=operator-scale
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$BENCH_DIR/.."

INFRAS=1000 STEADY=60 WRITE="" NO_BUILD=0
while (($#)); do
    case $1 in
        --infras) INFRAS=$2; shift ;;
        --steady) STEADY=$2; shift ;;
        --write) WRITE=$2; shift ;;
        --no-build) NO_BUILD=1 ;;
        -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
    shift
done
[[ $INFRAS =~ ^[1-9][0-9]*$ ]] || die "--infras takes a positive number"
[[ $STEADY =~ ^[1-9][0-9]*$ ]] || die "--steady takes a positive number of seconds"
if [[ -n $WRITE && $WRITE != /* ]]; then WRITE="$PWD/$WRITE"; fi

if ((NO_BUILD == 0)); then
    log "building release binaries"
    cargo build --release --locked -p causeway -p causeway-bench
fi
bash tests/kube/cluster.sh check || bash tests/kube/cluster.sh build
HELM=$(bash charts/test.sh --print-helm | tail -n 1)
[[ -x $HELM ]] || die "no helm (charts/test.sh --print-helm)"

DIR=$(mktemp -d)
trap 'bash tests/kube/cluster.sh stop "$DIR"; rm -rf "$DIR"' EXIT
log "starting the cluster in $DIR"
eval "$(bash tests/kube/cluster.sh start "$DIR" "$$" | grep '^KUBECONFIG=')"
"$HELM" template causeway charts/causeway --namespace causeway-system >"$DIR/chart.yaml"

REPORT="$DIR/report.md"
log "creating $INFRAS Infras"
OUT=$(target/release/causeway-bench operator --kubeconfig "$KUBECONFIG" --chart "$DIR/chart.yaml" \
    --causeway target/release/causeway --infras "$INFRAS" --steady-seconds "$STEADY" --json)
echo "$OUT" | grep -v '^{'
JSON=$(echo "$OUT" | grep '^{')
python3 - "$JSON" "$INFRAS" "$STEADY" "$(date -u +%Y-%m-%dT%H:%MZ)" "$(nproc)" >"$REPORT" <<'PY'
import json, sys
r, n, steady, when, cores = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
rss = r["rss_kib"]
mib = lambda k: k / 1024
ok = lambda b: "met" if b else "**not met**"
print(f"### Operator scale: {n} Infras, kube-apiserver 1.20 on loopback ({when}, {cores} cores)")
print()
print(f"Command: `sudo bench/operator-scale.sh --infras {n} --steady {steady}`")
print()
print("| measure | result | target |")
print("|---|---|---|")
print(f"| time until every Infra's status is current and every child exists | {r['converge_seconds']:.1f} s (creates took {r['create_seconds']:.1f} s) | under 60 s for 1000: {ok(n < 1000 or r['converge_seconds'] < 60)} |")
print(f"| API writes to converge | {r['writes_to_converge']:.0f} ({r['writes_to_converge']/n:.1f} per Infra) | |")
print(f"| time until no object changes for 1 s (the cluster's controllers done too) | {r['settle_seconds']:.1f} s, {r['writes_to_settle']:.0f} operator writes by then | |")
print(f"| reconciles in {steady} s of steady state | {r['steady_reconciles']:.0f} | |")
print(f"| writes in steady state (operator's counter) | {r['steady_writes']:.0f} | 0: {ok(r['steady_writes'] == 0)} |")
print(f"| objects whose resourceVersion moved in steady state | {r['steady_objects_changed']} of {r['objects']} | 0 |")
print(f"| operator RSS idle / converged / end / peak | {mib(rss['idle']):.1f} / {mib(rss['converged']):.1f} / {mib(rss['end']):.1f} / {mib(rss['peak']):.1f} MiB | under 64 MiB: {ok(rss['peak'] < 64 * 1024)} |")
PY
show_report "$REPORT" operator-scale
