"""Optimizers as Params: RMSProp, SGD with momentum, Adam and Adafactor.

Each optimizer is built with `p.Instantiate()` and applied once per
mini-batch with `opt.Apply(lr, grads, variables)`, the learning rate coming
from a schedule (`lr_schedules`). Optimizers are `tf.Module`s, so their slot
variables and step counter go into a `tf.train.Checkpoint` with the model.
Call `opt.Build(variables)` before restoring a checkpoint so the slots exist.

RMSProp, SGD and Adam wrap the tf-keras optimizers. Adafactor (Shazeer & Stern
2018) is written here because tf-keras' version has no momentum: GPipe trains
its Transformers with factored second moments, momentum and update clipping
1.0. Its update for a weight W with gradient G at step t (1-based):

  beta2_t = 1 - t ** decay_exponent                  # decay_exponent = -0.8
  G2 = G * G + epsilon1
  if W is a matrix [..., R, C] with R, C >= min_dim_size_to_factor:
    r = beta2_t * r + (1 - beta2_t) * mean(G2, axis=-1)    # [..., R]
    c = beta2_t * c + (1 - beta2_t) * mean(G2, axis=-2)    # [..., C]
    V = r[..., :, None] * c[..., None, :] / mean(r, axis=-1)
  else:
    V = beta2_t * V + (1 - beta2_t) * G2
  U = G / sqrt(V)
  U = U / max(1, rms(U) / clipping_threshold)       # update clipping
  M = beta1 * M + (1 - beta1) * U; U = M            # momentum (beta1 > 0)
  W = W - lr * U
"""

from typing import List, Sequence

import tensorflow as tf
import tf_keras

from tensorpipe import hyperparams


class BaseOptimizer(tf.Module):
  """Base class. Subclasses implement `_Build` and `_Apply`."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', cls.__name__, 'Name of the optimizer.')
    return p

  def __init__(self, params: hyperparams.InstantiableParams):
    super().__init__(name=None)
    p = params.Copy()
    p.Freeze()
    object.__setattr__(self, '_params', p)
    self._built = False

  @property
  def params(self) -> hyperparams.InstantiableParams:
    return self._params

  def Build(self, variables: Sequence[tf.Variable]) -> None:
    """Creates the slot variables (before a checkpoint restore)."""
    if not self._built:
      self._Build(list(variables))
      self._built = True

  def Apply(self, lr, grads: Sequence[tf.Tensor],
            variables: Sequence[tf.Variable]) -> None:
    """One update of `variables` with `grads` at learning rate `lr`."""
    grads, variables = list(grads), list(variables)
    if len(grads) != len(variables):
      raise ValueError(f'{len(grads)} gradients for {len(variables)} '
                       'variables')
    missing = [v.name for g, v in zip(grads, variables) if g is None]
    if missing:
      raise ValueError(f'no gradient for variables {missing}; they do not '
                       'affect the loss: make them non-trainable')
    self.Build(variables)
    self._Apply(tf.cast(lr, tf.float32), grads, variables)

  def _Build(self, variables: List[tf.Variable]) -> None:
    raise NotImplementedError

  def _Apply(self, lr, grads, variables) -> None:
    raise NotImplementedError


class _KerasOptimizer(BaseOptimizer):
  """Wraps a tf-keras optimizer; the learning rate is set every step."""

  def _MakeKeras(self):
    raise NotImplementedError

  def __init__(self, params):
    super().__init__(params)
    self.keras_optimizer = self._MakeKeras()

  def _Build(self, variables):
    self.keras_optimizer.build(variables)

  def _Apply(self, lr, grads, variables):
    self.keras_optimizer.learning_rate.assign(lr)
    self.keras_optimizer.apply_gradients(zip(grads, variables))


class RMSProp(_KerasOptimizer):
  """RMSProp: v = decay v + (1 - decay) g^2; W -= lr g / sqrt(v + epsilon).

  Defaults are the paper's AmoebaNet recipe (decay 0.9, epsilon 0.1; epsilon
  inside the square root as in TensorFlow's RMSProp).
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('decay', 0.9, 'Discount of the running mean of squared '
             'gradients (rho).')
    p.Define('momentum', 0.0, 'Momentum of the update (0 disables).')
    p.Define('epsilon', 0.1, 'Added to the mean square inside the square '
             'root.')
    return p

  def _MakeKeras(self):
    p = self.params
    return tf_keras.optimizers.RMSprop(
        learning_rate=0.0, rho=p.decay, momentum=p.momentum,
        epsilon=p.epsilon)


class SGD(_KerasOptimizer):
  """SGD with momentum: m = momentum m + g; W -= lr m (Nesterov optional)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('momentum', 0.9, 'Momentum coefficient (0 = plain SGD).')
    p.Define('nesterov', False, 'Use Nesterov momentum.')
    return p

  def _MakeKeras(self):
    p = self.params
    return tf_keras.optimizers.SGD(learning_rate=0.0, momentum=p.momentum,
                                   nesterov=p.nesterov)


class Adam(_KerasOptimizer):
  """Adam (Kingma & Ba 2015)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('beta1', 0.9, 'Decay of the first moment.')
    p.Define('beta2', 0.999, 'Decay of the second moment.')
    p.Define('epsilon', 1e-7, 'Added to the root of the second moment.')
    return p

  def _MakeKeras(self):
    p = self.params
    return tf_keras.optimizers.Adam(learning_rate=0.0, beta_1=p.beta1,
                                    beta_2=p.beta2, epsilon=p.epsilon)


class Adafactor(BaseOptimizer):
  """Adafactor with factored second moments, momentum and update clipping.

  See the module docstring for the update.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('beta1', 0.9, 'Momentum of the clipped update (0 disables '
             'momentum and its slot).')
    p.Define('decay_exponent', -0.8, 'beta2_t = 1 - t ** decay_exponent at '
             'step t (1-based); must be in [-1, 0).')
    p.Define('epsilon1', 1e-30, 'Added to the squared gradient.')
    p.Define('clipping_threshold', 1.0, 'Updates are scaled down so that '
             'their root mean square is at most this (per parameter).')
    p.Define('factored', True, 'Factor the second moment of matrices into '
             'row and column statistics.')
    p.Define('min_dim_size_to_factor', 128, 'Factor only when both of the '
             'last two dimensions are at least this large.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if not -1.0 <= p.decay_exponent < 0.0:
      raise ValueError(f'decay_exponent={p.decay_exponent!r} must be in '
                       '[-1, 0)')
    if not 0.0 <= p.beta1 < 1.0:
      raise ValueError(f'beta1={p.beta1!r} must be in [0, 1)')
    if p.clipping_threshold is not None and p.clipping_threshold <= 0:
      raise ValueError(f'clipping_threshold={p.clipping_threshold!r} must be '
                       '> 0 (or None for no clipping)')
    self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False,
                                  name='iterations')
    self.slot_list = []

  def _Factored(self, shape) -> bool:
    p = self.params
    return (p.factored and len(shape) >= 2 and
            shape[-1] >= p.min_dim_size_to_factor and
            shape[-2] >= p.min_dim_size_to_factor)

  def _Build(self, variables):
    slots = []
    for i, v in enumerate(variables):
      shape = v.shape.as_list()
      s = {}
      with tf.init_scope(), tf.device(v.device):
        if self._Factored(shape):
          s['vr'] = tf.Variable(tf.zeros(shape[:-1], tf.float32),
                                trainable=False, name=f'vr_{i}')
          s['vc'] = tf.Variable(tf.zeros(shape[:-2] + shape[-1:], tf.float32),
                                trainable=False, name=f'vc_{i}')
        else:
          s['v'] = tf.Variable(tf.zeros(shape, tf.float32), trainable=False,
                               name=f'v_{i}')
        if self.params.beta1:
          s['m'] = tf.Variable(tf.zeros(shape, tf.float32), trainable=False,
                               name=f'm_{i}')
      slots.append(s)
    self.slot_list = slots

  def _Apply(self, lr, grads, variables):
    p = self.params
    if len(variables) != len(self.slot_list):
      raise ValueError(f'Adafactor was built for {len(self.slot_list)} '
                       f'variables, got {len(variables)}')
    t = tf.cast(self.iterations + 1, tf.float32)
    beta2 = 1.0 - tf.pow(t, p.decay_exponent)
    for g, v, s in zip(grads, variables, self.slot_list):
      with tf.device(v.device):
        g = tf.cast(g, tf.float32)
        g2 = tf.square(g) + p.epsilon1
        if 'vr' in s:
          vr = beta2 * s['vr'] + (1.0 - beta2) * tf.reduce_mean(g2, -1)
          vc = beta2 * s['vc'] + (1.0 - beta2) * tf.reduce_mean(g2, -2)
          s['vr'].assign(vr)
          s['vc'].assign(vc)
          row_mean = tf.reduce_mean(vr, -1, keepdims=True)
          v_hat = (vr / row_mean)[..., :, tf.newaxis] * vc[..., tf.newaxis, :]
        else:
          v_hat = beta2 * s['v'] + (1.0 - beta2) * g2
          s['v'].assign(v_hat)
        u = g * tf.math.rsqrt(v_hat)
        if p.clipping_threshold is not None:
          rms = tf.sqrt(tf.reduce_mean(tf.square(u)))
          u = u / tf.maximum(1.0, rms / p.clipping_threshold)
        if 'm' in s:
          m = p.beta1 * s['m'] + (1.0 - p.beta1) * u
          s['m'].assign(m)
          u = m
        v.assign_sub(tf.cast(lr * u, v.dtype))
    self.iterations.assign_add(1)
