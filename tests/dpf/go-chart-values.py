#!/usr/bin/env python3
"""Reduces the Go DPF-HCP provisioner operator's chart values to the facts
the chart checks and the migration test use: every key with its default,
as data (the file's comments left out).

    git -C <clone of rh-ecosystem-edge/dpf-hcp-provisioner-operator> show \
        release-4.22:helm/dpf-hcp-provisioner-operator/values.yaml > v.yaml
    tests/dpf/go-chart-values.py "release-4.22 <commit>" v.yaml \
        > tests/dpf/fixtures/go-chart-values.yaml

The output is a values file helm reads as it is (`-f`), its source in a
comment on the first line.
"""
import sys

import yaml


def main(source, path):
    with open(path) as fh:
        values = yaml.safe_load(fh)
    sys.stdout.write(f"# The Go chart's values at {source}: every key and default, as data.\n")
    yaml.safe_dump(values, sys.stdout, sort_keys=True, default_flow_style=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
