"""TensorBoard scalars and the eval results file of a logdir."""

import json
import os
from typing import Callable, Dict

import tensorflow as tf

from tensorflow.core.framework import summary_pb2

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
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    warn(f'could not write the eval results into {logdir}: {first}')
