"""Helpers for TensorPipe tests: logical devices and oracle comparisons."""

from typing import Any, Callable, List, Sequence, Tuple

import numpy as np
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


def MicroBatchOracle(layer: Any, num_micro_batches: int,
                     loss_fn: Callable[[Any], tf.Tensor], *inputs):
  """The unpipelined `layer` run on each micro-batch, outputs concatenated.

  This is GPipe's semantics for an unpipelined model: batch norm sees
  micro-batch statistics, and each micro-batch's randomness is that of its
  examples (`py_utils.ExampleOffset`). Returns (outputs, loss, grads), the
  grads in `layer.trainable_variables` order.
  """
  from tensorpipe import microbatch  # pylint: disable=g-import-not-at-top
  from tensorpipe import py_utils  # pylint: disable=g-import-not-at-top
  variables = layer.trainable_variables
  size = microbatch.BatchSize(inputs) // num_micro_batches

  @tf.function(autograph=False)
  def Step(*xs):
    stacked = microbatch.Split(xs, num_micro_batches)
    with tf.GradientTape() as tape:
      outs = []
      for t in range(num_micro_batches):
        with py_utils.ExampleOffset(t * size):
          outs.append(layer.FPropDefaultTheta(*microbatch.Slice(stacked, t)))
      out = tf.nest.map_structure(lambda *a: tf.concat(a, 0), *outs)
      loss = loss_fn(out)
    return out, loss, tape.gradient(loss, variables)
  return Step(*inputs)


def AssertPipelineMatchesOracle(test: tf.test.TestCase,
                                layer_params: Sequence[Any],
                                num_partitions: int, num_micro_batches: int,
                                inputs: Sequence[Any],
                                loss_fn: Callable[[Any], tf.Tensor],
                                rtol: float = 1e-5, atol: float = 1e-6,
                                **pipeline_params) -> Any:
  """Asserts a TensorPipeLayer of `layer_params` equals MicroBatchOracle.

  Outputs, loss and every trainable variable's gradient (matched by layer
  names) are compared. Returns the pipeline layer.
  """
  from tensorpipe import pipeline  # pylint: disable=g-import-not-at-top
  from tensorpipe.layers import composite  # pylint: disable=g-import-not-at-top
  inputs = tuple(inputs)
  ref = composite.SequentialLayer.Params().Set(
      name='Sequential', sub=list(layer_params)).Instantiate()
  ref_out, ref_loss, ref_grads = MicroBatchOracle(ref, num_micro_batches,
                                                  loss_fn, *inputs)
  pipe = pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=list(layer_params),
      num_partitions=num_partitions, num_micro_batches=num_micro_batches,
      input_shapes=[tf.nest.map_structure(lambda x: x.shape.as_list(), x)
                    for x in inputs], **pipeline_params).Instantiate()
  test.assertLen(pipe.PartitionLayers(), num_partitions)
  out, loss, grads = LossAndGrads(pipe, loss_fn, *inputs)
  test.assertAllClose(out, ref_out, rtol=rtol, atol=atol)
  test.assertAllClose(loss, ref_loss, rtol=rtol, atol=atol)
  ref_vars, pipe_vars = VariablesByName(ref), VariablesByName(pipe)
  test.assertEqual(sorted(ref_vars), sorted(pipe_vars))
  ref_g = {v.ref(): g for v, g in zip(ref.trainable_variables, ref_grads)}
  pipe_g = {v.ref(): g for v, g in zip(pipe.trainable_variables, grads)}
  checked = 0
  for name, var in ref_vars.items():
    if var.trainable:
      test.assertAllClose(pipe_g[pipe_vars[name].ref()], ref_g[var.ref()],
                          rtol=rtol, atol=atol, msg=name)
      checked += 1
  test.assertGreater(checked, 0)
  return pipe


def NumpyAttention(theta, query, source, paddings, num_heads, causal):
  """Reference multi-head attention in NumPy (float64).

  `theta` holds wq, bq, wk, bk, wv, bv, wo, bo of MultiHeadedAttention;
  `paddings` is [batch, source_len] (1 = pad) or None.
  """
  t = {k: np.asarray(v, np.float64) for k, v in theta.items()
       if k != 'atten_dropout'}
  b, lq, _ = query.shape
  lk = source.shape[1]
  h = t['wq'].shape[1]
  dh = h // num_heads

  def Heads(x, w, bias):
    y = x @ t[w] + t[bias]
    return y.reshape(b, -1, num_heads, dh).transpose(0, 2, 1, 3)

  q, k, v = (Heads(query, 'wq', 'bq'), Heads(source, 'wk', 'bk'),
             Heads(source, 'wv', 'bv'))
  logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
  mask = np.zeros([b, 1, lq, lk])
  if paddings is not None:
    mask = np.maximum(mask, paddings[:, None, None, :])
  if causal:
    mask = np.maximum(mask, np.triu(np.ones([lq, lk]), 1)[None, None])
  logits = np.where(mask > 0, -1e30, logits)
  logits -= logits.max(-1, keepdims=True)
  probs = np.exp(logits)
  probs /= probs.sum(-1, keepdims=True)
  ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, lq, h)
  return ctx @ t['wo'] + t['bo']
