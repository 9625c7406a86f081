"""BaseLayer: the functional, Params-configured layer all TensorPipe layers extend.

Design (after Lingvo's `base_layer`): a layer is built from a frozen `Params`
object; it creates its variables and children in `__init__`; its forward pass
`FProp(theta, *inputs)` is a pure function of `theta` (a NestedMap of the
layer's and its children's weights) and the inputs. Taking the weights as an
argument is what lets a pipeline partition be recomputed, differentiated and
placed on a device without capturing variables (GPipe, Huang et al. 2018).

`FPropMeta(p, *input_shapes)` gives FLOPs, output shapes and parameter count
from Params alone; partitioning and model analysis are built on it, so they
never allocate a weight.

Layers are `tf.Module`s: `trainable_variables` works and `tf.train.Checkpoint`
tracks variables under the layers' own names (not partition indices), so a
checkpoint restores under a different partition count.
"""

import contextlib
import dataclasses
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tensorpipe import hyperparams
from tensorpipe import py_utils
from tensorpipe.nested_map import NestedMap

Shape = tf.TensorShape


class WeightInit:
  """How to initialise a weight. Use the constructors below.

  Example:
    p.params_init = WeightInit.Gaussian(0.02)
  """

  def __init__(self, method: str, scale: float = 1.0):
    self.method = method
    self.scale = float(scale)

  @classmethod
  def Constant(cls, c: float = 0.0) -> 'WeightInit':
    return cls('constant', c)

  @classmethod
  def Gaussian(cls, scale: float = 1.0) -> 'WeightInit':
    """Normal(0, scale**2)."""
    return cls('gaussian', scale)

  @classmethod
  def Uniform(cls, scale: float = 1.0) -> 'WeightInit':
    """Uniform(-scale, scale)."""
    return cls('uniform', scale)

  @classmethod
  def Xavier(cls, scale: float = 1.0) -> 'WeightInit':
    """Glorot uniform: U(-a, a), a = scale * sqrt(6 / (fan_in + fan_out))."""
    return cls('xavier', scale)

  @classmethod
  def TruncatedGaussianSqrtFanIn(cls, scale: float = 1.0) -> 'WeightInit':
    """He-style: truncated normal with stddev scale / sqrt(fan_in)."""
    return cls('truncated_gaussian_sqrt_fan_in', scale)

  _METHODS = ('constant', 'gaussian', 'uniform', 'xavier',
              'truncated_gaussian_sqrt_fan_in')

  def Initialize(self, shape: Sequence[int], dtype: tf.DType,
                 seed: int) -> tf.Tensor:
    """Returns the initial value, deterministic in `seed`."""
    shape = [int(d) for d in shape]
    seed = tf.constant([seed, 0], tf.int64)
    fan_in, fan_out = _Fans(shape)
    if self.method == 'constant':
      return tf.fill(shape, tf.cast(self.scale, dtype))
    if self.method == 'gaussian':
      v = tf.random.stateless_normal(shape, seed, stddev=self.scale)
    elif self.method == 'uniform':
      v = tf.random.stateless_uniform(shape, seed, -self.scale, self.scale)
    elif self.method == 'xavier':
      a = self.scale * np.sqrt(6.0 / max(1, fan_in + fan_out))
      v = tf.random.stateless_uniform(shape, seed, -a, a)
    elif self.method == 'truncated_gaussian_sqrt_fan_in':
      v = tf.random.stateless_truncated_normal(
          shape, seed, stddev=self.scale / np.sqrt(max(1, fan_in)))
    else:
      raise ValueError(f'unknown WeightInit method {self.method!r}; use one '
                       f'of {self._METHODS}')
    return tf.cast(v, dtype)

  def __repr__(self) -> str:
    return f'WeightInit.{self.method}({self.scale})'

  def __eq__(self, other) -> bool:
    return (isinstance(other, WeightInit) and self.method == other.method and
            self.scale == other.scale)

  def __hash__(self):
    return hash((self.method, self.scale))


def _Fans(shape: Sequence[int]) -> Tuple[int, int]:
  if not shape:
    return 1, 1
  if len(shape) == 1:
    return shape[0], shape[0]
  receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
  return shape[-2] * receptive, shape[-1] * receptive


@dataclasses.dataclass
class WeightParams:
  """What `CreateVariable` needs: shape, init, dtype and trainability."""
  shape: Sequence[int]
  init: Optional[WeightInit] = None
  dtype: Optional[tf.DType] = None
  trainable: bool = True


def ToShape(shape: Any) -> tf.TensorShape:
  return shape if isinstance(shape, tf.TensorShape) else tf.TensorShape(shape)


def NumElements(shape: Any) -> int:
  shape = ToShape(shape)
  if not shape.is_fully_defined():
    raise ValueError(f'shape {shape} is not fully defined; FPropMeta needs '
                     'static shapes: pass the batch size too')
  return int(np.prod(shape.as_list(), dtype=np.int64))


def _IsShapeLike(s: Any) -> bool:
  return isinstance(s, tf.TensorShape) or (
      isinstance(s, (list, tuple)) and
      all(isinstance(d, (int, np.integer)) or d is None for d in s))


def _ToShapes(s: Any) -> Any:
  """Lists of ints -> TensorShape, inside dicts / tuples of them."""
  if _IsShapeLike(s):
    if isinstance(s, tf.TensorShape):
      return s
    return ToShape([None if d is None else int(d) for d in s])
  if isinstance(s, dict):
    return NestedMap({k: _ToShapes(v) for k, v in s.items()})
  if isinstance(s, (list, tuple)):
    return tuple(_ToShapes(v) for v in s)
  raise TypeError(f'cannot read {s!r} as a shape; give a list of ints, a '
                  'tf.TensorShape, or a dict of them')


def InputShapes(input_shapes: Any) -> Tuple[Any, ...]:
  """Normalises input_shapes (one entry per FProp input) to TensorShapes."""
  if isinstance(input_shapes, dict):
    return (_ToShapes(input_shapes),)
  if _IsShapeLike(input_shapes):
    raise ValueError(f'input_shapes={input_shapes!r} looks like one shape; '
                     'give a list with one shape per input, e.g. '
                     f'[{list(input_shapes)!r}]')
  if not isinstance(input_shapes, (list, tuple)) or not input_shapes:
    raise ValueError(f'input_shapes={input_shapes!r} must be a non-empty '
                     'list with one shape (or dict of shapes) per input')
  return tuple(_ToShapes(s) for s in input_shapes)


def FPropMetaResult(flops: float, out_shapes: Any,
                    num_params: int) -> NestedMap:
  """What `FPropMeta` returns.

  Args:
    flops: forward floating-point operations (a multiply-add counts 2).
    out_shapes: tuple of output shapes (each a tf.TensorShape or a NestedMap
      / tuple of them), one per output of FProp.
    num_params: number of weights the layer creates (children included).
  """
  if not isinstance(out_shapes, tuple):
    out_shapes = (out_shapes,)
  return NestedMap(flops=float(flops), out_shapes=out_shapes,
                   num_params=int(num_params))


def _ChildParamsCopy(parent: 'BaseLayer', name: str, p):
  if not isinstance(p, hyperparams.InstantiableParams):
    # One line: the repr of a list of Params spans many.
    what = (f'a {type(p).__name__} of {len(p)} entries (one nesting level too '
            'many?)' if isinstance(p, (list, tuple)) else
            f'{type(p).__name__}: {p!r}')
    raise TypeError(f'CreateChild({name!r}) needs layer Params '
                    f'(e.g. FCLayer.Params()), got {what}')
  p = p.Copy()
  if not p.name:
    p.name = name
  for key in ('dtype', 'fprop_dtype', 'random_seed', 'params_init'):
    if key in p and getattr(p, key) is None:
      setattr(p, key, getattr(parent.params, key))
  return p


class BaseLayer(tf.Module):
  """Base class of all layers.

  Usage:
    p = SomeLayer.Params().Set(name='x', ...)
    layer = p.Instantiate()
    y = layer(x)                         # inference: eval mode
    with py_utils.TrainingMode(True):    # training: batch statistics, dropout
      y = layer.FPropDefaultTheta(x)     # or layer.FProp(layer.theta, x)
  """

  # Whether this layer's name is a level of its descendants' paths and
  # checkpoint keys. A layer that only groups others into one pipeline
  # partition (keras_graph_segment.KerasGraphSegment) sets False: its children get
  # the paths and keys they would have directly under its parent, so the
  # same Keras layer has the same key for any number of partitions.
  ADDS_PATH_LEVEL = True
  # Whether FProp on abstract weights (AbstractVariables) makes the
  # py_utils.WeightOp calls it makes on real ones (saved_activations).
  ABSTRACT_WEIGHT_OPS = True

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', '', 'Name of this layer; also names its variables and '
             'derives its random seed. Must be set.')
    p.Define('dtype', None, 'Dtype of the variables; None means the parent '
             "layer's dtype, or tf.float32 at the top.")
    p.Define('fprop_dtype', None, 'Dtype of the activations (e.g. '
             'tf.bfloat16 with float32 weights); None means `dtype`.')
    p.Define('params_init', None, 'Default WeightInit of the weights; None '
             "means the parent's, or WeightInit.Xavier() at the top.")
    p.Define('random_seed', None, 'Integer seed of weight initialisation and '
             'dropout, combined with the layer path; None means the '
             "parent's, or 0 at the top.")
    return p

  def __init__(self, params: hyperparams.InstantiableParams):
    if not isinstance(params, hyperparams.Params):
      raise TypeError(f'{type(self).__name__} needs its Params, got '
                      f'{params!r}; build it with {type(self).__name__}'
                      '.Params().Set(name=...).Instantiate()')
    if not params.name:
      raise ValueError(f'{type(self).__name__}.Params().name is empty; set '
                       'a name, e.g. p.Set(name="layer1")')
    if not isinstance(params.name, str) or '/' in params.name:
      raise ValueError(f'layer name {params.name!r} must be a string without '
                       "'/'")
    super().__init__(name=None)
    p = params.Copy()
    if p.dtype is None:
      p.dtype = tf.float32
    if p.random_seed is None:
      p.random_seed = 0
    if p.params_init is None:
      p.params_init = WeightInit.Xavier()
    p.Freeze()
    # Plain attributes: not tracked (tracked objects are added explicitly so
    # that checkpoint keys are the layers' own names).
    object.__setattr__(self, '_params', p)
    object.__setattr__(self, '_vars', NestedMap())
    object.__setattr__(self, '_children', NestedMap())
    object.__setattr__(self, '_path', getattr(
        _BuildScope, 'parent_path', None))

  # -- properties ----------------------------------------------------------

  @property
  def params(self) -> hyperparams.InstantiableParams:
    """This layer's frozen Params."""
    return self._params

  @property
  def layer_name(self) -> str:
    return self._params.name

  @property
  def path(self) -> str:
    """Slash-separated path below the top layer (the top layer's is '')."""
    return self._path or ''

  @property
  def dtype(self) -> tf.DType:
    return self._params.dtype

  @property
  def fprop_dtype(self) -> tf.DType:
    return self._params.fprop_dtype or self._params.dtype

  @property
  def vars(self) -> NestedMap:
    """This layer's own variables (children excluded)."""
    return self._vars

  @property
  def children(self) -> NestedMap:
    return self._children

  @property
  def theta(self) -> NestedMap:
    """The weights: own variables plus `theta.<child>` for each child."""
    theta = NestedMap(self._vars)
    for name, child in self._children.items():
      if isinstance(child, (list, tuple)):
        theta[name] = [c.theta for c in child]
      else:
        theta[name] = child.theta
    return theta

  def TiedWeights(self) -> Dict[str, str]:
    """The weights this layer reads from another layer: theta key -> that
    variable's path below the pipeline (or SequentialLayer) holding both,
    e.g. {'tied_emb': 'emb/tgt_emb/emb'}. The layer creates no variable
    for them; the container puts the owner's value in this layer's theta
    under the key (tied_weights.py). Default: none."""
    return {}

  def _ChildPath(self, name: str) -> str:
    base = self.path
    if not type(self).ADDS_PATH_LEVEL:
      base = base.rpartition('/')[0]
    return f'{base}/{name}' if base else name

  def _Track(self, child: 'BaseLayer', name: str) -> None:
    """Tracks `child` for checkpoints (a grouping child: its children)."""
    if type(child).ADDS_PATH_LEVEL:
      self._track_trackable(child, name=name)
      return
    for grandchild in Layers(child)[1:]:
      if grandchild._path.rpartition('/')[0] == self.path:  # pylint: disable=protected-access
        self._track_trackable(grandchild, name=grandchild.layer_name)

  def LayerSeed(self) -> int:
    return py_utils.LayerSeed(self.path or self.layer_name,
                              self._params.random_seed)

  # -- construction --------------------------------------------------------

  def CreateVariable(self, name: str, wp: WeightParams) -> tf.Variable:
    """Creates variable `name` from `wp`, seeded by the layer path.

    Inside `AbstractVariables()` nothing is allocated: the weight is recorded
    there and the layer keeps a tf.TensorSpec, which is returned.
    """
    if name in self._vars or name in self._children:
      raise ValueError(f'{type(self).__name__} {self.layer_name!r} already '
                       f'has a variable or child named {name!r}')
    init = wp.init or self._params.params_init
    dtype = wp.dtype or self.dtype
    abstract = _abstract_scope.records
    if abstract is not None:
      shape = tuple(int(d) for d in wp.shape)
      abstract.append(AbstractVariable(self._ChildPath(name), shape,
                                       tf.as_dtype(dtype), bool(wp.trainable)))
      spec = tf.TensorSpec(shape, dtype, name=name)
      self._vars[name] = spec
      return spec
    seed = py_utils.LayerSeed(self._ChildPath(name), self._params.random_seed)
    value = init.Initialize(wp.shape, dtype, seed)
    # Named by path ('model/conv3/w'), so that every name is unique and says
    # which layer holds it (Keras' get_weights users, error messages).
    var = tf.Variable(value, trainable=wp.trainable,
                      name=self._ChildPath(name))
    self._vars[name] = var
    self._track_trackable(var, name=name)
    return var

  def CreateChild(self, name: str, p: hyperparams.InstantiableParams):
    """Instantiates child layer `name` from a copy of `p`.

    The child inherits dtype, fprop_dtype, random_seed and params_init where
    its own value is None.
    """
    if name in self._vars or name in self._children:
      raise ValueError(f'{type(self).__name__} {self.layer_name!r} already '
                       f'has a variable or child named {name!r}')
    child = self._Build(name, _ChildParamsCopy(self, name, p))
    self._children[name] = child
    self._Track(child, name)
    return child

  def CreateChildren(self, name: str, params_list: Sequence[Any]):
    """Instantiates a list of children, kept as `self.children[name]`.

    Each child is named (tracked in checkpoints, seeded) by its own
    `p.name`, or `<name>_<i>` when that is empty, so that the same layers give
    the same variables whichever container holds them.
    """
    if name in self._vars or name in self._children:
      raise ValueError(f'{type(self).__name__} {self.layer_name!r} already '
                       f'has a variable or child named {name!r}')
    children = []
    seen = set(self._vars) | set(self._children)
    for i, p in enumerate(params_list):
      child_name = _ChildParamsCopy(self, f'{name}_{i}', p).name
      if child_name in seen:
        raise ValueError(
            f'{type(self).__name__} {self.layer_name!r}: two children are '
            f'named {child_name!r}; give each layer in {name!r} a unique name')
      seen.add(child_name)
      child = self._Build(child_name, _ChildParamsCopy(self, child_name, p))
      self._Track(child, child_name)
      children.append(child)
    self._children[name] = children
    return children

  def _Build(self, name: str, p):
    previous = getattr(_BuildScope, 'parent_path', None)
    _BuildScope.parent_path = self._ChildPath(name)
    try:
      return p.Instantiate()
    finally:
      _BuildScope.parent_path = previous

  # -- forward ------------------------------------------------------------

  def FProp(self, theta: NestedMap, *inputs):
    """Forward pass with weights `theta`. Subclasses implement it."""
    raise NotImplementedError(f'{type(self).__name__}.FProp')

  def FPropDefaultTheta(self, *inputs, **kwargs):
    """FProp with the layer's own variables as theta."""
    return self.FProp(self.theta, *inputs, **kwargs)

  def __call__(self, *inputs, **kwargs):
    """`layer(x)`: FPropDefaultTheta, in eval mode unless a mode is set.

    A plain call is inference: batch norm uses (and leaves unchanged) its
    moving averages and dropout is off. Inside `TrainingMode(True)` or
    `EvalMode()` the call follows that block. `FProp` and
    `FPropDefaultTheta` follow the enclosing block and train outside one,
    as the functional API a task's loss is built on.
    """
    if py_utils.ModeIsSet():
      return self.FPropDefaultTheta(*inputs, **kwargs)
    with py_utils.EvalMode():
      return self.FPropDefaultTheta(*inputs, **kwargs)

  @classmethod
  def FPropMeta(cls, p, *input_shapes) -> NestedMap:
    """FLOPs, output shapes and parameter count from Params alone."""
    raise NotImplementedError(
        f'{cls.__name__}.FPropMeta is not implemented: this layer cannot be '
        'partitioned by cost or analysed; give partitions explicitly')

  def CastTheta(self, theta: NestedMap) -> NestedMap:
    """Casts this layer's own trainable float weights to fprop_dtype.

    Children cast their own weights in their FProp; non-trainable variables
    (e.g. batch-norm moving statistics) keep their precision.
    """
    if self.fprop_dtype == self.dtype:
      return theta
    out = NestedMap(theta)
    for name, var in self._vars.items():
      w = theta[name]
      if var.trainable and w.dtype.is_floating:
        out[name] = tf.cast(w, self.fprop_dtype)
    return out

  def UpdateMovingStats(self, stats) -> None:
    """Applies merged batch statistics; layers with moving averages override."""
    raise NotImplementedError(f'{type(self).__name__} reported batch stats '
                              'but does not implement UpdateMovingStats')


@dataclasses.dataclass(frozen=True)
class AbstractVariable:
  """A weight recorded instead of created (see `AbstractVariables`).

  Attributes:
    path: the variable's path below the top layer, e.g. 'enc/fc/w'.
    shape: its shape.
    dtype: its dtype.
    trainable: whether an optimizer would update it.
  """
  path: str
  shape: Tuple[int, ...]
  dtype: tf.DType
  trainable: bool


class _AbstractScope(threading.local):
  """Per thread: the list AbstractVariables() records into, or None."""
  records: Optional[List[AbstractVariable]] = None


_abstract_scope = _AbstractScope()


@contextlib.contextmanager
def AbstractVariables() -> Iterator[List[AbstractVariable]]:
  """Layers built inside record their weights instead of creating them.

  `CreateVariable` then allocates no variable, tensor or initial value: it
  appends an `AbstractVariable` to the yielded list and leaves a
  tf.TensorSpec as the layer's variable, so even a billion-weight model is
  built in moments. Such layers are for inspection (model_analysis reads
  the weight shapes); they cannot run FProp. The mode holds for the calling
  thread only (other threads build real layers meanwhile) and nests (an
  inner block records into its own list).

  Usage:
    with base_layer.AbstractVariables() as weights:
      p.Instantiate()
    num_trainable = sum(np.prod(w.shape) for w in weights if w.trainable)
  """
  previous = _abstract_scope.records
  records: List[AbstractVariable] = []
  _abstract_scope.records = records
  try:
    yield records
  finally:
    _abstract_scope.records = previous


class _BuildScopeType:
  """Carries the path of the layer being built to its children (thread-safe
  enough: layers are built on one thread)."""
  parent_path: Optional[str] = None


_BuildScope = _BuildScopeType()


def Layers(layer: BaseLayer) -> List[BaseLayer]:
  """The layer and all its descendants, depth first."""
  out = [layer]
  for child in layer.children.values():
    for c in (child if isinstance(child, (list, tuple)) else [child]):
      out.extend(Layers(c))
  return out


def VariablePath(layer: BaseLayer, name: str) -> str:
  """Path of `layer`'s own variable `name`: the layer path, then the name.

  Paths are built from the names children are created under, from the top
  layer down; containers that only group layers (a TensorPipeLayer's
  `partition_<k>` lists) add no level, so a variable has the same path for
  any number of partitions. Example: 'model/conv3/w' for variable 'w' of
  layer 'conv3' in the task's child 'model'.
  """
  if name not in layer.vars:
    raise ValueError(f'{type(layer).__name__} {layer.layer_name!r} has no '
                     f'variable {name!r}; it has {sorted(layer.vars)}')
  return layer._ChildPath(name)  # pylint: disable=protected-access


def VariablesByPath(layer: BaseLayer,
                    trainable_only: bool = False) -> Dict[str, tf.Variable]:
  """All variables of `layer` and its descendants, keyed by `VariablePath`.

  This is the key to use wherever a variable must be found again in another
  build of the same model (optimizer slots, checkpoints, comparisons): it
  does not depend on partitioning or on `tf.Module`'s attribute order.

  Args:
    layer: the layer whose variable tree to walk (usually the top layer or
      the task).
    trainable_only: keep only trainable variables (those the optimizer
      updates; `layer.trainable_variables` as a set).

  Returns:
    {path: variable}, in depth-first layer order.
  """
  out = {}
  for l in Layers(layer):
    for name, var in l.vars.items():
      if trainable_only and not var.trainable:
        continue
      path = VariablePath(l, name)
      assert path not in out, f'two variables have path {path!r}'
      out[path] = var
  return out
