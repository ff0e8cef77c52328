#!/usr/bin/env bash
# A real Kubernetes control plane on loopback, for the operator tests:
# etcd, kube-apiserver and kube-controller-manager, started in a temporary
# directory and stopped by PID.
#
#   tests/kube/cluster.sh build          build the binaries once (root), cached
#   tests/kube/cluster.sh check          exit 0 when the cached binaries are there
#   tests/kube/cluster.sh start DIR      start a cluster whose state lives in DIR;
#                                        prints KEY=VALUE lines (kubeconfig, server, token)
#                                        with a PID after DIR, the cluster is also
#                                        stopped and DIR removed once that process
#                                        has exited (test suites pass their own);
#                                        CAUSEWAY_KUBE_SANS=DNS:a,IP:b adds names
#                                        to the serving certificate;
#                                        CAUSEWAY_KUBE_ADDRESS and CAUSEWAY_KUBE_PORT
#                                        choose where etcd and the API server listen
#                                        (default 127.0.0.1 and free ports; with an
#                                        address, 2379/2380 and 6443 there)
#   tests/kube/cluster.sh stop-apiserver DIR   stop only the API server (an outage)
#   tests/kube/cluster.sh start-apiserver DIR  start it again as it was
#   tests/kube/cluster.sh stop DIR       stop what `start DIR` started
#
# The only kube-apiserver to be had on these machines is Debian bookworm's
# `kubernetes` source package (1.20.2). Its vendored modern-go/reflect2 1.0.1
# crashes on the first custom-resource create under Go >= 1.18, so the build
# swaps in Debian's packaged reflect2 sources. etcd comes from Debian's
# etcd-server package, unpacked rather than installed so no daemon starts.
#
# The cache lives outside the clone (CAUSEWAY_KUBE_CACHE, default
# /var/cache/causeway-test) so clean clones in CI reuse it.
set -euo pipefail

CACHE="${CAUSEWAY_KUBE_CACHE:-/var/cache/causeway-test}"
KUBE_VERSION=v1.20.2
BIN="$CACHE/kube-$KUBE_VERSION"
ETCD_BIN="$CACHE/etcd/usr/bin/etcd"

die() { echo "cluster.sh: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }

have_binaries() {
  [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] && [ -x "$ETCD_BIN" ]
}

# deb-src entries mirroring the machine's own deb entries, so the source
# package comes from the same archive the binary packages do.
add_source_entries() {
  local list=/etc/apt/sources.list.d/causeway-test-src.sources
  local legacy=/etc/apt/sources.list.d/causeway-test-src.list
  if apt-get source --print-uris kubernetes >/dev/null 2>&1; then
    return
  fi
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    sed -e 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$list"
  fi
  if [ -f /etc/apt/sources.list ] && grep -q '^deb ' /etc/apt/sources.list; then
    sed -n -e 's/^deb /deb-src /p' /etc/apt/sources.list > "$legacy"
  fi
  apt-get update -q
}

build() {
  if have_binaries; then
    log "binaries cached in $BIN"
    return
  fi
  [ "$(id -u)" = 0 ] || die "building needs root (apt-get); run as root once to fill $CACHE"
  mkdir -p "$CACHE"
  exec 8>"$CACHE/.build.lock"
  flock 8
  if have_binaries; then
    return
  fi
  export DEBIAN_FRONTEND=noninteractive
  add_source_entries
  apt-get install -y -q --no-install-recommends golang-go rsync make dpkg-dev \
    golang-github-modern-go-reflect2-dev openssl

  if [ ! -x "$ETCD_BIN" ]; then
    local etcd_tmp
    etcd_tmp="$(mktemp -d)"
    (cd "$etcd_tmp" && apt-get download etcd-server)
    rm -rf "$CACHE/etcd"
    dpkg-deb -x "$etcd_tmp"/etcd-server_*.deb "$CACHE/etcd"
    rm -rf "$etcd_tmp"
  fi

  local work="$CACHE/build"
  rm -rf "$work"
  mkdir -p "$work"
  (cd "$work" && apt-get source -q kubernetes)
  local tree
  tree="$(find "$work" -maxdepth 1 -mindepth 1 -type d -name 'kubernetes-*' -print -quit)"
  [ -n "$tree" ] || die "apt-get source kubernetes left no tree in $work"
  local reflect2=/usr/share/gocode/src/github.com/modern-go/reflect2
  [ -d "$reflect2" ] || die "$reflect2 missing (golang-github-modern-go-reflect2-dev)"
  rm -rf "$tree/vendor/github.com/modern-go/reflect2"
  cp -r "$reflect2" "$tree/vendor/github.com/modern-go/reflect2"

  # The build scripts expect the tree at its import path in a GOPATH.
  local gopath="$work/.go"
  mkdir -p "$gopath/src/k8s.io"
  ln -sfn "$tree" "$gopath/src/k8s.io/kubernetes"
  local jobs
  jobs="$(nproc)"
  (
    cd "$gopath/src/k8s.io/kubernetes"
    export GOPATH="$gopath" GOCACHE="$work/.gocache" GO111MODULE=off
    export CGO_ENABLED=0 GOFLAGS="-p=$jobs" KUBE_GIT_VERSION="$KUBE_VERSION" KUBE_GIT_TREE_STATE=clean
    nice -n 10 make WHAT="cmd/kube-apiserver cmd/kube-controller-manager"
  )
  mkdir -p "$BIN"
  local out="$tree/_output/local/bin/linux/amd64"
  [ -d "$out" ] || out="$(dirname "$(find "$tree/_output" -type f -name kube-apiserver -print -quit)")"
  install -m 0755 "$out/kube-apiserver" "$out/kube-controller-manager" "$BIN/"
  "$BIN/kube-apiserver" --version
  # The build tree is 1.8 GB and only needed again for a rebuild.
  rm -rf "$work"
}

free_port() {
  python3 - <<'EOF'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
EOF
}

wait_for() { # what, seconds, command...
  local what="$1" secs="$2"
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
  log "$what ready"
}

# Kills what the cluster in $1 started, newest first, by PID file.
stop() {
  local dir="$1" name pid
  for name in kube-controller-manager kube-apiserver etcd; do
    [ -f "$dir/$name.pid" ] || continue
    pid="$(cat "$dir/$name.pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/$name.pid"
  done
}

# Starts the API server of the cluster in $1 from what start wrote there.
run_apiserver() {
  local dir="$1" pki="$1/pki" ETCD_PORT ADDRESS API_PORT TOKEN
  # shellcheck disable=SC1091
  . "$dir/apiserver.env"
  "$BIN/kube-apiserver" \
    --etcd-servers "http://$ADDRESS:$ETCD_PORT" \
    --bind-address "$ADDRESS" --advertise-address "$ADDRESS" --secure-port "$API_PORT" --insecure-port 0 \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --token-auth-file "$pki/tokens.csv" \
    --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --api-audiences https://kubernetes.default.svc \
    --service-cluster-ip-range 10.96.0.0/16 \
    --disable-admission-plugins ServiceAccount \
    --endpoint-reconciler-type none \
    --allow-privileged=true \
    >>"$dir/kube-apiserver.log" 2>&1 &
  echo $! > "$dir/kube-apiserver.pid"
}

# Waits until the API server of the cluster in $1 is ready.
apiserver_ready() {
  local dir="$1" ETCD_PORT ADDRESS API_PORT TOKEN
  # shellcheck disable=SC1091
  . "$dir/apiserver.env"
  wait_for kube-apiserver 90 curl -sf --cacert "$dir/pki/ca.crt" -H "Authorization: Bearer $TOKEN" \
    "https://$ADDRESS:$API_PORT/readyz"
}

# Stops only the API server of the cluster in $1.
stop_apiserver() {
  local dir="$1" pid
  [ -f "$dir/kube-apiserver.pid" ] || return 0
  pid="$(cat "$dir/kube-apiserver.pid")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/kube-apiserver.pid"
}

start() {
  local dir="$1" watch_pid="$2"
  have_binaries || die "no binaries in $CACHE; run 'tests/kube/cluster.sh build' as root"
  mkdir -p "$dir/pki" "$dir/etcd"
  local pki="$dir/pki"

  # A CA, a serving certificate for 127.0.0.1 (and CAUSEWAY_KUBE_SANS),
  # and the service-account keys.
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=causeway-test-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
  # CAUSEWAY_KUBE_SANS adds names (DNS:x,IP:y): a test whose API server
  # is also a hosted cluster's, reached by its api/api-int names.
  local address="${CAUSEWAY_KUBE_ADDRESS:-127.0.0.1}"
  printf 'subjectAltName=IP:127.0.0.1,IP:%s,DNS:localhost%s\nextendedKeyUsage=serverAuth\n' \
    "$address" "${CAUSEWAY_KUBE_SANS:+,$CAUSEWAY_KUBE_SANS}" > "$pki/san.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$pki/san.ext" -out "$pki/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  local token
  token="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
  echo "$token,causeway-test-admin,causeway-test-admin,system:masters" > "$pki/tokens.csv"

  # On an address of the caller's own (the test suites give every cluster
  # one), etcd and the API server take their usual ports, which nothing
  # else there holds; on 127.0.0.1 they take free ones.
  local etcd_port etcd_peer api_port
  if [ -n "${CAUSEWAY_KUBE_ADDRESS:-}" ]; then
    etcd_port=2379
    etcd_peer=2380
    api_port="${CAUSEWAY_KUBE_PORT:-6443}"
  else
    etcd_port="$(free_port)"
    etcd_peer="$(free_port)"
    api_port="${CAUSEWAY_KUBE_PORT:-$(free_port)}"
  fi

  "$ETCD_BIN" --data-dir "$dir/etcd" --name causeway-test \
    --listen-client-urls "http://$address:$etcd_port" --advertise-client-urls "http://$address:$etcd_port" \
    --listen-peer-urls "http://$address:$etcd_peer" --initial-advertise-peer-urls "http://$address:$etcd_peer" \
    --initial-cluster "causeway-test=http://$address:$etcd_peer" \
    --unsafe-no-fsync --quota-backend-bytes=2147483648 >"$dir/etcd.log" 2>&1 &
  echo $! > "$dir/etcd.pid"
  wait_for etcd 30 curl -sf "http://$address:$etcd_port/health" || { stop "$dir"; die "etcd did not start: $(tail -5 "$dir/etcd.log")"; }

  # Kept, so start-apiserver can bring it back after an outage.
  printf 'ETCD_PORT=%s\nADDRESS=%s\nAPI_PORT=%s\nTOKEN=%s\n' \
    "$etcd_port" "$address" "$api_port" "$token" > "$dir/apiserver.env"
  run_apiserver "$dir"
  local server="https://$address:$api_port"

  cat > "$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: causeway-test
  cluster:
    server: $server
    certificate-authority: $pki/ca.crt
users:
- name: admin
  user:
    token: $token
contexts:
- name: causeway-test
  context: {cluster: causeway-test, user: admin}
current-context: causeway-test
EOF

  apiserver_ready "$dir" || { stop "$dir"; die "kube-apiserver not ready: $(tail -20 "$dir/kube-apiserver.log")"; }

  "$BIN/kube-controller-manager" \
    --kubeconfig "$dir/kubeconfig" \
    --port 0 --secure-port 0 \
    --leader-elect=false \
    --controllers '*' \
    --use-service-account-credentials=false \
    --service-account-private-key-file "$pki/sa.key" \
    --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --concurrent-gc-syncs 5 \
    >"$dir/kube-controller-manager.log" 2>&1 &
  echo $! > "$dir/kube-controller-manager.pid"
  sleep 0.1
  kill -0 "$(cat "$dir/kube-controller-manager.pid")" 2>/dev/null \
    || { stop "$dir"; die "kube-controller-manager exited: $(tail -20 "$dir/kube-controller-manager.log")"; }

  if [ -n "$watch_pid" ]; then
    # Detached from every stream of the caller, which reads ours to the end.
    setsid bash "$0" watch "$dir" "$watch_pid" </dev/null >/dev/null 2>&1 &
  fi
  echo "KUBECONFIG=$dir/kubeconfig"
  echo "SERVER=$server"
  echo "CA=$pki/ca.crt"
  echo "TOKEN=$token"
}

case "${1:-}" in
  build) build ;;
  check) have_binaries ;;
  start) [ -n "${2:-}" ] || die "usage: start DIR [PID]"; start "$2" "${3:-}" ;;
  watch)
    # Internal: stop the cluster in $2 once process $3 is gone.
    while kill -0 "$3" 2>/dev/null; do sleep 1; done
    stop "$2"
    rm -rf "$2"
    ;;
  stop) [ -n "${2:-}" ] || die "usage: stop DIR"; stop "$2" ;;
  stop-apiserver) [ -n "${2:-}" ] || die "usage: stop-apiserver DIR"; stop_apiserver "$2" ;;
  start-apiserver)
    [ -n "${2:-}" ] || die "usage: start-apiserver DIR"
    run_apiserver "$2"
    apiserver_ready "$2" || die "kube-apiserver not ready again: $(tail -20 "$2/kube-apiserver.log")"
    ;;
  *) die "usage: $0 build | check | start DIR | stop DIR | stop-apiserver DIR | start-apiserver DIR" ;;
esac
