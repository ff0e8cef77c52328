#!/usr/bin/env python3
"""Adds this DPU's identity files to the target ignition.

DPF renders /etc/hostname, /etc/dpf/environment and, when it makes one, the
bootstrap kubeconfig into the live system; the installed system needs the
same files, so they are appended to the target ignition as data URLs.
"""
import base64
import gzip
import json
import sys

FILES = (
    ("/etc/hostname", 0o644),
    ("/etc/dpf/environment", 0o644),
    ("/var/lib/dpf/dpuagent/bootstrap-kubeconfig", 0o600),
)


def main(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    ign = json.loads(raw)
    files = ign.setdefault("storage", {}).setdefault("files", [])
    for name, mode in FILES:
        try:
            with open(name, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        files[:] = [x for x in files if x.get("path") != name]
        files.append({
            "path": name,
            "mode": mode,
            "overwrite": True,
            "contents": {"source": "data:;base64," + base64.b64encode(data).decode()},
        })
    with open(path, "w") as f:
        json.dump(ign, f, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/var/target.ign"))
