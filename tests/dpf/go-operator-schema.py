#!/usr/bin/env python3
"""Reduces the Go DPF-HCP provisioner operator's CRDs to the facts the
migration test checks causeway's CRDs against: every field's path, type,
format, enum and default (no descriptions).

    git -C <clone of rh-ecosystem-edge/dpf-hcp-provisioner-operator> show \
        release-4.22:config/crd/bases/provisioning.dpu.hcp.io_dpfhcpprovisioners.yaml > p.yaml
    (the same for ..._dpfhcpprovisionerconfigs.yaml > c.yaml)
    tests/dpf/go-operator-schema.py "release-4.22 <commit>" p.yaml c.yaml \
        > crates/causeway-operator/tests/fixtures/go-operator-schema.json
"""
import json
import sys

import yaml

FACTS = ("type", "format", "enum", "default")


def paths(schema, prefix, out):
    out[prefix or "."] = {k: schema[k] for k in FACTS if k in schema}
    for name, sub in sorted((schema.get("properties") or {}).items()):
        paths(sub, prefix + "." + name, out)
    if isinstance(schema.get("items"), dict):
        paths(schema["items"], prefix + "[]", out)
    if isinstance(schema.get("additionalProperties"), dict):
        paths(schema["additionalProperties"], prefix + "{}", out)
    return out


def main(source, *files):
    kinds = {}
    for f in files:
        with open(f) as fh:
            crd = yaml.safe_load(fh)
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        all_paths = paths(version["schema"]["openAPIV3Schema"], "", {})
        names = crd["spec"]["names"]
        kinds[names["kind"]] = {
            "group": crd["spec"]["group"],
            "names": {k: names[k] for k in ("plural", "singular", "listKind", "shortNames") if k in names},
            "version": version["name"],
            "scope": crd["spec"]["scope"],
            "statusSubresource": "status" in (version.get("subresources") or {}),
            "paths": {p: f for p, f in all_paths.items() if p.startswith((".spec", ".status"))},
        }
    json.dump({"source": source, "kinds": kinds}, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main(*sys.argv[1:])
