"""Helpers for TensorPipe tests: logical devices and oracle comparisons."""

import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import devices
from tensorpipe import distribute
from tensorpipe import optimizers
from tensorpipe import py_utils
from tensorpipe.layers import conv
from tensorpipe.layers import dropout
from tensorpipe.layers import linear

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


def WhileOps(graph: Any) -> List[Any]:
  """The tf.while_loop ops of a traced graph (a concrete function's),
  its nested function graphs included."""
  loops, todo = [], [graph]
  while todo:
    g = todo.pop()
    loops += [op for op in g.get_operations()
              if op.type in ('While', 'StatelessWhile')]
    todo += [f.graph for f in getattr(g, '_functions', {}).values()
             if getattr(f, 'graph', None) is not None]
  return loops


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


def SliceBatch(x: Any, start: int, size: int, batch_dim: int) -> Any:
  """Examples [start, start + size) of `x` on `batch_dim` (non-tensors as is)."""
  if not isinstance(x, (tf.Tensor, np.ndarray)):
    return x
  index = [slice(None)] * len(x.shape)
  index[batch_dim] = slice(start, start + size)
  return x[tuple(index)]


def MicroBatchOracle(layer: Any, num_micro_batches: int,
                     loss_fn: Callable[[Any], tf.Tensor], *inputs,
                     batch_dim: int = 0):
  """The unpipelined `layer` run on each micro-batch, outputs concatenated.

  This is GPipe's semantics for an unpipelined model: batch norm sees
  micro-batch statistics, and each micro-batch's randomness is that of its
  examples (`py_utils.ExampleOffset`). The slicing is written here, not taken
  from `tensorpipe.microbatch`, so that the oracle does not share code with
  the pipeline it checks. Returns (outputs, loss, grads), the grads in
  `layer.trainable_variables` order.
  """
  variables = layer.trainable_variables
  batch = {int(x.shape[batch_dim]) for x in tf.nest.flatten(inputs)
           if isinstance(x, (tf.Tensor, np.ndarray))}
  if len(batch) != 1:
    raise ValueError(f'inputs disagree on the batch size: {sorted(batch)}')
  batch = batch.pop()
  if batch % num_micro_batches:
    raise ValueError(f'batch {batch} is not divisible by '
                     f'num_micro_batches={num_micro_batches}')
  size = batch // num_micro_batches

  @tf.function(autograph=False)
  def Step(*xs):
    with tf.GradientTape() as tape:
      outs = []
      for t in range(num_micro_batches):
        part = tf.nest.map_structure(
            lambda x, t=t: SliceBatch(x, t * size, size, batch_dim), xs)
        # The layers draw per-example masks along the batch axis.
        with py_utils.ExampleOffset(t * size), py_utils.BatchAxis(batch_dim):
          outs.append(layer.FPropDefaultTheta(*part))
      out = tf.nest.map_structure(lambda *a: tf.concat(a, batch_dim), *outs)
      loss = loss_fn(out)
    return out, loss, tape.gradient(loss, variables)
  return Step(*inputs)


# Relative tolerance, as a fraction of the largest magnitude of the compared
# reference tensor, per dtype. The pipeline and its oracle compute the same
# function but not always in the same order: weight gradients are summed over
# micro-batches in the pipeline's order, and oneDNN / Eigen pick kernels (and
# with them the order of the sums inside a convolution) per shape and per CPU
# (AVX2 vs AVX-512 / AMX). Reordering a sum of n terms changes it by at most
# about n * eps * max|term|; for the tests' models (n up to ~1e4 terms per
# gradient element) that is < 1e-11 in float64, so 1e-9 leaves two orders of
# margin on any CPU while a real error (a wrong mask, a missing micro-batch,
# stale statistics) changes values by far more than 1e-6 of their scale.
# float32 (eps 1.2e-7) gets the same n * eps bound with n = 1e4: 1e-3.
DEFAULT_RTOL = {tf.float64: 1e-9, tf.float32: 1e-3}


def MaxAbs(values: Any) -> float:
  """The largest magnitude in a structure of tensors (0 if empty)."""
  return max([float(np.max(np.abs(np.asarray(v))))
              for v in tf.nest.flatten(values) if np.size(v)] or [0.0])


def AssertAllCloseScaled(test: tf.test.TestCase, actual: Any, expected: Any,
                         rtol: float, msg: str = '',
                         scale: float = 0.0) -> None:
  """assertAllClose with atol = rtol * max(max|expected|, scale), per tensor.

  A fixed absolute tolerance ignores the size of the values (a gradient of
  1e-6 and one of 1e3 need different ones); scaling by the reference's
  largest magnitude makes the tolerance a statement about relative precision.
  `scale` is a floor for tensors whose exact value is (near) zero, e.g. the
  gradient of a bias followed by batch norm: their rounding noise is set by
  the magnitudes summed to produce them, i.e. by the other gradients, not by
  their own size. Pass the largest magnitude of the whole group.
  """
  for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
    e = np.asarray(e)
    atol = rtol * max(MaxAbs(e), scale)
    test.assertAllClose(a, e, rtol=rtol, atol=atol, msg=msg)


def _WithDtype(layer_params: Sequence[Any], dtype) -> List[Any]:
  """Copies of the layer Params computing in `dtype` (children inherit it)."""
  out = []
  for lp in layer_params:
    lp = lp.Copy()
    if dtype is not None:
      lp.dtype = dtype
    out.append(lp)
  return out


def _CastInputs(inputs: Sequence[Any], dtype) -> Tuple[Any, ...]:
  def Cast(x):
    if dtype is not None and isinstance(x, tf.Tensor) and x.dtype.is_floating:
      return tf.cast(x, dtype)
    return x
  return tuple(tf.nest.map_structure(Cast, tuple(inputs)))


def AssertPipelineMatchesOracle(test: tf.test.TestCase,
                                layer_params: Sequence[Any],
                                num_partitions: int, num_micro_batches: int,
                                inputs: Sequence[Any],
                                loss_fn: Callable[[Any], tf.Tensor],
                                rtol: Optional[float] = None,
                                dtype=tf.float64,
                                **pipeline_params) -> Any:
  """Asserts a TensorPipeLayer of `layer_params` equals MicroBatchOracle.

  Outputs, loss and every trainable variable's gradient (matched by layer
  names) are compared. The claim is exactness, so by default both run in
  float64 (weights, activations and inputs), where the only differences left
  are sums taken in another order, far below `DEFAULT_RTOL`; pass
  `dtype=None` to keep the layers' own dtypes (e.g. a bfloat16 test), with an
  `rtol` that fits them. Tolerances scale with each tensor's magnitude
  (`AssertAllCloseScaled`). Returns the pipeline layer.
  """
  from tensorpipe import pipeline  # pylint: disable=g-import-not-at-top
  from tensorpipe.layers import composite  # pylint: disable=g-import-not-at-top
  layer_params = _WithDtype(layer_params, dtype)
  inputs = _CastInputs(inputs, dtype)
  if rtol is None:
    rtol = DEFAULT_RTOL[tf.as_dtype(dtype or tf.float32)]
  batch_dim = pipeline_params.get('batch_dim', 0)
  ref = composite.SequentialLayer.Params().Set(
      name='Sequential', sub=list(layer_params)).Instantiate()
  ref_out, ref_loss, ref_grads = MicroBatchOracle(
      ref, num_micro_batches, loss_fn, *inputs, batch_dim=batch_dim)
  pipe = pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=list(layer_params),
      num_partitions=num_partitions, num_micro_batches=num_micro_batches,
      input_shapes=[tf.nest.map_structure(lambda x: x.shape.as_list(), x)
                    for x in inputs], **pipeline_params).Instantiate()
  test.assertLen(pipe.PartitionLayers(), num_partitions)
  out, loss, grads = LossAndGrads(pipe, loss_fn, *inputs)
  AssertAllCloseScaled(test, out, ref_out, rtol, msg='outputs')
  AssertAllCloseScaled(test, loss, ref_loss, rtol, msg='loss')
  ref_vars, pipe_vars = VariablesByName(ref), VariablesByName(pipe)
  test.assertEqual(sorted(ref_vars), sorted(pipe_vars))
  ref_g = {v.ref(): g for v, g in zip(ref.trainable_variables, ref_grads)}
  pipe_g = {v.ref(): g for v, g in zip(pipe.trainable_variables, grads)}
  grad_scale = MaxAbs(ref_grads)
  checked = 0
  for name, var in ref_vars.items():
    if var.trainable:
      AssertAllCloseScaled(test, pipe_g[pipe_vars[name].ref()],
                           ref_g[var.ref()], rtol, msg=name, scale=grad_scale)
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


# tools/test.sh sets this: the README's test command must not pass by
# skipping the real-data tests when the data was never prepared.
REQUIRE_DATA_ENV = 'TENSORPIPE_REQUIRE_DATA'


def CheckPrepared(test: Any, name: str) -> None:
  """Skips `test` if data set `name` is not prepared, or fails under test.sh.

  Call at the start of a test that reads real data (data/tfds, or
  $TENSORPIPE_DATA_DIR). With $TENSORPIPE_REQUIRE_DATA=1 (set by
  tools/test.sh) missing data is a failure, not a skip.
  """
  from tensorpipe.inputs import tfds_utils  # pylint: disable=g-import-not-at-top
  data_dir = tfds_utils.DefaultDataDir()
  if tfds_utils.IsPrepared(name, data_dir):
    return
  message = (f'{name} is not prepared in {data_dir}; run bash '
             'tools/prepare_data.sh (or bash tools/setup.sh)')
  if os.environ.get(REQUIRE_DATA_ENV) == '1':
    test.fail(f'{message} ({REQUIRE_DATA_ENV}=1: missing data is a failure)')
  test.skipTest(message)


def _LossOf(result: Any) -> tf.Tensor:
  return result['loss'] if isinstance(result, dict) else result


def AssertOneFOneBMatchesOracle(test: tf.test.TestCase,
                                layer_params: Sequence[Any],
                                num_partitions: int, num_micro_batches: int,
                                inputs: Sequence[Any], targets: Any,
                                loss_fn: Callable[[Any, Any], Any],
                                normalizer: float,
                                rtol: Optional[float] = None,
                                dtype=tf.float64, step_seed: int = 3,
                                entry_points: Sequence[str] = (
                                    'FPropLossAndGrads', 'FPropLoss'),
                                schedule: str = '1f1b',
                                **pipeline_params) -> Any:
  """Asserts a loss-inside TensorPipeLayer equals MicroBatchOracle.

  The pipeline runs `schedule`: 1F1B, or any table schedule of the engine
  (interleaved 1F1B, the zero-bubble zb_h1 and zb_v with their split
  backward; pass num_stages_per_device in `pipeline_params` for v > 1).

  `loss_fn(outputs, targets)` returns a loss SUM over the examples it is
  given (or NestedMap(loss=..., metrics=...)), so the oracle's loss is
  loss_fn(all outputs, all targets) / normalizer. Both training entry points
  are checked against the oracle's loss and every gradient (matched by layer
  names): `FPropLossAndGrads`, and `FPropLoss` differentiated by a tape (its
  custom gradient); `entry_points` may name only one of them. Float inputs and targets are cast to `dtype` as in
  `AssertPipelineMatchesOracle`; both run in training mode with the same
  step seed (dropout masks). Returns the pipeline layer.
  """
  from tensorpipe import pipeline  # pylint: disable=g-import-not-at-top
  from tensorpipe.layers import composite  # pylint: disable=g-import-not-at-top
  layer_params = _WithDtype(layer_params, dtype)
  inputs = _CastInputs(inputs, dtype)
  targets = None if targets is None else _CastInputs([targets], dtype)[0]
  if rtol is None:
    rtol = DEFAULT_RTOL[tf.as_dtype(dtype or tf.float32)]
  batch_dim = pipeline_params.get('batch_dim', 0)
  ref = composite.SequentialLayer.Params().Set(
      name='Sequential', sub=list(layer_params)).Instantiate()
  with py_utils.TrainingMode(True), py_utils.StepSeed(step_seed):
    _, ref_loss, ref_grads = MicroBatchOracle(
        ref, num_micro_batches,
        lambda out: _LossOf(loss_fn(out, targets)) / normalizer, *inputs,
        batch_dim=batch_dim)
  pipe = pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=list(layer_params),
      num_partitions=num_partitions, num_micro_batches=num_micro_batches,
      input_shapes=[tf.nest.map_structure(lambda x: x.shape.as_list(), x)
                    for x in inputs], schedule=schedule,
      **pipeline_params).Instantiate()
  test.assertLen(pipe.PartitionLayers(), num_partitions * pipeline_params.get(
      'num_stages_per_device', 1))
  variables = pipe.trainable_variables

  @tf.function(autograph=False)
  def Step(xs, tgt):
    out = {}
    if 'FPropLossAndGrads' in entry_points:
      res = pipe.FPropLossAndGrads(pipe.theta, tuple(xs), tgt, loss_fn,
                                   normalizer)
      by_var = {id(v): g for v, g in zip(tf.nest.flatten(pipe.theta),
                                         tf.nest.flatten(res.grads))}
      out['FPropLossAndGrads'] = (res.loss,
                                  [by_var[id(v)] for v in variables])
    if 'FPropLoss' in entry_points:
      with tf.GradientTape() as tape:
        taped = pipe.FPropLoss(pipe.theta, tuple(xs), tgt, loss_fn,
                               normalizer)
      out['FPropLoss'] = (taped.loss, tape.gradient(taped.loss, variables))
    return out

  with py_utils.TrainingMode(True), py_utils.StepSeed(step_seed):
    results = Step(list(inputs), targets)
  test.assertNotEmpty(results)
  ref_vars, pipe_vars = VariablesByName(ref), VariablesByName(pipe)
  test.assertEqual(sorted(ref_vars), sorted(pipe_vars))
  ref_g = {v.ref(): g for v, g in zip(ref.trainable_variables, ref_grads)}
  grad_scale = MaxAbs(ref_grads)
  test.assertGreater(grad_scale, 0.0)
  for how, (l, gs) in results.items():
    AssertAllCloseScaled(test, l, ref_loss, rtol, msg=f'{how}: loss')
    pipe_g = {v.ref(): g for v, g in zip(variables, gs)}
    checked = 0
    for name, var in ref_vars.items():
      if var.trainable:
        AssertAllCloseScaled(test, pipe_g[pipe_vars[name].ref()],
                             ref_g[var.ref()], rtol, msg=f'{how}: {name}',
                             scale=grad_scale)
        checked += 1
    test.assertGreater(checked, 0)
  return pipe


# "name: (Op): /job:localhost/replica:0/task:0/device:CPU:3", one line per op
# in TensorFlow's log_device_placement report.
_PLACEMENT_LINE = re.compile(r'^(\S+): \((\w+)\): (\S+)$')


def DeviceIndex(name: str) -> Optional[int]:
  """'/job:localhost/replica:0/task:0/device:CPU:3' -> 3 (None: no CPU:n)."""
  m = re.search(r'CPU:(\d+)$', name)
  return int(m.group(1)) if m else None


def RunPlacementChild(script: str, child_env: str,
                      timeout_s: float = 300) -> Tuple[Any, List[Tuple[
                          str, str, str]]]:
  """Runs `script` as a child that logs op placements; returns its report.

  The placer prints its report on the process's stdout, so a test re-runs
  its own file in a child with `child_env` set to a JSON path the child
  writes (whatever else the test needs: devices, variables).

  Returns:
    (the child's JSON, [(op name, op type, device)] of every placed op).

  Raises:
    AssertionError: the child failed (its stderr's tail in the message).
  """
  with tempfile.TemporaryDirectory() as d:
    out_path = os.path.join(d, 'report.json')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env[child_env] = out_path
    env.pop('TF_CPP_MIN_LOG_LEVEL', None)
    proc = subprocess.run([sys.executable, os.path.abspath(script)], env=env,
                          capture_output=True, text=True, timeout=timeout_s,
                          check=False)
    if proc.returncode:
      raise AssertionError(f'placement child failed:\n{proc.stderr[-3000:]}')
    with open(out_path) as f:
      report = json.load(f)
  ops = [m.groups() for m in map(_PLACEMENT_LINE.match,
                                 proc.stdout.splitlines()) if m]
  return report, ops


def ReplicatedSgdStep(task_params: Any, groups: Sequence[Sequence[str]],
                      lr: float = 0.1, momentum: float = 0.9):
  """R replicas of `task_params` on device `groups`, and their train step.

  Returns:
    (topology, replicas, optimizers, Step) where Step(batch, step) is a
    tf.function running `distribute.TrainStep` in training mode with the
    step's seed and SGD with momentum.
  """
  topology = distribute.LocalTopology(groups)
  replicas = distribute.BuildReplicas(task_params, topology)
  opts = []
  for task in replicas:
    opt = optimizers.SGD.Params().Set(momentum=momentum).Instantiate()
    opt.Build(base_layer.VariablesByPath(task, trainable_only=True))
    opts.append(opt)

  @tf.function(autograph=False)
  def Step(batch, step):
    with py_utils.TrainingMode(True), py_utils.StepSeed(step):
      return distribute.TrainStep(topology, replicas, opts, batch,
                                  tf.constant(lr, tf.float32))
  return topology, replicas, opts, Step


def ConvTestModel(num_classes: int = 5) -> List[Any]:
  """Layer Params: conv+BN, dropout, strided conv, flatten, FC.

  [b, 8, 8, 2] -> [b, num_classes]; batch norm and dropout make it check
  micro-batch statistics and per-example masks.
  """
  c = conv.Conv2DLayer.Params
  return [
      c().Set(name='stem', filter_shape=(3, 3, 2, 4), batch_norm=True),
      dropout.DropoutLayer.Params().Set(name='drop1', keep_prob=0.7),
      c().Set(name='conv2', filter_shape=(3, 3, 4, 4), filter_stride=(2, 2),
              bias=True),
      linear.FlattenLayer.Params().Set(name='flat'),
      linear.FCLayer.Params().Set(name='fc', input_dim=64,
                                  output_dim=num_classes, activation='NONE'),
  ]
