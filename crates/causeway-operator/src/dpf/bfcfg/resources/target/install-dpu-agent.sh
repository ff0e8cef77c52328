#!/bin/bash
# Installs dpu-agent once: from the host agent's package repository over
# tmfifo_net0 (trusted), or from DPF's BFB registry over the OOB network
# (zero-trust, BFBRegistryURL from /etc/dpf/bfb-registry).
set -u
BIN=/usr/local/bin/dpu-agent
CLIENT=/usr/local/bin/dpuagent-client.py
WAIT=900
ZT_WAIT=300

[ -f "$BIN" ] && exit 0
zero_trust=false
[ "${DPUMode:-trusted}" = zero-trust ] && zero_trust=true

fail() {
  /usr/local/bin/bflog.sh "install-dpu-agent: $*"
  [ "$zero_trust" = true ] || "$CLIENT" send-error DPUAgentInstallFailed "$*" || true
  exit 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || fail "cannot enter $work"
start=$(date +%s)
if [ "$zero_trust" = true ]; then
  url=${BFBRegistryURL:-}
  [ -n "$url" ] || fail "BFBRegistryURL is not set (/etc/dpf/bfb-registry)"
  until curl -sf --max-time 5 -o /dev/null "$url/rpm/repodata/repomd.xml"; do
    [ $(($(date +%s) - start)) -ge "$ZT_WAIT" ] && fail "the BFB registry $url did not answer within ${ZT_WAIT}s"
    sleep 5
  done
  dnf download dpu-agent --disablerepo='*' --repofrompath="zt-agentrepo,$url/rpm/" ||
    fail "dpu-agent could not be downloaded from $url"
else
  until ping -6 -c 1 -W 1 fe80::1%tmfifo_net0 >/dev/null 2>&1; do
    [ $(($(date +%s) - start)) -ge "$WAIT" ] && fail "the host agent did not answer within ${WAIT}s"
    sleep 1
  done
  dnf download dpu-agent --disablerepo='*' --enablerepo=agentrepo ||
    fail "dpu-agent could not be downloaded from the host agent"
fi
rpm=$(find "$work" -maxdepth 1 -name 'dpu-agent*.rpm' | head -n 1)
[ -n "$rpm" ] || fail "no dpu-agent package downloaded"
rpm2cpio "$rpm" | cpio -idm --no-absolute-filenames || fail "cannot unpack $rpm"
[ -f opt/dpf/dpuagent ] || fail "$rpm has no opt/dpf/dpuagent"
mv opt/dpf/dpuagent "$BIN" || fail "cannot install $BIN"
chmod 0755 "$BIN"
restorecon "$BIN" 2>/dev/null || true
/usr/local/bin/bflog.sh "dpu-agent installed"
