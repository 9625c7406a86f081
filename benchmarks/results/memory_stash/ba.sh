#!/bin/bash
# before/after of the stash emptying: allocator peak, one process per setting, 1 inter-op thread
for m in dense32mem conv16 xfmr8; do for tt in 4 8; do for tag in zbh1-rc zbv-rc zbh1-norc zbv-norc; do
  for repo in /tmp/before /work/main; do
    cd $repo; r=$(INTER=1 TF_CPP_MIN_LOG_LEVEL=3 /work/main/.venv/bin/python3 /work/bits/s49/peak.py $m $tt $tag 1 2>&1 | grep RESULT)
    echo "$(basename $repo) $r"
  done
done; done; done
