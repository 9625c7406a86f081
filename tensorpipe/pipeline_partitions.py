"""A TensorPipeLayer's stages: its manual partitions, or its layers cut.

`Resolve(p)` turns TensorPipeLayer Params into the K v lists of layer Params
its stages hold: `partitions` as given (checked), or `layers` cut into
K v runs of balanced FPropMeta FLOPs, or of `partition_costs` where given
(`partitioning.Partition`, method `partition_method`), the plan logged.
Each refusal is one line naming the value and the fix.
"""

import math
from typing import Any, List, Optional, Tuple

from absl import logging

from tensorpipe import base_layer
from tensorpipe import checks
from tensorpipe import hyperparams
from tensorpipe import partitioning
from tensorpipe import schedule_builders
from tensorpipe.layers import composite


def Resolve(p) -> Tuple[List[List[Any]], Optional[partitioning.PartitionPlan]]:
  """The K v lists of layer Params of TensorPipeLayer Params `p` (its
  `partitions`, or its `layers` cut by FLOPs), and the automatic plan (or
  None)."""
  if p.partitions is not None and p.layers is not None:
    raise ValueError(f'TensorPipeLayer {p.name!r}: set either `partitions` '
                     '(manual) or `layers` + `num_partitions` (automatic), '
                     'not both')
  if p.partitions is not None and p.partition_costs is not None:
    raise ValueError(f'TensorPipeLayer {p.name!r}: partition_costs weigh '
                     'the automatic cut of `layers`, but `partitions` are '
                     'given by hand; drop one of them')
  if p.partitions is not None:
    parts = list(p.partitions)
    if not parts:
      raise ValueError(f'TensorPipeLayer {p.name!r}: partitions is empty; '
                       'give K >= 1 lists of layer Params')
    for k, part in enumerate(parts):
      if not isinstance(part, (list, tuple)):
        what = (f'layer Params {part.name!r}'
                if isinstance(part, hyperparams.Params) and 'name' in part
                else f'{type(part).__name__} {part!r}')
        raise TypeError(f'partitions[{k}] must be a list of layer Params, '
                        f'got {what}; give K lists of layer Params, e.g. '
                        'partitions=[[layer_a, layer_b], [layer_c]]')
      if not part:
        raise ValueError(f'TensorPipeLayer {p.name!r}: partition {k} is '
                         'empty; every partition needs at least one layer')
    v = schedule_builders.NumStagesPerDevice(p)
    if len(parts) % v:
      raise ValueError(
          f'TensorPipeLayer {p.name!r}: {len(parts)} partitions (stages) do '
          f'not fill num_stages_per_device={v} stages on each device; give '
          f'a multiple of {v} partitions')
    if p.input_shapes is not None:
      _CheckChain(p.name, [lp for part in parts for lp in part],
                       base_layer.InputShapes(p.input_shapes))
    return [list(part) for part in parts], None
  if p.layers is None:
    raise ValueError(f'TensorPipeLayer {p.name!r}: no layers; set '
                     '`partitions` (K lists of layer Params) or `layers` '
                     'with `num_partitions`')
  layers = list(p.layers)
  if not layers:
    raise ValueError(f'TensorPipeLayer {p.name!r}: layers is empty')
  k = p.num_partitions
  checks.CheckPositiveInts('', num_partitions=k)
  v = schedule_builders.NumStagesPerDevice(p)
  if k * v > len(layers):
    what = (f'num_partitions={k}' if v == 1 else
            f'num_partitions={k} x num_stages_per_device={v} = {k * v} '
            'stages')
    raise ValueError(f'{what} is larger than the number of layers '
                     f'({len(layers)}): each stage needs at least one '
                     f'layer; use num_partitions <= {len(layers) // v}')
  k *= v
  costs = p.partition_costs
  if costs is not None:
    costs = CheckCosts(p.name, costs, len(layers))
  if k == 1:
    return [layers], None
  if costs is None and p.input_shapes is None:
    raise ValueError(
        f'TensorPipeLayer {p.name!r}: automatic partitioning into {k} '
        'partitions balances FPropMeta costs, which need the input shapes; '
        'set input_shapes (e.g. [[batch, height, width, channels]]), '
        'partition_costs (one per layer) or give `partitions` explicitly')
  if p.input_shapes is not None:
    metas = _CheckChain(p.name, layers,
                        base_layer.InputShapes(p.input_shapes))
    if costs is None and metas is None:
      raise ValueError(
          f'TensorPipeLayer {p.name!r}: a layer has no FPropMeta, so its '
          'FLOPs are unknown and the layers cannot be cut by them; give '
          'partition_costs (one per layer) or `partitions` explicitly')
    if costs is None:
      costs = [m.flops for m in metas]
  plan = partitioning.Partition(costs, k, method=p.partition_method)
  # A row per stage; which device holds which: PlacementReport, logged
  # once the devices are known.
  logging.info('TensorPipeLayer %r partition plan (%d stages on %d '
               'devices):\n%s', p.name, k, k // v,
               plan.Report([lp.name for lp in layers]))
  out, start = [], 0
  for size in plan.sizes:
    out.append(layers[start:start + size])
    start += size
  return out, plan


def CheckCosts(name: str, costs: Any, num_layers: int) -> List[float]:
  """`partition_costs` as floats: one finite cost >= 0 per layer, not
  all 0; else ValueError naming the value and the fix."""
  fix = (f'give {num_layers} numbers >= 0 (one per layer, e.g. measured '
         'seconds) or None to balance FLOPs')
  if (not isinstance(costs, (list, tuple)) or len(costs) != num_layers or
      any(isinstance(c, bool) or not isinstance(c, (int, float))
          for c in costs)):
    raise ValueError(f'TensorPipeLayer {name!r}: partition_costs={costs!r} '
                     f'is not one number per layer; {fix}')
  out = [float(c) for c in costs]
  if any(not math.isfinite(c) or c < 0 for c in out) or not any(out):
    raise ValueError(f'TensorPipeLayer {name!r}: partition_costs={costs!r} '
                     f'has a negative, infinite or NaN cost, or is all 0; '
                     f'{fix}')
  return out


def _CheckChain(name: str, layer_params, input_shapes):
  """The layers' FPropMeta results in a chain (shapes checked), or None
  when a layer has no FPropMeta."""
  try:
    metas, _ = composite.ChainFPropMeta(
        layer_params, input_shapes, owner=f'TensorPipeLayer {name!r}')
  except NotImplementedError:
    return None
  return metas
