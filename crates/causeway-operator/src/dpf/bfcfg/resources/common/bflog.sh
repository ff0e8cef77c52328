#!/bin/bash
# Writes a line to the rshim log, which the host reads with `bfrshlog`, and
# to the journal.
set -u
msg="$*"
logger -t dpf "$msg" 2>/dev/null || true
if command -v bfrshlog >/dev/null 2>&1; then
  bfrshlog "$msg" 2>/dev/null || true
fi
