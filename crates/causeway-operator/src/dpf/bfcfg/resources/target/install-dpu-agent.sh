#!/bin/bash
# Installs dpu-agent from the host agent's package repository, once.
set -u
BIN=/usr/local/bin/dpu-agent
CLIENT=/usr/local/bin/dpuagent-client.py
WAIT=900

[ -x "$BIN" ] && exit 0

fail() {
  /usr/local/bin/bflog.sh "install-dpu-agent: $*"
  "$CLIENT" send-error DPUAgentInstallFailed "$*" || true
  exit 1
}

start=$(date +%s)
until ping -6 -c 1 -W 1 fe80::1%tmfifo_net0 >/dev/null 2>&1; do
  [ $(($(date +%s) - start)) -ge "$WAIT" ] && fail "the host agent did not answer within ${WAIT}s"
  sleep 1
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
until dnf download --disablerepo='*' --enablerepo=agentrepo --destdir "$work" dpu-agent; do
  [ $(($(date +%s) - start)) -ge "$WAIT" ] && fail "dpu-agent could not be downloaded within ${WAIT}s"
  sleep 10
done
rpm=$(find "$work" -name 'dpu-agent*.rpm' | head -n 1)
[ -n "$rpm" ] || fail "no dpu-agent package downloaded"
(cd "$work" && rpm2cpio "$rpm" | cpio -idm ./opt/dpf/dpuagent) || fail "cannot unpack $rpm"
install -m 0755 "$work/opt/dpf/dpuagent" "$BIN" || fail "cannot install $BIN"
/usr/local/bin/bflog.sh "dpu-agent installed"
