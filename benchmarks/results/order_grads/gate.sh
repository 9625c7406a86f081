#!/bin/bash
# A/B of the gated weight ops: /tmp/gate with GATE unset (0) and GATE=1 (1), 3 rounds alternating.
out=/work/bits/s50/gate
cd /tmp/gate
for r in 1 2 3; do for v in 0 1; do
  if [ $v = 0 ]; then g=; else g=1; fi
  GATE=$g TF_CPP_MIN_LOG_LEVEL=3 timeout 1200 .venv/bin/python3 -m tools.benchmark --models=dense16,conv16 \
    --settings=plain,K2-T8-1f1b-rc,K1-T8-1f1b-rc,K2-T8-1f1b-norc --nopair --memory_settings= --timeline= --out=$out/r${r}_v$v > $out/r${r}_v$v.log 2>&1
  echo "round $r v $v rc $?"
done; done
