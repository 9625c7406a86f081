"""Optimizers as Params: SGD with momentum, RMSProp, Adam and Adafactor.

Each optimizer is built with `p.Instantiate()`, given its variables keyed by
path with `opt.Build(base_layer.VariablesByPath(model, trainable_only=True))`
and applied once per mini-batch with `opt.Apply(lr, grads, variables)`, the
learning rate coming from a schedule (`lr_schedules`).

Design. Optimizers are `tf.Module`s whose slot variables are plain
`tf.Variable`s, one set per model variable, created on that variable's device
(so partition k's slots live on partition k's device) and kept in
`opt.slots[path][slot_name]`. A `tf.train.Checkpoint` of the optimizer thus
names every slot by its variable's path, never by position: the path does
not depend on the number of partitions, so a run checkpointed with K
partitions resumes with K' with every slot on its own weight. `Apply` is plain
ops on the given variables (no `merge_call`, no strategy-owned variables), so
it runs unchanged in a replica context of a `tf.distribute` strategy; it
does no cross-replica reduction: all-reduce the gradients first. Build the
optimizer outside any strategy scope (variables created under a strategy's
scope ignore `tf.device`).

Updates of a weight W with gradient g at learning rate lr (the lr of this
step) and step t (1-based). For float32 weights SGD, RMSProp and Adam do
tf-keras' operations in tf-keras' order, so they agree with it bit for bit
(tf-keras rounds mu and the betas to float32 even for float64 weights; this
module does not). The tf-keras update is XLA-compiled on GPUs, this one is
not.

  SGD:      m = mu * m - lr * g;  W = W + m                   (momentum mu)
            Nesterov: W = W + (mu * m - lr * g) with the new m
            mu = 0: W = W - lr * g (no slot)
  RMSProp:  v = decay * v + (1 - decay) * g^2
            u = lr * g / sqrt(v + epsilon)          # epsilon inside the root
            momentum mu > 0: m = mu * m + u; W = W - m;  else W = W - u
  Adam:     m = m + (g - m) * (1 - beta1)
            v = v + (g^2 - v) * (1 - beta2)
            alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
            W = W - m * alpha / (sqrt(v) + epsilon)

Adafactor (Shazeer & Stern 2018) with momentum (tf-keras' version has none):
GPipe trains its Transformers with factored second moments, momentum and
update clipping 1.0:

  beta2_t = 1 - t ** decay_exponent                  # decay_exponent = -0.8
  G2 = g * g + epsilon1
  if W is a matrix [..., R, C] with R, C >= min_dim_size_to_factor:
    vr = beta2_t * vr + (1 - beta2_t) * mean(G2, axis=-1)    # [..., R]
    vc = beta2_t * vc + (1 - beta2_t) * mean(G2, axis=-2)    # [..., C]
    V = vr[..., :, None] * vc[..., None, :] / mean(vr, axis=-1)
  else:
    V = v = beta2_t * v + (1 - beta2_t) * G2
  U = g / sqrt(V)
  U = U / max(1, rms(U) / clipping_threshold)       # update clipping
  m = beta1 * m + (1 - beta1) * U; U = m            # momentum (beta1 > 0)
  W = W - lr * U

Sparse gradients (`tf.IndexedSlices`) are made dense first (tf-keras
scatters them, rounding Adam and Nesterov updates differently; the
layers here give dense gradients, embeddings included).
"""

from typing import Dict, List, Mapping, Sequence, Tuple, Union

import tensorflow as tf

from tensorpipe import hyperparams

Variables = Union[Mapping[str, tf.Variable], Sequence[tf.Variable]]

# Slot name -> (shape, dtype) of the slot variable.
SlotSpecs = Dict[str, Tuple[List[int], tf.DType]]


def _Listed(paths, limit: int = 5) -> str:
  paths = sorted(paths)
  more = f' and {len(paths) - limit} more' if len(paths) > limit else ''
  return ', '.join(repr(p) for p in paths[:limit]) + more


def _KeyedByPath(variables: Variables) -> Dict[str, tf.Variable]:
  """{path: variable} from a mapping, or from a list keyed by names."""
  if isinstance(variables, Mapping):
    keyed = dict(variables)
    for path, v in keyed.items():
      if not isinstance(path, str) or not path:
        raise TypeError(f'variable paths must be non-empty strings, got '
                        f'{path!r}')
      if not isinstance(v, tf.Variable):
        raise TypeError(f'{path!r} maps to {type(v).__name__}, not a '
                        'tf.Variable')
    return keyed
  keyed = {}
  for v in variables:
    if not isinstance(v, tf.Variable):
      raise TypeError(f'expected tf.Variables, got {type(v).__name__}: {v!r}')
    name = v.name[:-2] if v.name.endswith(':0') else v.name
    if name in keyed:
      raise ValueError(
          f'two variables are named {name!r}, so a list of variables cannot '
          'key the slots; give paths: opt.Build(base_layer.VariablesByPath('
          'model, trainable_only=True))')
    keyed[name] = v
  return keyed


class BaseOptimizer(tf.Module):
  """Base class: slots keyed by variable path, one update per `Apply`.

  Usage:
    opt = optimizers.Adam.Params().Instantiate()
    opt.Build(base_layer.VariablesByPath(model, trainable_only=True))
    tf.train.Checkpoint(model=model, optimizer=opt).restore(...)
    opt.Apply(lr, grads, model.trainable_variables)   # any order

  Subclasses implement `_SlotSpecs` (the slots of one variable) and `_Update`
  (the update of one variable).
  """

  # The model variables it was built for are not the optimizer's own.
  _TF_MODULE_IGNORED_PROPERTIES = frozenset(
      tf.Module._TF_MODULE_IGNORED_PROPERTIES | {'_variables', '_path_of'})

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
    # Untracked: the variable each path was built for, and the reverse.
    object.__setattr__(self, '_variables', None)
    object.__setattr__(self, '_path_of', None)
    self.iterations = None
    self.slots = {}

  @property
  def params(self) -> hyperparams.InstantiableParams:
    return self._params

  @property
  def built(self) -> bool:
    return self._variables is not None

  def Paths(self) -> List[str]:
    """The variable paths the optimizer was built for, sorted."""
    return sorted(self._variables or ())

  def Build(self, variables: Variables) -> None:
    """Creates the slots of `variables` (call before restoring a checkpoint).

    Slots are created on their variable's device, outside any `tf.function`.
    Building again with the same variables does nothing.

    Args:
      variables: {path: variable}, normally `base_layer.VariablesByPath(model,
        trainable_only=True)`; or a list of variables, keyed by their names
        (`v.name` without ':0'), which must then be unique.

    Raises:
      ValueError: the optimizer was built for other variables; names of a
        list are not unique; called inside a distribution strategy's scope.
    """
    keyed = _KeyedByPath(variables)
    if self.built:
      self._CheckSameVariables(keyed)
      return
    if tf.distribute.has_strategy():
      raise ValueError(
          f'{type(self).__name__}.Build was called inside the scope of '
          f'{type(tf.distribute.get_strategy()).__name__}: slots created '
          "there would ignore their variables' devices; call opt.Build(...) "
          'outside strategy.scope() and before strategy.run')
    refs = {}
    for path, v in keyed.items():
      if v.ref() in refs:
        raise ValueError(f'one variable is given under two paths, '
                         f'{refs[v.ref()]!r} and {path!r}')
      refs[v.ref()] = path
    slots = {}
    with tf.init_scope():
      iterations = tf.Variable(0, dtype=tf.int64, trainable=False,
                               name='iterations')
      for path, v in keyed.items():
        with tf.device(v.device):
          slots[path] = {
              name: tf.Variable(tf.zeros(shape, dtype), trainable=False,
                                name=name)
              for name, (shape, dtype) in self._SlotSpecs(v).items()}
    self.iterations = iterations
    self.slots = slots
    object.__setattr__(self, '_variables', keyed)
    object.__setattr__(self, '_path_of', refs)

  def _CheckSameVariables(self, keyed: Dict[str, tf.Variable]) -> None:
    built = self._variables
    new, gone = set(keyed) - set(built), set(built) - set(keyed)
    if new or gone:
      raise ValueError(
          f'{type(self).__name__} was built for other variables: '
          f'new paths {_Listed(new) or "none"}; paths gone '
          f'{_Listed(gone) or "none"}; build a new optimizer for a changed '
          'model')
    moved = [p for p, v in keyed.items() if v is not built[p]]
    if moved:
      raise ValueError(
          f'{type(self).__name__} was built for other variable objects at '
          f'paths {_Listed(moved)} (a rebuilt model?); build a new optimizer '
          'for it')

  def Apply(self, lr, grads: Sequence[tf.Tensor],
            variables: Sequence[tf.Variable]) -> None:
    """One update of `variables` with `grads` at learning rate `lr`.

    Args:
      lr: scalar learning rate of this step (cast to float32).
      grads: one gradient per variable (tensors or IndexedSlices).
      variables: every variable the optimizer was built for, in any order
        (built here from this list if `Build` was not called).

    Raises:
      ValueError: a gradient is None; a variable is not one the optimizer
        was built for, or one it was built for is missing.
    """
    grads, variables = list(grads), list(variables)
    if len(grads) != len(variables):
      raise ValueError(f'{len(grads)} gradients for {len(variables)} '
                       'variables')
    missing = [v.name for g, v in zip(grads, variables) if g is None]
    if missing:
      raise ValueError(f'no gradient for variables {missing}; they do not '
                       'affect the loss: make them non-trainable')
    if not self.built:
      self.Build(variables)
    paths = []
    for v in variables:
      path = self._path_of.get(v.ref())
      if path is None:
        raise ValueError(
            f'variable {v.name!r} {v.shape} is not one that '
            f'{type(self).__name__} was built for (paths '
            f'{_Listed(self._variables)}); build the optimizer with every '
            'variable it updates')
      paths.append(path)
    absent = set(self._variables) - set(paths)
    if absent:
      raise ValueError(
          f'{type(self).__name__}.Apply got no variable for paths '
          f'{_Listed(absent)}, which it was built for; pass every variable '
          '(with its gradient) to each Apply')
    lr = tf.cast(lr, tf.float32)
    step = self.iterations + 1
    for path, g, v in zip(paths, grads, variables):
      with tf.device(v.device):
        if isinstance(g, tf.IndexedSlices):
          g = tf.convert_to_tensor(g)
        self._Update(lr, step, g, v, self.slots[path])
    self.iterations.assign_add(1)

  def _SlotSpecs(self, var: tf.Variable) -> SlotSpecs:
    """Slot name -> (shape, dtype) of the slots `var` needs."""
    raise NotImplementedError

  def _Update(self, lr: tf.Tensor, step: tf.Tensor, g: tf.Tensor,
              var: tf.Variable, slots: Mapping[str, tf.Variable]) -> None:
    """Updates `var` and its `slots`; lr float32, step int64 (1-based)."""
    raise NotImplementedError


class SGD(BaseOptimizer):
  """SGD with momentum: m = mu m - lr g; W = W + m (Nesterov optional).

  See the module docstring for the update.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('momentum', 0.9, 'Momentum coefficient mu (0 = plain SGD, no '
             'slot).')
    p.Define('nesterov', False, 'Use Nesterov momentum.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if not 0.0 <= p.momentum <= 1.0:
      raise ValueError(f'momentum={p.momentum!r} must be in [0, 1]')

  def _SlotSpecs(self, var):
    if not self.params.momentum:
      return {}
    return {'m': (var.shape.as_list(), var.dtype)}

  def _Update(self, lr, step, g, var, slots):
    p = self.params
    lr = tf.cast(lr, var.dtype)
    g = tf.cast(g, var.dtype)
    if 'm' not in slots:
      var.assign_add(-g * lr)
      return
    # tf-keras casts a float32 constant; the same for float32 variables,
    # full precision for float64 ones.
    momentum = tf.constant(p.momentum, var.dtype)
    m = -g * lr + slots['m'] * momentum
    slots['m'].assign(m)
    if p.nesterov:
      var.assign_add(-g * lr + m * momentum)
    else:
      var.assign_add(m)


class RMSProp(BaseOptimizer):
  """RMSProp: v = decay v + (1 - decay) g^2; W -= lr g / sqrt(v + epsilon).

  Defaults are the paper's AmoebaNet recipe (decay 0.9, epsilon 0.1; epsilon
  inside the square root as in TensorFlow's RMSProp). See the module
  docstring for momentum.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('decay', 0.9, 'Discount of the running mean of squared '
             'gradients (rho).')
    p.Define('momentum', 0.0, 'Momentum of the update (0 disables it and its '
             'slot).')
    p.Define('epsilon', 0.1, 'Added to the mean square inside the square '
             'root.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    for name in ('decay', 'momentum'):
      value = getattr(p, name)
      if not 0.0 <= value <= 1.0:
        raise ValueError(f'{name}={value!r} must be in [0, 1]')
    if not p.epsilon > 0.0:
      raise ValueError(f'epsilon={p.epsilon!r} must be > 0')

  def _SlotSpecs(self, var):
    specs = {'v': (var.shape.as_list(), var.dtype)}
    if self.params.momentum > 0:
      specs['m'] = (var.shape.as_list(), var.dtype)
    return specs

  def _Update(self, lr, step, g, var, slots):
    p = self.params
    lr = tf.cast(lr, var.dtype)
    g = tf.cast(g, var.dtype)
    v = p.decay * slots['v'] + (1 - p.decay) * tf.square(g)
    slots['v'].assign(v)
    increment = lr * g * tf.math.rsqrt(v + p.epsilon)
    if 'm' in slots:
      m = p.momentum * slots['m'] + increment
      slots['m'].assign(m)
      var.assign_add(-m)
    else:
      var.assign_add(-increment)


class Adam(BaseOptimizer):
  """Adam (Kingma & Ba 2015), epsilon outside the root (tf-keras' form).

  See the module docstring for the update.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('beta1', 0.9, 'Decay of the first moment.')
    p.Define('beta2', 0.999, 'Decay of the second moment.')
    p.Define('epsilon', 1e-7, 'Added to the root of the second moment.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    for name in ('beta1', 'beta2'):
      value = getattr(p, name)
      if not 0.0 <= value < 1.0:
        raise ValueError(f'{name}={value!r} must be in [0, 1)')
    if not p.epsilon > 0.0:
      raise ValueError(f'epsilon={p.epsilon!r} must be > 0')

  def _SlotSpecs(self, var):
    return {'m': (var.shape.as_list(), var.dtype),
            'v': (var.shape.as_list(), var.dtype)}

  def _Update(self, lr, step, g, var, slots):
    p = self.params
    lr = tf.cast(lr, var.dtype)
    g = tf.cast(g, var.dtype)
    t = tf.cast(step, var.dtype)
    beta1_power = tf.pow(tf.constant(p.beta1, var.dtype), t)
    beta2_power = tf.pow(tf.constant(p.beta2, var.dtype), t)
    alpha = lr * tf.sqrt(1 - beta2_power) / (1 - beta1_power)
    m = slots['m'] + (g - slots['m']) * (1 - p.beta1)
    slots['m'].assign(m)
    v = slots['v'] + (tf.square(g) - slots['v']) * (1 - p.beta2)
    slots['v'].assign(v)
    var.assign_sub((m * alpha) / (tf.sqrt(v) + p.epsilon))


class Adafactor(BaseOptimizer):
  """Adafactor with factored second moments, momentum and update clipping.

  Slots are float32 whatever the variable's dtype. See the module docstring
  for the update.
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

  def _Factored(self, shape) -> bool:
    p = self.params
    return (p.factored and len(shape) >= 2 and
            shape[-1] >= p.min_dim_size_to_factor and
            shape[-2] >= p.min_dim_size_to_factor)

  def _SlotSpecs(self, var):
    shape = var.shape.as_list()
    if self._Factored(shape):
      specs = {'vr': (shape[:-1], tf.float32),
               'vc': (shape[:-2] + shape[-1:], tf.float32)}
    else:
      specs = {'v': (shape, tf.float32)}
    if self.params.beta1:
      specs['m'] = (shape, tf.float32)
    return specs

  def _Update(self, lr, step, g, var, slots):
    p = self.params
    beta2 = 1.0 - tf.pow(tf.cast(step, tf.float32), p.decay_exponent)
    g = tf.cast(g, tf.float32)
    g2 = tf.square(g) + p.epsilon1
    if 'vr' in slots:
      vr = beta2 * slots['vr'] + (1.0 - beta2) * tf.reduce_mean(g2, -1)
      vc = beta2 * slots['vc'] + (1.0 - beta2) * tf.reduce_mean(g2, -2)
      slots['vr'].assign(vr)
      slots['vc'].assign(vc)
      row_mean = tf.reduce_mean(vr, -1, keepdims=True)
      v_hat = (vr / row_mean)[..., :, tf.newaxis] * vc[..., tf.newaxis, :]
    else:
      v_hat = beta2 * slots['v'] + (1.0 - beta2) * g2
      slots['v'].assign(v_hat)
    u = g * tf.math.rsqrt(v_hat)
    if p.clipping_threshold is not None:
      rms = tf.sqrt(tf.reduce_mean(tf.square(u)))
      u = u / tf.maximum(1.0, rms / p.clipping_threshold)
    if 'm' in slots:
      m = p.beta1 * slots['m'] + (1.0 - p.beta1) * u
      slots['m'].assign(m)
      u = m
    var.assign_sub(tf.cast(lr * u, var.dtype))
