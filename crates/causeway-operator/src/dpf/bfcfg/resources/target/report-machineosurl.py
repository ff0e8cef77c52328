#!/usr/bin/env python3
"""Reports the OS image the DPU booted on its DPU object (MachineOSURL)."""
import json
import subprocess
import sys

CLIENT = "/usr/local/bin/dpuagent-client.py"
TRANSPORTS = ("ostree-unverified-registry:", "ostree-unverified-image:docker://",
              "ostree-image-signed:docker://", "ostree-remote-registry:", "docker://")


def booted_image():
    out = subprocess.run(["rpm-ostree", "status", "--json"], check=True,
                         capture_output=True, text=True).stdout
    for deployment in json.loads(out).get("deployments", []):
        if deployment.get("booted"):
            ref = deployment.get("container-image-reference", "")
            for prefix in TRANSPORTS:
                if ref.startswith(prefix):
                    return ref[len(prefix):]
            return ref.split(":", 1)[1] if ref.startswith("ostree-") else ref
    return ""


def report(status, reason, message):
    return subprocess.run([CLIENT, "update-condition", "MachineOSURL",
                           status, reason, message]).returncode


def main():
    try:
        image = booted_image()
    except (OSError, subprocess.CalledProcessError, ValueError) as e:
        return report("False", "LookupFailed", "rpm-ostree status: %s" % e)
    if not image:
        return report("False", "LookupFailed", "no booted container image")
    return report("True", "Reported", image)


if __name__ == "__main__":
    sys.exit(main())
