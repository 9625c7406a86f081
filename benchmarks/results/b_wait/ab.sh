#!/bin/bash
# A/B: /tmp/before (HEAD) vs /work/main (working tree), 3 rounds alternating.
out=/work/bits/s50/ab
for r in 1 2 3; do for v in 0 1; do
  if [ $v = 0 ]; then d=/tmp/before; else d=/work/main; fi
  cd $d && TF_CPP_MIN_LOG_LEVEL=3 timeout 1200 .venv/bin/python3 -m tools.benchmark --models=dense16,conv16 \
    --settings=plain,K2-T8-1f1b-rc,K2-T8-i2-rc,K1-T8-i2-rc --memory_settings= --out=$out/r${r}_v$v > $out/r${r}_v$v.log 2>&1
  echo "round $r v $v rc $?"
done; done
