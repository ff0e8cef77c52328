#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs the system packages the
# tests use (when root), then checks formatting and lints, fuzzes briefly,
# and runs every test. CI runs exactly this (.ci/run).
#
# Tests that need root (network namespaces, port 67) print "SKIP ..." and
# return when run unprivileged; as root they run for real.
set -euo pipefail
cd "$(dirname "$0")/.."

# Real DHCP clients and peers, and the tools the lab uses.
PACKAGES=(isc-dhcp-client isc-dhcp-relay udhcpc dhcpcd-base kea-admin kea-dhcp4-server iproute2 curl procps util-linux mount
          bind9-dnsutils knot-dnsutils dnsmasq-base dnsperf openssl buildah binutils
          python3 python3-venv python3-pip shellcheck docker-registry e2fsprogs libfaketime
          prometheus iputils-ping jq cpio ndisc6)
# The chart test takes helm from an npm package: npm from Debian only when
# the machine has no npm of its own.
command -v npm >/dev/null || PACKAGES+=(npm)
# kubectl runs the operator docs' own commands against the test API server;
# Debian's build only when the machine has none (another package may own
# /usr/bin/kubectl).
command -v kubectl >/dev/null || PACKAGES+=(kubernetes-client)

# Each section's wall time, printed at the end of the run.
durations=()
section_name=""
section_started=$SECONDS
close_section() {
  if [ -n "$section_name" ]; then
    durations+=("$(( SECONDS - section_started ))|$section_name")
  fi
}
section() {
  close_section
  section_name="$*"
  section_started=$SECONDS
  printf '\n==> %s\n' "$*"
}
print_durations() {
  close_section
  echo "section durations (s):"
  for d in "${durations[@]}"; do
    printf '  %5s  %s\n' "${d%%|*}" "${d#*|}"
  done
  echo "  total: $SECONDS s"
}

# A one-shot run gains nothing from incremental compilation, whose caches
# are about a third of a clean build's target/.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# The disk is the first thing to read when a link fails with a bus error.
disk() { df -h --output=avail,size,target "${CARGO_TARGET_DIR:-target}" 2>/dev/null | tail -n 1 || true; }
mkdir -p "${CARGO_TARGET_DIR:-target}"
echo "disk free at start (avail, size, mount): $(disk)"

section "system packages"
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "all present: ${PACKAGES[*]}"
elif [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # The servers must not start as system services: the tests run their own.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -q --no-install-recommends "${missing[@]}"
  rm -f /usr/sbin/policy-rc.d
else
  echo "SKIP package install (not root); missing: ${missing[*]}; tests that need them will SKIP or fail"
fi

section "formatting and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Every shell script in the repository, the bench comparisons included:
# they run rarely, so a mistake in one would otherwise wait for a bench day.
mapfile -t scripts < <(git ls-files '*.sh' .ci/run)
if command -v shellcheck >/dev/null; then
  shellcheck "${scripts[@]}"
  echo "shellcheck: ${#scripts[@]} scripts clean"
else
  echo "SKIP shellcheck: not installed (not root, so the package step could not add it)"
fi

section "build (the e2e tests drive these binaries)"
cargo build --workspace --bins --locked

section "fuzz (briefly; cargo-fuzz needs a nightly toolchain)"
FUZZ_SECONDS="${FUZZ_SECONDS:-20}"
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
  fi
  # Each target starts from its committed seeds (fuzz/seeds/<target>) and
  # writes what it finds to the uncommitted fuzz/corpus/<target>. The
  # targets build once, together, under target/ (so a cached target/ keeps
  # their dependencies too), then run two at a time: libFuzzer uses one core.
  fuzz_targets=(dhcp_engine dns_query dns_fastpath dns_response lease_log client_hello config router_solicitation dhcp6_message)
  (cd fuzz && cargo +nightly fuzz build --target-dir ../target/fuzz)
  fuzz_one() {
    mkdir -p "fuzz/corpus/$1"
    (cd fuzz && cargo +nightly fuzz run --target-dir ../target/fuzz "$1" "corpus/$1" "seeds/$1" \
      -- -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 > "../target/fuzz/$1.log" 2>&1) ||
      { echo "fuzz $1 FAILED:"; tail -n 40 "target/fuzz/$1.log"; return 1; }
    echo "fuzz $1: $(grep -E '^Done [0-9]+ runs' "target/fuzz/$1.log" || tail -n 1 "target/fuzz/$1.log")"
  }
  fuzz_running=0
  fuzz_failed=0
  for target in "${fuzz_targets[@]}"; do
    if ((fuzz_running == 2)); then
      wait -n || fuzz_failed=1
      fuzz_running=$((fuzz_running - 1))
    fi
    fuzz_one "$target" &
    fuzz_running=$((fuzz_running + 1))
  done
  while ((fuzz_running > 0)); do
    wait -n || fuzz_failed=1
    fuzz_running=$((fuzz_running - 1))
  done
  ((fuzz_failed == 0)) || { echo "fuzz: a target failed (above)"; exit 1; }
else
  echo "SKIP cargo fuzz: no nightly toolchain here; the same harness runs on stable as the property tests arbitrary_bytes_never_panic and mutated_valid_packets_never_panic"
fi

section "helm chart (helm from npm, kubernetes-validate from PyPI)"
bash charts/test.sh

section "Kubernetes control plane for the operator tests (tests/kube/cluster.sh)"
# kube-apiserver and kube-controller-manager 1.20 are built once from
# Debian's source package (about 7 minutes on 2 cores) and cached in
# /var/cache/causeway-test, outside the clone.
if [ "$(id -u)" = 0 ]; then
  bash tests/kube/cluster.sh build
else
  echo "SKIP kube-apiserver build: needs root; the operator tests will SKIP"
fi
# The operator tests install the chart from `helm template` with this helm.
CAUSEWAY_HELM="$(bash charts/test.sh --print-helm 2>/dev/null | tail -n 1 || true)"
export CAUSEWAY_HELM

section "image (buildah, FROM scratch)"
if [ "$(id -u)" = 0 ] && command -v buildah >/dev/null; then
  images/build.sh
  images/test.sh
else
  echo "SKIP image: buildah needs root and the buildah package"
fi

section "tests"
log=$(mktemp)
kube_log=$(mktemp)
trap 'rm -f "$log" "$kube_log"' EXIT
# Built once, so the two streams below only run what is there.
cargo test --workspace --locked --no-run
# The integration suites are modules of a few test binaries, one per tier
# (docs/testing.md). `kube`, whose suites mostly wait on the control plane
# its process starts, runs as one stream beside everything else. The HA
# lab (`ha_lab::`, in `lab`), whose replicas race each other on purpose
# and are timed against goals, runs alone after both, on a quiet machine.
alone_filter=ha_lab::
mapfile -t test_targets < <(cargo metadata --no-deps --locked --format-version 1 |
  jq -r '.packages[].targets[] | select(.kind == ["test"]) | .name | select(. != "kube")')
kube_args=(--test kube)
other_args=(--lib --bins)
for t in "${test_targets[@]}"; do other_args+=(--test "$t"); done
echo "tests: the unit tests and ${test_targets[*]} here; kube beside them, printed when it ends; then $alone_filter alone"
tests_status=0
cargo test --workspace --locked --no-fail-fast "${kube_args[@]}" > "$kube_log" 2>&1 &
kube_pid=$!
cargo test --workspace --locked --no-fail-fast "${other_args[@]}" -- --skip "$alone_filter" 2>&1 | tee "$log" || tests_status=$?
cargo test --workspace --locked --doc 2>&1 | tee -a "$log" || tests_status=$?
kube_status=0
wait "$kube_pid" || kube_status=$?
printf '\n==> the kube suites (ran beside the tests above; exit %s)\n' "$kube_status"
cat "$kube_log"
cat "$kube_log" >> "$log"
[ "$kube_status" = 0 ] || tests_status=$kube_status
printf '\n==> alone: %s\n' "$alone_filter"
cargo test --workspace --locked --no-fail-fast --test lab -- "$alone_filter" 2>&1 | tee -a "$log" || tests_status=$?
# One closing line for the whole run (cargo prints one per test binary,
# the last of which is often an empty doc-test run). Tests that returned
# early for want of root said "SKIP ..." and count as skipped, not passed.
echo "disk free at end (avail, size, mount): $(disk)"
# The slowest test binaries: each "Running" line with the time its
# results line gives.
echo "slowest test binaries (s):"
awk '/^ *Running / { name = $NF; gsub(/[()]/, "", name); sub(/.*\//, "", name); sub(/-[0-9a-f]+$/, "", name) }
     /^test result:/ && name != "" { t = $NF; sub(/s$/, "", t); printf "  %8.1f  %s\n", t, name; name = "" }' "$log" |
  sort -rn | head -n 12
awk '/^test result:/ { p += $4; f += $6; s += $8 }
     /^SKIP / { k += 1 }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p - k, f, s + k }' "$log"
print_durations
exit "$tests_status"
