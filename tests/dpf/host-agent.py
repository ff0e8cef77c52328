#!/usr/bin/env python3
"""A stand-in for DPF's host agent, for the DPU boot lab.

Written from the protocol DPF's host agent serves to the DPU over the rshim
network (docs/research/dpf-host-agent-protocol.md): the routes, methods,
request bodies and status codes of its installation service, and the
shape the DPU CRD gives `status.agentStatus`. It is stricter than the real
server where the real one would accept a request and silently drop part of
it (an unknown key, a condition outside `agentStatus`): a script that sends
such a request is wrong against the real host agent too, only quietly.

It serves one DPU object, moves its phase the way DPF does for the calls a
booting DPU makes (OS Installing -> DPU Config once the installed system
reported its start time; Rebooting on a reboot request), and appends every
call, with the status it answered, to a JSON-lines record.

    host-agent.py --bind fe80::1%tmfifo_host --port 11029 --record calls.jsonl \
        --name dpu-0 --namespace dpf-operator-system --uid 1234
"""
import argparse
import json
import re
import socket
import sys
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

GROUP = "provisioning.dpu.nvidia.com"
VERSION = "v1alpha1"
# The DPU CRD's agentStatus fields (provisioning.dpu.nvidia.com_dpus.yaml).
AGENT_STATUS_KEYS = {
    "conditions", "initialBootID", "kubeletVersion", "lastObservedPendingNvconfig",
    "lastStartupTime", "rebootMethod", "rebootSequenceCount", "hostRebootRequired",
}
REBOOT_METHODS_IN_STATUS = {
    "Unknown", "NoAction", "PowerCycle", "SystemReboot", "SystemLevelReset",
    "FirmwareReset", "DPUWarmReboot",
}
# What POST /trigger-reboot carries out; anything else is 400.
REBOOT_METHODS_TRIGGERED = {"SystemLevelReset", "FirmwareReset", "SystemReboot", "PowerCycle"}
CONDITION_KEYS = {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
# The package repository's index, under the static /rpm/ tree.
RPM_INDEX = "/rpm/repodata/repomd.xml"
# Routes and the one method each accepts; any other path is 404 (GET /
# included: the installation service routes no root).
ROUTES = {
    "/update-status": "POST",
    "/get-object": "GET",
    "/configure-host-vfs": "POST",
    "/trigger-reboot": "POST",
    "/rebind-host-driver": "POST",
    "/healthz": "GET",
}


class Refused(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class Agent:
    def __init__(self, name, namespace, uid, record, vfs_marker=None):
        self.lock = threading.Lock()
        self.record = open(record, "a", buffering=1)
        # Where the host's VFs show on the DPU once made (the lab's devlink
        # lists a pcivf port while this file exists); None: never made.
        self.vfs_marker = vfs_marker
        self.dpu = {
            "apiVersion": "%s/%s" % (GROUP, VERSION),
            "kind": "DPU",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"dpuNodeName": name + "-node"},
            "status": {"phase": "OS Installing", "conditions": []},
        }

    def log(self, entry):
        self.record.write(json.dumps(entry, sort_keys=True) + "\n")

    def identify(self, body, uid_checked=True):
        meta = self.dpu["metadata"]
        if body.get("dpuName") != meta["name"] or body.get("dpuNamespace") != meta["namespace"]:
            raise Refused(404, "DPU %r/%r not found" % (body.get("dpuNamespace"), body.get("dpuName")))
        if uid_checked and body.get("dpuUID") != meta["uid"]:
            raise Refused(409, "stale DPU object: uid %r is not %r" % (body.get("dpuUID"), meta["uid"]))

    def get_object(self, query):
        one = {k: v[0] for k, v in query.items()}
        for required in ("version", "kind", "name"):
            if not one.get(required):
                raise Refused(400, "query parameter %s is required" % required)
        meta = self.dpu["metadata"]
        if (one.get("group"), one["version"], one["kind"], one.get("namespace"), one["name"]) != (
            GROUP, VERSION, "DPU", meta["namespace"], meta["name"]
        ):
            raise Refused(404, "no such object")
        return self.dpu

    def update_status(self, body):
        unknown = set(body) - {"dpuName", "dpuNamespace", "dpuUID", "agentStatus"}
        if unknown:
            raise Refused(400, "unknown fields %s: conditions and the rest go under agentStatus" % sorted(unknown))
        self.identify(body)
        agent = body.get("agentStatus")
        if not isinstance(agent, dict):
            raise Refused(400, "agentStatus is missing or not an object")
        unknown = set(agent) - AGENT_STATUS_KEYS
        if unknown:
            raise Refused(400, "agentStatus has unknown fields %s" % sorted(unknown))
        for key in ("lastStartupTime",):
            if key in agent and not (isinstance(agent[key], str) and RFC3339.match(agent[key])):
                raise Refused(400, "agentStatus.%s %r is not an RFC 3339 time" % (key, agent[key]))
        if "rebootMethod" in agent and agent["rebootMethod"] not in REBOOT_METHODS_IN_STATUS:
            raise Refused(400, "agentStatus.rebootMethod %r is not a reboot method" % agent["rebootMethod"])
        if "rebootSequenceCount" in agent and not isinstance(agent["rebootSequenceCount"], int):
            raise Refused(400, "agentStatus.rebootSequenceCount is not an integer")
        conditions = agent.get("conditions", [])
        if not isinstance(conditions, list):
            raise Refused(400, "agentStatus.conditions is not a list")
        for c in conditions:
            if not isinstance(c, dict) or set(c) - CONDITION_KEYS:
                raise Refused(400, "condition %r has unknown fields" % (c,))
            missing = [k for k in ("type", "status", "reason", "message", "lastTransitionTime") if not isinstance(c.get(k), str)]
            if missing:
                raise Refused(400, "condition %r lacks %s" % (c.get("type"), missing))
            if c["status"] not in ("True", "False", "Unknown"):
                raise Refused(400, "condition %s status %r" % (c["type"], c["status"]))
            if not RFC3339.match(c["lastTransitionTime"]):
                raise Refused(400, "condition %s lastTransitionTime %r" % (c["type"], c["lastTransitionTime"]))
            if not re.match(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", c["reason"]):
                raise Refused(400, "condition %s reason %r is not a CamelCase word" % (c["type"], c["reason"]))
        status = self.dpu["status"]
        mine = status.setdefault("agentStatus", {})
        for key, value in agent.items():
            if key != "conditions":
                mine[key] = value
        merged = {c["type"]: c for c in mine.get("conditions", [])}
        for c in conditions:
            merged[c["type"]] = c
        mine["conditions"] = list(merged.values())
        if "lastStartupTime" in agent:
            status["agentLastStartupTime"] = agent["lastStartupTime"]
            # The OS is installed and reported its start: DPF configures it.
            if status["phase"] == "OS Installing":
                status["phase"] = "DPU Config"
        return None

    def configure_host_vfs(self, body):
        unknown = set(body) - {"dpuName", "dpuNamespace", "dpuUID", "vfCount"}
        if unknown:
            raise Refused(400, "unknown fields %s" % sorted(unknown))
        self.identify(body, uid_checked=False)
        if "vfCount" in body and not isinstance(body["vfCount"], int):
            raise Refused(400, "vfCount is not an integer")
        if self.vfs_marker:
            open(self.vfs_marker, "w").close()
        return None

    def rebind_host_driver(self, body):
        unknown = set(body) - {"dpuName", "dpuNamespace", "dpuUID"}
        if unknown:
            raise Refused(400, "unknown fields %s" % sorted(unknown))
        self.identify(body)
        return None

    def trigger_reboot(self, body):
        unknown = set(body) - {"dpuName", "dpuNamespace", "dpuUID", "rebootMethod"}
        if unknown:
            raise Refused(400, "unknown fields %s" % sorted(unknown))
        self.identify(body)
        if body.get("rebootMethod") not in REBOOT_METHODS_TRIGGERED:
            raise Refused(400, "unsupported reboot method %r" % body.get("rebootMethod"))
        self.dpu["status"]["phase"] = "Rebooting"
        return None


def handler_for(agent):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def answer(self, status, payload):
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def serve(self, method):
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            raw = b""
            if self.headers.get("Content-Length"):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
            entry = {"method": method, "path": url.path, "query": {k: v[0] for k, v in query.items()},
                     "at": datetime.utcnow().isoformat() + "Z"}
            with agent.lock:
                try:
                    if url.path == RPM_INDEX and method == "GET":
                        # The host agent's package repository, as far as a
                        # DPU's first look at it goes.
                        entry["status"] = 200
                        entry["phase"] = agent.dpu["status"]["phase"]
                        agent.log(entry)
                        body = b"<repomd/>"
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                        return
                    if url.path not in ROUTES:
                        raise Refused(404, "no route %s" % url.path)
                    if ROUTES[url.path] != method:
                        raise Refused(405, "%s takes %s" % (url.path, ROUTES[url.path]))
                    if url.path == "/healthz":
                        result = None
                    elif url.path == "/get-object":
                        result = agent.get_object(query)
                    else:
                        if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
                            raise Refused(415, "Content-Type must be application/json")
                        try:
                            body = json.loads(raw or b"null")
                        except ValueError as e:
                            raise Refused(400, "body is not JSON: %s" % e)
                        if not isinstance(body, dict):
                            raise Refused(400, "body is not a JSON object")
                        entry["body"] = body
                        result = {
                            "/update-status": agent.update_status,
                            "/configure-host-vfs": agent.configure_host_vfs,
                            "/trigger-reboot": agent.trigger_reboot,
                            "/rebind-host-driver": agent.rebind_host_driver,
                        }[url.path](body)
                    entry["status"] = 200
                except Refused as r:
                    entry["status"] = r.status
                    entry["refused"] = str(r)
                    result = {"error": str(r)}
                entry["phase"] = agent.dpu["status"]["phase"]
                agent.log(entry)
            self.answer(entry["status"], result)

        def do_GET(self):
            self.serve("GET")

        def do_POST(self):
            self.serve("POST")

        def do_PUT(self):
            self.serve("PUT")

    return Handler


class Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bind", required=True, help="address%%scope to listen on")
    p.add_argument("--port", type=int, default=11029)
    p.add_argument("--record", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--uid", required=True)
    p.add_argument("--vfs-marker", help="made when the host is asked for its VFs (omit: never made)")
    a = p.parse_args()
    agent = Agent(a.name, a.namespace, a.uid, a.record, a.vfs_marker)
    host, _, scope = a.bind.partition("%")
    info = socket.getaddrinfo(a.bind, a.port, socket.AF_INET6, socket.SOCK_STREAM)[0]
    server = Server(info[4], handler_for(agent))
    print("host agent stand-in on [%s]:%d (scope %s)" % (host, a.port, scope or "-"), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
