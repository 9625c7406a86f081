"""The Keras front door: a keras.Sequential pipelined, and trained by `fit`.

`PipelineParams(model, K, T)` turns a `keras.Sequential` (or a list of Keras
3 layers) into TensorPipeLayer Params, one `KerasLayer` per Keras layer, each
holding its layer's config (so the Params are text, as every experiment's),
split into K partitions automatically (balanced by FPropMeta FLOPs) or by
`partition_sizes`. `BuildPipeline` instantiates them and copies the Keras
model's weights in. `TensorPipeModel` is a `keras.Model` around the pipeline:
`compile` / `fit` / `evaluate` / `predict`, callbacks (TensorBoard,
ModelCheckpoint) and `save` / `load_model` work as for any Keras model.

One training step of TensorPipeModel (`train_step`, the normal Keras loop):

  seed = optimizer.iterations                # each step its own dropout masks
  with StepSeed(seed), TrainingMode(True), GradientTape() as tape:
    y_pred = pipeline(x)                     # K partitions, T micro-batches
    loss = compiled loss(y, y_pred)
  optimizer.apply(tape.gradient(loss, weights))
  # batch norm: micro-batch statistics; moving averages once per step

Batches the pipeline cannot take as they are:

  * inference (predict, evaluate, serving) on a batch b that T does not
    divide, or of unknown size: padded to `batch_size` rows (or to a
    multiple of T when b is static), pipelined, and the padding rows
    dropped; a batch larger than `batch_size` runs unpipelined. In inference
    every row depends on its own example only, so results do not change.
  * training on a batch of b != batch_size rows (the last partial batch of
    an epoch): run unpipelined, the b examples as one micro-batch (what
    plain Keras does with that batch); full batches are pipelined.

Usage:
  model = keras.Sequential([keras.Input((28, 28, 1)), ...])
  pipe = keras_pipeline.TensorPipeModel(model, num_partitions=4,
                                        num_micro_batches=8, batch_size=128)
  pipe.compile(keras.optimizers.SGD(0.1), keras.losses.
               SparseCategoricalCrossentropy(from_logits=True), ['accuracy'])
  pipe.fit(dataset, epochs=2, callbacks=[keras.callbacks.TensorBoard(dir)])
"""

import copy
from typing import Any, Callable, List, Optional, Sequence, Union

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import hyperparams
from tensorpipe import keras_graph
from tensorpipe import keras_graph_params
from tensorpipe import keras_utils
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe.layers import composite
from tensorpipe.layers import keras_layer

KerasModelLike = Union[keras.Sequential, Sequence[Any]]


def _KerasLayers(model: KerasModelLike) -> List[Any]:
  """The layers of a Sequential or a list, checked to be Keras 3 layers."""
  if keras_utils.IsKeras2(model):
    raise keras_utils.Keras2Error('keras_pipeline', 'the model', model)
  if isinstance(model, keras.Sequential):
    layers = list(model.layers)
  elif isinstance(model, keras.Model):
    raise TypeError(
        f'keras_pipeline: {type(model).__name__} {model.name!r} is a '
        'subclassed Keras model: its graph is Python code, which cannot be '
        'cut into stages; build it functionally (keras.Model(inputs, '
        'outputs)) or as a keras.Sequential, or wrap it whole in one '
        'KerasLayer')
  elif isinstance(model, (list, tuple)):
    layers = list(model)
  else:
    raise TypeError(f'keras_pipeline: expected a keras.Sequential or a list '
                    f'of Keras layers, got {type(model).__name__}')
  if not layers:
    raise ValueError('keras_pipeline: the model has no layers')
  for i, layer in enumerate(layers):
    if isinstance(layer, dict):
      continue  # a serialised layer (TensorPipeModel.from_config)
    if keras_utils.IsKeras2(layer):
      raise keras_utils.Keras2Error('keras_pipeline', f'layer {i}', layer)
    if not isinstance(layer, keras.Layer):
      raise TypeError(f'keras_pipeline: layer {i} is a '
                      f'{type(layer).__name__}, not a Keras 3 layer')
    if isinstance(layer, keras.layers.InputLayer):
      raise ValueError(f'keras_pipeline: layer {i} is an InputLayer; give '
                       'the input shape with input_shape= (or a Sequential '
                       'starting with keras.Input)')
  return layers


def _InputShape(model: KerasModelLike,
                input_shape: Optional[Sequence[int]]) -> List[int]:
  """One example's input shape, from the argument or the model's Input."""
  declared = None
  if isinstance(model, keras.Sequential):
    try:
      declared = list(model.inputs[0].shape[1:])
    except (AttributeError, ValueError, IndexError, TypeError):
      declared = None
  if input_shape is not None:
    input_shape = list(input_shape)
    if declared is not None and declared != input_shape:
      raise ValueError(f'keras_pipeline: input_shape={input_shape} but the '
                       f'Sequential takes inputs of shape {declared}; drop '
                       'input_shape or make them agree')
    return input_shape
  if declared is None:
    raise ValueError('keras_pipeline: the input shape is unknown; give '
                     'input_shape=[...] (one example, no batch axis) or start '
                     'the Sequential with keras.Input(shape)')
  return declared


def _LayerParams(layer: Any, name: str, input_shape: List[Any]):
  if isinstance(layer, dict):
    config = layer
  else:
    config = keras.saving.serialize_keras_object(layer)
  return keras_layer.KerasLayer.Params().Set(
      name=name, keras_config=config, input_shape=list(input_shape))


def _LayerName(layer: Any) -> str:
  return layer['config']['name'] if isinstance(layer, dict) else layer.name


def _LayerInputShapes(layers: List[Any], shape: List[Any]) -> List[List[Any]]:
  """Each layer's per-example input shape, by Keras' symbolic calls."""
  shapes = [list(shape)]
  for layer in layers[:-1]:
    if isinstance(layer, dict):
      layer = keras.saving.deserialize_keras_object(copy.deepcopy(layer))
    out = layer(keras.KerasTensor([None] + shapes[-1]))
    if not hasattr(out, 'shape'):
      raise ValueError(f'keras_pipeline: layer {layer.name!r} returns '
                       f'{type(out).__name__}; a Sequential passes one tensor '
                       'from layer to layer')
    shapes.append(list(out.shape[1:]))
  return shapes


def PipelineParams(model: Union[KerasModelLike, Callable[[], Any]],
                   num_partitions: int, num_micro_batches: int,
                   input_shape: Optional[Sequence[int]] = None,
                   batch_size: Optional[int] = None,
                   partition_sizes: Optional[Sequence[int]] = None,
                   name: str = 'TensorPipe',
                   cut_after: Optional[Sequence[str]] = None,
                   **pipeline_params) -> hyperparams.Params:
  """TensorPipeLayer Params of a Keras model, one KerasLayer per layer.

  A Sequential (or list of layers) is cut into runs of layers; a functional
  model into runs of its layer calls, one `keras_graph.KerasGraphSegment`
  per partition (see keras_graph).

  Making the Params runs no TensorFlow op when `model` is a function (or
  its layers are built): the partition plan is computed when the Params are
  instantiated.

  Args:
    model: a keras.Sequential, a functional keras.Model (or its
      get_config() dict), a list of Keras 3 layers (built or not), or a
      function returning one of them, which is then built without
      allocating weights (experiments: their Params are made before the
      trainer sets up devices; the KerasLayers initialise their own weights).
    num_partitions: K.
    num_micro_batches: T.
    input_shape: one example's input shape (no batch axis); default: the
      Sequential's keras.Input.
    batch_size: the mini-batch size N the partition plan is costed at (the
      FLOPs per layer scale with it, the plan does not); default T.
    partition_sizes: manual split of a Sequential: K numbers of consecutive
      layers per partition; None balances FPropMeta FLOPs automatically.
    name: the TensorPipeLayer's name.
    cut_after: manual split of a functional model: K-1 Keras layer names,
      in model order; the cut falls after each one's last call.
    **pipeline_params: more TensorPipeLayer Params (recompute, devices, ...).

  Returns:
    TensorPipeLayer Params; each layer is a KerasLayer named after its Keras
    layer, with that layer's config and input shape.

  Raises:
    TypeError / ValueError: a non-Sequential model, a Keras 2 object, an
      unknown input shape, bad partition sizes.
  """
  if keras_utils.IsKeras2(model):
    raise keras_utils.Keras2Error('keras_pipeline', 'the model', model)
  if callable(model) and not isinstance(model, (keras.Layer, list, tuple)):
    with keras_utils.NoAllocation():
      return PipelineParams(model(), num_partitions, num_micro_batches,
                            input_shape, batch_size, partition_sizes, name,
                            cut_after, **pipeline_params)
  keras_graph_params.CheckKT(num_partitions, num_micro_batches)
  if keras_graph_params.IsGraph(model):
    if partition_sizes is not None:
      raise ValueError(
          f'keras_pipeline: partition_sizes={list(partition_sizes)} counts '
          'layers of a sequence; a functional model is cut by cut_after=[K-1 '
          'Keras layer names] (cut after each one\'s last call)')
    if input_shape is not None:
      raise ValueError(f'keras_pipeline: input_shape={input_shape} is not '
                       'used for a functional model: its keras.Input '
                       'shapes are; drop input_shape')
    return keras_graph_params.GraphPlan(model, num_partitions, num_micro_batches, batch_size,
                     cut_after, name, **pipeline_params).params
  if cut_after is not None:
    raise ValueError(f'keras_pipeline: cut_after={cut_after} is for '
                     'functional models; a Sequential is split by '
                     'partition_sizes')
  layers = _KerasLayers(model)
  shape = _InputShape(model, input_shape)
  if any(isinstance(layer, dict) for layer in layers):
    with keras_utils.NoAllocation():
      shapes = _LayerInputShapes(layers, shape)
  else:
    shapes = _LayerInputShapes(layers, shape)
  layer_ps = [_LayerParams(layer, _LayerName(layer), s)
              for layer, s in zip(layers, shapes)]
  batch = batch_size or num_micro_batches
  p = pipeline.TensorPipeLayer.Params().Set(
      name=name, num_micro_batches=num_micro_batches, **pipeline_params)
  if partition_sizes is not None:
    sizes = list(partition_sizes)
    if (len(sizes) != num_partitions or
        not all(isinstance(s, int) and s >= 1 for s in sizes) or
        sum(sizes) != len(layer_ps)):
      raise ValueError(
          f'keras_pipeline: partition_sizes={sizes} must be {num_partitions} '
          f'positive ints summing to the {len(layer_ps)} layers')
    parts, start = [], 0
    for size in sizes:
      parts.append(layer_ps[start:start + size])
      start += size
    p.Set(partitions=parts, input_shapes=[[batch] + shape])
  else:
    p.Set(layers=layer_ps, num_partitions=num_partitions,
          input_shapes=[[batch] + shape])
  return p


def CopyKerasWeights(pipe: pipeline.TensorPipeLayer,
                     model: KerasModelLike) -> None:
  """Copies the Keras layers' weights into the pipeline's KerasLayers."""
  if isinstance(model, dict):
    return
  if keras_graph_params.IsGraph(model):
    for layer in KerasLayersOf(pipe):
      source = model.get_layer(layer.layer_name)
      if source.built:
        layer.AssignFromKeras(source)
    return
  layers = {layer.name: layer for layer in _KerasLayers(model)
            if not isinstance(layer, dict)}
  for layer, _ in pipe.LayersWithTheta():
    source = layers.get(layer.layer_name)
    if source is not None and source.built:
      layer.AssignFromKeras(source)


def KerasLayersOf(pipe: pipeline.TensorPipeLayer
                  ) -> List[keras_layer.KerasLayer]:
  """The pipeline's KerasLayers, in partition and call order."""
  return [layer for layer in base_layer.Layers(pipe)
          if isinstance(layer, keras_layer.KerasLayer)]


def BuildPipeline(model: KerasModelLike, num_partitions: int,
                  num_micro_batches: int, copy_weights: bool = True,
                  **kwargs) -> pipeline.TensorPipeLayer:
  """`PipelineParams(...)` instantiated, starting from the model's weights.

  Args:
    model, num_partitions, num_micro_batches, **kwargs: as PipelineParams.
    copy_weights: copy the (built) Keras layers' weights into the pipeline;
      else the KerasLayers keep their own initial weights (seeded by path).

  Returns:
    The TensorPipeLayer.
  """
  pipe = PipelineParams(model, num_partitions, num_micro_batches,
                        **kwargs).Instantiate()
  if copy_weights:
    CopyKerasWeights(pipe, model)
  return pipe


def _Chain(pipe: pipeline.TensorPipeLayer, *xs: Any) -> Any:
  """The pipeline's layers run one after the other (no micro-batches)."""
  args = tuple(xs)
  with py_utils.BatchAxis(0):
    for layer, theta in pipe.LayersWithTheta():
      args = composite.AsArgs(layer.FProp(theta, *args))
  return composite.FromArgs(args)


def _Rows(out: Any, n: Any) -> Any:
  """The first n rows of every output."""
  return tf.nest.map_structure(lambda t: t[:n], out)


def _PadTo(x: tf.Tensor, rows: int) -> tf.Tensor:
  """x with zero rows appended to `rows` rows (static shape)."""
  n = tf.shape(x)[0]
  pad = [[0, tf.maximum(rows - n, 0)]] + [[0, 0]] * (x.shape.rank - 1)
  return _WithRows(tf.pad(x, pad), rows)


def _WithRows(x: tf.Tensor, rows: int) -> tf.Tensor:
  """x, its static batch size set to `rows` (which the caller guarantees).

  A static annotation, not tf.ensure_shape: inside a tf.cond branch a
  runtime check may run even when the branch is not taken.
  """
  x = tf.identity(x)
  x.set_shape([rows] + x.shape.as_list()[1:])
  return x


@keras.saving.register_keras_serializable(package='tensorpipe')
class TensorPipeModel(keras.Model):
  """A keras.Model whose forward pass is a TensorPipeLayer (GPipe).

  The weights are the pipeline's TensorPipe variables (`weights`,
  `trainable_weights` return them); `save_weights` / `ModelCheckpoint` /
  `model.save` store them by layer path and `keras.models.load_model`
  rebuilds the model from `get_config`. `export(dir)` writes a SavedModel
  with a serving signature (inference mode).

  Usage:
    model = TensorPipeModel(sequential, num_partitions=2,
                            num_micro_batches=4, batch_size=32)
    model.compile(optimizer, loss, metrics)
    model.fit(x, y, batch_size=32, epochs=3)
  """

  def __init__(self, layers: KerasModelLike, num_partitions: int = 1,
               num_micro_batches: int = 1, batch_size: Optional[int] = None,
               input_shape: Optional[Sequence[int]] = None,
               partition_sizes: Optional[Sequence[int]] = None,
               recompute: bool = True,
               devices: Optional[Sequence[str]] = None,
               partition_method: str = 'min_max', copy_weights: bool = True,
               cut_after: Optional[Sequence[str]] = None,
               weight_order: Optional[Sequence[Sequence[Any]]] = None,
               **kwargs):
    """Builds the pipeline.

    Args:
      layers: a keras.Sequential, a functional keras.Model, a list of Keras
        3 layers (or the serialised configs get_config stores).
      num_partitions: K.
      num_micro_batches: T.
      batch_size: N, the rows of a pipelined step (a multiple of T); fit,
        evaluate and predict should use this batch size. None: T.
      input_shape, partition_sizes, cut_after: as PipelineParams.
      recompute, devices, partition_method: TensorPipeLayer Params.
      copy_weights: start from the Keras layers' weights.
      weight_order: [Keras layer name, weight index] per weight of the
        wrapped model (get_weights order); default: read from `layers`.
      **kwargs: keras.Model arguments (name, ...).
    """
    super().__init__(**kwargs)
    keras_graph_params.CheckKT(num_partitions, num_micro_batches)
    batch_size = batch_size or num_micro_batches
    if (isinstance(batch_size, bool) or not isinstance(batch_size, int) or
        batch_size < 1 or batch_size % num_micro_batches):
      raise ValueError(f'TensorPipeModel: batch_size={batch_size!r} must be a '
                       f'multiple of num_micro_batches={num_micro_batches}')
    common = dict(recompute=recompute,
                  devices=list(devices) if devices else None,
                  partition_method=partition_method)
    self._graph = None
    if keras_graph_params.IsGraph(layers):
      built = keras_graph_params.GraphPlan(keras_graph_params.GraphConfig(layers), num_partitions,
                        num_micro_batches, batch_size, cut_after, **common)
      pipe = built.params.Instantiate()
      if copy_weights:
        CopyKerasWeights(pipe, layers)
      self._graph = built
      graph, costs = built.graph, built.costs
      self._input_specs = [(list(info.shape), info.dtype)
                           for info in keras_graph.InputSpecs(graph, costs)]
      self._input_names = list(graph.input_names)
      self._output_names = list(graph.output_names)
      self._out_dtypes = [costs.tensors[k].dtype for k in graph.outputs]
      self._single_output = graph.single_output
      stored, shape = keras_graph_params.GraphConfig(layers), None
      if weight_order is None and not isinstance(layers, dict):
        weight_order = keras_utils.WeightOrder(layers)
    else:
      keras_layers = _KerasLayers(layers)
      shape = _InputShape(layers, input_shape)
      pipe = BuildPipeline(
          layers, num_partitions, num_micro_batches,
          copy_weights=copy_weights, input_shape=shape,
          batch_size=batch_size, partition_sizes=partition_sizes, **common)
      first, last = pipe.LayersWithTheta()[0][0], pipe.LayersWithTheta()[-1][0]
      self._input_specs = [(list(shape), first.keras_object.compute_dtype)]
      self._input_names = ['inputs']
      self._output_names = ['outputs']
      self._out_dtypes = [last.keras_object.compute_dtype]
      self._single_output = True
      stored = [layer if isinstance(layer, dict) else
                keras.saving.serialize_keras_object(layer)
                for layer in keras_layers]
      if weight_order is None and not any(isinstance(l, dict)
                                          for l in keras_layers):
        weight_order = [[l.name, j] for l in keras_layers
                        for j in range(len(l.weights))]
    self._pipe = pipe
    self._weight_order = ([list(w) for w in weight_order]
                          if weight_order is not None else None)
    self._tp_config = dict(
        layers=stored,
        num_partitions=num_partitions, num_micro_batches=num_micro_batches,
        batch_size=batch_size, input_shape=list(shape) if shape else None,
        partition_sizes=list(partition_sizes) if partition_sizes else None,
        cut_after=list(cut_after) if cut_after else None,
        weight_order=self._weight_order, **common)
    self._batch_size = batch_size
    self._num_micro_batches = num_micro_batches
    # Keras' jit_compile='auto' would XLA-compile the step on a GPU; the
    # pipeline places its partitions on K devices, which XLA cannot.
    self.supports_jit = False
    self.built = True

  @property
  def output_names(self) -> Optional[List[str]]:
    """The Keras layers making the outputs, as a functional Keras model's
    `output_names` (which compile reads to match losses and metrics keyed
    by output name); None for a Sequential, as Keras' own."""
    if self._graph is None:
      return None
    return list(self._graph.graph.output_names)

  @property
  def graph_pipeline(self) -> Optional[keras_graph_params.GraphPipeline]:
    """For a functional model: the cut plan (`.Report()`); else None."""
    return self._graph

  # -- the pipeline and its variables ---------------------------------------

  @property
  def pipeline(self) -> pipeline.TensorPipeLayer:
    """The TensorPipeLayer this model runs."""
    return self._pipe

  def _PipeVariables(self, trainable: bool) -> List[tf.Variable]:
    return [v for v in base_layer.VariablesByPath(self._pipe).values()
            if v.trainable == trainable]

  @property
  def trainable_weights(self):
    return self._PipeVariables(True) if self.trainable else []

  @property
  def non_trainable_weights(self):
    if not self.trainable:
      return self._PipeVariables(True) + self._PipeVariables(False)
    return self._PipeVariables(False)

  @property
  def weights(self):
    return self._PipeVariables(True) + self._PipeVariables(False)

  @property
  def trainable_variables(self):
    return self.trainable_weights

  @property
  def non_trainable_variables(self):
    return self.non_trainable_weights

  @property
  def variables(self):
    return self.weights

  def _get_regularization_losses(self):
    # Keras reads `.regularizer` of each weight; TensorPipe variables have
    # none (KerasLayer refuses regularised Keras weights).
    return []

  def save_own_variables(self, store):
    """Stores the pipeline's variables, in VariablesByPath order."""
    for i, var in enumerate(base_layer.VariablesByPath(self._pipe).values()):
      store[str(i)] = var.numpy()

  def load_own_variables(self, store):
    variables = list(base_layer.VariablesByPath(self._pipe).items())
    if len(store.keys()) != len(variables):
      raise ValueError(
          f'TensorPipeModel {self.name!r}: the saved weights hold '
          f'{len(store.keys())} variables but this model has '
          f'{len(variables)}; load weights saved from the same model')
    for i, (path, var) in enumerate(variables):
      value = np.asarray(store[str(i)])
      if list(value.shape) != var.shape.as_list():
        raise ValueError(f'TensorPipeModel {self.name!r}: saved variable {i} '
                         f'has shape {list(value.shape)} but {path!r} has '
                         f'{var.shape.as_list()}')
      var.assign(value)

  def KerasOrderVariables(self) -> List[tf.Variable]:
    """The pipeline's variables in the wrapped Keras model's weight order."""
    if self._weight_order is None:
      raise ValueError(
          f'TensorPipeModel {self.name!r} does not know the Keras weight '
          'order (it was built from layer configs without weight_order); '
          'build it from the Keras model, or pass weight_order')
    layers = {layer.layer_name: layer for layer in KerasLayersOf(self._pipe)}
    out = []
    for name, j in self._weight_order:
      layer = layers[name]
      _, key = layer.KerasWeights()[j]
      out.append(layer.vars[key])
    return out

  def get_weights(self):
    """The weights as numpy arrays, in the wrapped Keras model's order."""
    return [v.numpy() for v in self.KerasOrderVariables()]

  def set_weights(self, weights):
    """Sets the weights from `get_weights()` order (the Keras model's)."""
    variables = self.KerasOrderVariables()
    weights = list(weights)
    if len(weights) != len(variables):
      raise ValueError(f'TensorPipeModel {self.name!r}: got {len(weights)} '
                       f'arrays but the model has {len(variables)} weights; '
                       'pass keras_model.get_weights() of the wrapped model')
    for i, (var, value) in enumerate(zip(variables, weights)):
      value = np.asarray(value)
      if list(value.shape) != var.shape.as_list():
        raise ValueError(f'TensorPipeModel {self.name!r}: weight {i} has '
                         f'shape {list(value.shape)} but {var.name!r} has '
                         f'{var.shape.as_list()}')
      var.assign(value.astype(var.dtype.as_numpy_dtype))

  def to_keras(self) -> keras.Model:
    """The plain Keras model with this model's weights (moving statistics
    included): for model.save, TFLite or any other Keras tool."""
    stored = copy.deepcopy(self._tp_config['layers'])
    if self._graph is not None:
      model = keras.Model.from_config(stored)
    else:
      shape, dtype = self._input_specs[0]
      model = keras.Sequential(
          [keras.Input(shape, dtype=dtype)] +
          [keras.saving.deserialize_keras_object(l) for l in stored])
    model.set_weights(self.get_weights())
    # Keras' set_weights leaves a Normalization's mean and variance tensors
    # as they were derived at build: derive them from the new weights.
    keras_utils.FinalizeState(model)
    return model

  def get_config(self):
    config = {'name': self.name, 'trainable': self.trainable}
    config.update(self._tp_config)
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    config['copy_weights'] = False
    return cls(**config)

  # -- forward -------------------------------------------------------------

  def _StepSeed(self):
    optimizer = getattr(self, 'optimizer', None)
    if optimizer is None:
      return 0
    return tf.convert_to_tensor(optimizer.iterations)

  def _Inputs(self, x) -> tuple:
    """Keras' x as the pipeline's positional inputs (keras.Input order)."""
    n = len(self._input_specs)
    if isinstance(x, dict):
      missing = [k for k in self._input_names if k not in x]
      if missing or len(x) != n:
        raise ValueError(f'TensorPipeModel {self.name!r}: inputs keyed '
                         f'{sorted(x)}, but the model takes '
                         f'{self._input_names}')
      return tuple(x[k] for k in self._input_names)
    if isinstance(x, (list, tuple)):
      if len(x) != n:
        raise ValueError(f'TensorPipeModel {self.name!r} takes {n} input(s) '
                         f'({self._input_names}) but got {len(x)}')
      return tuple(x)
    if n != 1:
      raise ValueError(f'TensorPipeModel {self.name!r} takes {n} inputs '
                       f'({self._input_names}); pass a list of {n} tensors')
    return (x,)

  def _Outputs(self, out):
    return list(out) if isinstance(out, tuple) else out

  def _OutputSpecLike(self, xs):
    """Zeros shaped like the outputs (Keras' symbolic build only)."""
    meta = self._pipe.FPropMeta(self._pipe.params,
                                *[[1] + x.shape.as_list()[1:] for x in xs])
    outs = [tf.zeros(tf.concat([tf.shape(xs[0])[:1], s.as_list()[1:]], 0),
                     dtype) for s, dtype in zip(
                         tf.nest.flatten(meta.out_shapes), self._out_dtypes)]
    return outs[0] if self._single_output else outs

  def call(self, x, training=None):
    """The pipeline on x: training=True trains (batch statistics, dropout)."""
    xs = self._Inputs(x)
    if keras_utils.InSymbolicScope():
      return self._OutputSpecLike(xs)
    if training:
      with py_utils.StepSeed(self._StepSeed()), py_utils.TrainingMode(True):
        return self._Outputs(self._Train(xs))
    with py_utils.EvalMode():
      return self._Outputs(self._Infer(xs))

  def _Pipelined(self, xs):
    return self._pipe.FProp(self._pipe.theta, *xs)

  def _Infer(self, xs):
    """Inference on any batch: padded to a pipelined size, then sliced."""
    t = self._num_micro_batches
    n = xs[0].shape[0]
    if n is not None:
      if n % t == 0:
        return self._Pipelined(xs)
      rows = -(-n // t) * t
      return _Rows(self._Pipelined([_PadTo(x, rows) for x in xs]), n)
    size = tf.shape(xs[0])[0]
    rows = self._batch_size
    # Made outside the cond, valid for any size: TF may run a branch's pure
    # ops although the branch is not taken.
    fitted = [_PadTo(x[:rows], rows) for x in xs]
    return tf.cond(size <= rows,
                   lambda: _Rows(self._Pipelined(fitted), size),
                   lambda: _Chain(self._pipe, *xs))

  def _Train(self, xs):
    """Training forward on a batch of static size (a multiple of T)."""
    n = xs[0].shape[0]
    if n is not None and n % self._num_micro_batches == 0:
      return self._Pipelined(xs)
    return _Chain(self._pipe, *xs)

  def train_step(self, data):
    """One pipelined step: forward, loss, backward (recompute), update."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    xs = self._Inputs(x)
    variables = self.trainable_weights

    def Step(inputs, pipelined):
      with tf.GradientTape() as tape:
        if pipelined:
          y_pred = _Rows(self._Pipelined(inputs), tf.shape(xs[0])[0])
        else:
          y_pred = _Chain(self._pipe, *inputs)
        y_pred = self._Outputs(y_pred)
        loss = self.compute_loss(x=x, y=y, y_pred=y_pred,
                                 sample_weight=sample_weight, training=True)
        scaled = self.optimizer.scale_loss(loss)
      grads = tape.gradient(scaled, variables)
      return y_pred, loss, grads

    n = xs[0].shape[0]
    rows = self._batch_size
    with py_utils.StepSeed(self._StepSeed()), py_utils.TrainingMode(True):
      if n is not None:
        y_pred, loss, grads = Step(xs, n % self._num_micro_batches == 0)
      else:
        # A dataset of unknown batch size (e.g. fit on arrays): full batches
        # are pipelined, the last partial one runs unpipelined. The
        # pipeline's input is made outside the cond, valid for any size: TF
        # may run a branch's pure ops although the branch is not taken.
        fitted = [_PadTo(x_[:rows], rows) for x_ in xs]
        y_pred, loss, grads = tf.cond(
            tf.equal(tf.shape(xs[0])[0], rows), lambda: Step(fitted, True),
            lambda: Step(xs, False))
    tracker = getattr(self, '_loss_tracker', None)
    if tracker is not None:
      tracker.update_state(loss, sample_weight=tf.shape(xs[0])[0])
    self.optimizer.apply_gradients(zip(grads, variables))
    return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

  # -- export --------------------------------------------------------------

  def export(self, filepath: str, format: str = 'tf_saved_model',  # pylint: disable=redefined-builtin
             verbose=None, input_signature=None, **kwargs) -> str:
    """Keras' `model.export`: a SavedModel (see export_saved_model)."""
    del verbose  # unused
    if format not in ('tf_saved_model', ''):
      raise ValueError(f'TensorPipeModel.export: format={format!r} is not '
                       "supported; use format='tf_saved_model'")
    if input_signature is not None:
      raise ValueError('TensorPipeModel.export takes no input_signature: '
                       'the signature has one input per keras.Input')
    return self.export_saved_model(filepath, **kwargs)

  def export_saved_model(self, export_dir: str, pipelined: bool = False,
                         overwrite: bool = False) -> str:
    """Writes a SavedModel with a `serving_default` signature.

    The signature takes one input [batch, ...] (any batch) per keras.Input
    (`inputs` for a Sequential, else the keras.Input names) and returns
    {'outputs': ...} (a Sequential) or one output per model output, named
    by the layers that make them, in inference mode (moving averages, no
    dropout); plain `tf.saved_model.load(export_dir)` serves it without
    tensorpipe.
    """
    from tensorpipe import export  # pylint: disable=g-import-not-at-top
    specs = {name: tf.TensorSpec([None] + shape, dtype)
             for name, (shape, dtype) in zip(self._input_names,
                                             self._input_specs)}
    names = self._output_names
    return export.ExportModel(
        self._pipe, export_dir, specs, pipelined=pipelined,
        serving_batch_size=self._batch_size if pipelined else None,
        outputs=lambda out: dict(zip(names, tf.nest.flatten(out))),
        overwrite=overwrite,
        info={'front_end': 'keras_pipeline.TensorPipeModel'})
