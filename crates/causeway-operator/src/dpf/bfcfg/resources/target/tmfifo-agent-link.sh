#!/bin/bash
# Waits, with no time limit, until the host agent answers over tmfifo_net0
# (any HTTP answer on /: it routes no root), then records HostAgentConnected
# on the DPU object. A failed report does not fail the unit, which the
# host-agent units require.
set -u
CLIENT=/usr/local/bin/dpuagent-client.py
HOST_AGENT='http://[fe80::1%25tmfifo_net0]:11029'

log() { echo "$*"; /usr/local/bin/bflog.sh "tmfifo-agent-link: $*"; }

# A zero-trust DPU does not talk to the host agent.
[ "${DPUMode:-trusted}" = zero-trust ] && exit 0

until ping -6 -c 1 -W 2 fe80::1%tmfifo_net0 >/dev/null 2>&1; do sleep 5; done
until curl -s -o /dev/null --connect-timeout 5 --max-time 10 "$HOST_AGENT/"; do sleep 5; done
log "host agent reachable over tmfifo_net0"
"$CLIENT" update-condition HostAgentConnected True Connected "Host agent reachable via tmfifo_net0" ||
  log "HostAgentConnected was not recorded"
exit 0
