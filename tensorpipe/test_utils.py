"""Helpers for TensorPipe tests: logical devices and oracle comparisons."""

from typing import Any, Callable, List, Sequence, Tuple

import tensorflow as tf

from tensorpipe import devices

NUM_TEST_DEVICES = 8


def ConfigureTestDevices(num: int = NUM_TEST_DEVICES) -> None:
  """Gives the test process `num` logical CPU devices (call at import)."""
  devices.SetNumLogicalCpuDevices(num)


def LossAndGrads(layer: Any, loss_fn: Callable[[Any], tf.Tensor],
                 *inputs) -> Tuple[Any, tf.Tensor, List[tf.Tensor]]:
  """Runs layer + loss in a tf.function; returns (outputs, loss, grads).

  Gradients are with respect to `layer.trainable_variables`, in that order.
  """
  variables = layer.trainable_variables

  # autograph=False: layers are plain Python; converting them is slow.
  @tf.function(autograph=False)
  def Step(*xs):
    with tf.GradientTape() as tape:
      out = layer.FPropDefaultTheta(*xs)
      loss = loss_fn(out)
    return out, loss, tape.gradient(loss, variables)
  return Step(*inputs)


def GlobalNorm(grads: Sequence[tf.Tensor]) -> float:
  return float(tf.linalg.global_norm(list(grads)))


def VariablesByName(layer: Any):
  """Trainable variables keyed by their path-free name within the layer tree.

  Containers differ (pipeline partitions vs a sequential layer), so match
  variables by the chain of layer names, skipping container levels.
  """
  out = {}
  _Collect(layer, '', out)
  return out


def _Collect(layer, prefix, out):
  for name, var in layer.vars.items():
    out[prefix + name] = var
  for child in layer.children.values():
    for c in (child if isinstance(child, (list, tuple)) else [child]):
      _Collect(c, prefix + c.layer_name + '/', out)
