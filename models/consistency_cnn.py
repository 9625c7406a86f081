"""The paper's consistency model: a stack of 3x3 single-channel convolutions.

GPipe's unit test (Huang et al. 2018, supplement figure 1) checks that the
gradient norm of 16 `Conv2DLayer`s with `filter_shape=(3, 3, 1, 1)` is the same
for 1, 2 and 4 partitions.
"""

from typing import List

from tensorpipe import checks
from tensorpipe import hyperparams
from tensorpipe import pipeline
from tensorpipe.layers import conv


def ConsistencyLayers(num_layers: int = 16) -> List[hyperparams.Params]:
  """The paper's layers: `num_layers` Conv2DLayers 3x3, 1 -> 1 channel."""
  checks.CheckPositiveInts('', num_layers=num_layers)
  return [conv.Conv2DLayer.Params().Set(
      name=f'conv{i}', filter_shape=(3, 3, 1, 1), filter_stride=(1, 1))
          for i in range(num_layers)]


def ConsistencyPipeline(num_partitions: int, num_micro_batches: int = 8,
                        num_layers: int = 16,
                        input_shape=(16, 8, 8, 1)) -> hyperparams.Params:
  """TensorPipeLayer Params of the consistency model, automatically split."""
  return pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=ConsistencyLayers(num_layers),
      num_partitions=num_partitions, num_micro_batches=num_micro_batches,
      input_shapes=[list(input_shape)])
