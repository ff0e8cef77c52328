#!/bin/bash
# Reports each physical port's link state on the DPU object when it changes.
set -u
CLIENT=/usr/local/bin/dpuagent-client.py
INTERVAL=30

physical_ports() {
  local ports
  ports=$(devlink port show 2>/dev/null | grep 'flavour physical' | grep -o 'netdev [^ ]*' | cut -d' ' -f2)
  if [ -z "$ports" ]; then
    ports=$(cd /sys/class/net && ls -d p[0-9]* 2>/dev/null)
  fi
  echo "$ports"
}

declare -A last
while true; do
  i=0
  for port in $(physical_ports); do
    state=$(cat "/sys/class/net/$port/operstate" 2>/dev/null || echo unknown)
    if [ "${last[$port]:-}" != "$state" ]; then
      "$CLIENT" update-pf-status "PF${i}" "$state" "$port" "PF${i} interface $port operstate is $state" &&
        last[$port]=$state
    fi
    i=$((i + 1))
  done
  sleep "$INTERVAL"
done
