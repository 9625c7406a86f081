#!/bin/bash
# Step time of the zero-bubble schedules before (9c735b9) and after the stash emptying, 3 alternating rounds
F="--models=dense16,conv16 --settings=plain,K2-T8-rc,K2-T8-zbh1-rc,K2-T8-zbv-rc --nopair --timeline= --memory_settings= --nopartition_costs --steps=10"
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then order="main old"; else order="old main"; fi
  for w in $order; do
    if [ $w = main ]; then d=/work/main; else d=/tmp/before; fi
    (cd $d && /work/main/.venv/bin/python -m tools.benchmark $F --out=/work/bits/s49/zbt_${w}_$i > /work/bits/s49/zbt_${w}_$i.log 2>&1)
  done
done
echo done > /work/bits/s49/zbt.done
