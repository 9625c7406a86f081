"""Measures a pipeline's cost profile: the engine's own cells, per layer.

`ProfileLayer(layer, inputs)` times, for every layer of a built
TensorPipeLayer on one micro-batch, the cells the schedule engine runs,
built from the same cell algebra (`Stage.FlatCall`; cell_algebra:
`TapedCall` + `Vjp`, `TraceWeightOps` + `WeightGrads`), each traced once as
a tf.function on the layer's device:

  F     the forward call                      t_F = F - null
  FB    forward under a tape + full vjp       t_B = FB - F
  FI    the same, weight ops' dw left out     t_I = FI - F
  W     WeightGrads from FI's kept (x, dz)    t_W = W - null
  null  identity of the inputs (the cost of calling a tf.function, which a
        cell inside the engine's loop does not pay)

Timed alone, a layer's cell reads the same weights over and over, so they
stay in the CPU's cache; in the engine a stage's layers follow one
another. So all layers' cells are also run one after another, each on its
own weights (`_ChainScales`: per cell kind, and an SGD update of every
weight), and the layers' costs of each kind are scaled to sum to that
chained time, the update split by weight bytes (LayerCost.update). For
16 dense layers with 1024 x 1024 weights at 8 rows a chained matmul took
2.6x one timed alone.

Each is the median of `reps` calls, the functions called in turn (this
machine drifts), in CPU time: a cell's work in thread-seconds (ops of one
cell that run in parallel count each, time spent waiting for a core while
other processes run does not), which is what the shared regime divides
over the cores. A layer is its own stage here, so any cut of the layers
into stages (`cost_model.StageCosts`) is priced from one profile. It also
measures the wall time of one clock tick of the engine's loop (a 1F1B
pipeline of one 8 -> 8 FC layer per device, micro-batches of 2, at T = 2K
and 4K: the difference over the difference in ticks, 10th percentiles as
in tools/benchmark --tick_cost), the time per byte of a boundary tensor
copied from the first device to the second in the same process, and the
cores the process gets now (`EffectiveCores`: on a machine shared with
other processes fewer than its threads).

With `calibrate` it also times a training step of the layer itself on its
own schedule (`StepTime`, with an SGD update) and fits the profile to it
(`cost_model.Profile.Calibrated`: one factor on every cell, and the cores
the step got), and each micro-batch size of `micro_batch_sizes` to a step
at its T (one more factor on that size's cells).

With `micro_batch_sizes` it times the cells again at those micro-batch
sizes (the profile's points): small micro-batches cost more per row than
the size they were measured at says (dense layers at a few rows are bound
by reading the weights), and num_micro_batches='auto' plans from that
curve.

Usage:
  prof = cell_profile.ProfileLayer(layer, (x,), reps=10,
                                   micro_batch_sizes=(4, 8, 16, 32))
  prof.Save('profile.json')      # TensorPipeLayer.Params().plan_profile
"""

import dataclasses
import os
import statistics
import time
from typing import (Any, Callable, Dict, List, NamedTuple, Optional,
                    Sequence, Tuple)

import tensorflow as tf

from tensorpipe import cell_algebra
from tensorpipe import cost_model
from tensorpipe import microbatch
from tensorpipe import pipeline_stage
from tensorpipe import py_utils
from tensorpipe import schedule_builders
from tensorpipe import schedules


def _Timed(fns: Dict[str, Callable[[], Any]], reps: int,
           pick: Callable[[List[float]], float] = statistics.median,
           clock: Callable[[], float] = time.process_time
           ) -> Dict[str, float]:
  """`pick` of each function's call times (outputs fetched), in turn, on
  `clock`: by default the process's CPU time, the thread-seconds the call
  kept cores busy (ops that run in parallel count each; time waiting for a
  core on a shared machine does not)."""
  for fn in fns.values():
    tf.nest.map_structure(lambda t: t.numpy(), fn())
  times = {name: [] for name in fns}
  names = list(fns)
  for i in range(reps):
    for name in names[i % len(names):] + names[:i % len(names)]:
      start = clock()
      tf.nest.map_structure(lambda t: t.numpy(), fns[name]())
      times[name].append(clock() - start)
  return {name: pick(v) for name, v in times.items()}


def _Looped(cell: Callable[[List[tf.Tensor]], Any], args: List[tf.Tensor],
            n: int) -> Callable[[], tf.Tensor]:
  """A tf.function running `cell(args)` n times in a tf.while_loop, one
  iteration after another (each one's inputs wait for the last one's
  outputs), as the engine's loop runs cells: no call or fetch cost per
  cell; returns a scalar made from one element of every output."""

  def Body(i, acc):
    zero = acc * 0.0
    xs = [a + tf.cast(zero, a.dtype) if a.dtype.is_floating else a
          for a in args]
    outs = [o for o in tf.nest.flatten(cell(xs)) if o is not None]
    firsts = [tf.cast(tf.reshape(o, [-1])[0], tf.float32) for o in outs
              if o.shape.num_elements()]
    # One Sum of the stacked scalars: Grappler rewrote an AddN of many
    # (AddOpsRewrite) into a temporary variable that a second iteration
    # found already existing.
    return i + 1, acc + tf.reduce_sum(tf.stack(firsts + [zero]))

  def Run():
    return tf.while_loop(lambda i, _: i < n, Body,
                         (tf.constant(0), tf.constant(0.0)),
                         parallel_iterations=1)[1]
  return tf.function(Run, autograph=False)


def _Cells(stage: pipeline_stage.Stage, spec: pipeline_stage.StageSpecs,
           theta: List[Any], mb_size: int, watch_inputs: bool):
  """The layer's F, FB, FI and W cells: functions of flat tensor lists."""
  ops = cell_algebra.TraceWeightOps(stage, spec, theta, mb_size)
  n = len(tf.nest.flatten(theta))
  nx = len(spec.in_specs)
  t0 = tf.constant(0)

  def Theta():
    return tf.nest.map_structure(tf.identity, theta)

  def Forward(x):
    y, _ = stage.FlatCall(spec.in_struct, Theta(), list(x), t0, mb_size)
    return [y[i] for i in spec.float_out]

  # The sums the engine's cells add their weight gradients to.
  dtheta = cell_algebra.Zeros(
      [pipeline_stage.SpecOf(v) for v in tf.nest.flatten(theta)])

  def Backward(x_dy, split):
    th = Theta()
    flat = tf.nest.flatten(th)
    watched = cell_algebra.Watched(n, ops, split)
    cell = cell_algebra.TapedCall(
        stage, spec, th, list(x_dy[:nx]), t0, mb_size,
        watch_inputs=watch_inputs, watched=watched, split=split,
        head=cell_algebra.FloatOutputs(spec), dys=list(x_dy[nx:]))
    zs = [c.z for c in cell.calls]
    dxs, dzs, dws = cell_algebra.Vjp(
        cell.tape, cell.ys, (cell.xs, zs, [flat[i] for i in watched]),
        cell.dys)
    sums = cell_algebra.AccumulateAt(dtheta, watched, dws)
    return dxs, sums, [c.x for c in cell.calls], dzs

  def WeightGrad(xs_dzs):
    half = len(xs_dzs) // 2
    return cell_algebra.WeightGrads(ops, Theta(), xs_dzs[:half],
                                    xs_dzs[half:], dtheta)
  return (Forward, lambda a: Backward(a, False)[:2],
          lambda a: Backward(a, True), WeightGrad)


class _ChainArgs(NamedTuple):
  """One layer's cells and their arguments, for the chained timing."""
  device: str
  cells: Tuple[Callable, ...]       # F, FB, FI, W (as _Cells)
  x: List[tf.Tensor]                # its inputs
  dy: List[tf.Tensor]               # its output gradients
  xs_dzs: List[tf.Tensor]           # the (x, dz) its FI cell kept
  weights: List[tf.Tensor]          # its weights (the update's w and g)


def _LayerCost(stage: pipeline_stage.Stage,
               spec: pipeline_stage.StageSpecs, theta: List[Any],
               x: List[tf.Tensor], mb_size: int, reps: int,
               watch_inputs: bool, timed: bool = True, inner: int = 8
               ) -> Tuple[Optional[cost_model.LayerCost], List[tf.Tensor],
                          _ChainArgs]:
  """One layer's LayerCost timed alone (None unless `timed`), its flat
  outputs (the next one's inputs) and its cells for `_ChainScales`."""
  with tf.device(stage.device):
    cells = _Cells(stage, spec, theta, mb_size, watch_inputs)
    fwd, full, split, wgrad = cells
    out, _ = stage.FlatCall(spec.in_struct, theta, list(x), tf.constant(0),
                            mb_size)
    dy = [tf.ones_like(out[i]) for i in spec.float_out]
    _, _, xs, dzs = split(list(x) + dy)   # eagerly: one trace less
    weights = [tf.identity(w) for w in tf.nest.flatten(theta)
               if w.dtype.is_floating]
  chain = _ChainArgs(stage.device, cells, list(x), dy, list(xs) + list(dzs),
                     weights)
  if not timed:
    return None, list(out), chain
  with tf.device(stage.device):
    fns = {'null': _Looped(lambda a: a, list(x), inner),
           'F': _Looped(fwd, list(x), inner),
           'FB': _Looped(full, list(x) + dy, inner),
           'FI': _Looped(split, list(x) + dy, inner),
           'W': _Looped(wgrad, list(xs) + list(dzs), inner)}
    t = {k: v / inner for k, v in _Timed(
        {k: f for k, f in fns.items()}, reps).items()}
  out_bytes = sum(v.shape.num_elements() * v.dtype.size for v in out)
  cost = cost_model.LayerCost(
      forward=max(0.0, t['F'] - t['null']),
      backward=max(0.0, t['FB'] - t['F']),
      input_grad=max(0.0, t['FI'] - t['F']),
      weight_grad=max(0.0, t['W'] - t['null']) if xs else 0.0,
      out_bytes=float(out_bytes))
  return cost, list(out), chain


def _Update(weights_and_grads: List[tf.Tensor]) -> List[tf.Tensor]:
  """An SGD step's traffic: w - lr g per weight (args: ws then gs)."""
  n = len(weights_and_grads) // 2
  return [w - 1e-3 * g for w, g in zip(weights_and_grads[:n],
                                       weights_and_grads[n:])]


def _ChainScales(chains: Sequence[_ChainArgs], reps: int, inner: int = 2
                 ) -> Tuple[Dict[str, float], float]:
  """The cells of all layers run one after another (each on its own
  weights, as a pipeline stage runs them): per cell kind, their total
  time, and the time of an SGD update of every weight.

  A layer timed alone runs its cell over and over on the same weights,
  which then stay in the CPU's cache; in the engine the layers' cells
  follow one another, so a model whose weights do not fit in the cache
  reads them from memory on every cell (8-row products with 1024 x 1024
  weights took 2.6x as long with 16 layers' weights in turn as with one
  layer's). Returns ({'F', 'B', 'I', 'W': chained seconds}, update s).
  """
  def KindArgs(c, kind):
    return {'null': c.x, 'F': c.x, 'FB': c.x + c.dy, 'FI': c.x + c.dy,
            'nullW': c.xs_dzs, 'W': c.xs_dzs, 'nullU': c.weights * 2,
            'U': c.weights * 2}[kind]

  def Run(kind):
    def Fn(args):
      outs, i = [], 0
      for c in chains:
        n = len(KindArgs(c, kind))
        mine = list(args[i:i + n])
        i += n
        with tf.device(c.device):
          if kind.startswith('null'):
            outs.append(mine)
          elif kind == 'U':
            outs.append(_Update(mine))
          elif kind == 'W':
            outs.append(c.cells[3](mine) if c.xs_dzs else [])
          else:
            outs.append(c.cells[{'F': 0, 'FB': 1, 'FI': 2}[kind]](mine))
      return outs
    return Fn

  kinds = ('null', 'F', 'FB', 'FI', 'nullW', 'W', 'nullU', 'U')
  fns = {k: _Looped(Run(k), [a for c in chains for a in KindArgs(c, k)],
                     inner) for k in kinds}
  t = {k: v / inner for k, v in _Timed(fns, reps).items()}
  return ({'F': max(0.0, t['F'] - t['null']),
           'B': max(0.0, t['FB'] - t['F']),
           'I': max(0.0, t['FI'] - t['F']),
           'W': max(0.0, t['W'] - t['nullW'])},
          max(0.0, t['U'] - t['nullU']))


def _Scaled(costs: Sequence[cost_model.LayerCost], chains: Sequence[_ChainArgs],
            chained: Dict[str, float], update_s: float
            ) -> Tuple[cost_model.LayerCost, ...]:
  """`costs` (timed alone) scaled per cell kind so that each kind sums to
  its chained time; the update split by the layers' weight bytes. Equal
  costs stay one object."""
  alone = {'F': sum(c.forward for c in costs),
           'B': sum(c.backward for c in costs),
           'I': sum(c.input_grad for c in costs),
           'W': sum(c.weight_grad for c in costs)}
  k = {kind: chained[kind] / alone[kind] if alone[kind] > 0 else 1.0
       for kind in alone}
  nbytes = [sum(w.shape.num_elements() * w.dtype.size for w in c.weights)
            for c in chains]
  total = float(sum(nbytes)) or 1.0
  memo = {}
  out = []
  for c, b in zip(costs, nbytes):
    key = (id(c), b)
    if key not in memo:
      memo[key] = dataclasses.replace(
          c, forward=c.forward * k['F'], backward=c.backward * k['B'],
          input_grad=c.input_grad * k['I'],
          weight_grad=c.weight_grad * k['W'], update=update_s * b / total)
    out.append(memo[key])
  return tuple(out)


def TickCost(devices: Sequence[str], reps: int = 30) -> float:
  """Wall seconds one clock tick of a 1F1B loop adds (module docstring)."""
  from tensorpipe import pipeline  # pylint: disable=g-import-not-at-top
  from tensorpipe.layers import linear  # pylint: disable=g-import-not-at-top
  kk = len(devices)
  fns, ticks = {}, {}
  for tt in (2 * kk, 4 * kk):
    layer = pipeline.TensorPipeLayer.Params().Set(
        name=f'tick_probe_t{tt}', devices=list(devices), schedule='1f1b',
        num_micro_batches=tt, partitions=[[linear.FCLayer.Params().Set(
            name=f'fc{k}', input_dim=8, output_dim=8)] for k in range(kk)]
    ).Instantiate()
    x = tf.random.stateless_uniform([2 * tt, 8], seed=[1, 2])

    def Step(x, layer=layer):
      with tf.GradientTape() as tape, py_utils.TrainingMode(True):
        loss = layer.FPropLoss(layer.theta, (x,), None,
                               lambda y, _: tf.reduce_sum(y), 1.0).loss
      return tape.gradient(loss, layer.trainable_variables)
    fn = tf.function(Step).get_concrete_function(x)
    fns[tt] = lambda fn=fn, x=x: fn(x)
    ticks[tt] = len(schedule_builders.Build('1f1b', kk, tt).grid[0])
  t = _Timed(fns, reps, pick=lambda v: sorted(v)[len(v) // 10])
  lo, hi = sorted(fns)
  return max(0.0, (t[hi] - t[lo]) / (ticks[hi] - ticks[lo]))


def TransferRate(devices: Sequence[str], num_bytes: float,
                 reps: int = 30) -> float:
  """Seconds per byte of a tensor copied from devices[0] to devices[1]."""
  if len(devices) < 2 or devices[0] == devices[1] or num_bytes <= 0:
    return 0.0
  n = max(1, int(num_bytes // 4))
  with tf.device(devices[0]):
    x = tf.random.stateless_uniform([n], seed=[3, 4])

  def On(device):
    def Fn(x):
      with tf.device(device):
        return tf.reduce_sum(tf.identity(x))
    return tf.function(Fn)
  there, here = On(devices[1]), On(devices[0])
  t = _Timed({'there': lambda: there(x), 'here': lambda: here(x)}, reps)
  return max(0.0, t['there'] - t['here']) / (4 * n)


def StepTime(layer: Any, inputs: Tuple[Any, ...], reps: int = 10
             ) -> Tuple[float, float]:
  """(wall, CPU) seconds of one training step of TensorPipeLayer `layer`
  on its own schedule, each the median of `reps` calls: the loss 0.5
  sum(y^2) of its outputs (GPipe: FProp under a tape; else FPropLoss, the
  loss inside), the gradient of every trainable weight and an SGD update
  of each on its device. The layer's variables are restored afterwards.
  The step `Profile.Calibrated` fits the profile to."""
  p = layer.params
  trainable = layer.trainable_variables

  def Half(y, unused_targets=None):
    return tf.add_n([0.5 * tf.reduce_sum(tf.square(tf.cast(v, tf.float32)))
                     for v in tf.nest.flatten(y)])

  def Step(*xs):
    with tf.GradientTape() as tape, py_utils.TrainingMode(True):
      if schedules.LossInside(p.schedule):
        loss = layer.FPropLoss(layer.theta, xs, None, Half, 1.0).loss
      else:
        loss = Half(layer.FPropDefaultTheta(*xs))
    for v, g in zip(trainable, tape.gradient(loss, trainable)):
      if g is not None:
        with tf.device(v.device):
          v.assign_sub(1e-6 * tf.cast(tf.convert_to_tensor(g), v.dtype))
    return loss
  saved = [(v, v.numpy()) for v in layer.variables]
  try:
    fn = tf.function(Step, autograph=False).get_concrete_function(*inputs)
    fn(*inputs).numpy()
    walls, cpus = [], []
    for _ in range(reps):
      wall, cpu = time.perf_counter(), time.process_time()
      fn(*inputs).numpy()
      cpus.append(time.process_time() - cpu)
      walls.append(time.perf_counter() - wall)
    # Both clocks read around the same calls.
    return statistics.median(walls), statistics.median(cpus)
  finally:
    for v, value in saved:
      v.assign(value)


def StageCut(layer: Any) -> List[Tuple[int, int]]:
  """[start, end) of each stage of TensorPipeLayer `layer` in its layers
  flattened stage by stage (as `_CellCosts` profiles them): the cut
  cost_model.Predict takes, for a planned or a hand-given partition."""
  cut, start = [], 0
  for stage in layer.stages:
    cut.append((start, start + len(stage.layers)))
    start += len(stage.layers)
  return cut


def NumCores() -> int:
  """Cores the devices' ops run on: the CPUs, or inter x intra-op threads
  where both are set lower."""
  cpus = os.cpu_count() or 1
  inter = tf.config.threading.get_inter_op_parallelism_threads()
  intra = tf.config.threading.get_intra_op_parallelism_threads()
  return min(cpus, inter * intra) if inter > 0 and intra > 0 else cpus


def _SameCost(stage: pipeline_stage.Stage, spec: pipeline_stage.StageSpecs,
              watch_inputs: bool) -> Tuple[Any, ...]:
  """Layers with equal keys cost the same and are timed once: the layer's
  class, Params but its name, input specs, device and watched inputs."""
  layer = stage.layers[0]
  text = '\n'.join(line for line in layer.params.ToText().splitlines()
                   if not line.startswith('name '))
  return (type(layer), text, spec.in_specs, stage.device, watch_inputs)


def EffectiveCores(devices: Sequence[str], cores: int,
                   reps: int = 20) -> float:
  """The cores this process gets now: `cores` independent chains of
  256x256 matmuls, one per thread (on the devices in turn), run at once;
  per call their CPU time over its wall time, at most `cores`. On a
  machine other processes share this is below the thread count, even
  below 1.

  Other processes only take cores away, and a call's own scheduling can
  leave a thread idle for a moment, so the figure is a high percentile of
  the calls (the 80th), not their median: with two threads on 2 idle
  cores the median call got 1.0 to 1.9 cores while the training steps
  used 1.9 (a ratio of two medians over separate calls, as first
  measured, put the steps' wall time 2x off).
  """
  x = tf.random.stateless_uniform([256, 256], seed=[5, 6]) / 256.0
  devs = [devices[i % len(devices)] for i in range(cores)]

  def Chains():
    outs = []
    for d in devs:
      with tf.device(d):
        y = x
        for _ in range(40):
          y = tf.matmul(y, x)
        outs.append(tf.reduce_sum(y))
    return tf.add_n(outs)
  fn = tf.function(Chains)
  fn().numpy()
  ratios = []
  for _ in range(reps):
    wall, cpu = time.perf_counter(), time.process_time()
    fn().numpy()
    ratios.append((time.process_time() - cpu) /
                  max(1e-9, time.perf_counter() - wall))
  ratios.sort()
  return max(0.05, min(float(cores), ratios[int(0.8 * (len(ratios) - 1))]))


def _CellCosts(layer: Any, inputs: Tuple[Any, ...], tt: int, reps: int
               ) -> Tuple[Tuple[cost_model.LayerCost, ...], int, float]:
  """(per-layer cells, micro-batch rows, input bytes) of TensorPipeLayer
  `layer` on `inputs` (the whole mini-batch) split into `tt` micro-batches."""
  p = layer.params
  batch = microbatch.BatchSize(inputs, p.batch_dim)
  mb_size = batch // tt
  stacked = microbatch.Split(tuple(inputs), tt, p.batch_dim)
  stages = [pipeline_stage.Stage(i, [lay], st.device) for i, (lay, st) in
            enumerate((lay, st) for st in layer.stages for lay in st.layers)]
  thetas = [[s.layers[0].theta] for s in stages]
  specs = pipeline_stage.InferSpecs(stages, thetas, stacked, mb_size)
  x = microbatch.FlattenTensors(microbatch.Slice(stacked, 0))
  in_bytes = sum(v.shape.num_elements() * v.dtype.size for v in x)
  costs, seen, chains = [], {}, []
  for i, (stage, theta, spec) in enumerate(zip(stages, thetas, specs)):
    key = _SameCost(stage, spec, i > 0)
    cost, out, chain = _LayerCost(stage, spec, theta, x, mb_size, reps,
                                  watch_inputs=i > 0,
                                  timed=key not in seen)
    seen.setdefault(key, cost)
    costs.append(seen[key])
    chains.append(chain)
    x = out
  chained, update_s = _ChainScales(chains, reps)
  return (_Scaled(costs, chains, chained, update_s), mb_size,
          float(in_bytes))


def _OwnTable(layer: Any, tt: int) -> schedules.Schedule:
  """The schedule table TensorPipeLayer `layer` trains with at T=tt."""
  p = layer.params
  return schedule_builders.FromParam(
      p.schedule, len(layer.devices), tt,
      schedule_builders.NumStagesPerDevice(p))


def _CalibratedPoint(layer: Any, inputs: Tuple[Any, ...],
                     point: cost_model.Profile, batch: int, tick_s: float,
                     reps: int) -> cost_model.Profile:
  """`point` (cells at its micro-batch size, scaled by the layer's own
  calibration) fitted to a step of a copy of `layer` at that size's T
  (`Profile.Calibrated` with the profile's tick cost: one more factor on
  its cells; its cores unused). A point at a T the layer's schedule cannot
  run (ZB-V below 2K - 1) is returned uncalibrated."""
  p = layer.params
  tt = batch // point.micro_batch_rows
  try:
    at_t = p.Copy().Set(name=f'{p.name}_t{tt}', num_micro_batches=tt,
                        micro_batch_size=None).Instantiate()
  except ValueError:   # e.g. ZB-V with T < 2K - 1
    return point
  table = _OwnTable(at_t, tt)
  wall, cpu = StepTime(at_t, tuple(inputs), reps)
  fitted = dataclasses.replace(point, tick_s=tick_s).Calibrated(
      table, StageCut(at_t), p.recompute, wall, cpu, NumCores())
  return dataclasses.replace(fitted, tick_s=point.tick_s)


def ProfileLayer(layer: Any, inputs: Tuple[Any, ...], reps: int = 10,
                 tick: bool = True,
                 micro_batch_sizes: Sequence[int] = (),
                 calibrate: bool = False,
                 calibrate_modes: Sequence[str] = ()) -> cost_model.Profile:
  """The cost profile of TensorPipeLayer `layer` on `inputs` (a tuple of
  its FProp inputs, the whole mini-batch) at its micro-batch size, and the
  cells alone at each of `micro_batch_sizes` (the profile's points: the
  curve num_micro_batches='auto' plans from). With `calibrate`, fitted to
  a step of `layer` itself (`StepTime`, `cost_model.Profile.Calibrated`),
  each point to a step of a copy of the layer at that point's T (the
  cells' engine-over-alone factor drifts with the micro-batch: conv16's
  0.94 at 16 rows, 0.83 at 4), and per mode of `calibrate_modes`
  (cost_model.MODES) to a step of a copy of the layer in that mode
  (`cost_model.Profile.WithMode`; a mode the layer's settings cannot run
  is skipped).

  Raises:
    ValueError: a size that does not divide the mini-batch.
  """
  p = layer.params
  batch = microbatch.BatchSize(inputs, p.batch_dim)
  tt = microbatch.NumMicroBatches(batch, p.num_micro_batches,
                                  p.micro_batch_size)
  for mode in calibrate_modes:
    if mode not in cost_model.MODES:
      raise ValueError(f'calibrate_modes: {mode!r} is not one of '
                       f'{sorted(cost_model.MODES)}')
  for size in micro_batch_sizes:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1 or (
        batch % size):
      raise ValueError(f'micro_batch_sizes: {size!r} must be a positive '
                       f'int dividing the mini-batch of {batch} rows')
  costs, mb_size, in_bytes = _CellCosts(layer, inputs, tt, reps)
  points = []
  for size in sorted(set(micro_batch_sizes) - {mb_size}):
    other, _, other_bytes = _CellCosts(layer, inputs, batch // size, reps)
    points.append(cost_model.Profile(other, size, input_bytes=other_bytes))
  biggest = max([c.out_bytes for c in costs[:-1]] or [0.0])
  prof = cost_model.Profile(
      costs, mb_size,
      tick_s=TickCost(layer.devices) if tick else 0.0,
      transfer_s_per_byte=TransferRate(layer.devices, biggest),
      input_bytes=in_bytes,
      num_cores=EffectiveCores(layer.devices, NumCores()),
      points=tuple(points))
  if not calibrate:
    if calibrate_modes:
      raise ValueError(f'calibrate_modes={list(calibrate_modes)!r} needs '
                       'calibrate=True')
    return prof
  cut = StageCut(layer)
  table = _OwnTable(layer, tt)
  wall, cpu = StepTime(layer, tuple(inputs), reps)
  prof = prof.Calibrated(table, cut, p.recompute, wall, cpu, NumCores())
  prof = dataclasses.replace(prof, points=tuple(
      _CalibratedPoint(layer, inputs, q, batch, prof.tick_s, reps)
      for q in prof.points))
  own = cost_model.Mode(table, p.recompute)
  for mode in calibrate_modes:
    if mode == own:
      continue   # the layer's own step: the calibration itself
    schedule, recompute = cost_model.MODES[mode]
    try:
      other = p.Copy().Set(name=f'{p.name}_{mode}', schedule=schedule,
                           recompute=recompute,
                           num_stages_per_device=1).Instantiate()
      _, other_cpu = StepTime(other, tuple(inputs), reps)
    except ValueError:
      continue   # e.g. the I/W split without grad_sum='sequential'
    prof = prof.WithMode(_OwnTable(other, tt), StageCut(other), recompute,
                         other_cpu)
  return prof
