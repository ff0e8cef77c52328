#!/usr/bin/env bash
# Checks an image built by images/build.sh: the entrypoint, the non-root
# user, the size (under 30 MB unpacked), and that the binary in it runs.
#
#   images/test.sh [OCI_ARCHIVE]     default target/image/causeway.oci.tar
set -euo pipefail
cd "$(dirname "$0")/.."
ARCHIVE=${1:-target/image/causeway.oci.tar}
[[ -f $ARCHIVE ]] || { echo "images/test.sh: $ARCHIVE not found (run images/build.sh)" >&2; exit 1; }
work=$(mktemp -d /tmp/causeway-image-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar -xf "$ARCHIVE" -C "$work"

python3 - "$work" <<'PY'
import gzip, json, os, subprocess, sys, tarfile

root = sys.argv[1]
def blob(digest):
    algo, hexd = digest.split(":")
    return os.path.join(root, "blobs", algo, hexd)

index = json.load(open(os.path.join(root, "index.json")))
manifest = json.load(open(blob(index["manifests"][0]["digest"])))
config = json.load(open(blob(manifest["config"]["digest"])))["config"]
failures = []
if config.get("Entrypoint") != ["/causeway"]:
    failures.append(f"entrypoint is {config.get('Entrypoint')}, not ['/causeway']")
if config.get("User") != "65532:65532":
    failures.append(f"user is {config.get('User')!r}, not '65532:65532'")

unpacked = 0
rootfs = os.path.join(root, "rootfs")
os.makedirs(rootfs)
for layer in manifest["layers"]:
    path = blob(layer["digest"])
    opener = gzip.open if layer["mediaType"].endswith("gzip") else open
    with opener(path, "rb") as f:
        with tarfile.open(fileobj=f, mode="r|") as t:
            for m in t:
                unpacked += m.size
                t.extract(m, rootfs, filter="tar") if hasattr(tarfile, "data_filter") else t.extract(m, rootfs)
packed = sum(l["size"] for l in manifest["layers"])
print(f"image: {len(manifest['layers'])} layer(s), {packed/1e6:.1f} MB compressed, {unpacked/1e6:.1f} MB unpacked")
if unpacked >= 30e6:
    failures.append(f"unpacked size {unpacked/1e6:.1f} MB is not under 30 MB")
for needed in ["causeway", "etc/ssl/certs/ca-certificates.crt", "etc/passwd"]:
    if not os.path.exists(os.path.join(rootfs, needed)):
        failures.append(f"/{needed} is missing")
# The binary is static: it runs straight from the unpacked layer.
out = subprocess.run([os.path.join(rootfs, "causeway"), "--version"], capture_output=True, text=True)
if out.returncode != 0 or not out.stdout.startswith("causeway "):
    failures.append(f"/causeway --version failed: {out.returncode} {out.stdout!r} {out.stderr!r}")
else:
    print(f"/causeway --version: {out.stdout.strip()}")
crd = subprocess.run([os.path.join(rootfs, "causeway"), "operator", "crd"], capture_output=True, text=True)
if crd.returncode != 0 or "kind: CustomResourceDefinition" not in crd.stdout:
    failures.append("/causeway operator crd did not print the CRD")
for f in failures:
    print("FAIL image:", f)
sys.exit(1 if failures else 0)
PY
echo "images/test.sh: ok"
