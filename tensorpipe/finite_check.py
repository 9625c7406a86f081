"""The trainer's check that a step left the loss, weights and slots finite.

A step's update can make a weight or an optimizer slot NaN / Inf (an infinite
learning rate, an overflowing second moment). The step itself computes one
boolean (`AllFinite`, on each variable's device); the trainer stops before
any checkpoint of that step is saved (`CheckStep`), so the newest checkpoint
is always finite, and names the bad variables by layer path.
"""

from typing import Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf

from tensorpipe import checkpoints


class NonFiniteError(FloatingPointError):
  """The loss or the weights became NaN or infinite; nothing was saved."""


def AllFinite(variables: List[tf.Variable]) -> tf.Tensor:
  """bool scalar: every element of every variable is finite."""
  checks = []
  for v in variables:
    with tf.device(v.device):
      checks.append(tf.reduce_all(tf.math.is_finite(v)))
  return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def NonFiniteNames(variables: List[tf.Variable], paths: Dict[int, str],
                   limit: int = 3) -> str:
  """The non-finite variables, by layer path where `paths` has them."""
  bad = [paths.get(id(v), v.name) for v in variables
         if not np.all(np.isfinite(v.numpy()))]
  more = f' and {len(bad) - limit} more' if len(bad) > limit else ''
  return ', '.join(bad[:limit]) + more


def CheckStep(loss: float, weights_finite: bool, step: int,
              latest: Optional[str], describe: Callable[[], str]) -> None:
  """Raises NonFiniteError if the step's loss or update is not finite.

  Args:
    loss: the step's loss.
    weights_finite: AllFinite of the weights and slots after the update.
    step: the step just run.
    latest: path of the newest checkpoint, or None.
    describe: names the non-finite variables (called only if there are).
  """
  number = checkpoints.CheckpointNumber(latest or '')
  kept = (f'the newest checkpoint, ckpt-{number}, is finite and stays the '
          'latest' if number is not None else 'no checkpoint was saved')
  fix = ('lower the learning rate or clip gradients '
         '(task.train.grad_norm_clip)')
  if not np.isfinite(loss):
    raise NonFiniteError(f'training stopped at step {step}: the loss is '
                         f'{loss}; {kept}; {fix}')
  if not weights_finite:
    raise NonFiniteError(
        f'training stopped at step {step}: the update made weights or '
        f'optimizer slots non-finite ({describe()}); {kept}; {fix}')
