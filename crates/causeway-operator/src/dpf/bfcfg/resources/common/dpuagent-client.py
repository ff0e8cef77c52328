#!/usr/bin/env python3
"""Talks to the DPF host agent over the tmfifo link.

The host agent answers on the host side of the rshim network, at
[fe80::1%tmfifo_net0]:11029. Every call is one JSON POST; the answer is
printed on stdout, and a failure exits non-zero with the reason on stderr.
"""
import argparse
import http.client
import json
import sys

HOST = "fe80::1%tmfifo_net0"
PORT = 11029
TIMEOUT = 60
MAX_MESSAGE = 4096


def call(path, body=None):
    conn = http.client.HTTPConnection(HOST, PORT, timeout=TIMEOUT)
    try:
        payload = json.dumps(body or {})
        conn.request("POST", path, payload, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read().decode("utf-8", "replace")
        if resp.status // 100 != 2:
            raise RuntimeError("%s: HTTP %d: %s" % (path, resp.status, data[:200]))
        return data
    finally:
        conn.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("get-object", help="the DPU object, as JSON")
    sub.add_parser("phase", help="the DPU object's status.phase")
    sub.add_parser("configure-host-vfs", help="ask the host to create its VFs")
    sub.add_parser("rebind-host-driver", help="ask the host to reload mlx5")
    reboot = sub.add_parser("trigger-reboot", help="ask the host to reboot the DPU")
    reboot.add_argument("method", help="for example PowerCycle")
    status = sub.add_parser("update-status", help="write agentStatus fields and conditions")
    status.add_argument("--condition", nargs=4, action="append", default=[],
                        metavar=("TYPE", "STATUS", "REASON", "MESSAGE"))
    status.add_argument("--field", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    try:
        if args.command == "get-object":
            print(call("/get-object"))
        elif args.command == "phase":
            print(json.loads(call("/get-object")).get("status", {}).get("phase", ""))
        elif args.command == "configure-host-vfs":
            print(call("/configure-host-vfs"))
        elif args.command == "rebind-host-driver":
            print(call("/rebind-host-driver"))
        elif args.command == "trigger-reboot":
            print(call("/trigger-reboot", {"method": args.method}))
        else:
            fields = dict(f.split("=", 1) for f in args.field if "=" in f)
            conditions = [
                {"type": t, "status": s, "reason": r, "message": m[:MAX_MESSAGE]}
                for t, s, r, m in args.condition
            ]
            print(call("/update-status", {"agentStatus": fields, "conditions": conditions}))
    except Exception as e:  # noqa: BLE001 - every failure is reported the same way
        print("dpuagent-client: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
