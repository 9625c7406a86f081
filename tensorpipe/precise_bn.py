"""Batch-norm moving averages recomputed from training batches ("precise BN").

Wu & Johnson, "Rethinking 'Batch' in BatchNorm" (arXiv 2105.07576): the
moving averages that evaluation uses weigh the initial values and early
training (normalization.MovingAverageWarnings); averaging each batch-norm
layer's per-batch statistics over a fresh pass of the trained model is what
they estimate. `Trainer.RecomputeBatchNormStats` and the trainer's
--recompute_bn_stats call this.
"""

import itertools
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tensorpipe import base_input
from tensorpipe import py_utils


def RecomputeBatchNormStats(task: Any, train_input: Callable[[], Any],
                            num_batches: int, num_replicas: int,
                            log_fn: Callable[[str], None]) -> int:
  """Sets batch-norm moving averages from `num_batches` training batches.

  "Precise BN" (Wu & Johnson, arXiv 2105.07576): the model runs forward in
  training mode (no update) on the first num_batches batches of a fresh
  pass over the training input; each batch-norm layer's moving mean and
  variance become the averages of its per-mini-batch statistics (what the
  moving averages estimate, without their weight on the initial values and
  on early training, see normalization.MovingAverageWarnings). Only the
  variables in memory change: call it after restoring and before
  Evaluate(restore=False); no checkpoint is written.

  Args:
    task: the trained task (its batch-norm variables are assigned).
    train_input: returns the training input (read from its start).
    num_batches: training batches to read, an int >= 1.
    num_replicas: R of the run; must be 1.
    log_fn: gets one line on what was recomputed.

  Returns:
    The number of batch-norm layers updated (0: the model has none).

  Raises:
    ValueError: num_batches < 1, or several replicas (run it in one
      process, on the chief's checkpoint).
  """
  if (not isinstance(num_batches, int) or isinstance(num_batches, bool) or
      num_batches < 1):
    raise ValueError(f'num_batches={num_batches!r} must be an int >= 1 '
                     '(training batches to recompute batch-norm '
                     'statistics from)')
  if num_replicas > 1:
    raise ValueError(
        f'recomputing batch-norm statistics runs in one process, but this '
        f'trainer has {num_replicas} replicas: evaluate the chief\'s logdir '
        'with --mode=eval in a single process')
  reported = []

  @tf.function(autograph=False)  # as the trainer's TrainStep
  def BatchStats(batch):
    with py_utils.TrainingMode(True), \
        py_utils.CollectBatchStats() as collected:
      task.FPropDefaultTheta(batch)
    merged = {}
    for layer, stats in collected:
      merged[id(layer)] = (layer, stats if id(layer) not in merged else
                           merged[id(layer)][1].Merge(stats))
    reported[:] = [layer for layer, _ in merged.values()]
    return [s.MeanAndVariance() for _, s in merged.values()]

  train_input = train_input()
  sums, read = None, 0
  try:
    for batch in itertools.islice(train_input.Dataset(), num_batches):
      values = [(m.numpy().astype(np.float64),
                 v.numpy().astype(np.float64))
                for m, v in BatchStats(batch)]
      sums = values if sums is None else [
          (a + m, b + v) for (a, b), (m, v) in zip(sums, values)]
      read += 1
  except tf.errors.OpError as e:
    raise base_input.DataFileError(
        train_input.DescribeReadError(e)) from None
  for layer, (mean, variance) in zip(reported, sums or []):
    for var, value in ((layer.vars.moving_mean, mean),
                       (layer.vars.moving_variance, variance)):
      var.assign(tf.constant(value / read, var.dtype))
  log_fn(f'batch-norm statistics of {len(reported)} layer(s) recomputed '
         f'from {read} training batches (in memory only)')
  return len(reported)
