"""One pass over the eval input: the task's metrics, weighted per example.

  for each eval batch (at most eval_steps; the whole split when None):
    stop here, writing nothing, if a stop signal came (preemption.py)
    per_batch += eval_step(batch)        # {metric: (value, weight)}
    feed the task's decoding metrics (BLEU) the batch, if it has any
  metrics = task.PostProcessEvalMetrics(task.AggregateMetrics(per_batch))
  metrics += decoded metrics, num_batches, num_examples

A split read once is covered completely: its last batch is padded, and the
padding (rows of weight 0) left out of the means and of num_examples
(base_input.py). Writing the results is the caller's (trainer_lib).
"""

import itertools
from typing import Callable, Dict, Optional

import tensorflow as tf

from tensorpipe import base_input
from tensorpipe import decode_metrics
from tensorpipe import preemption


def Evaluate(task, eval_step: Callable, eval_input, dataset: tf.data.Dataset,
             eval_steps: Optional[int], batch_size: int,
             stop: Optional[preemption.StopSignals],
             log: Callable[[str], None]) -> Dict[str, float]:
  """The metrics of one pass over `dataset`; {} if a stop signal came.

  Args:
    task: the task (AggregateMetrics, PostProcessEvalMetrics,
      CreateDecodeMetrics).
    eval_step: batch -> {metric: (value, weight) tensors}.
    eval_input: the input that made `dataset` (its read errors described).
    dataset: the eval batches.
    eval_steps: batches to read at most; None: until the dataset ends.
    batch_size: eval_input.batch_size, for the error of an empty split.
    stop: stop requests polled before each batch, or None.
    log: where the decoding metrics' description and a stop are logged.

  Raises:
    ValueError: the dataset gave no batch.
    base_input.DataFileError: the eval input's files are damaged.
  """
  per_batch = []
  # Decoding metrics (e.g. BLEU) are the task's: the trainer only feeds
  # them the eval batches.
  decoded = task.CreateDecodeMetrics(eval_input)
  batches = iter(dataset)
  num_examples = 0
  for i in itertools.count():
    if eval_steps is not None and i >= eval_steps:
      break
    if stop is not None and stop.requested:
      log(f'evaluation ended by {preemption.SignalName(stop.signum)} after '
          f'{i} batches: no eval results written')
      return {}
    try:
      batch = next(batches)
    except StopIteration:
      break
    except tf.errors.OpError as e:
      raise base_input.DataFileError(
          eval_input.DescribeReadError(e)) from None
    per_batch.append({k: (float(v[0]), float(v[1]))
                      for k, v in eval_step(batch).items()})
    # The last batch of a split may be padded (weights 0, base_input.py).
    num_examples += int(decode_metrics.RealRows(batch).sum())
    if decoded is not None:
      decoded.Update(batch)
  if not per_batch:
    raise ValueError('the eval input gave no batch: its split has fewer '
                     f'examples than batch_size={batch_size}')
  metrics = task.AggregateMetrics(per_batch)
  metrics = task.PostProcessEvalMetrics(metrics)
  if decoded is not None:
    metrics.update(decoded.Finalize())
    if decoded.Description():
      log(decoded.Description())
  metrics['num_batches'] = float(len(per_batch))
  metrics['num_examples'] = float(num_examples)
  return metrics
