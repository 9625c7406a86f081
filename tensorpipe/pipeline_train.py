"""The training wrappers of a TensorPipeLayer: GPipe's and the loss-inside step.

Every wrapper takes the per-call object (`pipeline_stage.PipelineCall`:
stages, thetas on their devices, specs, stacked inputs, T) and the
`schedules.Schedule` it runs, and runs it on the one engine
(`schedule_program.Compile`, `schedule_engine.Run`; the pseudo-code is
there).

GPipe (Huang et al. 2018, arXiv 1811.06965; the loss outside the pipeline):
`GPipeForward` runs the table's F ticks and returns the last stage's
outputs; a task's loss on them is differentiated by the trainer's tape.
With recompute (`recompute_impl='explicit'`) the forward and an explicit
backward pass (the table's B ticks, recomputing each stage's forward from
its saved boundary inputs) form one tf.custom_gradient
(`_RecomputedPipeline`): autodiff of a tf.while_loop would stack every
tensor the loop body's gradient needs. Without it, or with
`recompute_impl='tf_recompute_grad'`, TF's autodiff differentiates the
forward loop (`schedule_ends.GPipeForward.autodiff`).

The loss inside (1F1B, interleaved 1F1B, the zero-bubble tables, CSV
tables; PipeDream-flush, Narayanan et al. 2021, arXiv 2006.09503 and
2104.04473): the last stage applies a per-micro-batch loss function to its
outputs, and one step (`LossInsideStep`) returns (loss, metrics, weight
gradients). Every schedule relabels micro-batches so that its backward
cells run GPipe's order (`schedule_program.Labels`), which makes the weight
gradients equal GPipe's bit for bit. The loop (recompute) is never
differentiated: `FPropLoss` wraps the step in a tf.custom_gradient whose
gradient is upstream x the stored gradients, so a task's loss built on it
works with the trainer's GradientTape unchanged. Without recompute the
engine unrolls the table (`schedule_unrolled.Run`): each stage keeps its
forward cells' activations until their backward cells, at a graph that
grows with T.

A tied weight is one more theta entry of each stage that reads it, and
batch norm and dropout behave alike under every schedule (pipeline.py's
docstring says how). Each wrapper accumulates a tied weight per stage like
any weight; a tape sums the stages' totals in stage order through
`tied_weights.Share`, and FPropLossAndGrads folds them itself
(`tied_weights.Fold`). The moving averages are updated once per step from
the statistics summed over micro-batches (`ReportStats`).
"""

from typing import Any, List, NamedTuple, Sequence, Tuple

import tensorflow as tf

from tensorpipe import cell_algebra
from tensorpipe import grad_sum
from tensorpipe import pipeline_stage
from tensorpipe import py_utils
from tensorpipe import schedule_engine
from tensorpipe import schedule_ends
from tensorpipe import schedule_program
from tensorpipe import schedule_unrolled
from tensorpipe import schedules
from tensorpipe.nested_map import NestedMap
from tensorpipe.pipeline_stage import PipelineCall

# One clock tick in flight at a time in GPipe's loops. tf.while_loop's
# default (10) lets later ticks start early; with per-tick weight gradients
# that kept up to 10 copies of every partition's dtheta alive (dense16,
# K=1, T=8: 543 MB peak above idle instead of 111 MB) and made the
# unrecomputed loop's autodiff 3x slower. GPipe's schedule is
# tick-synchronous anyway: within a tick the K partitions still run
# concurrently on their devices.
GPIPE_PARALLEL_ITERATIONS = 1


def ReportStats(stages: Sequence[pipeline_stage.Stage],
                stats_layers: Sequence[Sequence[Any]],
                stats: List[List[List[tf.Tensor]]]) -> None:
  """Hands each batch-norm layer its statistics summed over micro-batches
  (per stage and layer, `BatchStats.Flatten()`), on its stage's device.

  stats_layers: per stage, its reporting layers (`StageSpecs.stats_layers`).
  """
  for stage, layers, stage_stats in zip(stages, stats_layers, stats):
    for layer, flat in zip(layers, stage_stats):
      with tf.device(stage.device):
        py_utils.AddBatchStats(layer, py_utils.BatchStats.Pack(flat))


def ReportCallStats(call: PipelineCall,
                    stats: List[List[List[tf.Tensor]]]) -> None:
  """`ReportStats` of every stage of the call."""
  ReportStats(call.stages, [spec.stats_layers for spec in call.specs], stats)


# -- GPipe: the loss outside -------------------------------------------------


class ForwardResult(NamedTuple):
  """What GPipe's forward pass hands on."""
  outputs: List[tf.Tensor]        # last stage's flat outputs, [T, N/T, ...]
  stats: List[List[List[tf.Tensor]]]  # per stage and layer, summed over t
  saved: Any = None               # per stage, inputs [T, ...] (for B)


def _GPipeHalf(call: PipelineCall, table: schedules.Schedule,
               end: schedule_ends.End, backward: bool,
               acc=None) -> cell_algebra.Sums:
  """GPipe's forward (or backward) pass: the table's F (B) ticks, one tick
  in flight. GPipe's table is its F ticks, then as many B ticks; a
  forward-only table (`schedule_builders.ForwardOnly`) is all F."""
  has_b = any(a and a.op != 'F' for row in table.grid for a in row)
  span = table.num_ticks // 2 if has_b else table.num_ticks
  first = span if backward else 0
  return schedule_engine.Run(
      call, schedule_program.Compile(table), end, acc, first=first,
      last=first + span, unroll_ticks=call.unroll_ticks,
      parallel_iterations=GPIPE_PARALLEL_ITERATIONS)


def GPipeForward(call: PipelineCall, table: schedules.Schedule,
                 save_inputs: bool = False,
                 autodiff: str = '') -> ForwardResult:
  """GPipe's forward pass (the table's F ticks).

  Args:
    call: the call.
    table: GPipe's table, or a forward-only one.
    save_inputs: whether to return every stage's inputs (for a recompute).
    autodiff: '' or how TF's autodiff will differentiate the loop
      (`cell_algebra.CellCall`: 'place', 'recompute_grad').

  Returns:
    A `ForwardResult`; its `saved` is None unless `save_inputs`.
  """
  sums = _GPipeHalf(call, table,
                    schedule_ends.GPipeForward(save_inputs, autodiff),
                    backward=False)
  return ForwardResult(sums.outputs, sums.stats, sums.saved)


def GPipeTrain(call: PipelineCall, table: schedules.Schedule,
               recompute_impl: str = 'explicit') -> ForwardResult:
  """GPipe's training step up to the outputs, differentiable by a tape:
  the explicit recompute (`_RecomputedPipeline`), or the forward loop
  under TF's autodiff (each stage's gradient on its device, under
  tf.recompute_grad with recompute)."""
  if call.recompute and recompute_impl == 'explicit':
    return _RecomputedPipeline(call, table)
  return GPipeForward(
      call, table,
      autodiff='recompute_grad' if call.recompute else 'place')


def _RecomputedPipeline(call: PipelineCall,
                        table: schedules.Schedule) -> ForwardResult:
  """Forward pass + explicit backward pass, as one tf.custom_gradient."""
  arg_struct = (list(call.flat_stacked), call.thetas)
  # The stats leave the pipeline without a gradient (FlatStats).
  result_struct = (list(call.specs[-1].out_specs),
                   [spec.StatsSpecs() for spec in call.specs])

  @tf.custom_gradient
  def Pipeline(*args):
    f_stacked, f_thetas = tf.nest.pack_sequence_as(arg_struct, list(args))
    inner = call.With(flat_stacked=f_stacked, thetas=f_thetas)
    fwd = GPipeForward(inner, table, save_inputs=True)
    forward_ctx = py_utils.Current()

    def Grad(*dys):
      dys, _ = tf.nest.pack_sequence_as(result_struct, list(dys))
      dys = [tf.zeros_like(o) if d is None else d
             for d, o in zip(dys, fwd.outputs)]
      # The recompute must draw the forward pass's dropout masks even when
      # tape.gradient runs outside the forward's StepSeed block.
      with py_utils.RestoreContext(forward_ctx):
        sums = _GPipeHalf(
            inner, table, schedule_ends.GPipeBackward(dys, fwd.saved),
            backward=True, acc=grad_sum.GradSum(call.grad_sum, call.num_mb))
      return tf.nest.flatten((sums.d_inputs, sums.dthetas))

    return tf.nest.flatten((fwd.outputs, fwd.stats)), Grad

  outputs, stats = tf.nest.pack_sequence_as(
      result_struct, list(Pipeline(*tf.nest.flatten(arg_struct))))
  return ForwardResult(outputs, stats)


# -- The loss inside ---------------------------------------------------------


class LossAndGrads(NamedTuple):
  """What one loss-inside step returns.

  Attributes:
    loss: sum over micro-batches of loss_fn's loss, divided by `normalizer`.
    metrics: NestedMap name -> (value sum, weight sum) over micro-batches
      (empty if loss_fn returns a bare loss).
    grads: per stage, the flat gradients of `loss` with respect to its
      weights.
    stats: per stage and batch-norm layer, BatchStats.Flatten() summed
      over micro-batches (not yet reported: `ReportStats`).
  """
  loss: tf.Tensor
  metrics: NestedMap
  grads: List[List[tf.Tensor]]
  stats: List[List[List[tf.Tensor]]]


def LossInsideStep(call: PipelineCall, table: schedules.Schedule,
                   targets: Any, loss_fn: schedule_ends.LossFn,
                   normalizer: Any) -> LossAndGrads:
  """One step of a loss-inside schedule: loss, metrics and weight gradients.

  Args:
    call: the call (stage s on call.devices[table.StageDevice()[s]]).
    table: the schedule (`schedule_builders.FromParam`).
    targets: a structure of tensors with the batch on call.batch_dim (split
      like the inputs and handed to loss_fn), or None.
    loss_fn: see `schedule_ends.LossFn`.
    normalizer: scalar dividing the summed loss (and its gradients).

  Returns:
    A `LossAndGrads`.
  """
  place = table.StageDevice()
  for s, stage in enumerate(call.stages):
    want = call.devices[place[s]]
    if stage.device != want:
      raise AssertionError(f'stage {s} is on {stage.device}, but schedule '
                           f'{schedules.Label(table.name)!r} places it on '
                           f'{want}')
  end = schedule_ends.LossInside.Make(call, targets, loss_fn, normalizer)
  program = schedule_program.Compile(table)
  # One stage, one micro-batch: the recompute would run right after the
  # forward and save no memory (as for GPipe, recompute is ignored there).
  if not call.recompute or (len(call.stages) == 1 and call.num_mb == 1):
    if call.grad_sum != 'sequential' and call.num_mb > 1:
      raise ValueError(f'grad_sum={call.grad_sum!r} needs recompute=True '
                       f'(the unrolled {table.name} schedule sums in Python)')
    sums = schedule_unrolled.Run(call, program, end)
  else:
    sums = schedule_engine.Run(call, program, end,
                               grad_sum.GradSum(call.grad_sum, call.num_mb))
  with tf.device(call.stages[-1].device):
    loss = sums.loss[0] / end.normalizer
    metrics = end.Metrics(sums.loss)
  return LossAndGrads(loss, metrics, sums.dthetas, sums.stats)


def FPropLossAndGrads(call: PipelineCall, table: schedules.Schedule,
                      targets: Any, loss_fn: schedule_ends.LossFn,
                      normalizer: Any,
                      training: bool) -> Tuple[LossAndGrads, List[Any]]:
  """`LossInsideStep`, the stats reported in training: (its result, per
  stage the gradients in its theta's structure)."""
  res = LossInsideStep(call, table, targets, loss_fn, normalizer)
  if training:
    ReportCallStats(call, res.stats)
  return res, [tf.nest.pack_sequence_as(theta, g)
               for theta, g in zip(call.thetas, res.grads)]


def FPropLoss(call: PipelineCall, table: schedules.Schedule, targets: Any,
              loss_fn: schedule_ends.LossFn, normalizer: Any,
              training: bool) -> Tuple[tf.Tensor, NestedMap]:
  """The loss-inside step as (loss, metrics) a tape differentiates.

  The step runs in the forward pass of a tf.custom_gradient over the flat
  weights; its gradient function returns upstream x the gradients the step
  computed. So `tape.gradient(f(loss), variables)` equals the GPipe
  pipeline's for any scalar f that is linear in the loss (the trainer's
  loss * weight / total_weight + regulariser is), without a second pass.
  Metrics get no gradient.
  """
  flat_theta = tf.nest.flatten(call.thetas)
  structs = []

  @tf.custom_gradient
  def Step(*flat):
    th = tf.nest.pack_sequence_as(call.thetas, list(flat))
    res = LossInsideStep(call.With(thetas=th), table, targets, loss_fn,
                         normalizer)
    structs.append((res.metrics, res.stats))
    grads = tf.nest.flatten(res.grads)

    def Grad(dloss, *unused_dys):
      return [tf.cast(dloss, g.dtype) * g for g in grads]
    return [res.loss] + tf.nest.flatten((res.metrics, res.stats)), Grad

  flat_out = Step(*flat_theta)
  metrics, stats = tf.nest.pack_sequence_as(structs[-1], list(flat_out[1:]))
  if training:
    ReportCallStats(call, stats)
  return flat_out[0], metrics

