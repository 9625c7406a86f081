#!/bin/bash
# Step time of the zero-bubble schedules before (9c735b9, a checkout at
# $BEFORE) and after the stash emptying (this checkout), 3 alternating
# rounds; results in $OUT/zbt_{old,main}_<i>/.
here=$(cd "$(dirname "$0")" && pwd)
after=$(git -C "$here" rev-parse --show-toplevel)
BEFORE=${BEFORE:-/tmp/before}
OUT=${OUT:-/tmp/zbt}
F="--models=dense16,conv16 --settings=plain,K2-T8-rc,K2-T8-zbh1-rc,K2-T8-zbv-rc --nopair --timeline= --memory_settings= --nopartition_costs --steps=10"
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then order="main old"; else order="old main"; fi
  for w in $order; do
    if [ $w = main ]; then d=$after; else d=$BEFORE; fi
    (cd "$d" && "$after/.venv/bin/python" -m tools.benchmark $F --out="$OUT/zbt_${w}_$i" > "$OUT/zbt_${w}_$i.log" 2>&1)
  done
done
