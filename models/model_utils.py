"""Parameter counts of models from Params alone (no variables created).

`FPropMeta(...).num_params` counts every variable a layer creates, including
batch norm's non-trainable moving mean and variance. Published parameter
counts (ResNet-50's 25.6M, AmoebaNet's) count trainable weights only, so
`NumTrainableParams` subtracts 2 * channels for each batch-norm layer, found
by walking the layer Params tree:

  - a BatchNormLayer counts its `dim`;
  - a conv layer with `batch_norm=True` counts its output channels (its BN
    child is made from `bn_tpl` at construction);
  - composite layers are walked through the Params they hold (`sub`, ...);
  - a layer whose children are derived from its Params at construction
    (e.g. an AmoebaNet cell) exposes them with a classmethod
    `SubLayerParams(p) -> list of layer Params`, which is walked instead.
"""

from typing import Any, Sequence

from tensorpipe import hyperparams
from tensorpipe.layers import composite
from tensorpipe.layers import conv
from tensorpipe.layers import normalization


def NumBatchNormChannels(p: hyperparams.InstantiableParams) -> int:
  """Total channels of the batch-norm layers in layer Params `p`."""
  cls = p.cls
  if issubclass(cls, normalization.BatchNormLayer):
    return int(p.dim)
  # pylint: disable=protected-access
  if issubclass(cls, conv._ConvBase):
    return cls._OutChannels(p) if p.batch_norm else 0
  # pylint: enable=protected-access
  if hasattr(cls, 'SubLayerParams'):
    return sum(NumBatchNormChannels(s) for s in cls.SubLayerParams(p))
  total = 0
  for key, value in p.IterParams():
    if key.endswith('_tpl') or key.endswith('_tpls'):
      continue  # templates are copied into children, counted there
    total += _Walk(value)
  return total


def _Walk(value: Any) -> int:
  if isinstance(value, hyperparams.InstantiableParams) and value.cls:
    return NumBatchNormChannels(value)
  if isinstance(value, (list, tuple)):
    return sum(_Walk(v) for v in value)
  return 0


def NumTrainableParams(layer_params: Sequence[hyperparams.Params],
                       *input_shapes) -> int:
  """Trainable weights of a chain of layers, from FPropMeta alone.

  Args:
    layer_params: list of layer Params (a model's layers).
    *input_shapes: shapes of the first layer's inputs (batch may be 1).

  Returns:
    sum of FPropMeta num_params minus the batch-norm moving statistics.
  """
  metas, _ = composite.ChainFPropMeta(list(layer_params), input_shapes)
  total = sum(m.num_params for m in metas)
  return total - 2 * sum(NumBatchNormChannels(p) for p in layer_params)


def NumParams(layer_params: Sequence[hyperparams.Params], *input_shapes) -> int:
  """All weights (FPropMeta num_params, BN moving statistics included)."""
  metas, _ = composite.ChainFPropMeta(list(layer_params), input_shapes)
  return sum(m.num_params for m in metas)
