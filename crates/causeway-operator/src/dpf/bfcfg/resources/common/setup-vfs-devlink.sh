#!/bin/bash
# switchdev: put every ConnectX eswitch in switchdev mode with software
# steering, before the network starts.
# create-vfs: ask the host agent to create the host's VFs until a pcivf
# devlink port shows here, then wait for a default route.
set -u
CLIENT=/usr/local/bin/dpuagent-client.py
LIMIT=1800
RETRY=30
REBIND_AFTER=3
REBIND_EVERY=480

log() { /usr/local/bin/bflog.sh "setup-vfs-devlink: $*"; }

connectx_devices() {
  devlink dev show 2>/dev/null | grep '^pci/' || true
}

switchdev() {
  local dev
  for dev in $(connectx_devices); do
    devlink dev param set "$dev" name flow_steering_mode value smfs cmode runtime 2>/dev/null ||
      log "$dev: could not set smfs steering"
    if ! devlink dev eswitch set "$dev" mode switchdev; then
      log "$dev: could not set switchdev"
      return 1
    fi
  done
}

has_pcivf() {
  devlink port show 2>/dev/null | grep -q 'flavour pcivf'
}

create_vfs() {
  local start failures=0 last_rebind=0 now
  start=$(date +%s)
  # A zero-trust DPU asks the host for nothing: the VFs are the host's
  # business; only the default route is waited for.
  wait_for_vfs=true
  [ "${DPUMode:-trusted}" = zero-trust ] && wait_for_vfs=false
  until [ "$wait_for_vfs" = false ] || has_pcivf; do
    now=$(date +%s)
    if [ $((now - start)) -ge "$LIMIT" ]; then
      log "no host VF after ${LIMIT}s"
      "$CLIENT" send-error VFSetupTimedOut \
        "setup-vfs-devlink (create-vfs): no host VF representor appeared within ${LIMIT}s" || true
      return 1
    fi
    "$CLIENT" configure-host-vfs >/dev/null || log "configure-host-vfs was not taken"
    # A pass that ends without a VF counts, whether or not the call was
    # taken: the host may accept it and still make none.
    failures=$((failures + 1))
    if [ "$failures" -ge "$REBIND_AFTER" ] && [ $((now - last_rebind)) -ge "$REBIND_EVERY" ]; then
      log "asking the host to reload its driver"
      "$CLIENT" rebind-host-driver >/dev/null || true
      last_rebind=$now
      failures=0
    fi
    sleep "$RETRY"
  done
  until ip route show default | grep -q .; do
    if [ $(($(date +%s) - start)) -ge "$LIMIT" ]; then
      log "no default route after ${LIMIT}s"
      return 1
    fi
    sleep 5
  done
}

case "${1:-}" in
  switchdev) switchdev ;;
  create-vfs) create_vfs ;;
  *)
    echo "usage: $0 switchdev|create-vfs" >&2
    exit 2
    ;;
esac
