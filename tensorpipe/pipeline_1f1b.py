"""1F1B: the one-forward-one-backward pipeline schedule, loss inside the loop.

PipeDream-flush / 1F1B (Narayanan et al. 2021, arXiv 2006.09503; Megatron-LM,
DeepSpeed) has GPipe's bubble and GPipe's synchronous, exact gradients, but
starts a micro-batch's backward pass as soon as the last partition has
computed its loss, so partition k holds at most min(K - k, T) micro-batches
between their forward and backward passes where GPipe holds T. This needs the
loss inside the pipeline: the last partition applies a per-micro-batch loss
function to its outputs, and one step returns (loss, metrics, gradients)
rather than outputs (`TensorPipeLayer.FPropLossAndGrads`).

The engine is a tf.while_loop over the 2 (T + K - 1) ticks of
`schedules.OneFOneBCell`, which says what each partition does on a tick
(idle, forward of micro-batch t, backward of micro-batch t); each partition
reads it from a table on its own device. The ticks on which every partition
works (2K - 1 .. 2T - 2, alternating backward and forward) run as a loop of
tick pairs whose ops are fixed in the graph (`_Loops`: no tf.switch_case);
warm-up and cool-down switch on the op. Pseudo-code:

  x[t] = micro-batch t of the inputs                       # [T, N/T, ...]
  for c in range(2 (T + K - 1)):                            # tf.while_loop
    for k in range(K):                                      # concurrently
      op, t = OneFOneBCell(c, k, K, T)                      # schedules.py
      t = T - 1 - t                          # last-first: MicroBatchOf
      if op == FORWARD:
        in_k = x[t] if k == 0 else out[k - 1]               # latched
        slot[k][t mod (K - k)] = in_k                       # k > 0
        out[k], stats_k += F_k(theta_k, in_k)
        if k == K - 1: loss, metrics += loss_fn(out[k], targets[t])
      elif op == BACKWARD:                                  # recompute + vjp
        in_k = x[t] if k == 0 else slot[k][t mod (K - k)]
        dy = d(loss_fn / normalizer) if k == K - 1 else dx[k + 1]
        dx[k], dtheta_k += vjp(F_k, in_k, dy)
  moving stats of batch norm <- stats summed over all micro-batches

Why one latched buffer per boundary is enough: partition k - 1 runs no other
forward between producing micro-batch t and partition k consuming it, and
the gradient of (t, k) is produced by partition k + 1 on the tick before.
Slot t mod (K - k) of partition k is free again before it is reused (its
micro-batch's backward ran), so each partition keeps min(K - k, T) boundary
inputs (a TensorArray of that size; partition 0 reads its inputs from the
mini-batch and keeps none).

With recompute (the default) each partition's forward pass is recomputed
in its backward cell (GPipe's re-materialisation), so only boundary inputs
cross ticks. Without recompute, a forward cell's intermediate tensors must
live until its backward cell on a later tick; nothing public in TensorFlow
carries a stage's autodiff state from one tf.while_loop iteration to
another, so recompute=False unrolls the schedule in Python instead
(`_RunUnrolled`): each forward cell runs under its own GradientTape and its
backward cell takes that tape's gradient, 2 K T stage calls in the graph.
That keeps the activations of at most min(K - k, T) micro-batches on
partition k (GPipe without recompute keeps T) and skips the recompute, at a
graph that grows with T (tracing time; a warning past
`UNROLLED_CELLS_WARNING` stage calls). Layer-level recompute (stash each
layer's input, recompute inside layers) was not chosen: it recomputes every
layer's forward once as well, so it costs what stage recompute costs.

The loop (recompute) is traced once for all ticks and, like GPipe's loops,
is never differentiated: the step computes the gradients itself.
`TensorPipeLayer.FPropLoss` wraps it in a tf.custom_gradient whose gradient
is upstream x the stored gradients, so a task's loss built on it works with
the trainer's GradientTape unchanged.

Batch norm and dropout behave as in GPipe: each micro-batch normalises with
its own statistics, the moving averages are updated once per step from the
sum over micro-batches, and dropout masks are per example (micro-batch t's
example offset, the step's context), so they do not depend on K, T or the
schedule, and the recompute redraws them exactly.
"""

from typing import Any, Callable, List, NamedTuple, Sequence, Tuple

from absl import logging
import tensorflow as tf

from tensorpipe import grad_sum
from tensorpipe import microbatch
from tensorpipe import pipeline_stage
from tensorpipe import py_utils
from tensorpipe import schedules
from tensorpipe import timeline
from tensorpipe.nested_map import NestedMap

# A loss function: (outputs of one micro-batch, its targets or None) -> the
# micro-batch's loss SUM (scalar), or NestedMap(loss=scalar sum,
# metrics=NestedMap(name=(value sum, weight))).
LossFn = Callable[[Any, Any], Any]

# Ticks in flight. 1 makes the loop tick-synchronous: a tick lasts as long as
# its slowest cell, and in 1F1B's steady state every tick has a backward
# cell on some partition, so F-ticks would cost as much as B-ticks. With 2,
# a partition may start its next tick's cell while a neighbour finishes the
# current one: the cells then run as their data dependencies allow (the
# real 1F1B dataflow), while the loop still bounds how far a partition runs
# ahead (and with it the boundary activations in flight). One run, 8 dense
# 512x512 tanh layers, batch 256, K=4, T=8, one thread per device (2 shared
# cores): step time / GPipe's with recompute = 1.50 (1 tick in flight), 0.86
# (2), 1.07 (3), 1.37 (8); at K=2, T=8 all within 0.94-1.03.
PARALLEL_ITERATIONS = 2
# The steady loop (`_Loops`) runs two ticks per iteration: one iteration in
# flight keeps the same two ticks in flight. One run each (2 cores, same
# process as GPipe-rc), throughput 1F1B-rc / GPipe-rc with 1 / 2 iterations
# in flight: conv16 K=2, T=32 1.035 / 0.986; conv16 K=4, T=8 1.05 / 1.05;
# dense16 K=2, T=32 0.91 / 0.95; dense16 K=4, T=8 0.98 / 0.98 (within this
# machine's noise of each other).
STEADY_PARALLEL_ITERATIONS = 1

# 1F1B without recompute unrolls the schedule: 2 K T stage calls in the
# graph. Past this many, tracing takes long enough to warn.
UNROLLED_CELLS_WARNING = 256


def MicroBatchOf(t: Any, num_micro_batches: int) -> Any:
  """The micro-batch of the mini-batch that schedule slot t carries: T-1-t.

  1F1B runs its micro-batches last-first. Its backward cells run in slot
  order, so each partition then sums its weight gradients over micro-batches
  T-1, ..., 0: the order of GPipe's backward pass (t = T-1 .. 0, whose
  autodiffed form, recompute=False, has the same order). Float sums in the
  same order give the same bits, so 1F1B's gradients equal GPipe's exactly
  rather than to rounding, and training runs of the two schedules do not
  drift apart (they did, by 5e-3 in the loss after 14 steps of a batch-norm
  ResNet in float32, when 1F1B summed in the order 0 .. T-1). Slots of
  boundary inputs stay distinct: the micro-batches in flight on a partition
  are still consecutive. An int or an int32 tensor.
  """
  return num_micro_batches - 1 - t


class LossAndGrads(NamedTuple):
  """What one 1F1B step returns.

  Attributes:
    loss: sum over micro-batches of loss_fn's loss, divided by `normalizer`.
    metrics: NestedMap name -> (value sum, weight sum) over micro-batches
      (empty if loss_fn returns a bare loss).
    grads: per partition, the flat gradients of `loss` with respect to its
      weights.
    stats: per partition and batch-norm layer, BatchStats.Flatten() summed
      over micro-batches (not yet reported).
    stats_layers: per partition, its batch-norm layers in `stats` order.
  """
  loss: tf.Tensor
  metrics: NestedMap
  grads: List[List[tf.Tensor]]
  stats: List[List[List[tf.Tensor]]]
  stats_layers: List[Tuple[Any, ...]]


class _LossSpec(NamedTuple):
  """What loss_fn returns, learned by tracing it once."""
  loss: tf.TensorSpec
  metric_names: Tuple[str, ...]
  metric_specs: Tuple[Tuple[tf.TensorSpec, tf.TensorSpec], ...]


def _CheckLossResult(result: Any) -> Tuple[tf.Tensor, NestedMap]:
  """loss_fn's result as (scalar loss sum, NestedMap of (value, weight))."""
  fix = ('loss_fn(outputs, targets) must return the micro-batch\'s loss sum '
         '(a scalar float tensor) or NestedMap(loss=scalar, metrics='
         'NestedMap(name=(value sum, weight)))')
  if isinstance(result, dict):
    extra = sorted(set(result) - {'loss', 'metrics'})
    if 'loss' not in result or extra:
      raise ValueError(f'loss_fn returned a dict with keys {sorted(result)}; '
                       f'{fix}')
    loss, metrics = result['loss'], result.get('metrics') or NestedMap()
  else:
    loss, metrics = result, NestedMap()
  if not isinstance(loss, tf.Tensor) or not (
      loss.dtype.is_floating and loss.shape.rank == 0):
    what = (f'a {loss.dtype.name} tensor of shape {loss.shape}'
            if isinstance(loss, tf.Tensor) else f'{type(loss).__name__} '
            f'{loss!r}')
    raise ValueError(f'loss_fn returned {what} as the loss; {fix}')
  if not isinstance(metrics, dict):
    raise ValueError(f'loss_fn returned metrics={metrics!r}; {fix}')
  for name, pair in metrics.items():
    ok = (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(
        isinstance(v, tf.Tensor) and v.shape.rank == 0 for v in pair))
    if not ok:
      raise ValueError(f'loss_fn returned metrics[{name!r}]={pair!r}, not a '
                       f'(value sum, weight) pair of scalar tensors; {fix}')
  return loss, NestedMap(metrics)


def _TraceLoss(loss_fn: LossFn, out_struct: Any, target_specs: Any,
               device: str) -> _LossSpec:
  """Traces loss_fn once on one micro-batch's specs and checks its result."""
  traced = []

  def Fn(out_flat, target_flat):
    outs = microbatch.PackTensors(out_struct, list(out_flat))
    targets = (None if target_specs is None else
               microbatch.PackTensors(target_specs, list(target_flat)))
    traced.append(_CheckLossResult(loss_fn(outs, targets)))

  out_specs = microbatch.FlattenTensors(out_struct)
  tgt_specs = ([] if target_specs is None else
               microbatch.FlattenTensors(target_specs))
  with tf.device(device):
    tf.function(Fn, autograph=False).get_concrete_function(
        list(out_specs), list(tgt_specs))
  loss, metrics = traced[-1]
  names = tuple(sorted(metrics))
  return _LossSpec(
      pipeline_stage.SpecOf(loss), names,
      tuple((pipeline_stage.SpecOf(metrics[n][0]),
             pipeline_stage.SpecOf(metrics[n][1])) for n in names))


class _State(NamedTuple):
  """One partition's loop state; fields it does not need are []."""
  out: List[tf.Tensor]          # latched forward outputs (k < K - 1)
  dx: List[tf.Tensor]           # latched input gradients (k > 0)
  slots: List[tf.TensorArray]   # saved boundary inputs (k > 0)
  stats: List[List[tf.Tensor]]  # batch-norm statistics summed so far
  dtheta: List[tf.Tensor]       # flat weight gradients summed so far
  loss: List[tf.Tensor]         # k = K - 1: [loss sum, metric value/weights]


def NumSlots(k: int, num_partitions: int, num_micro_batches: int) -> int:
  """Boundary inputs partition k keeps: min(K - k, T), 0 for partition 0."""
  if k == 0:
    return 0
  return schedules.OneFOneBMaxInFlight(k, num_partitions, num_micro_batches)


def _Loops(num_partitions: int, num_micro_batches: int, one_loop: bool
           ) -> List[Tuple[int, int, List[List[int]]]]:
  """The loops over the 1F1B ticks: (first, end, steady ops).

  On ticks 2K - 1 .. 2T - 2 every partition works, alternating backward and
  forward cells in a phase of its own (partition k runs a backward on tick
  c when c - (2 K - 1 - k) is even, `schedules.OneFOneBCell`). A loop over
  them runs two ticks per iteration, each partition's op known in the graph
  (steady ops: per tick of the pair, per partition): no tf.switch_case and
  half the loop iterations. The ticks before and after (warm-up, cool-down:
  idle cells) and every tick when T <= K or `one_loop` (the timeline's
  recorded step) look their op up and switch (steady ops empty). Each
  partition adds to each of its sums (weight gradients, batch-norm
  statistics, loss) once per pair of ticks, so Grappler has no two
  additions of one sum in a loop body to merge into an AddN (see
  pipeline.py's unrolled ticks): the sums stay those of one tick per
  iteration, bit for bit.
  """
  ticks = schedules.OneFOneBNumClockTicks(num_partitions, num_micro_batches)
  first, end = 2 * num_partitions - 1, 2 * num_micro_batches - 1
  if one_loop or end <= first:
    return [(0, ticks, [])]
  steady_ops = [[schedules.OneFOneBCell(first + i, k, num_partitions,
                                        num_micro_batches)[0]
                 for k in range(num_partitions)] for i in range(2)]
  for c in range(first, end):
    for k in range(num_partitions):
      op = schedules.OneFOneBCell(c, k, num_partitions, num_micro_batches)[0]
      if op == schedules.IDLE or op != steady_ops[(c - first) % 2][k]:
        raise AssertionError(f'1F1B tick {c}, partition {k}: op {op} breaks '
                             'the steady alternation (schedules changed?)')
  return [(0, first, []), (first, end, steady_ops), (end, ticks, [])]


def Run(stages: Sequence[pipeline_stage.Stage], thetas: List[List[Any]],
        inputs: Tuple[Any, ...], targets: Any, loss_fn: LossFn,
        normalizer: tf.Tensor, num_mb: int, batch_dim: int,
        recompute: bool = True,
        grad_sum_mode: str = 'sequential') -> LossAndGrads:
  """One 1F1B step: loss, metrics and weight gradients of a mini-batch.

  Args:
    stages: the K stages.
    thetas: per stage, its weights (a list per layer) as tensors.
    inputs: the first layer's inputs (a tuple), batch on `batch_dim`.
    targets: a structure of tensors with the batch on `batch_dim` (split like
      the inputs and handed to loss_fn), or None.
    loss_fn: see `LossFn`.
    normalizer: scalar tensor dividing the summed loss (and its gradients).
    num_mb: T.
    batch_dim: the batch axis of inputs and targets.
    recompute: True: the tf.while_loop, recomputing each forward cell in
      its backward cell; False: the schedule unrolled in Python
      (`_RunUnrolled`), keeping each cell's activations until its backward.
    grad_sum_mode: grad_sum.MODES ('pairwise' needs recompute).

  Returns:
    A `LossAndGrads`.
  """
  num_k = len(stages)
  batch = microbatch.BatchSize(inputs, batch_dim)
  mb_size = batch // num_mb
  stacked = microbatch.Split(inputs, num_mb, batch_dim)
  specs = pipeline_stage.InferSpecs(stages, thetas, stacked, mb_size)
  flat_stacked = microbatch.FlattenTensors(stacked)
  flat_targets, target_specs = [], None
  if targets is not None:
    stacked_targets = microbatch.Split(targets, num_mb, batch_dim)
    flat_targets = microbatch.FlattenTensors(stacked_targets)
    target_specs = microbatch.PackTensors(
        stacked_targets, [tf.TensorSpec(x.shape[1:], x.dtype)
                          for x in flat_targets])
  last = stages[-1]
  loss_spec = _TraceLoss(loss_fn, specs[-1].out_struct, target_specs,
                         last.device)
  normalizer = tf.cast(normalizer, loss_spec.loss.dtype)
  ticks = schedules.OneFOneBNumClockTicks(num_k, num_mb)
  # The timeline enters here: every cell stamps through it (no-op when off).
  probe = timeline.ActiveProbe()

  def LossOf(k_out, t):
    """(loss sum, flat metric sums) of micro-batch t from the last outputs."""
    outs = microbatch.PackTensors(specs[-1].out_struct, list(k_out))
    tgt = None
    if targets is not None:
      tgt = microbatch.PackTensors(
          target_specs, [tf.gather(s, t) for s in flat_targets])
    loss, metrics = _CheckLossResult(loss_fn(outs, tgt))
    flat = []
    for name in loss_spec.metric_names:
      flat.extend(metrics[name])
    return loss, flat

  # K = 1, T = 1: the recompute would run right after the forward and save
  # no memory (as for GPipe, recompute is ignored there).
  acc = grad_sum.GradSum(grad_sum_mode, num_mb)
  if not recompute or (num_k == 1 and num_mb == 1):
    if grad_sum_mode != 'sequential' and num_mb > 1:
      raise ValueError(f'grad_sum={grad_sum_mode!r} needs recompute=True '
                       '(the unrolled 1F1B schedule sums in Python)')
    return _RunUnrolled(stages, thetas, specs, flat_stacked, LossOf,
                        loss_spec, normalizer, num_mb, mb_size, probe)

  def Input(k, state, t):
    """Partition k's input of micro-batch t, as saved for its backward."""
    if k == 0:
      return [tf.gather(s, t) for s in flat_stacked]
    slot = t % NumSlots(k, num_k, num_mb)
    return [ta.read(slot) for ta in state.slots]

  def Forward(k, state, x_in, t) -> Tuple[_State, List[tf.Tensor]]:
    """Partition k's forward cell of micro-batch t; (state, stamps)."""
    stage, spec = stages[k], specs[k]
    if k == 0:
      x = [tf.gather(s, t) for s in flat_stacked]
      slots = []
    else:
      x = list(x_in)
      slot = t % NumSlots(k, num_k, num_mb)
      slots = [ta.write(slot, v) for ta, v in zip(state.slots, x)]
    start = probe.Stamp(x)
    with tf.control_dependencies(start):
      y, stats = stage.FlatCall(spec.in_struct, thetas[k], x, t, mb_size)
      stats = tf.nest.map_structure(lambda a, b: a + b, state.stats, stats)
      out, loss = state.out, state.loss
      if k == num_k - 1:
        l, m = LossOf(y, t)
        loss = [a + b for a, b in zip(state.loss, [l] + m)]
      else:
        out = y
    # A forward row of the timeline is (start, -1, end).
    stamps = start + probe.Missing(1) + probe.Stamp([y, stats, loss])
    return state._replace(out=out, slots=slots, stats=stats,
                          loss=loss), stamps

  def Backward(k, state, dy_in, t) -> Tuple[_State, List[tf.Tensor]]:
    """Partition k's recompute + vjp of micro-batch t; (state, stamps)."""
    stage, spec = stages[k], specs[k]
    theta_flat = tf.nest.flatten(thetas[k])
    x = Input(k, state, t)
    start = probe.Stamp(x + list(dy_in))
    with tf.GradientTape(watch_accessed_variables=False) as tape, \
        tf.control_dependencies(start):
      # Partition 0's inputs are data: no gradient is computed for them.
      xs = [x[i] for i in spec.float_in] if k > 0 else []
      tape.watch(xs)
      tape.watch(theta_flat)
      th = tf.nest.pack_sequence_as(thetas[k], theta_flat)
      y, _ = stage.FlatCall(spec.in_struct, th, list(x), t, mb_size)
      if k == num_k - 1:
        l, _ = LossOf(y, t)
        ys, dy = [l / normalizer], None
      else:
        ys, dy = [y[i] for i in spec.float_out], list(dy_in)
    mid = probe.Stamp(ys)
    with tf.control_dependencies(mid):
      dxs, dws = tape.gradient(
          ys, (xs, theta_flat), output_gradients=dy,
          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    dtheta = acc.Add(state.dtheta, dws, t)
    stamps = start + mid + probe.Stamp([dxs, dtheta])
    return state._replace(dx=list(dxs) if k > 0 else [],
                          dtheta=dtheta), stamps

  # Each partition reads its (op, slot) of tick c from a table on its own
  # device, indexed by its own copy of the clock: two gathers per tick
  # instead of OneFOneBCell's ~25 integer ops on a tensor clock, and no
  # clock sent from another device on every tick.
  tables, clocks = [], []
  for k, stage in enumerate(stages):
    cells = [schedules.OneFOneBCell(c, k, num_k, num_mb)
             for c in range(ticks)]
    with tf.device(stage.device):
      tables.append((tf.constant([op for op, _ in cells], tf.int32),
                     tf.constant([MicroBatchOf(t, num_mb) for _, t in cells],
                                 tf.int32)))
      clocks.append(tf.constant(0))

  def Tick(cs, states, logs, ops=None):
    """One tick. ops: per partition its op when the loop knows it (steady
    ticks: no switch), else None (looked up in the table; tf.switch_case)."""
    new_states, new_logs, new_cs = [], [], []
    for k, stage in enumerate(stages):
      state = states[k]
      x_in = states[k - 1].out if k > 0 else []
      dy_in = states[k + 1].dx if k < num_k - 1 else []
      with tf.device(stage.device):
        c = cs[k]
        t = tf.gather(tables[k][1], c)
        new_cs.append(c + 1)
        if ops is None:
          state, stamps = probe.SwitchCase(tf.gather(tables[k][0], c), [
              lambda state=state: (state, probe.Missing(3)),
              lambda k=k, state=state, x_in=x_in, t=t: Forward(
                  k, state, x_in, t),
              lambda k=k, state=state, dy_in=dy_in, t=t: Backward(
                  k, state, dy_in, t),
          ])
        elif ops[k] == schedules.FORWARD:
          state, stamps = Forward(k, state, x_in, t)
        else:
          state, stamps = Backward(k, state, dy_in, t)
        new_states.append(state)
        new_logs.append(probe.Log(logs[k], c, stamps))
    return new_cs, new_states, new_logs

  states = []
  for k, (stage, spec) in enumerate(zip(stages, specs)):
    with tf.device(stage.device):
      zeros = lambda ss: [tf.zeros(s.shape, s.dtype) for s in ss]
      loss = []
      if k == num_k - 1:
        loss = zeros([loss_spec.loss] + [s for pair in loss_spec.metric_specs
                                          for s in pair])
      states.append(_State(
          out=zeros(spec.out_specs) if k < num_k - 1 else [],
          dx=zeros(spec.DxSpecs()) if k > 0 else [],
          slots=[tf.TensorArray(s.dtype, size=NumSlots(k, num_k, num_mb),
                                element_shape=s.shape)
                 for s in spec.in_specs] if k > 0 else [],
          stats=[zeros(s) for s in spec.StatsSpecs()],
          dtheta=acc.Init(tf.nest.flatten(thetas[k])),
          loss=loss))
  logs = []
  for stage in stages:
    with tf.device(stage.device):
      logs.append(probe.NewLog(ticks, 3))
  loop_vars = (clocks, states, logs)
  for first, end, steady_ops in _Loops(num_k, num_mb, probe.recording):
    # A steady iteration runs its pair of ticks; the others one switching
    # tick (ops=None).
    per_iteration = steady_ops or [None]

    def Body(*args, per_iteration=per_iteration):
      for ops in per_iteration:
        args = Tick(*args, ops=ops)
      return args
    loop_vars = tf.while_loop(
        lambda *_: tf.constant(True), Body, loop_vars,
        maximum_iterations=(end - first) // len(per_iteration),
        parallel_iterations=(STEADY_PARALLEL_ITERATIONS if steady_ops
                             else PARALLEL_ITERATIONS))
  _, states, logs = loop_vars
  for k, log in enumerate(logs):
    probe.Add('1f1b', k, num_k, num_mb, log)
  totals = []
  for stage, state in zip(stages, states):
    with tf.device(stage.device):
      totals.append(acc.Total(state.dtheta))
  return _Result(last.device, states[-1].loss, normalizer, loss_spec,
                 totals, [s.stats for s in states], specs)


def _Result(device, sums, normalizer, loss_spec, dthetas, stats,
            specs) -> LossAndGrads:
  """The `LossAndGrads` of the summed [loss, metric value, weight, ...]."""
  with tf.device(device):
    loss = sums[0] / normalizer
    metrics = NestedMap()
    for i, name in enumerate(loss_spec.metric_names):
      metrics[name] = (sums[1 + 2 * i], sums[2 + 2 * i])
  return LossAndGrads(loss, metrics, dthetas, stats,
                      [spec.stats_layers for spec in specs])


def _RunUnrolled(stages, thetas, specs, flat_stacked, loss_of, loss_spec,
                 normalizer, num_mb, mb_size, probe) -> LossAndGrads:
  """1F1B without recompute: the schedule unrolled in Python.

  Each forward cell runs under its own GradientTape, built when the step is
  traced; its backward cell, traced later in schedule order, takes that
  tape's gradient, so the forward cell's intermediate tensors stay alive
  exactly from the forward to the backward cell: at most min(K - k, T)
  micro-batches of activations on partition k. A control dependency on the
  previous cell of the same partition makes each device run its cells in
  the schedule's order (the dataflow alone would let every forward run
  first, as in GPipe). The graph holds 2 K T stage calls, so it grows with
  T (the loop's does not): `UNROLLED_CELLS_WARNING` says where tracing gets
  slow.
  """
  num_k = len(stages)
  ticks = schedules.OneFOneBNumClockTicks(num_k, num_mb)
  if 2 * num_k * num_mb > UNROLLED_CELLS_WARNING:
    logging.warning(
        '1F1B without recompute unrolls its schedule: K=%d x T=%d gives '
        '%d stage calls in the graph (more than %d), which makes tracing '
        'slow; use recompute=True (a loop whose graph does not grow with '
        'T) or fewer micro-batches', num_k, num_mb, 2 * num_k * num_mb,
        UNROLLED_CELLS_WARNING)
  outs, dxs_of, pending = {}, {}, {}
  dthetas = [[tf.zeros_like(w) for w in tf.nest.flatten(th)]
             for th in thetas]
  stats = []
  for spec in specs:
    stats.append([[tf.zeros(s.shape, s.dtype) for s in ss]
                  for ss in spec.StatsSpecs()])
  sums = [tf.zeros(loss_spec.loss.shape, loss_spec.loss.dtype)] + [
      tf.zeros(s.shape, s.dtype) for pair in loss_spec.metric_specs
      for s in pair]
  previous = [[] for _ in stages]      # per partition: its last cell's results
  rows = [[] for _ in stages]          # per partition: timeline rows
  for c in range(ticks):
    for k, (stage, spec) in enumerate(zip(stages, specs)):
      op, t = schedules.OneFOneBCell(c, k, num_k, num_mb)
      t = MicroBatchOf(t, num_mb)
      if op == schedules.IDLE:
        rows[k].append(probe.Missing(3))
        continue
      theta_flat = tf.nest.flatten(thetas[k])
      with tf.device(stage.device), tf.control_dependencies(previous[k]):
        if op == schedules.FORWARD:
          x = ([tf.gather(s, t) for s in flat_stacked] if k == 0 else
               outs.pop((t, k - 1)))
          start = probe.Stamp(x)
          with tf.GradientTape(watch_accessed_variables=False) as tape, \
              tf.control_dependencies(start):
            # Partition 0's inputs are data: no gradient for them.
            xs = [x[i] for i in spec.float_in] if k > 0 else []
            tape.watch(xs)
            tape.watch(theta_flat)
            th = tf.nest.pack_sequence_as(thetas[k], theta_flat)
            y, cell_stats = stage.FlatCall(spec.in_struct, th, list(x), t,
                                           mb_size)
            if k == num_k - 1:
              l, m = loss_of(y, t)
              ys = [l / normalizer]
              sums = [a + b for a, b in zip(sums, [l] + m)]
            else:
              ys = [y[i] for i in spec.float_out]
              outs[(t, k)] = y
          stats[k] = tf.nest.map_structure(lambda a, b: a + b, stats[k],
                                           cell_stats)
          pending[(t, k)] = (tape, xs, theta_flat, ys)
          end = probe.Stamp([y, cell_stats])
          rows[k].append(start + probe.Missing(1) + end)
          # (With the timeline on, the next cell's start follows this end.)
          previous[k] = y + tf.nest.flatten(cell_stats) + end
        else:
          tape, xs, theta_flat, ys = pending.pop((t, k))
          dy = None if k == num_k - 1 else dxs_of.pop((t, k + 1))
          start = probe.Stamp(ys + (dy or []))
          with tf.control_dependencies(start):
            dxs, dws = tape.gradient(
                ys, (xs, theta_flat), output_gradients=dy,
                unconnected_gradients=tf.UnconnectedGradients.ZERO)
          dthetas[k] = [a + g for a, g in zip(dthetas[k], dws)]
          if k > 0:
            dxs_of[(t, k)] = list(dxs)
          # A backward row without a recompute is (start, -1, end).
          end = probe.Stamp([dxs, dthetas[k]])
          rows[k].append(start + probe.Missing(1) + end)
          previous[k] = list(dxs) + dthetas[k] + end
  assert not (outs or dxs_of or pending), (outs, dxs_of, pending)
  for k, stage in enumerate(stages):
    if timeline.Active() is not None:
      with tf.device(stage.device):
        probe.Add('1f1b', k, num_k, num_mb, tf.stack([
            tf.stack(row) for row in rows[k]]))
  return _Result(stages[-1].device, sums, normalizer, loss_spec, dthetas,
                 stats, specs)


def _ReportStats(stats_layers, stages, stats) -> None:
  """Hands each batch-norm layer its statistics summed over micro-batches."""
  for stage, layers, stage_stats in zip(stages, stats_layers, stats):
    for layer, flat in zip(layers, stage_stats):
      with tf.device(stage.device):
        py_utils.AddBatchStats(layer, py_utils.BatchStats.Pack(flat))


def _Setup(layer, theta: NestedMap, inputs: Tuple[Any, ...]):
  """(stages, per-stage thetas on their devices, T) of a TensorPipeLayer."""
  p = layer.params
  stages = [pipeline_stage.Stage(k, layers, device) for k, (layers, device)
            in enumerate(zip(layer.PartitionLayers(), layer.devices))]
  thetas = []
  for k, stage in enumerate(stages):
    with tf.device(stage.device):
      thetas.append(tf.nest.map_structure(
          tf.identity, list(theta[f'partition_{k}'])))
  batch = microbatch.BatchSize(inputs, p.batch_dim)
  num_mb = microbatch.NumMicroBatches(batch, p.num_micro_batches,
                                      p.micro_batch_size)
  return stages, thetas, num_mb


def _CheckLossFn(loss_fn: Any) -> None:
  if not callable(loss_fn):
    raise TypeError(f'loss_fn={loss_fn!r} is not callable; pass a function '
                    '(outputs, targets) -> loss sum of one micro-batch')


def FPropLossAndGrads(layer, theta: NestedMap, inputs: Tuple[Any, ...],
                      targets: Any, loss_fn: LossFn,
                      normalizer: Any) -> NestedMap:
  """`TensorPipeLayer.FPropLossAndGrads` (see there): no tape needed."""
  _CheckLossFn(loss_fn)
  stages, thetas, num_mb = _Setup(layer, theta, inputs)
  with py_utils.BatchAxis(layer.params.batch_dim):
    res = Run(stages, thetas, inputs, targets, loss_fn, normalizer, num_mb,
              layer.params.batch_dim, layer.params.recompute,
              layer.params.grad_sum)
  if py_utils.IsTraining():
    _ReportStats(res.stats_layers, stages, res.stats)
  grads = NestedMap({f'partition_{k}': tf.nest.pack_sequence_as(
      thetas[k], res.grads[k]) for k in range(len(stages))})
  return NestedMap(loss=res.loss, metrics=res.metrics, grads=grads)


def FPropLoss(layer, theta: NestedMap, inputs: Tuple[Any, ...], targets: Any,
              loss_fn: LossFn, normalizer: Any) -> NestedMap:
  """`TensorPipeLayer.FPropLoss` (see there): a loss a tape differentiates.

  The 1F1B loop runs in the forward pass of a tf.custom_gradient over the
  flat weights; its gradient function returns upstream x the gradients the
  loop computed. So `tape.gradient(f(loss), variables)` equals the GPipe
  pipeline's for any scalar f that is linear in the loss (the trainer's
  loss * weight / total_weight + regulariser is), without a second pass.
  Metrics get no gradient.
  """
  _CheckLossFn(loss_fn)
  stages, thetas, num_mb = _Setup(layer, theta, inputs)
  flat_theta = tf.nest.flatten(thetas)
  stats_layers = []

  @tf.custom_gradient
  def Step(*flat):
    th = tf.nest.pack_sequence_as(thetas, list(flat))
    with py_utils.BatchAxis(layer.params.batch_dim):
      res = Run(stages, th, inputs, targets, loss_fn, normalizer, num_mb,
                layer.params.batch_dim, layer.params.recompute,
                layer.params.grad_sum)
    stats_layers.append((res.stats_layers, res.metrics, res.stats))
    grads = tf.nest.flatten(res.grads)

    def Grad(dloss, *unused_dys):
      return [tf.cast(dloss, g.dtype) * g for g in grads]
    return [res.loss] + tf.nest.flatten((res.metrics, res.stats)), Grad

  flat_out = Step(*flat_theta)
  layers, metrics_struct, stats_struct = stats_layers[-1]
  metrics, stats = tf.nest.pack_sequence_as((metrics_struct, stats_struct),
                                            list(flat_out[1:]))
  if py_utils.IsTraining():
    _ReportStats(layers, stages, stats)
  return NestedMap(loss=flat_out[0], metrics=metrics)


SCHEDULES = ('gpipe', '1f1b')


def CheckScheduleParams(p) -> None:
  """ValueError for a TensorPipeLayer `schedule` its settings cannot run."""
  if p.schedule not in SCHEDULES and p.schedule in schedules.Names():
    raise ValueError(
        f'TensorPipeLayer {p.name!r}: schedule={p.schedule!r} is a schedule '
        'table (schedules.Build) that TensorPipeLayer does not run yet; use '
        "schedule='gpipe' or '1f1b' (tools/model_analysis --schedules=all "
        'predicts the others)')
  if p.schedule not in SCHEDULES:
    raise ValueError(f'TensorPipeLayer {p.name!r}: schedule={p.schedule!r} '
                     f'is not one of {SCHEDULES}; use schedule=\'gpipe\' '
                     "(default) or schedule='1f1b'")
  if p.schedule != '1f1b':
    return
  if p.recompute_impl != 'explicit':
    raise ValueError(
        f"TensorPipeLayer {p.name!r}: schedule='1f1b' recomputes in its own "
        f'loop, so recompute_impl={p.recompute_impl!r} does not apply; '
        "leave recompute_impl='explicit'")
