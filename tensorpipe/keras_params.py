"""Keras models as TensorPipeLayer Params (the Params route).

`PipelineParams(model, K, T)` turns a `keras.Sequential` (or a list of Keras
3 layers) into TensorPipeLayer Params, one `KerasLayer` per Keras layer, each
holding its layer's config (so the Params are text, as every experiment's),
split into K partitions automatically (balanced by FPropMeta FLOPs) or by
`partition_sizes`; a functional model goes to keras_graph_params.GraphPlan.
`BuildPipeline` instantiates them and copies the Keras model's weights in
(`CopyKerasWeights`). Experiments (params/image/fashion_mnist.py) and
TensorPipeModel (keras_pipeline.py) build on these.
"""

import copy
from typing import Any, Callable, List, Optional, Sequence, Union

import keras

from tensorpipe import base_layer
from tensorpipe import hyperparams
from tensorpipe import keras_graph_params
from tensorpipe import keras_nested
from tensorpipe import keras_utils
from tensorpipe import pipeline
from tensorpipe.layers import keras_layer

KerasModelLike = Union[keras.Sequential, Sequence[Any]]


def CheckedLayers(model: KerasModelLike) -> List[Any]:
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


def InputShape(model: KerasModelLike,
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
  model into runs of its layer calls, one
  `keras_graph_segment.KerasGraphSegment` per partition (see keras_graph).

  Making the Params runs no TensorFlow op when `model` is a function (or
  its layers are built): the partition plan is computed when the Params are
  instantiated.

  Args:
    model: a keras.Sequential, a functional keras.Model (or its
      get_config() dict; a keras_hub model, or one with dict inputs or
      outputs, is flattened first: keras_nested), a list of Keras 3 layers
      (built or not), or a function returning one of them, which is then
      built without allocating weights (experiments: their Params are made
      before the trainer sets up devices; the KerasLayers initialise their
      own weights).
    num_partitions: K, the devices. With v stages per device
      (num_stages_per_device, or the schedule's own: 2 for 'zb_v') the
      model is cut into K v stages, for every kind of model.
    num_micro_batches: T.
    input_shape: one example's input shape (no batch axis); default: the
      Sequential's keras.Input.
    batch_size: the mini-batch size N the partition plan is costed at (the
      FLOPs per layer scale with it, the plan does not); default T.
    partition_sizes: manual split of a Sequential: K v numbers of
      consecutive layers per stage; None balances FPropMeta FLOPs
      automatically.
    name: the TensorPipeLayer's name.
    cut_after: manual split of a functional model: K v - 1 Keras layer
      names, in model order; the cut falls after each one's last call.
    **pipeline_params: more TensorPipeLayer Params (recompute, devices, ...).

  Returns:
    TensorPipeLayer Params; each layer is a KerasLayer named after its Keras
    layer, with that layer's config and input shape. A functional model's
    pipeline takes its inputs in keras.Input order or as one dict keyed by
    their names (a flattened model's dict inputs come in sorted-name
    order); a model with dict outputs returns a NestedMap keyed by them.

  Raises:
    TypeError / ValueError: a non-Sequential model, a Keras 2 object, an
      unknown input shape, bad partition sizes.
  """
  if keras_utils.IsKeras2(model):
    raise keras_utils.Keras2Error('keras_pipeline', 'the model', model)
  if callable(model) and not isinstance(model, (keras.Layer, list, tuple)):
    with keras_utils.NoAllocation():
      try:
        built = model()
      except ValueError as e:
        # Keras 3.15's refusal of a variable with a fixed value inside a
        # StatelessScope (keras_params_dict_test fails if it changes).
        if 'stateless scope' not in str(e):
          raise
        raise ValueError(
            'keras_pipeline: the model function made a variable with a '
            'fixed value, which the Params route cannot defer (it builds '
            'the model without allocating weights); a keras_hub task model '
            'compiles an optimizer when made: pass compile=False') from None
      return PipelineParams(built, num_partitions, num_micro_batches,
                            input_shape, batch_size, partition_sizes, name,
                            cut_after, **pipeline_params)
  keras_graph_params.CheckKT(num_partitions, num_micro_batches)
  nested = keras_nested.NestedSource(model)
  if nested is not None:  # a keras_hub model, or dict inputs or outputs
    model = nested.model
    pipeline_params.setdefault(
        'sequence_length', keras_nested.MaxSequenceLength(nested.source))
    pipeline_params['output_keys'] = nested.output_keys
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
    return keras_graph_params.GraphPlan(
        model, num_partitions, num_micro_batches, batch_size, cut_after,
        name, **pipeline_params).params
  if cut_after is not None:
    raise ValueError(f'keras_pipeline: cut_after={cut_after} is for '
                     'functional models; a Sequential is split by '
                     'partition_sizes')
  return _SequenceParams(model, num_partitions, num_micro_batches,
                         input_shape, batch_size, partition_sizes, name,
                         pipeline_params)


def _SequenceParams(model, num_partitions: int, num_micro_batches: int,
                    input_shape, batch_size, partition_sizes, name: str,
                    pipeline_params) -> hyperparams.Params:
  """PipelineParams of a Sequential or a list of layers."""
  layers = CheckedLayers(model)
  shape = InputShape(model, input_shape)
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
    v = keras_graph_params.StagesPerDevice(pipeline_params)
    if (len(sizes) != num_partitions * v or
        not all(isinstance(s, int) and s >= 1 for s in sizes) or
        sum(sizes) != len(layer_ps)):
      stages = (f'{num_partitions}' if v == 1 else f'{num_partitions * v} '
                f'(num_partitions={num_partitions} devices x {v} stages '
                'per device)')
      raise ValueError(
          f'keras_pipeline: partition_sizes={sizes} must be {stages} '
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
  nested = keras_nested.NestedSource(model)
  if nested is not None:
    model = nested.model
  elif isinstance(model, dict):
    return
  if keras_graph_params.IsGraph(model):
    for layer in KerasLayersOf(pipe):
      source = model.get_layer(layer.layer_name)
      if source.built:
        layer.AssignFromKeras(source)
    return
  layers = {layer.name: layer for layer in CheckedLayers(model)
            if not isinstance(layer, dict)}
  for layer, _ in pipe.LayersWithTheta():
    source = layers.get(layer.layer_name)
    if source is not None and source.built:
      layer.AssignFromKeras(source)


def KerasLayersOf(pipe: pipeline.TensorPipeLayer
                  ) -> List[keras_layer.KerasLayer]:
  """The pipeline's KerasLayers, in partition and call order; a tied
  reader (`tied_to`, a layer called again in a later stage) is not listed:
  its weights are its owner's."""
  return [layer for layer in base_layer.Layers(pipe)
          if isinstance(layer, keras_layer.KerasLayer) and
          layer.params.tied_to is None]


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
