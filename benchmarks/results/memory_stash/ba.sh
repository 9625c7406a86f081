#!/bin/bash
# Before/after of the stash emptying: the allocator's peak of one step, one
# process per setting, one inter-op thread (peak.py beside this script).
# Run from a checkout with its .venv; BEFORE: a checkout of 9c735b9 (the
# commit before), e.g. `git worktree add /tmp/before 9c735b9`.
here=$(cd "$(dirname "$0")" && pwd)
after=$(git -C "$here" rev-parse --show-toplevel)
BEFORE=${BEFORE:-/tmp/before}
for m in dense32mem conv16 xfmr8; do for tt in 4 8; do for tag in zbh1-rc zbv-rc zbh1-norc zbv-norc; do
  for repo in "$BEFORE" "$after"; do
    cd "$repo"; r=$(TF_CPP_MIN_LOG_LEVEL=3 "$after/.venv/bin/python3" "$here/peak.py" $m $tt $tag 1 2>&1 | grep RESULT)
    if [ "$repo" = "$BEFORE" ]; then w=before; else w=main; fi
    echo "$w $r"
  done
done; done; done
