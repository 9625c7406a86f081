"""TensorBoard scalars and the eval results file of a logdir."""

import json
import os
import time
from typing import Callable, Dict

import numpy as np

import tensorflow as tf

from tensorflow.core.framework import summary_pb2

from tensorpipe import errors

# The last evaluation's metrics, as JSON, in the logdir.
EVAL_FILE = 'eval_metrics.json'


def WriteScalar(name: str, value: float, step: int) -> None:
  """Writes a TensorBoard scalar to the default writer.

  Same record as tensorboard's `tf.summary.scalar` (plugin 'scalars'), without
  needing the tensorboard package installed.
  """
  metadata = summary_pb2.SummaryMetadata()
  metadata.plugin_data.plugin_name = 'scalars'
  tf.summary.write(name, tf.constant(value, tf.float32), step=step,
                   metadata=metadata)


def WriteEvalResults(logdir: str, metrics: Dict[str, float], step: int,
                     warn: Callable[[str], None]) -> None:
  """Writes eval summaries (logdir/eval) and logdir/eval_metrics.json.

  A logdir that cannot be written (someone else's, read-only) only gets a
  warning: the evaluation still reports its metrics.
  """
  try:
    writer = tf.summary.create_file_writer(os.path.join(logdir, 'eval'))
    with writer.as_default():
      for name, value in metrics.items():
        WriteScalar(name, value, step)
    writer.close()
    with open(os.path.join(logdir, EVAL_FILE), 'w') as f:
      json.dump(dict(metrics, step=step), f, indent=1, sort_keys=True)
  except (OSError, tf.errors.OpError) as e:
    first = errors.FirstLine(e)
    warn(f'could not write the eval results into {logdir}: {first}')


def WriteScalars(writer, values: Dict[str, float], step: int) -> None:
  """Writes every scalar of `values` at `step` with `writer`; flushes."""
  with writer.as_default():
    for name, value in values.items():
      WriteScalar(name, value, step)
  writer.flush()


class StepRate:
  """Training speed over the steps since the last `Reset`.

  The trainer resets it after the first step (which includes tracing) and
  after every log line.
  """

  def __init__(self, batch_size: int):
    self._batch_size = batch_size
    self.Reset()

  def Reset(self) -> None:
    self._t, self._steps = time.perf_counter(), 0

  def Tick(self) -> None:
    self._steps += 1

  def Add(self, values: Dict[str, float],
          step_time: float) -> Dict[str, float]:
    """`values` with examples_per_sec and step_time (s) of the window added;
    `step_time` (the last step's) if the window is empty."""
    elapsed = time.perf_counter() - self._t
    rate = self._steps / elapsed if elapsed > 0 and self._steps else 0.
    values['examples_per_sec'] = rate * self._batch_size
    values['step_time'] = 1.0 / rate if rate else step_time
    return values


def StepLine(step: int, max_steps: int, last: Dict[str, float]) -> str:
  """The trainer's log line of a step: metrics, speed and the ETA."""
  rate = 1.0 / last['step_time'] if last['step_time'] else 0.0
  eta = (max_steps - step) / rate if rate else float('nan')
  extra = ''
  if 'accuracy' in last:
    extra = f' acc {last["accuracy"]:.4f}'
  elif 'log_pplx' in last:
    extra = f' log_pplx {last["log_pplx"]:.4f}'
  return (f'step {step}/{max_steps}: loss {last["loss"]:.4f}{extra} '
          f'lr {last["learning_rate"]:.3g} grad_norm '
          f'{last["grad_norm"]:.3g} | {last["examples_per_sec"]:.1f} '
          f'examples/s, {last["step_time"] * 1e3:.0f} ms/step, ETA '
          f'{FormatSeconds(eta)}')


def FormatSeconds(seconds: float) -> str:
  """'1:02:03', '2:03' or '?' (not finite)."""
  if not np.isfinite(seconds):
    return '?'
  seconds = int(round(seconds))
  h, rest = divmod(seconds, 3600)
  m, s = divmod(rest, 60)
  return f'{h}:{m:02d}:{s:02d}' if h else f'{m}:{s:02d}'
