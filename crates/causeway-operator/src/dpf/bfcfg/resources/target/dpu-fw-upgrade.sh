#!/bin/bash
# Brings the DPU's firmware to what the installed DOCA runtime ships: ATF and
# UEFI, the NIC firmware, then the BMC and CEC. Done once per DOCA version.
set -u
CLIENT=/usr/local/bin/dpuagent-client.py
STAMP=/var/dpf/fw-installed-version
BFB=/opt/mellanox/bfb
IPMI_USER_ID=8

log() { /usr/local/bin/bflog.sh "dpu-fw-upgrade: $*"; }
# A zero-trust DPU reports nothing to the host agent.
trusted=true
[ "${DPUMode:-trusted}" = zero-trust ] && trusted=false
condition() { [ "$trusted" = false ] || "$CLIENT" update-condition "$@" || true; }
fail() {
  log "$*"
  [ "$trusted" = false ] || "$CLIENT" send-error FirmwareUpgradeFailed "$*" || true
  exit 1
}

version=$(rpm -q --qf '%{VERSION}-%{RELEASE}' doca-runtime 2>/dev/null) || version=""
[ -n "$version" ] || fail "doca-runtime is not installed"
if [ "$(cat "$STAMP" 2>/dev/null)" = "$version" ]; then
  log "firmware already at $version"
  exit 0
fi

# Under Secure Boot mstflint reaches the NIC through its fwctl device.
device_for() {
  local pci=$1 ctl
  if mokutil --sb-state 2>/dev/null | grep -q enabled; then
    for ctl in /sys/class/fwctl/fwctl*; do
      if [ "$(basename "$(readlink -f "$ctl/device")")" = "$pci" ]; then
        echo "/dev/fwctl/$(basename "$ctl")"
        return
      fi
    done
  fi
  echo "$pci"
}

cleanup() {
  ipmitool user set name "$IPMI_USER_ID" "" >/dev/null 2>&1 || true
  ip link del vlan4040 >/dev/null 2>&1 || true
}
trap cleanup EXIT

start=$(date +%s)
condition NICFirmwareUpgraded False Upgrading "upgrading ATF/UEFI and NIC firmware to $version"
if [ -x "$BFB/bfb-atf-uefi-update" ]; then
  "$BFB/bfb-atf-uefi-update" || fail "ATF/UEFI update failed"
fi
pci=$(lspci -D -d 15b3: 2>/dev/null | awk 'NR==1 {print $1}')
[ -n "$pci" ] || fail "no ConnectX device"
dev=$(device_for "$pci")
psid=$(mstflint -d "$dev" query 2>/dev/null | awk -F: '/PSID/ {gsub(/ /, "", $2); print $2}')
image=$(find /opt/mellanox/mlnx-fw-updater/firmware -name "*${psid}*.bin" 2>/dev/null | head -n 1)
if [ -n "$image" ]; then
  mstflint -y -d "$dev" -i "$image" burn || fail "NIC firmware burn failed for PSID $psid"
fi
condition NICFirmwareUpgraded True Upgraded "NIC firmware upgrade completed in $(($(date +%s) - start))s"

bmc_start=$(date +%s)
condition BMCFirmwareUpgraded False Upgrading "upgrading BMC and CEC firmware"
if [ -x "$BFB/bfb-bmc-update" ] && ip link add link oob_net0 name vlan4040 type vlan id 4040 2>/dev/null; then
  password=$(head -c 18 /dev/urandom | base64)
  ipmitool user set name "$IPMI_USER_ID" dpfupgrade >/dev/null 2>&1
  ipmitool user set password "$IPMI_USER_ID" "$password" >/dev/null 2>&1
  ipmitool user enable "$IPMI_USER_ID" >/dev/null 2>&1
  if "$BFB/bfb-bmc-update" --user dpfupgrade --password "$password"; then
    condition BMCFirmwareUpgraded True Upgraded "BMC firmware upgrade completed in $(($(date +%s) - bmc_start))s"
  else
    condition BMCFirmwareUpgraded False Failed "BMC firmware upgrade failed"
  fi
else
  condition BMCFirmwareUpgraded False Failed "no BMC update helper or no vlan4040"
fi

mkdir -p "$(dirname "$STAMP")"
echo "$version" > "$STAMP"
log "firmware at $version"
