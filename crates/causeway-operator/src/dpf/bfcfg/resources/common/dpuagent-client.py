#!/usr/bin/env python3
"""Talks to DPF's host agent from the DPU, over the rshim network.

The host agent listens on the host side of tmfifo_net0, at
http://[fe80::1%25tmfifo_net0]:11029. The DPU is named by the DPUName,
DPUNamespace and DPUUID environment variables (the units load them from
/etc/dpf/environment), and every POST carries them as dpuName,
dpuNamespace and dpuUID; the host agent refuses a call for another DPU, or
for an older DPU object of the same name. What the DPU reports goes under
agentStatus: its fields, and conditions with a lastTransitionTime.

A POST prints "[status] body" on stdout. A refused call prints the same on
stderr and exits 1; so does a call that gets no answer, with the reason.
Nothing is retried here: the scripts decide how long to keep trying.
"""
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone

BASE = "http://[fe80::1%25tmfifo_net0]:11029"
TIMEOUT = 60
# The longest message a condition carries; longer ones are cut.
MAX_MESSAGE = 4096
DPU_GROUP = "provisioning.dpu.nvidia.com"
DPU_VERSION = "v1alpha1"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# How a BlueField is reset without the host: the reboot method it reports.
SYSTEM_LEVEL_RESET = "SystemLevelReset"


class Failed(Exception):
    pass


def now():
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def dpu():
    return {
        "dpuName": os.environ.get("DPUName"),
        "dpuNamespace": os.environ.get("DPUNamespace"),
        "dpuUID": os.environ.get("DPUUID"),
    }


def condition(type_, status, reason, message):
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "lastTransitionTime": now(),
    }


def send(method, path, body=None):
    data = None
    headers = {}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(BASE + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            return answer.status, answer.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as refused:
        text = refused.read().decode("utf-8", "replace")
        raise Failed("[%d] %s" % (refused.code, text))
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise Failed("Request to %s failed: %s" % (path.split("?")[0], reason))


def post(path, fields=None):
    body = dpu()
    body.update(fields or {})
    status, text = send("POST", path, body)
    print("[%d] %s" % (status, text))


def report(agent_status):
    post("/update-status", {"agentStatus": agent_status})


def get_dpu_phase():
    query = urllib.parse.urlencode({
        "group": DPU_GROUP,
        "version": DPU_VERSION,
        "kind": "DPU",
        "namespace": os.environ.get("DPUNamespace", ""),
        "name": os.environ.get("DPUName", ""),
    })
    _, text = send("GET", "/get-object?" + query)
    try:
        phase = json.loads(text)["status"]["phase"]
    except (ValueError, KeyError, TypeError):
        raise Failed("the DPU object has no status.phase: %s" % text[:200])
    print(phase)


def update_pf_status(pf, state, interface, message=None):
    up = state.lower() == "up"
    report({"conditions": [condition(
        "%sLinkDown" % pf,
        "False" if up else "True",
        "%sLinkUp" % pf if up else "%sLinkDown" % pf,
        message or "%s interface %s is %s" % (pf, interface, state),
    )]})


def update_nvconfig_applied():
    with open(BOOT_ID) as f:
        boot_id = f.read().strip()
    report({
        "initialBootID": boot_id,
        "conditions": [condition("NVConfigApplied", "True", "AppliedByInstallScript",
                                 "NVConfig applied by the install script; the DPU needs a power cycle")],
    })


COMMANDS = {
    # name: (usage of the arguments, how many at least, at most, what it does)
    "get-dpu-phase": ("", 0, 0, get_dpu_phase),
    "configure-host-vfs": ("[vfCount]", 0, 1,
                           lambda *n: post("/configure-host-vfs", {"vfCount": int(n[0])} if n else {})),
    "update-reboot-method-discovery": ("", 0, 0, lambda: report({"conditions": [condition(
        "RebootMethodDiscovery", "True", SYSTEM_LEVEL_RESET,
        "the DPU is reset with a system-level reset, without the host")]})),
    "update-host-reboot": ("", 0, 0, lambda: report({"rebootMethod": SYSTEM_LEVEL_RESET})),
    "update-nvconfig-applied": ("", 0, 0, update_nvconfig_applied),
    "trigger-reboot": ("METHOD", 1, 1, lambda m: post("/trigger-reboot", {"rebootMethod": m})),
    "rebind-host-driver": ("", 0, 0, lambda: post("/rebind-host-driver")),
    "update-time": ("", 0, 0, lambda: report({"lastStartupTime": now()})),
    "send-error": ("REASON MESSAGE", 2, 2, lambda reason, message: report(
        {"conditions": [condition("InstallError", "True", reason, message)]})),
    "update-pf-status": ("PFn STATE INTERFACE [MESSAGE]", 3, 4, update_pf_status),
    "update-condition": ("TYPE STATUS REASON MESSAGE", 4, 4,
                         lambda t, s, r, m: report({"conditions": [condition(t, s, r, m)]})),
}


def usage():
    lines = ["usage: dpuagent-client.py COMMAND [ARGS]"]
    lines += ["  %s %s" % (name, spec[0]) for name, spec in COMMANDS.items()]
    return "\n".join(lines)


def main(argv):
    if len(argv) < 2 or argv[1] not in COMMANDS:
        print(usage(), file=sys.stderr)
        return 2
    _, least, most, run = COMMANDS[argv[1]]
    args = argv[2:]
    if not least <= len(args) <= most:
        print(usage(), file=sys.stderr)
        return 2
    try:
        run(*args)
    except Failed as e:
        print(e, file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print("%s: %s" % (argv[1], e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
