"""tools/test.sh --slow runs the slow files on lanes, longest first.

The script itself runs on a scratch tree holding a copy of tools/test.sh,
a fake `bazel` and a fake interpreter at .venv/bin/python3 that lists three
slow files and "runs" each by sleeping, writing when it started and ended,
and exiting with the file's code. So the lanes, the order, the result
lines and the summary are those of the real script, in seconds.
"""

import glob
import os
import shutil
import stat
import subprocess
import tempfile
import unittest

from tests import conftest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The fake interpreter: `-c ...` lists the slow files (as test.sh's
# listing does), the tier's pytest passes, and `-m pytest -q -m slow F`
# sleeps F's seconds between two lines of $EVENTS and exits with F's code.
_FAKE_PYTHON = r'''#!/usr/bin/env bash
if [ "$1" = "-c" ]; then
  printf '%s\n' tests/long_slow_test.py tests/failing_slow_test.py \
    tests/short_slow_test.py
  exit 0
fi
f="${@: -1}"
case "$f" in
  tests/long_slow_test.py) s=2; rc=0 ;;
  tests/failing_slow_test.py) s=0.5; rc=1 ;;
  tests/short_slow_test.py) s=0.5; rc=0 ;;
  *) exit 0 ;;  # the default tier
esac
echo "start $f $(date +%s.%N)" >> "$EVENTS"
echo "output of $f"
sleep "$s"
echo "end $f $(date +%s.%N)" >> "$EVENTS"
exit "$rc"
'''


def _Executable(path: str, text: str) -> None:
  with open(path, 'w') as f:
    f.write(text)
  os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class SlowLanesTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.tree = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.tree)
    os.makedirs(os.path.join(self.tree, 'tools'))
    os.makedirs(os.path.join(self.tree, '.venv', 'bin'))
    os.makedirs(os.path.join(self.tree, 'bin'))
    shutil.copy(os.path.join(_ROOT, 'tools', 'test.sh'),
                os.path.join(self.tree, 'tools', 'test.sh'))
    _Executable(os.path.join(self.tree, '.venv', 'bin', 'python3'),
                _FAKE_PYTHON)
    _Executable(os.path.join(self.tree, 'bin', 'bazel'),
                '#!/usr/bin/env bash\nexit 0\n')
    self.events = os.path.join(self.tree, 'events')

  def _Run(self, lanes: str):
    open(self.events, 'w').close()
    env = dict(os.environ, EVENTS=self.events, TENSORPIPE_SLOW_JOBS=lanes,
               PATH=os.path.join(self.tree, 'bin') + os.pathsep +
               os.environ['PATH'])
    proc = subprocess.run(
        ['bash', os.path.join(self.tree, 'tools', 'test.sh'), '--slow'],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    times = {}
    with open(self.events) as f:
      for line in f:
        what, path, t = line.split()
        times[(what, path)] = float(t)
    return proc, times

  def testTwoLanesOverlapAndEveryFileIsReported(self):
    proc, t = self._Run('2')
    out = proc.stdout
    self.assertEqual(proc.returncode, 1, out + proc.stderr)
    # The long file runs beside the two short ones, which run one after
    # the other on the second lane.
    long_f, fail_f, short_f = ('tests/long_slow_test.py',
                               'tests/failing_slow_test.py',
                               'tests/short_slow_test.py')
    self.assertLess(t[('start', fail_f)], t[('end', long_f)])
    self.assertLess(t[('start', short_f)], t[('end', long_f)])
    self.assertGreaterEqual(t[('start', short_f)], t[('end', fail_f)])
    for f in (long_f, fail_f, short_f):
      self.assertEqual(out.count(f'output of {f}'), 1, out)
    self.assertIn(f'test: {fail_f}: FAIL (pytest exit 1)', out)
    self.assertIn(f'test: {long_f}: PASS', out)
    self.assertIn(f'test: {short_f}: PASS', out)
    summary = out.strip().splitlines()[-1]
    self.assertIn(f'other slow files: FAIL (1 of 3 files: {fail_f}: FAIL '
                  '(pytest exit 1))', summary)

  def testOneLaneRunsOneFileAtATime(self):
    proc, t = self._Run('1')
    self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
    spans = sorted((t[('start', f)], t[('end', f)])
                   for (what, f) in t if what == 'start')
    self.assertEqual(len(spans), 3)
    for (_, end), (start, _) in zip(spans, spans[1:]):
      self.assertGreaterEqual(start, end)

  def testBadLaneCountIsNamedBeforeAnythingRuns(self):
    proc, t = self._Run('two')
    self.assertEqual(proc.returncode, 2)
    self.assertIn('TENSORPIPE_SLOW_JOBS=two must be a positive integer',
                  proc.stderr)
    self.assertEqual(t, {})


class SlowFileOrderTest(unittest.TestCase):

  def testListedFilesAreOtherSlowFilesThatExist(self):
    present = {os.path.relpath(p, _ROOT) for p in glob.glob(
        os.path.join(_ROOT, 'tests', '**', '*_slow_test.py'), recursive=True)}
    if not present:  # a Bazel sandbox holds only this target's files
      self.skipTest('no *_slow_test.py files here (run under pytest)')
    for path in conftest.SLOW_FILE_S:
      self.assertIn(path, present)
      self.assertNotIn(path, conftest.E2E_TIER)

  def testLongestFirstThenByName(self):
    longest = max(conftest.SLOW_FILE_S, key=conftest.SLOW_FILE_S.get)
    order = conftest.SlowFilesLongestFirst(
        ['tests/z_slow_test.py', 'tests/a_slow_test.py',
         'tests/cluster_slow_test.py', longest])
    self.assertEqual(order, [longest, 'tests/cluster_slow_test.py',
                             'tests/a_slow_test.py', 'tests/z_slow_test.py'])


if __name__ == '__main__':
  unittest.main()
