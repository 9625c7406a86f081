"""Learning-rate schedules: Params-built callables of the global step.

Kept apart from `schedules.py` (pipeline clock schedules). Each schedule is
built with `p.Instantiate()` and called as `schedule(step)` with a Python
number or a scalar tensor; it returns a float32 scalar tensor. The GPipe
recipes (Huang et al. 2018):

  AmoebaNet / images:  ExponentialDecay, lr = 0.00125 * batch_size, x0.97
                       every 3 epochs (staircase).
  Transformer:         WarmupRsqrtDecay, linear warm-up to `peak` over
                       `warmup_steps`, then peak * sqrt(warmup_steps / step).
"""

import numpy as np
import tensorflow as tf

from tensorpipe import hyperparams
from tensorpipe import py_utils


class BaseSchedule:
  """Base class: `Params()`, `__init__(params)` and `Value(step)`."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', 'lr_schedule', 'Name of this schedule.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams):
    p = params.Copy()
    p.Freeze()
    self._params = p
    self._isolated = None

  @property
  def params(self) -> hyperparams.InstantiableParams:
    return self._params

  def __call__(self, step) -> tf.Tensor:
    """Value(step) as a function of its own (not inlined), in a graph and
    eagerly alike: Grappler then optimizes the schedule's arithmetic alone,
    so its bits do not depend on the step it sits in (and an eager call
    gives the step's value). Inlined, `peak * (step + 1) / warmup_steps`
    gave 0.00500000035 in one trainer step and 0.005 in another whose
    pipeline ran its ramps without a loop (the constants pushed together
    or not): the same gradients, other weights."""
    step = tf.cast(step, tf.float32)
    if self._isolated is None:
      self._isolated = py_utils.IsolatedFunction(self.Value)
    return self._isolated(step)

  def __getstate__(self):
    """For copy and pickle: the traced function is rebuilt on first use."""
    state = dict(self.__dict__)
    state['_isolated'] = None
    return state

  def Value(self, step: tf.Tensor) -> tf.Tensor:
    raise NotImplementedError(f'{type(self).__name__}.Value')


def _CheckPositive(p, *names):
  for name in names:
    value = getattr(p, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
        value <= 0):
      raise ValueError(f'{p.cls.__name__}: {name}={value!r} must be a '
                       'positive number')


class Constant(BaseSchedule):
  """lr = value at every step."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('value', 1e-3, 'The learning rate.')
    return p

  def __init__(self, params):
    super().__init__(params)
    _CheckPositive(self.params, 'value')

  def Value(self, step):
    del step
    return tf.constant(self.params.value, tf.float32)


class ExponentialDecay(BaseSchedule):
  """lr = initial_value * decay_rate ** floor(step / (decay_epochs * spe)).

  With `base_lr_per_example` set, initial_value = base_lr_per_example *
  batch_size (the paper's 0.00125 x batch size). With `staircase=False` the
  exponent is not floored.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('initial_value', None, 'Learning rate at step 0; None means '
             'base_lr_per_example * batch_size.')
    p.Define('base_lr_per_example', 0.00125, 'Learning rate per example of '
             'the mini-batch, used when initial_value is None.')
    p.Define('batch_size', 128, 'Mini-batch size N (examples), used with '
             'base_lr_per_example.')
    p.Define('decay_rate', 0.97, 'Factor applied every decay_epochs.')
    p.Define('decay_epochs', 3.0, 'Epochs between decays.')
    p.Define('steps_per_epoch', 1000, 'Optimizer steps per epoch (training '
             'examples / batch size).')
    p.Define('staircase', True, 'Decay in discrete steps (True) or '
             'continuously (False).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    _CheckPositive(p, 'decay_rate', 'decay_epochs', 'steps_per_epoch')
    if p.initial_value is None:
      _CheckPositive(p, 'base_lr_per_example', 'batch_size')
    else:
      _CheckPositive(p, 'initial_value')

  @property
  def initial_value(self) -> float:
    p = self.params
    if p.initial_value is not None:
      return float(p.initial_value)
    return float(p.base_lr_per_example) * float(p.batch_size)

  def Value(self, step):
    p = self.params
    exponent = step / float(p.decay_epochs * p.steps_per_epoch)
    if p.staircase:
      exponent = tf.floor(exponent)
    return self.initial_value * tf.pow(float(p.decay_rate), exponent)


class WarmupRsqrtDecay(BaseSchedule):
  """Linear warm-up to `peak`, then inverse square root decay.

  lr(step) = peak * min((step + 1) / warmup_steps, sqrt(warmup_steps /
  (step + 1))): rises linearly to `peak` at step warmup_steps - 1, then decays
  as 1 / sqrt(step).
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('peak', 1e-3, 'Largest learning rate, reached at the end of '
             'warm-up.')
    p.Define('warmup_steps', 4000, 'Steps of linear warm-up.')
    return p

  def __init__(self, params):
    super().__init__(params)
    _CheckPositive(self.params, 'peak', 'warmup_steps')

  def Value(self, step):
    p = self.params
    s = step + 1.0
    w = float(p.warmup_steps)
    return float(p.peak) * tf.minimum(s / w, tf.sqrt(w / s))


class WarmupCosineDecay(BaseSchedule):
  """Linear warm-up to `peak`, then cosine decay to `final_fraction * peak`.

  lr(step) = peak * (step + 1) / warmup_steps           for step < warmup_steps
  lr(step) = peak * (f + (1 - f) * (1 + cos(pi * r)) / 2),
             r = min(1, (step - warmup_steps) / (total_steps - warmup_steps))
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('peak', 0.1, 'Largest learning rate, reached at the end of '
             'warm-up.')
    p.Define('warmup_steps', 100, 'Steps of linear warm-up (0 = none).')
    p.Define('total_steps', 1000, 'Step at which the decay ends.')
    p.Define('final_fraction', 0.0, 'Learning rate at total_steps, as a '
             'fraction of peak.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    _CheckPositive(p, 'peak', 'total_steps')
    if not isinstance(p.warmup_steps, int) or not (
        0 <= p.warmup_steps < p.total_steps):
      raise ValueError(f'warmup_steps={p.warmup_steps!r} must be an int in '
                       f'[0, total_steps={p.total_steps})')

  def Value(self, step):
    p = self.params
    w = float(p.warmup_steps)
    warm = float(p.peak) * (step + 1.0) / max(w, 1.0)
    r = tf.clip_by_value((step - w) / float(p.total_steps - p.warmup_steps),
                         0.0, 1.0)
    f = float(p.final_fraction)
    cosine = float(p.peak) * (f + (1.0 - f) * 0.5 * (1.0 + tf.cos(np.pi * r)))
    return tf.where(step < w, warm, cosine)
