"""Which model TensorPipeModel wraps, asked once: a Front per kind.

`Make` looks at the model once: a keras_hub model or one with dict inputs or
outputs is flattened first (keras_nested); a functional graph is cut by
keras_graph (GraphPlan); a Sequential or a list of layers is one KerasLayer
per layer (keras_params.PipelineParams). The Front it returns holds every fact
TensorPipeModel needs of the model (the pipeline, input and output names
and specs, what get_config stores, the Keras weight order) and rebuilds a
plain Keras model of the same kind (`ToKeras`).
"""

import copy
import dataclasses
from typing import Any, List, Optional, Tuple

import keras

from tensorpipe import keras_graph_params
from tensorpipe import keras_graph_segment
from tensorpipe import keras_nested
from tensorpipe import keras_params
from tensorpipe import keras_utils
from tensorpipe import pipeline


@dataclasses.dataclass(frozen=True)
class Front:
  """What TensorPipeModel needs of the model it wraps, found once by its
  kind (`Make`): a functional graph (keras_graph) or a sequence of
  layers (a Sequential or a list).

  Attributes:
    pipe: the TensorPipeLayer.
    input_specs: per model input, (one example's shape, dtype).
    input_names, output_names: the keras.Input names and the layers making
      the outputs (a sequence: ['inputs'] and ['outputs']).
    out_dtypes: per output, its dtype.
    single_output: the model returns one tensor, not a list.
    stored: what get_config stores to build the model again.
    input_shape: a sequence's input shape (None for a graph).
    weight_order: [layer name, index] per weight in the wrapped model's
      get_weights order (None when unknown).
    graph: the cut plan of a functional model (None for a sequence).
    sequence_length: the length the cost model counted unknown dims at.
    nested: the model was flattened (keras_nested): `stored` is its own
      serialised config.
    output_keys: for a model with dict outputs, their keys in output order
      (TensorPipeModel returns a dict keyed by them); else None.
  """
  pipe: pipeline.TensorPipeLayer
  input_specs: List[Tuple[List[Any], str]]
  input_names: List[str]
  output_names: List[str]
  out_dtypes: List[str]
  single_output: bool
  stored: Any
  input_shape: Optional[List[int]]
  weight_order: Optional[List[List[Any]]]
  graph: Optional[keras_graph_params.GraphPipeline] = None
  sequence_length: Optional[int] = None
  nested: bool = False
  output_keys: Optional[List[str]] = None

  def ToKeras(self) -> keras.Model:
    """A new plain Keras model of the wrapped model's kind (own weights)."""
    stored = copy.deepcopy(self.stored)
    if self.nested:
      return keras.saving.deserialize_keras_object(stored)
    if self.graph is not None:
      return keras.Model.from_config(stored)
    shape, dtype = self.input_specs[0]
    return keras.Sequential(
        [keras.Input(shape, dtype=dtype)] +
        [keras.saving.deserialize_keras_object(l) for l in stored])


def GraphFront(model: Any, num_partitions: int, num_micro_batches: int,
                batch_size: int, copy_weights: bool, cut_after, weight_order,
                sequence_length: Optional[int], nested, **common) -> Front:
  built = keras_graph_params.GraphPlan(
      keras_graph_params.GraphConfig(model), num_partitions,
      num_micro_batches, batch_size, cut_after,
      sequence_length=sequence_length, **common)
  pipe = built.params.Instantiate()
  if copy_weights:
    keras_params.CopyKerasWeights(pipe, model)
  graph, costs = built.graph, built.costs
  if weight_order is None and not isinstance(model, dict):
    weight_order = keras_utils.WeightOrder(model)
  return Front(
      pipe=pipe,
      input_specs=[(list(info.shape), info.dtype)
                   for info in keras_graph_segment.InputSpecs(graph, costs)],
      input_names=list(graph.input_names),
      output_names=list(graph.output_names),
      out_dtypes=[costs.tensors[k].dtype for k in graph.outputs],
      single_output=graph.single_output,
      # A flattened model stores its own config (keras_nested docstring).
      stored=(keras.saving.serialize_keras_object(nested.source) if nested
              else keras_graph_params.GraphConfig(model)),
      input_shape=None, weight_order=weight_order, graph=built,
      sequence_length=sequence_length, nested=nested is not None,
      output_keys=nested.output_keys if nested else None)


def LayersFront(model: Any, num_partitions: int, num_micro_batches: int,
                 batch_size: int, copy_weights: bool, input_shape,
                 partition_sizes, weight_order, **common) -> Front:
  keras_layers = keras_params.CheckedLayers(model)
  shape = keras_params.InputShape(model, input_shape)
  pipe = keras_params.BuildPipeline(
      model, num_partitions, num_micro_batches, copy_weights=copy_weights,
      input_shape=shape, batch_size=batch_size,
      partition_sizes=partition_sizes, **common)
  first, last = pipe.LayersWithTheta()[0][0], pipe.LayersWithTheta()[-1][0]
  if weight_order is None and not any(isinstance(l, dict)
                                      for l in keras_layers):
    weight_order = [[l.name, j] for l in keras_layers
                    for j in range(len(l.weights))]
  return Front(
      pipe=pipe, input_specs=[(list(shape), first.keras_object.compute_dtype)],
      input_names=['inputs'], output_names=['outputs'],
      out_dtypes=[last.keras_object.compute_dtype], single_output=True,
      stored=[layer if isinstance(layer, dict) else
              keras.saving.serialize_keras_object(layer)
              for layer in keras_layers],
      input_shape=list(shape), weight_order=weight_order)


def PlanSettings(model: Any, schedule: Any, recompute: Any = True,
                 **plan) -> dict:
  """TensorPipeModel's planner settings that are set (plan_regime,
  plan_memory_budget), checked against the 'auto' settings and the model.

  Raises:
    ValueError: schedule='auto' or recompute='auto' for a functional model
      (cut along its graph before the planner runs), or a planner setting
      with neither 'auto'.
  """
  autos = [f"{k}='auto'" for k, v in (('schedule', schedule),
                                      ('recompute', recompute))
           if v == 'auto']
  if autos and keras_graph_params.IsGraph(model):
    raise ValueError(
        f"TensorPipeModel: {' and '.join(autos)} plans the cut of a "
        'Sequential or a list of layers; a functional model is cut along '
        "its graph first: name a schedule ('1f1b', 'zb_h1', ...: README, "
        "'Which schedule?') and set recompute")
  given = {k: v for k, v in plan.items() if v is not None}
  if given and not autos:
    raise ValueError(f'TensorPipeModel: {", ".join(sorted(given))} set with '
                     f'schedule={schedule!r}, recompute={recompute!r}; they '
                     "steer the planner of schedule='auto' or "
                     "recompute='auto' only: drop them or use 'auto'")
  return given


def Resolved(pipe_params: Any, common: dict) -> dict:
  """The 'auto' settings of `common` (schedule, its v; recompute) as the
  layer resolved them (schedule_auto, from the layers' FLOPs): the train
  step takes the path of the schedule it runs, and get_config stores the
  picks, so from_config rebuilds the same pipeline without planning
  again."""
  out = {}
  if common['schedule'] == 'auto':
    out.update(schedule=pipe_params.schedule,
               num_stages_per_device=pipe_params.num_stages_per_device)
  if common['recompute'] == 'auto':
    out.update(recompute=pipe_params.recompute)
  return out


def Make(model: Any, num_partitions: int, num_micro_batches: int,
               batch_size: int, copy_weights: bool, input_shape,
               partition_sizes, cut_after, weight_order,
               sequence_length: Optional[int], **common) -> Front:
  """The Front for `model`'s kind, asked once.

  num_partitions is K devices, for every kind: with v stages per device
  (num_stages_per_device, or the schedule's own) the Params route cuts the
  model into K v stages (keras_params.PipelineParams, GraphPlan).
  """
  nested = keras_nested.NestedSource(model)
  if nested is not None:  # a keras_hub model, or dict inputs or outputs
    model = nested.model
    if weight_order is None:
      weight_order = nested.weight_order
    if sequence_length is None:
      sequence_length = keras_nested.MaxSequenceLength(nested.source)
  if weight_order is not None:
    weight_order = [list(w) for w in weight_order]
  if keras_graph_params.IsGraph(model):
    return GraphFront(model, num_partitions, num_micro_batches, batch_size,
                       copy_weights, cut_after, weight_order,
                       sequence_length, nested, **common)
  return LayersFront(model, num_partitions, num_micro_batches, batch_size,
                     copy_weights, input_shape, partition_sizes,
                     weight_order, **common)
