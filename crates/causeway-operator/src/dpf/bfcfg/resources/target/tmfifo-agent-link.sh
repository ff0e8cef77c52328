#!/bin/bash
# Waits, with no time limit, until the host agent answers over tmfifo_net0,
# then records HostAgentConnected on the DPU object.
set -u
CLIENT=/usr/local/bin/dpuagent-client.py
until ping6 -c 1 -W 2 fe80::1%tmfifo_net0 >/dev/null 2>&1 && "$CLIENT" get-object >/dev/null 2>&1; do
  sleep 5
done
/usr/local/bin/bflog.sh "host agent reachable over tmfifo_net0"
"$CLIENT" update-status --condition HostAgentConnected True Connected "the DPU reaches the host agent over tmfifo_net0"
