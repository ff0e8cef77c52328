#!/bin/bash
# Installs the hosted cluster's RHCOS onto the DPU's NVMe disk from the live
# system DPF booted, with the target ignition this template carries.
set -u
CLIENT=/usr/local/bin/dpuagent-client.py
DISK=/dev/nvme0n1
TARGET=/var/target.ign
FLAVOR=/etc/dpf/dpuflavor.json
KARGS="console=hvc0 console=ttyAMA0 earlycon=pl011,0x13010000 ignore_loglevel"

log() { /usr/local/bin/bflog.sh "install-rhcos-dpf: $*"; echo "$*"; }
fail() {
  local reason=$1
  shift
  log "$*"
  "$CLIENT" update-status --condition InstallError True "$reason" "$*" || true
  exit 1
}

if mokutil --sb-state 2>/dev/null | grep -q enabled; then
  modprobe fwctl || true
  modprobe mlx5_fwctl || true
fi
# The host's mlx5 driver needs time to come back after the BFB push.
sleep 60

[ -b "$DISK" ] || fail Hardware "no disk $DISK"
lspci -d 15b3: 2>/dev/null | grep -q . || fail Hardware "no ConnectX device"
# shellcheck source=/dev/null
. /etc/dpf/environment || fail Ignition "no /etc/dpf/environment"
if [ -z "${DPUName:-}" ] || [ -z "${DPUNamespace:-}" ] || [ -z "${DPUUID:-}" ]; then
  fail Ignition "the DPU's name, namespace or UID is missing"
fi
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$TARGET" ||
  fail Ignition "$TARGET is not JSON"
/usr/local/bin/update_ignition.py "$TARGET" || fail Ignition "cannot add the DPU's identity to $TARGET"

"$CLIENT" update-status --condition RebootMethodDiscovery True SystemLevelReset \
  "the DPU is reset with a system-level reset" || true

flavor() { python3 -c "$1" "$FLAVOR" 2>/dev/null; }
want_vfs=$(flavor 'import json, re, sys
f = json.load(open(sys.argv[1])).get("spec", {})
for n in f.get("nvconfig") or []:
    for p in n.get("parameters") or []:
        m = re.match(r"NUM_OF_VFS=(\d+)", p)
        if m:
            print(m.group(1)); sys.exit()
print(1)')
want_vfs=${want_vfs:-1}
flavor_kargs=$(flavor 'import json, sys
print(" ".join(json.load(open(sys.argv[1])).get("spec", {}).get("grub", {}).get("kernelParameters") or []))')

nvconfig_changed=false
for dev in $(lspci -D -d 15b3: 2>/dev/null | awk '$0 ~ /function 0|\.0 / {print $1}'); do
  q=$(mstconfig -d "$dev" query 2>/dev/null) || fail NVConfig "mstconfig query $dev failed"
  if echo "$q" | grep -Eq 'PF_NUM_OF_VF_VALID +True' || ! echo "$q" | grep -Eq 'SRIOV_EN +True'; then
    mstconfig -y -d "$dev" reset >/dev/null || fail NVConfig "mstconfig reset $dev failed"
    mstconfig -y -d "$dev" set SRIOV_EN=1 PF_NUM_OF_VF_VALID=0 >/dev/null ||
      fail NVConfig "mstconfig set SRIOV_EN $dev failed"
    nvconfig_changed=true
  fi
  have_vfs=$(echo "$q" | awk '$1 == "NUM_OF_VFS" {print $2}')
  if [ "$have_vfs" != "$want_vfs" ]; then
    mstconfig -y -d "$dev" set NUM_OF_VFS="$want_vfs" >/dev/null ||
      fail NVConfig "mstconfig set NUM_OF_VFS $dev failed"
    nvconfig_changed=true
  fi
done

kargs=()
for k in $KARGS $flavor_kargs; do
  case " ${kargs[*]} " in *" $k "*) ;; *) kargs+=("--append-karg" "$k") ;; esac
done
coreos-installer install --offline "$DISK" --ignition-file "$TARGET" "${kargs[@]}" ||
  fail RHCOSInstallation "coreos-installer failed"

for entry in $(efibootmgr | awk '/Red-Hat CoreOS GRUB/ {print substr($1, 5, 4)}'); do
  efibootmgr -b "$entry" -B >/dev/null || true
done
efibootmgr -c -d "$DISK" -p 2 -l '\EFI\redhat\shimaa64.efi' -L "Red-Hat CoreOS GRUB" >/dev/null ||
  fail RHCOSInstallation "cannot create the EFI boot entry"

/usr/local/bin/bfupsignal.sh
"$CLIENT" update-status --field "phase=OSInstalled" || true
if command -v update-time >/dev/null; then update-time || true; fi
until [ "$("$CLIENT" phase 2>/dev/null)" = "DPU Config" ]; do sleep 10; done
if [ "$nvconfig_changed" = true ]; then
  log "NVConfig changed: asking the host for a power cycle"
  while true; do
    "$CLIENT" trigger-reboot PowerCycle || true
    sleep 60
  done
fi
log "installed; rebooting"
