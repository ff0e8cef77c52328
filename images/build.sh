#!/usr/bin/env bash
# Builds the causeway image FROM scratch with buildah into an OCI archive.
#
#   images/build.sh [--no-build] [OUT]
#
# OUT defaults to target/image/causeway.oci.tar. The binary is built static
# (glibc with +crt-static), so the image needs no libraries; it also holds
# the CA bundle, an nsswitch.conf and passwd/group entries for uid 65532.
# buildah keeps its storage under a temporary directory of its own and
# nothing is pulled. Needs root (or a user namespace) for buildah.
set -euo pipefail
cd "$(dirname "$0")/.."

NO_BUILD=0
if [[ ${1:-} == --no-build ]]; then NO_BUILD=1; shift; fi
OUT=${1:-target/image/causeway.oci.tar}
TARGET=x86_64-unknown-linux-gnu
BIN=target/$TARGET/release/causeway

if ((!NO_BUILD)); then
    RUSTFLAGS="-C target-feature=+crt-static" \
        cargo build --release --locked --target "$TARGET" -p causeway
fi
[[ -x $BIN ]] || { echo "images/build.sh: $BIN missing (build it, or drop --no-build)" >&2; exit 1; }
if readelf -d "$BIN" | grep -q '(NEEDED)'; then
    echo "images/build.sh: $BIN is dynamically linked; the image needs a static binary" >&2
    exit 1
fi
command -v buildah >/dev/null || { echo "images/build.sh: buildah not found (apt-get install buildah)" >&2; exit 1; }

work=$(mktemp -d /tmp/causeway-image.XXXXXX)
cleanup() {
    buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs rmi -a -f >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

ctx=$work/context
mkdir -p "$ctx/rootfs/etc/ssl/certs" "$ctx/rootfs/tmp"
install -m 0755 "$BIN" "$ctx/rootfs/causeway"
strip "$ctx/rootfs/causeway"
install -m 0644 /etc/ssl/certs/ca-certificates.crt "$ctx/rootfs/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/:/causeway\nnonroot:x:65532:65532:nonroot:/:/causeway\n' >"$ctx/rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$ctx/rootfs/etc/group"
printf 'hosts: files dns\n' >"$ctx/rootfs/etc/nsswitch.conf"
chmod 1777 "$ctx/rootfs/tmp"
cp images/Containerfile "$ctx/Containerfile"

version=$("$BIN" --version | awk '{print $NF}')
b=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
"${b[@]}" bud --quiet --isolation chroot --format oci \
    --label "org.opencontainers.image.title=causeway" \
    --label "org.opencontainers.image.version=$version" \
    -f "$ctx/Containerfile" -t "localhost/causeway:$version" "$ctx" >/dev/null
mkdir -p "$(dirname "$OUT")"
rm -f "$OUT"
"${b[@]}" push --quiet "localhost/causeway:$version" "oci-archive:$OUT:causeway:$version"
echo "$OUT: causeway:$version, $(du -h "$OUT" | cut -f1)"
