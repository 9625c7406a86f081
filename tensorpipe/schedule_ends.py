"""The pipeline's ends: what a schedule_engine run does at its two ends.

The engine's cells (schedule_cells: F, B or I, W) are the same for every
caller; what happens at the pipeline's first and last stage is not. Each
kind of run is a small `End` whose hooks the cells call:

  LossInside     1F1B and every loss-inside table: the last stage's F adds
                 its micro-batch's loss and metrics, its B starts from
                 d(loss / normalizer); it owns the loss function's
                 contract (`LossFn`, checked and traced once by `Make`)
  GPipeForward   GPipe's forward half (the loss outside): the last stage's
                 outputs kept per micro-batch, every stage's inputs saved
                 for the recompute (or a forward that TF's autodiff
                 differentiates: `autodiff`)
  GPipeBackward  GPipe's backward half: the recompute from the saved
                 inputs, starting from the outputs' gradients dys, keeping
                 stage 0's input gradients

A hook takes and returns a stage's loop state (`StageState`), the record
the engine carries per stage through its tf.while_loops (or its one pass).
"""

from typing import Any, Callable, List, NamedTuple, Sequence, Tuple

import tensorflow as tf

from tensorpipe import cell_algebra
from tensorpipe import microbatch
from tensorpipe.cell_algebra import Sums
from tensorpipe.nested_map import NestedMap
from tensorpipe.pipeline_stage import PipelineCall
from tensorpipe.pipeline_stage import SpecOf

# A loss function: (outputs of one micro-batch, its targets or None) -> the
# micro-batch's loss SUM (scalar), or NestedMap(loss=scalar sum,
# metrics=NestedMap(name=(value sum, weight))).
LossFn = Callable[[Any, Any], Any]
# loss_of(last stage's flat outputs, t) -> (loss sum, flat metric sums).
LossOf = Callable[[List[tf.Tensor], Any], Tuple[tf.Tensor, List[tf.Tensor]]]


def CheckLossFn(loss_fn: Any) -> None:
  if not callable(loss_fn):
    raise TypeError(f'loss_fn={loss_fn!r} is not callable; pass a function '
                    '(outputs, targets) -> loss sum of one micro-batch')


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


class StageState(NamedTuple):
  """One stage's loop state; fields it does not need are []."""
  out: List[Any]                # its outputs to stage s + 1: tensors, or
  #                               TensorArrays when the ring is deeper than 1
  dx: List[Any]                 # its input gradients to stage s - 1, same
  slots: List[tf.TensorArray]   # saved boundary inputs (s > 0)
  stats: List[List[tf.Tensor]]  # batch-norm statistics summed so far
  dtheta: List[tf.Tensor]       # flat weight gradients summed so far
  loss: List[tf.Tensor]         # s = S - 1: [loss sum, metric sums...]
  ends: List[tf.TensorArray]    # last stage: outputs; stage 0: input grads
  stash: List[tf.TensorArray]   # I -> W: per weight op, its x and dz


def TensorArrays(specs, size) -> List[tf.TensorArray]:
  """One TensorArray of `size` entries per spec."""
  return [tf.TensorArray(s.dtype, size=size, element_shape=s.shape)
          for s in specs]


class End:
  """What a run does at the pipeline's two ends: the hooks its cells call.

  The defaults are those of a run with nothing at either end beyond the
  cells' own; each subclass below overrides what its end does.
  """
  # How TF's autodiff differentiates a forward run (`pipeline_stage.
  # CellCall`); '' for a run that computes its gradients itself. With
  # 'recompute_grad' bubble ticks compute on a clamped index with their
  # results masked instead of skipped (the gradient of tf.recompute_grad
  # inside a tf.cond inside a while loop fails in cond_v2).
  autodiff = ''
  # Whether stage 0's B cells take the gradient of its inputs.
  input_grads = False
  # Whether stage s > 0 keeps its inputs in slots from F to B (or to the
  # run's end).
  keeps_slots = False
  loss_specs: Sequence[tf.TensorSpec] = ()

  def EndBuffers(self, s: int, num_s: int, spec, size: int
                 ) -> List[tf.TensorArray]:
    """Stage s's `StageState.ends` (size: T, + 1 with masked bubbles)."""
    del s, num_s, spec, size
    return []

  def AfterLastForward(self, state: StageState, y, t, valid,
                       num_mb) -> StageState:
    """The last stage's F cell after its call: what it does with y."""
    del y, t, valid, num_mb
    return state

  def BackwardInputs(self, engine: Any, s: int, state: StageState, t,
                     slot) -> List[tf.Tensor]:
    """Stage s's inputs of micro-batch t in its B or I cell."""
    if s == 0:
      return [tf.gather(v, t) for v in engine.flat_stacked]
    return [ta.read(slot) for ta in state.slots]

  def LastDys(self, spec, t) -> List[tf.Tensor]:
    """The gradients the last stage's B cell starts from (before the
    call); [] when its head makes its own (`LastHead`)."""
    del spec, t
    return []

  def LastHead(self, spec, t) -> Callable:
    """The last stage's `cell_algebra.TapedCall` head in its B cell."""
    del t
    return cell_algebra.FloatOutputs(spec)

  def AfterFirstBackward(self, state: StageState, t, dxs) -> List[Any]:
    """Stage 0's B cell: its new `StageState.ends` from its input
    gradients."""
    del t, dxs
    return state.ends

  def Finish(self, engine: Any, states: List[StageState],
             sums: Sums) -> Sums:
    """The run's `Sums` with this end's results."""
    del engine, states
    return sums


class LossInside(End):
  """The loss inside the pipeline (1F1B and the other loss-inside tables):
  the last stage's F adds its micro-batch's loss and metrics, and its B
  starts from d(loss / normalizer). `Make` builds it from a `LossFn`.

  Attributes:
    loss_of: (last stage's flat outputs, t) -> (loss sum, flat metric
      sums: value, weight per name in `metric_names`).
    loss_specs: specs of [loss sum, metric value, weight, ...].
    normalizer: the scalar dividing the summed loss, in the loss's dtype.
    metric_names: the metrics' names, sorted.
  """
  keeps_slots = True

  def __init__(self, loss_of: LossOf, loss_specs: Sequence[tf.TensorSpec],
               normalizer: Any, metric_names: Sequence[str]):
    self.loss_of = loss_of
    self.loss_specs = list(loss_specs)
    self.normalizer = normalizer
    self.metric_names = tuple(metric_names)

  @classmethod
  def Make(cls, call: PipelineCall, targets: Any, loss_fn: LossFn,
           normalizer: Any) -> 'LossInside':
    """The end of `call` for `loss_fn` (traced once on one micro-batch's
    specs and checked), its targets split like the inputs."""
    flat_targets, target_specs = [], None
    if targets is not None:
      stacked = microbatch.Split(targets, call.num_mb, call.batch_dim)
      flat_targets = microbatch.FlattenTensors(stacked)
      target_specs = microbatch.PackTensors(
          stacked, [tf.TensorSpec(x.shape[1:], x.dtype)
                    for x in flat_targets])
    out_struct = call.specs[-1].out_struct

    def Apply(out_flat, target_flat):
      outs = microbatch.PackTensors(out_struct, list(out_flat))
      tgt = None if targets is None else microbatch.PackTensors(
          target_specs, list(target_flat))
      return _CheckLossResult(loss_fn(outs, tgt))

    # Traced once on specs: its result checked, its structure learnt.
    traced = []
    with tf.device(call.stages[-1].device):
      tf.function(lambda o, g: traced.append(Apply(o, g)),
                  autograph=False).get_concrete_function(
                      list(microbatch.FlattenTensors(out_struct)),
                      [] if targets is None else
                      list(microbatch.FlattenTensors(target_specs)))
    loss, metrics = traced[-1]
    names = tuple(sorted(metrics))

    def LossOf(y, t):
      l, m = Apply(y, [tf.gather(x, t) for x in flat_targets])
      return l, [v for name in names for v in m[name]]
    specs = [SpecOf(loss)] + [SpecOf(v) for n in names for v in metrics[n]]
    return cls(LossOf, specs, tf.cast(normalizer, loss.dtype), names)

  def Metrics(self, sums: List[tf.Tensor]) -> NestedMap:
    """name -> (value sum, weight sum) from a run's `Sums.loss`."""
    return NestedMap({name: (sums[1 + 2 * i], sums[2 + 2 * i])
                      for i, name in enumerate(self.metric_names)})

  def AfterLastForward(self, state, y, t, valid, num_mb):
    l, m = self.loss_of(y, t)
    return state._replace(loss=[a + b for a, b in zip(state.loss, [l] + m)])

  def LastHead(self, spec, t):
    def Head(y, unused_dys):
      l, _ = self.loss_of(y, t)
      return [l / self.normalizer], None
    return Head


class GPipeForward(End):
  """GPipe's forward half (the loss outside): the last stage's outputs
  kept per micro-batch, and with `save_inputs` every stage's inputs (for
  `GPipeBackward`'s recompute). `autodiff` (see `End`) for a forward run
  that TF's autodiff differentiates."""

  def __init__(self, save_inputs: bool = False, autodiff: str = ''):
    self.keeps_slots = save_inputs
    self.autodiff = autodiff

  def EndBuffers(self, s, num_s, spec, size):
    return TensorArrays(spec.out_specs, size) if s == num_s - 1 else []

  def AfterLastForward(self, state, y, t, valid, num_mb):
    at = t if valid is None else tf.where(valid, t, num_mb)
    return state._replace(
        ends=[ta.write(at, v) for ta, v in zip(state.ends, y)])

  def Finish(self, engine, states, sums):
    num_mb, dev_of = engine.num_mb, engine.program.stage_device
    with tf.device(engine.devices[dev_of[-1]]):
      outputs = [ta.gather(tf.range(num_mb)) for ta in states[-1].ends]
    saved = None
    if self.keeps_slots:
      saved = [list(engine.flat_stacked)]
      for s in range(1, len(states)):
        with tf.device(engine.devices[dev_of[s]]):
          saved.append([ta.gather(tf.range(num_mb))
                        for ta in states[s].slots])
    return sums._replace(outputs=outputs, saved=saved)


class GPipeBackward(End):
  """GPipe's backward half: each B cell recomputes from the inputs
  `GPipeForward` saved (per stage, [T, ...]), the last stage's starting
  from `dys` (per float output, [T, ...]); stage 0's input gradients are
  kept (`Sums.d_inputs`)."""
  input_grads = True

  def __init__(self, dys: List[tf.Tensor], saved: List[List[tf.Tensor]]):
    self.dys = dys
    self.saved = saved

  def EndBuffers(self, s, num_s, spec, size):
    del num_s
    return TensorArrays(spec.DxSpecs(), size) if s == 0 else []

  def BackwardInputs(self, engine, s, state, t, slot):
    return [tf.gather(v, t) for v in self.saved[s]]

  def LastDys(self, spec, t):
    return [tf.gather(self.dys[i], t) for i in spec.float_out]

  def AfterFirstBackward(self, state, t, dxs):
    return [ta.write(t, v) for ta, v in zip(state.ends, dxs)]

  def Finish(self, engine, states, sums):
    spec = engine.specs[0]
    d_inputs = [None] * len(spec.in_specs)
    with tf.device(engine.devices[engine.program.stage_device[0]]):
      for ta, i in zip(states[0].ends, spec.float_in):
        d_inputs[i] = ta.gather(tf.range(engine.num_mb))
    return sums._replace(d_inputs=d_inputs)
