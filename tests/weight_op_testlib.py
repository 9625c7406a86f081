"""Checks that a layer routes its weights through `py_utils.WeightOp`.

The zero-bubble schedules split a stage's backward pass (schedule_engine.py):
the I cell differentiates the stage with respect to its inputs, each weight
op's output z and the weights outside weight ops; the W cell later takes each
routed weight's gradient as the vjp of fn(x, .) with the dz that I kept.
`AssertWeightOpsSplit` replays that split on one layer, eagerly, and checks:

- which weights the layer's weight ops take, in call order;
- the split gradients (I, then W) equal the unsplit tape's bit for bit (the
  same kernels on the same tensors), for every weight: a weight used outside
  its ops (a term the W cell cannot see) or a dz lost shows here.

`LiveNodes` / `IsWeightGradient` find the weight-gradient kernels a traced
cell runs; tensorpipe/cell_flops.py counts each cell's weight-gradient
FLOPs, for the share that runs in W cells.
"""

import re
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from tensorpipe import py_utils
from tensorpipe import schedule_builders
from tensorpipe import schedule_program
from tensorpipe import timeline


def _Dense(g):
  """A gradient as a tensor (a gather's IndexedSlices summed into rows, as
  a pipeline sums it)."""
  return tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g


def AssertWeightOpsSplit(test: tf.test.TestCase, layer: Any,
                         inputs: Sequence[Any], op_weights: Sequence[str],
                         fprop: Optional[Callable[..., Any]] = None) -> list:
  """Asserts the weight ops of `layer.FProp(theta, *inputs)` and their split.

  Args:
    test: the calling test case.
    layer: a built layer.
    inputs: FProp's inputs.
    op_weights: per weight op in call order, the dotted theta key of its
      weight (e.g. 'self_atten.atten.wq').
    fprop: (theta, *inputs) -> outputs; default layer.FProp.

  Returns:
    The `py_utils.WeightOpCall`s of the forward pass.
  """
  fprop = fprop or layer.FProp
  items = layer.theta.FlattenItems()
  keys = [k for k, _ in items]
  flat = [tf.convert_to_tensor(v) for _, v in items]
  theta = layer.theta.Pack(flat)
  index = {id(v): i for i, v in enumerate(flat)}

  def Loss(out):
    # A weighted sum: dz differs from element to element.
    outs = [o for o in tf.nest.flatten(out) if o.dtype.is_floating]
    return tf.add_n([tf.cast(tf.reduce_sum(o * tf.random.stateless_normal(
        tf.shape(o), [i, 7], dtype=o.dtype)), tf.float64)
                     for i, o in enumerate(outs)])

  with tf.GradientTape() as tape:
    tape.watch(flat)
    with py_utils.CollectWeightOps() as calls:
      loss = Loss(fprop(theta, *inputs))
  want = [_Dense(g) for g in tape.gradient(loss, flat)]
  got_keys = [keys[index[id(c.w)]] if id(c.w) in index else '<not theta>'
              for c in calls]
  test.assertEqual(list(op_weights), got_keys)
  # I: the routed weights unwatched, each op's z watched.
  routed = sorted({index[id(c.w)] for c in calls})
  others = [i for i in range(len(flat)) if i not in routed]
  with tf.GradientTape(watch_accessed_variables=False) as tape:
    tape.watch([flat[i] for i in others])
    with py_utils.CollectWeightOps(tape) as split_calls:
      loss = Loss(fprop(theta, *inputs))
  dzs, dws = tape.gradient(
      loss, ([c.z for c in split_calls], [flat[i] for i in others]),
      unconnected_gradients=tf.UnconnectedGradients.ZERO)
  got = [None] * len(flat)
  for i, g in zip(others, dws):
    got[i] = _Dense(g)
  # W: each op's dw from its (x, dz), summed in call order.
  for c, dz in zip(split_calls, dzs):
    i = index[id(c.w)]
    with tf.GradientTape() as tape:
      tape.watch(c.w)
      z = c.fn(c.x, c.w)
    g = _Dense(tape.gradient(z, c.w, output_gradients=dz))
    got[i] = g if got[i] is None else got[i] + g
  for key, a, b in zip(keys, want, got):
    if a is None:
      test.assertAllEqual(tf.zeros_like(b), b, msg=key)
    else:
      test.assertAllEqual(a, b, msg=key)
  # A whole backward with each op's dx handed on after its dw (B cells:
  # CollectWeightOps(order_grads=True)): the tape's bits.
  with tf.GradientTape() as tape:
    tape.watch(flat)
    with py_utils.CollectWeightOps(order_grads=True):
      loss = Loss(fprop(theta, *inputs))
  for key, a, g in zip(keys, want, tape.gradient(loss, flat)):
    b = _Dense(g)
    if a is None:
      test.assertIsNone(b, msg=key)
    else:
      test.assertAllEqual(a, b, msg=key)
  return calls


# The kernels that take a weight gradient (besides a MatMul with
# transpose_a: a 2-D dw = x^T dz): the filter gradients of the
# convolutions, the embedding's scatter-add.
_DW_KERNELS = ('Conv2DBackpropFilter', 'Conv3DBackpropFilterV2',
               'DepthwiseConv2dNativeBackpropFilter', 'UnsortedSegmentSum')


def IsWeightGradient(node) -> bool:
  """Whether a NodeDef is a weight-gradient kernel (see _DW_KERNELS)."""
  if node.op == 'MatMul':
    return node.attr['transpose_a'].b
  return node.op in _DW_KERNELS


def LiveNodes(f) -> list:
  """The nodes of FunctionDef `f` that its outputs depend on: what runs
  once TF instantiates it (it prunes the rest, e.g. the filter gradient
  that a convolution's gradient function builds for an unwatched filter)."""
  nodes = {n.name: n for n in f.node_def}
  todo = list(f.ret.values()) + list(f.control_ret.values())
  live = set()
  while todo:
    name = todo.pop().lstrip('^').split(':')[0]
    if name in nodes and name not in live:
      live.add(name)
      todo += list(nodes[name].input)
  return [nodes[name] for name in live]


def GPipeAndLossInsideSteps(want_pipe, got_pipe, x, loss_fn,
                            normalizer: float):
  """[loss] + gradients of the same step on two pipelines with the same
  weights: `want_pipe` (GPipe: loss_fn on its whole output, under a tape)
  and `got_pipe` (a loss-inside schedule: its FPropLoss), each divided by
  `normalizer`. Run it in the caller's training mode and step seed."""
  want_fn, got_fn = StepFns(want_pipe, got_pipe, loss_fn, normalizer)
  return want_fn(x), got_fn(x)


def StepFns(want_pipe, got_pipe, loss_fn, normalizer: float):
  """The two tf.functions of `GPipeAndLossInsideSteps`, not yet traced;
  `got_pipe` under GPipe runs as `want_pipe` does."""

  def Step(pipe):
    @tf.function(autograph=False)
    def Fn(x):
      with tf.GradientTape() as tape:
        if pipe.params.schedule == 'gpipe':
          loss = loss_fn(pipe.FPropDefaultTheta(x)) / normalizer
        else:
          loss = pipe.FPropLoss(pipe.theta, (x,), None, loss_fn,
                                normalizer).loss
      return [loss] + list(tape.gradient(loss, pipe.trainable_variables))
    return Fn
  return Step(want_pipe), Step(got_pipe)


def WeightGradientKernelsPerCellKind(pipe, x, loss_fn) -> dict:
  """Per kind of cell ('F', 'I', 'W') of a K=2, T=2 ZB-H1 pipeline that
  runs any, the number of weight-gradient kernels each of its cells runs
  (the branch functions of the switching loop; traced with the cells
  inline, schedule_program.IsolatedCells(False), so their ops sit in
  those branches), sorted."""
  # Branch b > 0 of device d runs cells[d][b - 1]: F, I, W on both.
  cells = schedule_program.Compile(
      schedule_builders.Build('zb_h1', 2, 2)).cells
  assert [[op for op, _ in row] for row in cells] == [['F', 'I', 'W']] * 2

  def Step(x):
    return pipe.FPropLossAndGrads(pipe.theta, (x,), None, loss_fn, 1.0).loss
  with py_utils.TrainingMode(True), timeline.Record(), \
      schedule_program.IsolatedCells(False):
    graph_def = tf.function(Step, autograph=False).get_concrete_function(
        x).graph.as_graph_def()
  got = {}
  for f in graph_def.library.function:
    branch = re.search(r'_branch(\d+)_', f.signature.name)
    n = sum(IsWeightGradient(node) for node in LiveNodes(f))
    if branch and n:
      got.setdefault(cells[0][int(branch.group(1)) - 1][0], []).append(n)
  return {op: sorted(counts) for op, counts in got.items()}
