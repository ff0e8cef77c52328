#!/usr/bin/env bash
# shellcheck disable=SC2016  # stub bodies expand when the stubs run
# Runs DPU boot units, as unpacked from a generated template, against the
# host-agent stand-in, the way systemd on the DPU would run them.
#
#   tests/dpf/boot-lab.sh ROOT OUT NAME NAMESPACE UID UNIT...
#
# ROOT holds what the template's ignition writes (files at their paths,
# units under /etc/systemd/system). Two network namespaces stand for the
# DPU and the host, joined by a veth whose DPU end is tmfifo_net0 with
# fe80::2 and whose host end carries fe80::1, where the stand-in listens
# on port 11029 as DPF's host agent does. Each UNIT's ExecStart runs in
# the DPU namespace, chrooted into ROOT (the host's /usr bound under it,
# a private /dev, /proc and /tmp), with the environment its
# EnvironmentFile= lines give, one after another, each bounded by
# UNIT_TIMEOUT seconds (default 60).
#
# Hardware tools are stubs that record their arguments in OUT/stubs.log:
# mokutil, modprobe, udevadm, lspci, mstconfig, coreos-installer,
# efibootmgr, reboot, rpm-ostree, dnf, rpm2cpio, restorecon, devlink, rpm,
# mstflint, ipmitool, and ip for the BMC's VLAN only. `sleep`
# is shortened to 0.05 s. Their answers follow LAB_* variables:
#   LAB_NVCONFIG=ok|change   whether the NIC's NVConfig already fits
#   LAB_INSTALL=ok|fail      whether coreos-installer succeeds
#   LAB_PORTS="p0=up p1=down"  the DPU's physical ports: each a veth in the
#                            DPU namespace, its link up or down, and listed
#                            by the `devlink` stub as a physical port
#   LAB_HOST_VFS=made|never  whether the host makes its VFs when asked
#                            (configure-host-vfs): `devlink` lists a pcivf
#                            port once it has
#   LAB_DOCA=VERSION         the installed doca-runtime (rpm -q): with it the
#                            BFB's firmware tools (/opt/mellanox/bfb, a NIC
#                            image for the PSID mstflint reports) and an
#                            oob_net0 for the BMC's VLAN are there; mstflint,
#                            ipmitool and the BFB tools are stubs
# The DPU namespace has an IPv4 default route (the DPU's, by DHCP, on a
# real one).
#
# OUT gets calls.jsonl (every request the stand-in saw), stubs.log,
# UNIT.log (each unit's output) and UNIT.rc (its exit status; 124 when
# it was still running at its bound). Needs root.
set -euo pipefail

ROOT=$(realpath "$1")
OUT=$(realpath "$2")
DPU_NAME=$3
DPU_NAMESPACE=$4
DPU_UID=$5
shift 5
UNITS=("$@")
HERE=$(dirname "$(realpath "$0")")
UNIT_TIMEOUT=${UNIT_TIMEOUT:-60}

tag=$$
dpu_ns="cw-dpu-$tag"
host_ns="cw-host-$tag"
agent_pid=""
cleanup() {
  local status=$?
  if [ -n "$agent_pid" ]; then
    kill "$agent_pid" 2>/dev/null || true
    wait "$agent_pid" 2>/dev/null || true
  fi
  ip netns del "$dpu_ns" 2>/dev/null || true
  ip netns del "$host_ns" 2>/dev/null || true
  exit "$status"
}
trap cleanup EXIT

mkdir -p "$OUT"
: > "$OUT/calls.jsonl"
: > "$OUT/stubs.log"

ip netns add "$dpu_ns"
ip netns add "$host_ns"
ip link add tmfifo_net0 netns "$dpu_ns" type veth peer name tmfifo_host netns "$host_ns"
ip -n "$dpu_ns" link set lo up
ip -n "$host_ns" link set lo up
ip -n "$dpu_ns" addr add fe80::2/64 dev tmfifo_net0 nodad
ip -n "$host_ns" addr add fe80::1/64 dev tmfifo_host nodad
ip -n "$dpu_ns" link set tmfifo_net0 up
ip -n "$host_ns" link set tmfifo_host up
ip -n "$dpu_ns" route add default dev tmfifo_net0
if [ -n "${LAB_DOCA:-}" ]; then
  ip -n "$dpu_ns" link add oob_net0 type veth peer name oob-wire
  ip -n "$dpu_ns" link set oob-wire up
  ip -n "$dpu_ns" link set oob_net0 up
fi
# The physical ports: a veth whose far end is up carries the link.
for port in ${LAB_PORTS:-}; do
  name=${port%%=*}
  ip -n "$dpu_ns" link add "$name" type veth peer name "$name-wire"
  if [ "${port#*=}" = up ]; then
    ip -n "$dpu_ns" link set "$name-wire" up
    ip -n "$dpu_ns" link set "$name" up
  fi
done

vfs=()
[ "${LAB_HOST_VFS:-made}" = never ] || vfs=(--vfs-marker "$ROOT/lab-host-vfs")
rm -f "$ROOT/lab-host-vfs"
ip netns exec "$host_ns" python3 "$HERE/host-agent.py" --bind 'fe80::1%tmfifo_host' \
  --record "$OUT/calls.jsonl" --name "$DPU_NAME" --namespace "$DPU_NAMESPACE" --uid "$DPU_UID" \
  "${vfs[@]}" > "$OUT/host-agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 1 100); do
  if ip netns exec "$host_ns" curl -s -o /dev/null --max-time 1 'http://[fe80::1%25tmfifo_host]:11029/healthz'; then
    break
  fi
  sleep 0.1
done
# The stand-in's own readiness probe is not the DPU's business.
: > "$OUT/calls.jsonl"

# The stubs, inside the root so the chrooted units find them first; their
# record is this run's alone.
stubs="$ROOT/lab-stubs"
mkdir -p "$stubs"
: > "$ROOT/lab-stubs.log"
stub() {
  local name=$1 body=$2
  printf '#!/bin/bash\necho "%s $*" >> /lab-stubs.log\n%s\n' "$name" "$body" > "$stubs/$name"
  chmod 0755 "$stubs/$name"
}
stub mokutil 'echo "SecureBoot disabled"'
stub modprobe 'exit 0'
stub udevadm 'exit 0'
stub restorecon 'exit 0'
stub lspci 'case " $* " in *" -D"*) p=0000: ;; *) p= ;; esac
echo "${p}03:00.0 Ethernet controller: Mellanox Technologies MT43244 BlueField-3 integrated ConnectX-7 network controller (rev 01)"
echo "${p}03:00.1 Ethernet controller: Mellanox Technologies MT43244 BlueField-3 integrated ConnectX-7 network controller (rev 01)"'
# mstconfig: with -e the Default, Current and Next Boot columns; without,
# the Next Boot one. LAB_NVCONFIG=change reports a NIC without SR-IOV.
cat > "$stubs/mstconfig" <<'STUB'
#!/bin/bash
echo "mstconfig $*" >> /lab-stubs.log
case " $* " in *" set "*|*" reset "*|*" reset") exit 0 ;; esac
if [ "${LAB_NVCONFIG:-ok}" = change ]; then sriov="True(1)"; valid="True(1)"; vfs=0; else sriov="True(1)"; valid="False(0)"; vfs=1; fi
echo "Configurations:                              Default         Current         Next Boot"
while read -r name default current; do
  case " $* " in
    *" -e "*) printf '         %-40s %-15s %-15s %s\n' "$name" "$default" "$current" "$current" ;;
    *) printf '         %-40s %s\n' "$name" "$current" ;;
  esac
done <<ROWS
SRIOV_EN False(0) $sriov
NUM_OF_VFS 0 $vfs
PF_NUM_OF_VF_VALID False(0) $valid
ROWS
STUB
chmod 0755 "$stubs/mstconfig"
stub coreos-installer '[ "${LAB_INSTALL:-ok}" = ok ] || { echo "coreos-installer: error: writing /dev/nvme0n1: I/O error" >&2; exit 1; }'
stub efibootmgr 'exit 0'
stub reboot 'exit 0'
# The installed system boots the image its MachineConfig names (the
# machine-config daemon's first-boot rebase), read from the template.
stub rpm-ostree 'image=$(jq -r .spec.osImageURL /etc/ignition-machine-config-encapsulated.json) && echo "{\"deployments\":[{\"booted\":true,\"container-image-reference\":\"ostree-unverified-registry:$image\"}]}"'
stub sleep 'exec /usr/bin/sleep 0.05'
stub rpm 'case "$*" in *doca-runtime*) [ -n "${LAB_DOCA:-}" ] && printf %s "$LAB_DOCA" ;; *) exit 1 ;; esac'
stub mstflint 'case " $* " in *" query "*) echo "PSID:                  MT_0000000884" ;; esac'
stub ipmitool 'exit 0'
# The BMC's VLAN: this kernel may have no 802.1Q support, so adding and
# deleting vlan4040 on oob_net0 are recorded, not made; anything else is ip.
real_ip=$(command -v ip)
stub ip 'case "$*" in
  "link add link oob_net0 name vlan4040 type vlan id 4040") [ -e /sys/class/net/oob_net0 ] ;;
  "link del vlan4040") exit 0 ;;
  *) exec '"$real_ip"' "$@" ;;
esac'
if [ -n "${LAB_DOCA:-}" ]; then
  mkdir -p "$ROOT/opt/mellanox/bfb" "$ROOT/opt/mellanox/mlnx-fw-updater/firmware"
  : > "$ROOT/opt/mellanox/mlnx-fw-updater/firmware/fw-ConnectX7-rel-MT_0000000884.bin"
  for tool in bfb-atf-uefi-update bfb-bmc-update; do
    printf '#!/bin/bash\necho "%s $*" >> /lab-stubs.log\n' "$tool" > "$ROOT/opt/mellanox/bfb/$tool"
    chmod 0755 "$ROOT/opt/mellanox/bfb/$tool"
  done
fi
stub devlink 'case "$1 $2" in
  "dev show") echo "pci/0000:03:00.0" ;;
  "port show")
    n=0; for port in ${LAB_PORTS:-}; do echo "pci/0000:03:00.$n/65535: type eth netdev ${port%%=*} flavour physical port $n splittable false"; n=$((n + 1)); done
    [ ! -e /lab-host-vfs ] || echo "pci/0000:03:00.0/1: type eth netdev pf0hpf flavour pcivf controller 1 pfnum 0 vfnum 0 external true splittable false" ;;
esac'
# dnf "downloads" a package into the working directory; rpm2cpio unpacks
# a payload with the agent binary, as the real package carries it.
stub dnf 'touch dpu-agent-1.0-1.aarch64.rpm'
mkdir -p "$ROOT/lab-payload/opt/dpf"
printf '#!/bin/sh\necho dpu-agent\n' > "$ROOT/lab-payload/opt/dpf/dpuagent"
stub rpm2cpio 'cd /lab-payload && echo opt/dpf/dpuagent | cpio -o -H newc 2>/dev/null'

# The chroot: the host's /usr read-only under the unpacked files, a
# private /dev with a block device where the DPU's disk is.
inner=$(cat <<'INNER'
set -eu
R=$1
[ -d "$R/.usr-local" ] || mv "$R/usr/local" "$R/.usr-local"
mkdir -p "$R/usr" "$R/usr/local" "$R/proc" "$R/sys" "$R/dev" "$R/tmp" "$R/run" "$R/root" "$R/var"
mount --bind /usr "$R/usr"
mount -o remount,bind,ro "$R/usr"
mount -t tmpfs tmpfs "$R/usr/local"
cp -a "$R/.usr-local/." "$R/usr/local/"
for d in bin sbin lib lib64; do
  [ -e "$R/$d" ] || ln -s "usr/$d" "$R/$d"
done
# Debian's awk and friends are alternatives symlinks through /etc.
mkdir -p "$R/etc/alternatives"
mount --bind /etc/alternatives "$R/etc/alternatives"
mount -t proc proc "$R/proc"
mount --bind /sys "$R/sys"
mount -t tmpfs tmpfs "$R/dev"
mknod -m 666 "$R/dev/null" c 1 3
mknod -m 666 "$R/dev/zero" c 1 5
mknod -m 666 "$R/dev/urandom" c 1 9
mknod -m 666 "$R/dev/random" c 1 8
mknod -m 660 "$R/dev/nvme0n1" b 7 200
: > "$R/dev/kmsg"
mount -t tmpfs tmpfs "$R/tmp"
mount -t tmpfs tmpfs "$R/run"
[ -f "$R/etc/passwd" ] || echo "root:x:0:0:root:/root:/bin/bash" > "$R/etc/passwd"
[ -f "$R/etc/group" ] || echo "root:x:0:" > "$R/etc/group"
shift
exec chroot "$R" /usr/bin/env -i PATH=/lab-stubs:/usr/local/bin:/usr/bin:/usr/sbin HOME=/root \
  LAB_NVCONFIG="${LAB_NVCONFIG:-ok}" LAB_INSTALL="${LAB_INSTALL:-ok}" LAB_PORTS="${LAB_PORTS:-}" LAB_DOCA="${LAB_DOCA:-}" /bin/bash -c "$1"
INNER
)

for unit in "${UNITS[@]}"; do
  file="$ROOT/etc/systemd/system/$unit"
  [ -f "$file" ] || { echo "boot-lab: no unit $unit in the template" >&2; exit 2; }
  # What systemd would do: each EnvironmentFile= (a leading "-" makes it
  # optional), then ExecStart.
  run="set -a"
  while IFS= read -r f; do
    case $f in -*) run="$run; [ ! -f ${f#-} ] || . ${f#-}" ;; *) run="$run; . $f" ;; esac
  done < <(sed -n 's/^EnvironmentFile=//p' "$file")
  exec_start=$(sed -n 's/^ExecStart=//p' "$file" | tail -n 1)
  run="$run; set +a; exec $exec_start"
  rc=0
  # Its own session: at the bound, timeout signals its whole process group.
  setsid --wait timeout "$UNIT_TIMEOUT" ip netns exec "$dpu_ns" unshare --mount --propagation private \
    bash -c "$inner" inner "$ROOT" "$run" > "$OUT/$unit.log" 2>&1 || rc=$?
  echo "$rc" > "$OUT/$unit.rc"
done
cp "$ROOT/lab-stubs.log" "$OUT/stubs.log" 2>/dev/null || true
