#!/bin/bash
# Holds kubelet back until the DPU has the scalable functions its flavor
# asks for (PF_TOTAL_SF in the nvconfig parameters).
set -u
FLAVOR=/etc/dpf/dpuflavor.yaml
want=$(grep -o 'PF_TOTAL_SF=[0-9]*' "$FLAVOR" 2>/dev/null | head -n 1 | cut -d= -f2)
want=${want:-0}
while true; do
  have=$(devlink port show 2>/dev/null | grep -c 'flavour pcisf')
  if [ "$have" -ge "$want" ]; then
    /usr/local/bin/bflog.sh "wait-for-sfs: $have of $want SFs present"
    exit 0
  fi
  sleep 5
done
