"""The functional-model route of the Keras front door: a graph to Params.

`GraphPlan(model, K, T)` reads a functional Keras model (or its config),
costs and cuts it (keras_graph.py, keras_graph_costs.py) into K v stages
(K devices, v stages per device: `StagesPerDevice`) and returns the
TensorPipeLayer Params with one KerasGraphSegment per stage, and the
cut report; it warns once of each keras.ops node that reduces over the
batch axis (keras_graph_mixing.BatchMixingOps), which micro-batching
changes. keras_params.PipelineParams and TensorPipeModel call it for
functional models.
"""

import dataclasses
import types
from typing import Any, Dict, Optional, Sequence

from absl import logging

from tensorpipe import checks
from tensorpipe import errors
from tensorpipe import hyperparams
from tensorpipe import keras_graph
from tensorpipe import keras_graph_costs
from tensorpipe import keras_graph_mixing
from tensorpipe import keras_graph_segment
from tensorpipe import keras_utils
from tensorpipe import pipeline
from tensorpipe import schedule_builders


def CheckKT(num_partitions: Any, num_micro_batches: Any) -> None:
  """K and T as TensorPipeLayer checks them, before any Keras work."""
  checks.CheckPositiveInts('keras_pipeline', num_partitions=num_partitions,
                           num_micro_batches=num_micro_batches)


def StagesPerDevice(pipeline_params: Dict[str, Any]) -> int:
  """v of the TensorPipeLayer Params `pipeline_params` will set: its
  num_stages_per_device, or where None its schedule's own.

  Raises:
    ValueError: num_stages_per_device is neither None nor an int >= 1.
  """
  return schedule_builders.NumStagesPerDevice(types.SimpleNamespace(
      name='TensorPipe', schedule=pipeline_params.get('schedule', 'gpipe'),
      num_stages_per_device=pipeline_params.get('num_stages_per_device')))


def IsGraph(model: Any) -> bool:
  """A functional model, or its config (get_config or serialised)."""
  if isinstance(model, dict):
    return GraphConfig(model) is not None
  return keras_graph.IsFunctional(model)


def _ModelConfig(model: Any) -> Dict[str, Any]:
  """model.get_config(), or one line naming the (outermost) layer whose own
  config fails: the graph is read from the configs, as Keras saves a model."""
  try:
    return model.get_config()
  except Exception as e:  # pylint: disable=broad-except
    culprit, error = f'model {model.name!r}', e
    for layer in model._flatten_layers(include_self=False):  # pylint: disable=protected-access
      try:
        layer.get_config()
      except Exception as layer_error:  # pylint: disable=broad-except
        culprit = f'layer {layer.name!r} ({type(layer).__name__})'
        error = layer_error
        break
    raise ValueError(
        f'{culprit}: get_config() fails ({type(error).__name__}: '
        f'{errors.FirstLine(error)}), so the model cannot be read as a '
        'graph of layers (Keras could not save it either); fix or override '
        "that layer's get_config, or pass the layers as a keras.Sequential "
        'or a list') from None


def GraphConfig(model: Any) -> Optional[Dict[str, Any]]:
  """A functional model's get_config() dict (None if it is none)."""
  if not isinstance(model, dict):
    return _ModelConfig(model)
  if 'input_layers' in model:
    return model
  inner = model.get('config')
  if isinstance(inner, dict) and 'input_layers' in inner:
    return inner
  return None


@dataclasses.dataclass(frozen=True)
class GraphPipeline:
  """A functional model cut into a pipeline (`GraphPlan`).

  Attributes:
    params: the TensorPipeLayer Params (one KerasGraphSegment a partition).
    graph, costs, plan: keras_graph's Graph, GraphCosts and CutPlan.
    batch_size: the mini-batch the report sizes boundaries for.
  """
  params: hyperparams.Params
  graph: keras_graph.Graph
  costs: keras_graph.GraphCosts
  plan: keras_graph.CutPlan
  batch_size: int

  def Report(self) -> str:
    """Per partition its layers and FLOPs; per cut the tensors and bytes."""
    return self.plan.Report(self.graph, self.costs, self.batch_size)


_WARNED_BATCH_MIXING = set()


def WarnBatchMixing(graph: keras_graph.Graph,
                    costs: keras_graph.GraphCosts) -> None:
  """Warns once per process for each op that mixes the batch's examples."""
  for op in keras_graph_mixing.BatchMixingOps(graph, costs):
    if (graph.name, op.layer) in _WARNED_BATCH_MIXING:
      continue
    _WARNED_BATCH_MIXING.add((graph.name, op.layer))
    logging.warning(
        'keras_pipeline: node %r of model %r (keras.ops %s, axis=%r) '
        'reduces over the batch axis; a pipeline computes it per '
        'micro-batch (N/T examples), so it and what follows it differ from '
        'plain Keras on the whole batch (predict included). Compute it '
        'outside the model, or use num_micro_batches=1 for this model.',
        op.layer, graph.name, op.op, op.axis)


def GraphPlan(model: Any, num_partitions: int, num_micro_batches: int,
              batch_size: Optional[int] = None,
              cut_after: Optional[Sequence[str]] = None,
              name: str = 'TensorPipe', sequence_length: Optional[int] = None,
              output_keys: Optional[Sequence[str]] = None,
              **pipeline_params) -> GraphPipeline:
  """A functional model (or its config) cut into K v stages on K devices.

  Args: as PipelineParams (num_partitions: K devices; cut_after: K v - 1
    names); sequence_length: the length the cost model counts unknown
    non-batch dims at (keras_graph_costs.Analyse); output_keys: the
    pipeline returns a NestedMap keyed by them (dict outputs).

  Returns:
    The GraphPipeline; its Report() names what crosses each cut.
  """
  CheckKT(num_partitions, num_micro_batches)
  if keras_utils.IsKeras2(model):
    raise keras_utils.Keras2Error('keras_pipeline', 'the model', model)
  stages = num_partitions * StagesPerDevice(pipeline_params)
  graph = keras_graph.ReadGraph(GraphConfig(model))
  costs = keras_graph_costs.Analyse(graph, sequence_length)
  WarnBatchMixing(graph, costs)
  plan = keras_graph.PlanCuts(
      graph, costs, stages, cut_after,
      method=pipeline_params.get('partition_method', 'min_max'),
      stages_per_device=stages // num_partitions)
  batch = batch_size or num_micro_batches
  parts = [[keras_graph_segment.SegmentParams(graph, costs, plan, k,
                                              output_keys)]
           for k in range(stages)]
  p = pipeline.TensorPipeLayer.Params().Set(
      name=name, num_micro_batches=num_micro_batches, partitions=parts,
      input_shapes=[[batch] + list(info.shape)
                    for info in keras_graph_segment.InputSpecs(graph, costs)],
      **pipeline_params)
  result = GraphPipeline(p, graph, costs, plan, batch)
  logging.info('keras_pipeline: %s', result.Report())
  return result
