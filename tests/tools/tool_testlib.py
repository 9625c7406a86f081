"""Runs a tools/ binary as `python -m tools.<name>` in a fresh process.

Shared by the tests of the binaries (tests/tools/*_test.py).
"""

import os
import subprocess
import sys

# The repository root (the folder holding tools/).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def RunTool(name: str, *args: str,
            timeout_s: float = 600) -> subprocess.CompletedProcess:
  """Runs tools/<name>.py with `args`; returns the finished process (text
  stdout and stderr, any exit status)."""
  return subprocess.run(
      [sys.executable, '-m', f'tools.{name}', *args], cwd=ROOT,
      capture_output=True, text=True, timeout=timeout_s, check=False)


def CheckpointTensors(logdir: str, prefixes=('model/', 'optimizer/')):
  """{name: array} of the newest checkpoint in logdir/checkpoints."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(os.path.join(logdir, 'checkpoints'))
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if name.startswith(tuple(prefixes))}


def SummaryScalars(logdir: str, tag: str = 'loss', job: str = 'train'):
  """The values of scalar summary `tag` in logdir/<job>, in step order."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out = {}
  for f in tf.io.gfile.glob(os.path.join(logdir, job, 'events*')):
    for event in tf.compat.v1.train.summary_iterator(f):
      for v in event.summary.value:
        if v.tag == tag:
          out[event.step] = float(tf.make_ndarray(v.tensor))
  return [out[s] for s in sorted(out)]
