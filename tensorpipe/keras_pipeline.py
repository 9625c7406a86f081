"""The Keras front door: a Keras model pipelined, and trained by `fit`.

`TensorPipeModel` takes a `keras.Sequential`, a list of Keras 3 layers, a
functional model or a keras_hub model; keras_front.Make asks once which
kind it is and builds the pipeline (keras_params for the Params route,
keras_graph_params for graphs, keras_nested for keras_hub models and dict
inputs). `TensorPipeModel` is a `keras.Model` around the pipeline:
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

from typing import Any, List, Optional, Sequence, Union

import keras
import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import keras_front
from tensorpipe import keras_graph_params
from tensorpipe import keras_loss_inside
from tensorpipe import keras_params
from tensorpipe import keras_utils
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import schedules
from tensorpipe.layers import composite


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

  def __init__(self, layers: keras_params.KerasModelLike, num_partitions: int = 1,
               num_micro_batches: int = 1, batch_size: Optional[int] = None,
               input_shape: Optional[Sequence[int]] = None,
               partition_sizes: Optional[Sequence[int]] = None,
               recompute: Union[bool, str] = True,
               devices: Optional[Sequence[str]] = None,
               partition_method: str = 'min_max', copy_weights: bool = True,
               cut_after: Optional[Sequence[str]] = None,
               weight_order: Optional[Sequence[Sequence[Any]]] = None,
               sequence_length: Optional[int] = None,
               schedule: str = 'gpipe',
               num_stages_per_device: Optional[int] = None,
               plan_regime: Optional[str] = None,
               plan_memory_budget: Optional[int] = None,
               **kwargs):
    """Builds the pipeline.

    Args:
      layers: a keras.Sequential, a functional keras.Model, a list of Keras
        3 layers (or the serialised configs get_config stores).
      num_partitions: K.
      num_micro_batches: T.
      batch_size: N, the rows of a pipelined step (a multiple of T); fit,
        evaluate and predict should use this batch size. None: T.
      input_shape, partition_sizes, cut_after: as keras_params.PipelineParams.
      recompute, devices, partition_method: TensorPipeLayer Params
        (recompute='auto': the planner's choice, as schedule='auto';
        get_config stores the choice).
      copy_weights: start from the Keras layers' weights.
      weight_order: [Keras layer name, weight index] per weight of the
        wrapped model (get_weights order); default: read from `layers`.
      sequence_length: for a functional model whose inputs have unknown
        non-batch dims (token ids of shape (None, None)): the length the
        cost model counts them at, so the cut balances the blocks. None: a
        keras_hub model's `max_sequence_length` (its backbone's), else
        unknown dims count no FLOPs.
      schedule: the training schedule (TensorPipeLayer's `schedule`):
        'gpipe' (the forward of every micro-batch, Keras' compiled loss on
        the whole batch, then the backward), or one that runs the loss
        inside the pipeline ('1f1b', 'interleaved_1f1b', 'zb_h1', 'zb_v',
        a registered name or a CSV table): the compiled loss is then
        computed per micro-batch on the last stage (keras_loss_inside).
        'auto' (a Sequential or a list of layers): the planner's pick
        from the layers' FLOPs (schedule_auto; logged), v = 2 included,
        which the model then runs and get_config stores.
      plan_regime, plan_memory_budget: schedule='auto' only (TensorPipeLayer
        Params): 'shared' or 'separate' devices (None: from the devices),
        and the most activation bytes per device.
      num_stages_per_device: v, stages per device (TensorPipeLayer's): the
        model is cut into num_partitions x v stages (partition_sizes: K v
        sizes; cut_after: K v - 1 names). None: the schedule's own (2 for
        'zb_v', else 1).
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
                  partition_method=partition_method, schedule=schedule,
                  num_stages_per_device=num_stages_per_device)
    plan = keras_front.PlanSettings(layers, schedule, recompute,
                                    plan_regime=plan_regime,
                                    plan_memory_budget=plan_memory_budget)
    front = keras_front.Make(
        layers, num_partitions, num_micro_batches, batch_size,
        copy_weights=copy_weights, input_shape=input_shape,
        partition_sizes=partition_sizes, cut_after=cut_after,
        weight_order=weight_order, sequence_length=sequence_length,
        **common, **plan)
    self._front = front
    self._pipe = front.pipe
    common.update(keras_front.Resolved(front.pipe.params, common))
    schedule = common['schedule']
    self._weight_order = front.weight_order
    self._tp_config = dict(
        layers=front.stored,
        num_partitions=num_partitions, num_micro_batches=num_micro_batches,
        batch_size=batch_size,
        input_shape=list(front.input_shape) if front.input_shape else None,
        partition_sizes=list(partition_sizes) if partition_sizes else None,
        cut_after=list(cut_after) if cut_after else None,
        weight_order=self._weight_order,
        sequence_length=front.sequence_length, **common)
    self._batch_size = batch_size
    self._num_micro_batches = num_micro_batches
    self._schedule = schedule
    # Keras' jit_compile='auto' would XLA-compile the step on a GPU; the
    # pipeline places its partitions on K devices, which XLA cannot.
    self.supports_jit = False
    self.built = True

  @property
  def output_names(self) -> Optional[List[str]]:
    """The Keras layers making the outputs, as a functional Keras model's
    `output_names` (which compile reads to match losses and metrics keyed
    by output name); None for a Sequential, as Keras' own."""
    if self._front.graph is None:
      return None
    return list(self._front.output_names)

  @property
  def graph_pipeline(self) -> Optional[keras_graph_params.GraphPipeline]:
    """For a functional model: the cut plan (`.Report()`); else None."""
    return self._front.graph

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
    layers = {layer.layer_name: layer for layer in keras_params.KerasLayersOf(self._pipe)}
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
    model = self._front.ToKeras()
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
    n = len(self._front.input_specs)
    if isinstance(x, dict):
      missing = [k for k in self._front.input_names if k not in x]
      if missing or len(x) != n:
        raise ValueError(f'TensorPipeModel {self.name!r}: inputs keyed '
                         f'{sorted(x)}, but the model takes '
                         f'{self._front.input_names}')
      return tuple(x[k] for k in self._front.input_names)
    if isinstance(x, (list, tuple)):
      if len(x) != n:
        raise ValueError(f'TensorPipeModel {self.name!r} takes {n} input(s) '
                         f'({self._front.input_names}) but got {len(x)}')
      return tuple(x)
    if n != 1:
      raise ValueError(f'TensorPipeModel {self.name!r} takes {n} inputs '
                       f'({self._front.input_names}); pass a list of {n} tensors')
    return (x,)

  def _Outputs(self, out):
    """The pipeline's outputs as the wrapped model returns them: a dict
    keyed as its outputs were, a list, or one tensor."""
    keys = self._front.output_keys
    if keys is not None:
      return dict(zip(keys, tf.nest.flatten(out)))
    return list(out) if isinstance(out, tuple) else out

  def _OutputSpecLike(self, xs):
    """Zeros shaped like the outputs, as the model returns them (Keras'
    symbolic build, the loss check)."""
    outs = self._FlatOutputSpecLike(xs)
    return self._Outputs(outs[0] if self._front.single_output
                         else tuple(outs))

  def _FlatOutputSpecLike(self, xs) -> List[tf.Tensor]:
    """Zeros shaped like the outputs, in the pipeline's output order. An
    unknown dim (a sequence axis of None) takes the first input's dim on
    that axis (a sequence model's length), else 1."""
    meta = self._pipe.FPropMeta(self._pipe.params,
                                *[[1] + x.shape.as_list()[1:] for x in xs])
    rank = xs[0].shape.rank or 0

    def Dim(i, d):
      if d is not None:
        return tf.constant(d, tf.int32)
      return tf.shape(xs[0])[i] if i < rank else tf.constant(1, tf.int32)
    return [tf.zeros(tf.stack([tf.shape(xs[0])[0]] + [
        Dim(i, d) for i, d in enumerate(s.as_list()[1:], start=1)]), dtype)
            for s, dtype in zip(tf.nest.flatten(meta.out_shapes),
                                self._front.out_dtypes)]

  def _OutputIndex(self):
    """The outputs' structure (as `_Outputs` returns them), each output's
    index among the pipeline's flat outputs as its leaf."""
    n = len(self._front.out_dtypes)
    return self._Outputs(0 if self._front.single_output else tuple(range(n)))

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

  def _maybe_symbolic_build(self, iterator=None, data_batch=None):
    """Builds Keras' compiled loss, metrics and optimizer before a step is
    traced, as Keras' TF trainer does under a distribution strategy.

    Without a strategy Keras builds them while tracing the step: their
    variables (the metrics' totals and counts, the per-output loss
    trackers) are then created in the first trace, and tf.function traces
    the step a second time; tracing a pipelined step is most of a short
    fit's time (a 1f1b fit of a small model: 11 s -> 7 s).
    """
    if iterator is not None:
      for _, _, it in iterator:
        data_batch = next(it)
        break
    self._symbolic_build(data_batch=data_batch)

  def train_step(self, data):
    """One pipelined step: forward, loss, backward (recompute), update."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    xs = self._Inputs(x)
    if schedules.LossInside(self._schedule):
      return self._LossInsideTrainStep(x, y, sample_weight, xs)
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

  def _LossInsideTrainStep(self, x, y, sample_weight, xs):
    """train_step under a schedule with the loss inside the pipeline.

      targets = each loss's and metric's labels and weights (whole batch)
      loss, sums = pipeline.FPropLoss(x, targets, per micro-batch: the
          compiled losses' sums (several: sum_i weight_i S_i / N_i) and
          metric (sum, count) pairs; Keras' normalisers of the whole batch)
      optimizer.apply(tape.gradient(loss, weights))
      Keras' loss trackers and metric states += the step's sums

    A batch of other than batch_size rows runs unpipelined, as under GPipe.
    """
    compiled = keras_loss_inside.Check(
        self, self._schedule, y, self._OutputSpecLike([x_[:0] for x_ in xs]),
        self._OutputIndex())
    variables = self.trainable_weights
    # What Keras' per-loss trackers weight a step by: the outputs' static
    # rows (CompileLoss.call), here the inputs'.
    static_rows = xs[0].shape[0]

    def Step(inputs, targets, pipelined):
      with tf.GradientTape() as tape:
        if pipelined:
          rows0 = self._FlatOutputSpecLike([x_[:0] for x_ in inputs])
          norms = compiled.Normalisers(targets, rows0, tf.shape(inputs[0])[0])
          res = self._pipe.FPropLoss(
              self._pipe.theta, tuple(inputs), targets,
              compiled.LossFn(norms), compiled.PipelineNormaliser(norms))
          loss, sums = compiled.Total(res.loss), res.metrics
          compiled.UpdateLossTrackers(sums, norms, static_rows)
        else:
          out = _Chain(self._pipe, *inputs)
          loss = self.compute_loss(x=x, y=y, y_pred=self._Outputs(out),
                                   sample_weight=sample_weight, training=True)
          sums = compiled.MetricSums(out, targets)
        scaled = self.optimizer.scale_loss(loss)
      return (loss, tape.gradient(scaled, variables),
              compiled.MetricPairs(sums))

    n = xs[0].shape[0]
    rows = self._batch_size
    targets = compiled.Targets(y, sample_weight)
    with py_utils.StepSeed(self._StepSeed()), py_utils.TrainingMode(True):
      if n is not None:
        loss, grads, sums = Step(xs, targets,
                                 n % self._num_micro_batches == 0)
      else:
        # As train_step's GPipe branch: the targets fitted with the inputs.
        fit = lambda t: _PadTo(t[:rows], rows)
        fitted = [fit(x_) for x_ in xs]
        fitted_targets = tf.nest.map_structure(fit, targets)
        loss, grads, sums = tf.cond(
            tf.equal(tf.shape(xs[0])[0], rows),
            lambda: Step(fitted, fitted_targets, True),
            lambda: Step(xs, targets, False))
    tracker = getattr(self, '_loss_tracker', None)
    if tracker is not None:
      tracker.update_state(loss, sample_weight=tf.shape(xs[0])[0])
    self.optimizer.apply_gradients(zip(grads, variables))
    compiled.UpdateMetrics(sums)
    return self.get_metrics_result()

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
    by the layers that make them (by their keys for a model with dict
    outputs), in inference mode (moving averages, no dropout); plain
    `tf.saved_model.load(export_dir)` serves it without tensorpipe.
    """
    from tensorpipe import export  # pylint: disable=g-import-not-at-top
    specs = {name: tf.TensorSpec([None] + shape, dtype)
             for name, (shape, dtype) in zip(self._front.input_names,
                                             self._front.input_specs)}
    names = self._front.output_keys or self._front.output_names
    return export.ExportModel(
        self._pipe, export_dir, specs, pipelined=pipelined,
        serving_batch_size=self._batch_size if pipelined else None,
        outputs=lambda out: dict(zip(names, tf.nest.flatten(out))),
        overwrite=overwrite,
        info={'front_end': 'keras_pipeline.TensorPipeModel'})
