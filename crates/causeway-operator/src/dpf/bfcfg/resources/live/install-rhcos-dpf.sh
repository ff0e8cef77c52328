#!/bin/bash
# Installs the hosted cluster's RHCOS onto the DPU's NVMe disk from the live
# system DPF booted, with the target ignition this template carries, and
# reports each step to DPF's host agent: the reboot method, the NVConfig,
# the start time; then waits for DPF to configure the DPU and reboots into
# the installed system (or, when NVConfig changed, asks the host for the
# power cycle that applies it). The unit loads the DPU's identity from
# /etc/dpf/environment. A zero-trust DPU (DPUMode=zero-trust) does not
# trust the host: it installs and reboots without a word to the host agent.
set -u
CLIENT=/usr/local/bin/dpuagent-client.py
DISK=/dev/nvme0n1
TARGET=/var/target.ign
FLAVOR=/etc/dpf/dpuflavor.json
HOST_AGENT='http://[fe80::1%25tmfifo_net0]:11029'
KARGS="console=hvc0 console=ttyAMA0 earlycon=pl011,0x13010000 ignore_loglevel"
# How long a report is retried while the host agent does not take it; past
# that the install stops without rebooting, for someone to look.
AGENT_PATIENCE=300

log() {
  echo "$*"
  echo "install-rhcos-dpf: $*" > /dev/kmsg 2>/dev/null || true
  /usr/local/bin/bflog.sh "install-rhcos-dpf: $*"
}

# A call to the host agent, retried every 5 s for AGENT_PATIENCE seconds.
agent() {
  local waited=0
  until "$CLIENT" "$@"; do
    if [ "$waited" -ge "$AGENT_PATIENCE" ]; then
      log "the host agent did not take '$1' within ${AGENT_PATIENCE}s; stopping"
      exit 1
    fi
    sleep 5
    waited=$((waited + 5))
  done
}

zero_trust=false
[ "${DPUMode:-trusted}" = zero-trust ] && zero_trust=true

fail() {
  local reason=$1
  shift
  log "error ($reason): $*"
  [ "$zero_trust" = true ] || agent send-error "$reason" "$*"
  exit 1
}

# Under Secure Boot mstconfig reaches the NIC through fwctl, not PCI.
secure_boot=false
if mokutil --sb-state 2>/dev/null | grep -q "SecureBoot enabled"; then
  secure_boot=true
  modprobe fwctl || true
  modprobe mlx5_fwctl || true
  udevadm settle || true
  for _ in 1 2 3 4 5; do
    compgen -G '/dev/fwctl/fwctl*' >/dev/null && break
    sleep 1
  done
fi
nic_devices() {
  if [ "$secure_boot" = true ]; then
    compgen -G '/dev/fwctl/fwctl*' || true
  else
    lspci -D -d 15b3: 2>/dev/null | grep ConnectX | awk '{print $1}'
  fi
}

# The host's mlx5 driver reports errors for a minute after the BFB push.
sleep 60

[ -b "$DISK" ] || fail Hardware "no disk $DISK"
devices=$(nic_devices)
[ -n "$devices" ] || fail Hardware "no ConnectX device"
if [ -z "${DPUName:-}" ] || [ -z "${DPUNamespace:-}" ] || [ -z "${DPUUID:-}" ]; then
  fail Ignition "the DPU's name, namespace or UID is missing from /etc/dpf/environment"
fi
jq -e . "$TARGET" >/dev/null 2>&1 || fail Ignition "$TARGET is not JSON"
/usr/local/bin/update_ignition.py "$TARGET" || fail Ignition "cannot add the DPU's identity to $TARGET"

if [ "$zero_trust" = false ]; then
  # Any HTTP answer on / means the host agent is up (it routes no root).
  until ping -6 -c 1 -W 1 fe80::1%tmfifo_net0 >/dev/null 2>&1; do sleep 1; done
  until curl -s -o /dev/null --max-time 5 "$HOST_AGENT/"; do sleep 1; done
  log "host agent reachable"
  agent update-reboot-method-discovery
fi

flavor() { jq -r "$1" "$FLAVOR" 2>/dev/null; }
want_vfs=$(flavor '[.spec.nvconfig[]?.parameters[]? | capture("^NUM_OF_VFS=(?<n>[0-9]+)$").n] | first // "1"')
want_vfs=${want_vfs:-1}
flavor_kargs=$(flavor '.spec.grub.kernelParameters // [] | join(" ")')

# The current value of each setting: the column before Next Boot.
current() { echo "$1" | awk -v k="$2" '$1 == k {print $(NF - 1)}'; }
nvconfig_changed=false
for dev in $devices; do
  q=$(mstconfig -d "$dev" -e q SRIOV_EN NUM_OF_VFS PF_NUM_OF_VF_VALID 2>/dev/null) ||
    fail NVConfig "mstconfig query of $dev failed"
  if [ "$(current "$q" PF_NUM_OF_VF_VALID)" = "True(1)" ] || [ "$(current "$q" SRIOV_EN)" != "True(1)" ]; then
    mstconfig -d "$dev" -y reset >/dev/null || fail NVConfig "mstconfig reset of $dev failed"
    mstconfig -d "$dev" -y set SRIOV_EN=1 PF_NUM_OF_VF_VALID=0 >/dev/null ||
      fail NVConfig "enabling SR-IOV on $dev failed"
    nvconfig_changed=true
    q=$(mstconfig -d "$dev" -e q SRIOV_EN NUM_OF_VFS PF_NUM_OF_VF_VALID 2>/dev/null) ||
      fail NVConfig "mstconfig query of $dev failed"
  fi
  if [ "$(current "$q" NUM_OF_VFS)" != "$want_vfs" ]; then
    mstconfig -d "$dev" -y set NUM_OF_VFS="$want_vfs" >/dev/null ||
      fail NVConfig "setting NUM_OF_VFS=$want_vfs on $dev failed"
    nvconfig_changed=true
  fi
done

# One karg string: the defaults, then the flavor's, each once.
kargs=""
for k in $KARGS $flavor_kargs; do
  case " $kargs " in *" $k "*) ;; *) kargs="${kargs:+$kargs }$k" ;; esac
done
coreos-installer install "$DISK" --append-karg "$kargs" --ignition-file "$TARGET" --offline ||
  fail RHCOSInstallation "coreos-installer failed"

for entry in $(efibootmgr | awk '/Red-Hat CoreOS GRUB/ {print substr($1, 5, 4)}'); do
  efibootmgr -b "$entry" -B >/dev/null || true
done
efibootmgr -c -d "$DISK" -p 2 -l '\EFI\redhat\shimaa64.efi' -L "Red-Hat CoreOS GRUB" >/dev/null ||
  fail RHCOSInstallation "cannot create the EFI boot entry"
sync

if [ "$zero_trust" = true ]; then
  log "installed (zero-trust); rebooting into the installed system"
  sleep 10
  reboot
  exit 0
fi
/usr/local/bin/bfupsignal.sh
agent update-time
log "installed; waiting for DPF to configure the DPU"
until [ "$("$CLIENT" get-dpu-phase 2>/dev/null)" = "DPU Config" ]; do sleep 5; done
if [ "$nvconfig_changed" = true ]; then
  # Only a power cycle from the host applies a new NVConfig.
  log "NVConfig changed: asking the host for a power cycle"
  while true; do
    "$CLIENT" trigger-reboot PowerCycle || true
    sleep 60
  done
fi
log "rebooting into the installed system"
sleep 10
reboot
