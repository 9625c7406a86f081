"""Model analysis from Params alone: parameters, FLOPs, memory, partition plan.

Before training a large pipelined model one wants to know how many
parameters it has, how many FLOPs each layer costs, where `TensorPipeLayer`
(GPipe, Huang et al. 2018) would cut it into K partitions and how much memory
each device needs for T micro-batches. This module answers from the layer
Params alone: it runs each layer's `FPropMeta` (shapes, FLOPs, parameter
count) and never creates a variable or a tensor, so a 6-billion-parameter
Transformer is analysed in well under a second.

Memory model of partition k (layers s..e-1, mini-batch of N examples split
into T micro-batches of N/T):

  parameters      P_k weights * bytes(param_dtype)
  gradients       the same again (one accumulator per weight; T.bit_length()
                  of them with grad_sum='pairwise', grad_sum.py)
  optimizer state slots(optimizer) per weight (see OPTIMIZER_SLOTS);
                  Adafactor keeps rows + cols per matrix and the full size of
                  vectors (needs the weight shapes: the layers are
                  instantiated under base_layer.AbstractVariables(), which
                  allocates nothing)
  activations, with recompute (GPipe re-materialisation):
                  the partition's input for all T micro-batches (boundary
                  activations, kept for the backward pass)
                  + the outputs of all its layers for ONE micro-batch (alive
                  while that micro-batch is recomputed and back-propagated)
  activations, without recompute:
                  the partition's input for all T micro-batches
                  + the outputs of all its layers for ALL T micro-batches

With the 1F1B schedule (one forward, one backward) partition k holds n_k
micro-batches between their forward and backward passes instead of GPipe's
T, n_k read off the `1f1b` table's boundary slots (`Schedule.NumSlots`, as
`schedule_plan` reads every table: min(K - k, T)), so the "all T" above
become n_k:

  1F1B, recompute     n_k x (input of one micro-batch) + its layer outputs
                      for one micro-batch
  1F1B, no recompute  n_k x (input + layer outputs of one micro-batch)

(simulator.ActivationPeak; with recompute TensorPipe runs 1F1B in the
engine's loops, without it unrolls the table in the graph).

Activation sizes are the layers' output shapes (layer granularity: tensors
that live only inside a layer, e.g. attention probabilities, are not counted,
so the figures are lower bounds), all at bytes(activation_dtype). Partition
costs are forward FLOPs, as in `TensorPipeLayer`'s automatic partitioning.

Usage:
  report = model_analysis.AnalyzeLayers(
      layer_params_list, input_shapes=[[64, 224, 224, 3]],
      num_partitions=4, num_micro_batches=16, optimizer='rmsprop')
  print(report.ToText())
"""

import dataclasses
import math
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import checks
from tensorpipe import grad_sum
from tensorpipe import partitioning
from tensorpipe import saved_activations
from tensorpipe import schedule_builders
from tensorpipe import simulator

# Optimizer state per weight, in weights (the 'adafactor' entry is computed
# from the weight shapes instead).
OPTIMIZER_SLOTS = {
    'sgd': 0,
    'momentum': 1,
    'rmsprop': 2,
    'adam': 2,
    'adafactor': None,
}
OPTIMIZER_NOTES = {
    'sgd': 'SGD: no state',
    'momentum': 'momentum: 1 slot per weight (velocity)',
    'rmsprop': 'RMSProp with momentum: 2 slots per weight (mean square, '
               'momentum; 1 without momentum, 3 if centered)',
    'adam': 'Adam: 2 slots per weight (first and second moments)',
    'adafactor': 'Adafactor (factored, beta1=0): rows + cols per matrix, the '
                 'full size of vectors',
}


def DtypeBytes(dtype: Any) -> int:
  """Bytes per element of a dtype given as tf.DType or a name ('bfloat16')."""
  try:
    return tf.as_dtype(dtype).size
  except TypeError:
    raise ValueError(f'unknown dtype {dtype!r}; use e.g. tf.float32 or '
                     "'bfloat16'") from None


InputShapes = base_layer.InputShapes


def _Leaves(shapes: Any) -> List[tf.TensorShape]:
  if isinstance(shapes, tf.TensorShape):
    return [shapes]
  if isinstance(shapes, dict):
    return [leaf for k in sorted(shapes) for leaf in _Leaves(shapes[k])]
  if isinstance(shapes, (list, tuple)):
    return [leaf for s in shapes for leaf in _Leaves(s)]
  return [base_layer.ToShape(shapes)]


def NumElements(shapes: Any) -> int:
  """Total elements of a structure of shapes."""
  return sum(base_layer.NumElements(s) for s in _Leaves(shapes))


def FormatShapes(shapes: Any, max_keys: int = 2) -> str:
  """Compact text of a structure of shapes: [8,224,224,3] or {k: [...]}.

  Dicts show their `max_keys` largest entries and count the others.
  """
  if isinstance(shapes, tf.TensorShape):
    return '[' + ','.join('?' if d is None else str(d)
                          for d in shapes.as_list()) + ']'
  if isinstance(shapes, dict):
    # The largest leaves first; small ones (ids, paddings) summarised.
    keys = sorted(shapes, key=lambda k: (-NumElements(shapes[k]), k))
    shown = keys[:max_keys]
    more = f' +{len(keys) - len(shown)} more' if len(keys) > len(shown) else ''
    return '{' + ' '.join(f'{k}:{FormatShapes(shapes[k])}'
                          for k in shown) + more + '}'
  if isinstance(shapes, (list, tuple)):
    inner = ", ".join(FormatShapes(s, max_keys) for s in shapes)
    return inner if len(shapes) == 1 else f'({inner})'
  return repr(shapes)


def _BatchSize(shapes: Tuple[Any, ...]) -> int:
  leaves = _Leaves(shapes)
  if not leaves or leaves[0].rank is None or leaves[0].rank < 1 or (
      leaves[0][0] is None):
    raise ValueError(f'input shapes {FormatShapes(shapes)} need a static '
                     'batch size on axis 0')
  return int(leaves[0][0])


# -- weight shapes without allocating ----------------------------------------

def WeightShapes(layer_params: Any) -> List[Tuple[str, List[int], bool]]:
  """(path, shape, trainable) of every weight a layer would create.

  The layer is built under base_layer.AbstractVariables(): no variable,
  tensor or initial value is created.

  Raises:
    ValueError: the layer cannot be built that way (it reads a variable's
      value while being built), with the fix.
  """
  try:
    with base_layer.AbstractVariables() as weights:
      layer_params.Instantiate()
  except (TypeError, ValueError, AttributeError) as e:
    raise ValueError(
        f'{layer_params.cls.__name__} {layer_params.name!r} cannot be built '
        f'with abstract variables ({type(e).__name__}: {e}); pass '
        'exact_optimizer_state=False to estimate the optimizer state from '
        'parameter counts') from None
  return [(w.path, list(w.shape), w.trainable) for w in weights]


def _AdafactorSlots(shape: Sequence[int]) -> int:
  if len(shape) >= 2:
    outer = int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 2 else 1
    return outer * (shape[-2] + shape[-1])
  return int(np.prod(shape, dtype=np.int64)) if shape else 1


# -- report --------------------------------------------------------------------


@dataclasses.dataclass
class LayerRow:
  """One layer: FPropMeta results for the whole mini-batch."""
  index: int
  name: str
  cls: str
  num_params: int
  flops: float
  out_shapes: Any
  activation_bytes: int


@dataclasses.dataclass
class PartitionRow:
  """One partition of the plan; byte counts are per device."""
  index: int
  start: int
  end: int
  layer_names: List[str]
  flops: float
  share: float
  num_params: int
  param_bytes: int
  grad_bytes: int
  optimizer_bytes: int
  boundary_bytes: int
  internal_bytes_per_micro_batch: int
  activation_bytes_recompute: int
  activation_bytes_no_recompute: int
  max_in_flight_1f1b: int = 0
  activation_bytes_1f1b_recompute: int = 0
  activation_bytes_1f1b_no_recompute: int = 0

  @property
  def total_bytes_recompute(self) -> int:
    return (self.param_bytes + self.grad_bytes + self.optimizer_bytes +
            self.activation_bytes_recompute)

  @property
  def total_bytes_no_recompute(self) -> int:
    return (self.param_bytes + self.grad_bytes + self.optimizer_bytes +
            self.activation_bytes_no_recompute)


@dataclasses.dataclass
class Report:
  """What `AnalyzeLayers` returns; `ToText()` prints it."""
  layers: List[LayerRow]
  partitions: List[PartitionRow]
  input_shapes: Any
  batch_size: int
  num_partitions: int
  num_micro_batches: int
  optimizer: str
  param_dtype: str
  activation_dtype: str
  method: str
  imbalance: float
  optimizer_exact: bool
  notes: List[str]
  num_trainable_params: Optional[int] = None
  # Per layer its Params and input shapes, for `Saved`.
  layer_inputs: List[Tuple[Any, Any]] = dataclasses.field(
      default_factory=list, repr=False, compare=False)

  def Saved(self) -> List[Optional[saved_activations.Saved]]:
    """Per layer what its backward keeps (`saved_activations.Trace`, in
    the activation dtype; None: not traced). Traced on first use: the
    memory model needs it, the report's tables do not."""
    if getattr(self, '_saved', None) is None:
      scale = DtypeBytes(self.activation_dtype) / 4
      self._saved = [  # pylint: disable=attribute-defined-outside-init
          saved_activations.Scaled(saved_activations.Trace(p, shapes),
                                   scale) for p, shapes in self.layer_inputs]
      self._saved += [None] * (len(self.layers) - len(self._saved))
    return self._saved

  @property
  def num_params(self) -> int:
    return sum(r.num_params for r in self.layers)

  @property
  def flops(self) -> float:
    return sum(r.flops for r in self.layers)

  @property
  def bubble_fraction(self) -> float:
    """Idle fraction of the gpipe table: (K - 1) / (T + K - 1)."""
    return schedule_builders.Build('gpipe', self.num_partitions,
                                   self.num_micro_batches).BubbleFraction()

  def ToText(self, max_layer_rows: Optional[int] = None) -> str:
    """Tables: per layer, then the partition plan and memory per partition.

    Args:
      max_layer_rows: show at most this many layer rows (first and last
        halves); None shows all.
    """
    lines = [
        f'Model: {len(self.layers)} layers, {_Count(self.num_params)} '
        f'parameters ({self.num_params:,}'
        + ('' if self.num_trainable_params is None else
           f'; trainable {self.num_trainable_params:,}')
        + f'), {FormatFlops(self.flops)} forward FLOPs '
        f'per mini-batch of {self.batch_size} (training step ~3x, 4x with '
        'recompute)',
        f'Input: {FormatShapes(self.input_shapes, max_keys=99)}; params '
        f'{self.param_dtype}, activations {self.activation_dtype}', '']
    header = ['#', 'layer', 'class', 'params', 'FLOPs', 'output shape',
              'act. bytes']
    rows = [[str(r.index), r.name, r.cls, _Count(r.num_params),
             FormatFlops(r.flops), FormatShapes(r.out_shapes),
             FormatBytes(r.activation_bytes)] for r in self.layers]
    if max_layer_rows is not None and len(rows) > max_layer_rows:
      half = max(1, max_layer_rows // 2)
      skipped = len(rows) - 2 * half
      rows = rows[:half] + [['...', f'({skipped} more)', '', '', '', '', '']
                           ] + rows[-half:]
    lines.append('Layers (activation bytes: layer outputs for the whole '
                 'mini-batch)')
    lines += FormatTable(header, rows, right={0, 3, 4, 6})
    lines.append('')
    mb = self.batch_size // self.num_micro_batches
    lines.append(
        f'Partition plan ({self.method}, cost = forward FLOPs): '
        f'K={self.num_partitions} partitions, T={self.num_micro_batches} '
        f'micro-batches of {mb}; optimizer {OPTIMIZER_NOTES[self.optimizer]}'
        + ('' if self.optimizer_exact else ' (estimated from parameter '
           'counts)'))
    header = ['k', 'layers', 'first .. last', 'FLOPs', 'share', 'params',
              'param B', 'grad B', 'opt. B', 'act. B recompute',
              'act. B no recompute', 'total recompute', 'total no recompute']
    rows = []
    for r in self.partitions:
      span = (r.layer_names[0] if len(r.layer_names) == 1 else
              f'{r.layer_names[0]} .. {r.layer_names[-1]}')
      rows.append([
          str(r.index), f'{r.start}-{r.end - 1}', span, FormatFlops(r.flops),
          f'{100 * r.share:.1f}%', _Count(r.num_params),
          FormatBytes(r.param_bytes), FormatBytes(r.grad_bytes),
          FormatBytes(r.optimizer_bytes),
          FormatBytes(r.activation_bytes_recompute),
          FormatBytes(r.activation_bytes_no_recompute),
          FormatBytes(r.total_bytes_recompute),
          FormatBytes(r.total_bytes_no_recompute)])
    lines += FormatTable(header, rows,
                         right={0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
    lines.append(
        f'load imbalance (max / mean partition FLOPs): {self.imbalance:.3f}; '
        f'pipeline bubble (K-1)/(T+K-1): {100 * self.bubble_fraction:.1f}%')
    lines.append('act. B recompute = partition input for all T micro-batches '
                 '+ its layer outputs for one micro-batch; no recompute = '
                 'input + layer outputs for all T (layer outputs only: lower '
                 'bounds).')
    lines.append('')
    lines += self.ScheduleMemoryText()
    lines += self.notes
    return '\n'.join(lines)

  def ScheduleMemoryText(self) -> List[str]:
    """The per-partition activation memory of GPipe next to 1F1B's."""
    k, t = self.num_partitions, self.num_micro_batches
    lines = [f'Activation memory per partition, GPipe vs 1F1B (K={k}, T={t}; '
             'in flight = micro-batches held between forward and backward)']
    header = ['partition', 'in flight GPipe', 'in flight 1F1B',
              'GPipe recompute',
              '1F1B recompute', 'GPipe no recompute', '1F1B no recompute']
    rows = [[str(r.index), str(t), str(r.max_in_flight_1f1b),
             FormatBytes(r.activation_bytes_recompute),
             FormatBytes(r.activation_bytes_1f1b_recompute),
             FormatBytes(r.activation_bytes_no_recompute),
             FormatBytes(r.activation_bytes_1f1b_no_recompute)]
            for r in self.partitions]
    lines += FormatTable(header, rows, right=set(range(len(header))))
    lines.append('1F1B holds min(K-k, T) micro-batches on partition k (the '
                 "1f1b table's boundary slots): with recompute their inputs, "
                 'without all their layer outputs.')
    return lines


def FormatTable(header: List[str], rows: List[List[str]],
                right=()) -> List[str]:
  """Text table lines: header, rule, rows; columns in `right` right-aligned."""
  widths = [max(len(row[i]) for row in [header] + rows)
            for i in range(len(header))]

  def Fmt(row):
    cells = [c.rjust(w) if i in right else c.ljust(w)
             for i, (c, w) in enumerate(zip(row, widths))]
    return '  '.join(cells).rstrip()
  return [Fmt(header), '  '.join('-' * w for w in widths)] + [
      Fmt(r) for r in rows]


def _Scaled(value: float, units: Sequence[Tuple[float, str]]) -> str:
  for scale, suffix in units:
    if abs(value) >= scale:
      return f'{value / scale:.3g}{suffix}'
  return f'{value:.3g}'


def _Count(n: float) -> str:
  return _Scaled(n, [(1e12, 'T'), (1e9, 'B'), (1e6, 'M'), (1e3, 'k')])


def FormatFlops(n: float) -> str:
  """A FLOP count with a k/M/G/T/P suffix, 3 significant digits."""
  return _Scaled(n, [(1e15, 'P'), (1e12, 'T'), (1e9, 'G'), (1e6, 'M'),
                     (1e3, 'k')])


def FormatBytes(n: float) -> str:
  """A byte count in B, KiB, MiB, GiB or TiB, 3 significant digits."""
  if n < 1024:
    return f'{int(n)} B'
  for power, suffix in ((4, 'TiB'), (3, 'GiB'), (2, 'MiB'), (1, 'KiB')):
    if n >= 1024**power:
      return f'{n / 1024**power:.3g} {suffix}'
  return f'{n} B'


# -- analysis ------------------------------------------------------------------


def _LayerMetas(layer_params_list, shapes):
  metas = []
  for i, p in enumerate(layer_params_list):
    if not hasattr(p, 'cls') or not hasattr(p.cls, 'FPropMeta'):
      raise TypeError(f'layer {i} is not layer Params: {p!r}')
    try:
      meta = p.cls.FPropMeta(p, *shapes)
    except NotImplementedError as e:
      raise ValueError(f'layer {i} ({p.cls.__name__} {p.name!r}) cannot be '
                       f'analysed: {e}') from None
    except (ValueError, TypeError) as e:
      raise ValueError(f'layer {i} ({p.cls.__name__} {p.name!r}) does not '
                       f'accept its input shapes {FormatShapes(shapes)}: {e}'
                       ) from None
    metas.append(meta)
    shapes = meta.out_shapes
  return metas


def AnalyzeLayers(layer_params_list: Sequence[Any],
                  input_shapes: Any,
                  num_partitions: int = 1,
                  num_micro_batches: int = 1,
                  optimizer: str = 'adam',
                  param_dtype: Any = tf.float32,
                  activation_dtype: Any = tf.float32,
                  method: str = 'min_max',
                  exact_optimizer_state: bool = True,
                  grad_sum_mode: str = 'sequential') -> Report:
  """Analyses a sequence of layers and its partition plan from Params alone.

  Args:
    layer_params_list: the model's layer Params, in order (as given to
      `TensorPipeLayer.Params().layers`).
    input_shapes: shapes of the mini-batch inputs, one per FProp input of the
      first layer, e.g. [[64, 224, 224, 3]] or [dict(ids=[8, 256], ...)].
    num_partitions: K.
    num_micro_batches: T; must divide the batch size.
    optimizer: one of OPTIMIZER_SLOTS.
    param_dtype: dtype of weights, gradients and optimizer state.
    activation_dtype: dtype the activations are counted in.
    method: partitioning objective, one of partitioning.METHODS.
    exact_optimizer_state: read trainable weight shapes by instantiating the
      layers under base_layer.AbstractVariables() (allocates nothing);
      needed for exact Adafactor state and to leave out non-trainable
      weights (batch-norm moving statistics). False estimates from
      parameter counts.
    grad_sum_mode: how the pipeline sums micro-batch gradients
      (TensorPipeLayer's grad_sum): 'pairwise' keeps T.bit_length()
      gradient buffers.

  Returns:
    A `Report`.

  Raises:
    ValueError / TypeError: on bad arguments, quoting the value and the fix;
      ValueError for a layer that cannot be built with abstract variables
      (use exact_optimizer_state=False).
  """
  if optimizer not in OPTIMIZER_SLOTS:
    raise ValueError(f'optimizer={optimizer!r} is not one of '
                     f'{sorted(OPTIMIZER_SLOTS)}')
  grad_sum.CheckMode(grad_sum_mode, 'AnalyzeLayers')
  layer_params_list = list(layer_params_list)
  if not layer_params_list:
    raise ValueError('layer_params_list is empty; give the model\'s layer '
                     'Params')
  checks.CheckPositiveInts('', num_partitions=num_partitions,
                           num_micro_batches=num_micro_batches)
  if num_partitions > len(layer_params_list):
    raise ValueError(f'num_partitions={num_partitions} is larger than the '
                     f'number of layers ({len(layer_params_list)}); use '
                     f'num_partitions <= {len(layer_params_list)}')
  p_bytes, a_bytes = DtypeBytes(param_dtype), DtypeBytes(activation_dtype)
  shapes = base_layer.InputShapes(input_shapes)
  batch = _BatchSize(shapes)
  if batch % num_micro_batches:
    raise ValueError(f'batch size {batch} is not divisible by '
                     f'num_micro_batches={num_micro_batches}; use a batch size '
                     f'that is a multiple of {num_micro_batches}')
  metas = _LayerMetas(layer_params_list, shapes)
  rows, layer_inputs = [], []
  for i, (p, m) in enumerate(zip(layer_params_list, metas)):
    out = m.out_shapes
    rows.append(LayerRow(
        index=i, name=p.name, cls=p.cls.__name__, num_params=m.num_params,
        flops=m.flops, out_shapes=out[0] if len(out) == 1 else out,
        activation_bytes=NumElements(out) * a_bytes))
    layer_inputs.append((p, shapes if i == 0 else metas[i - 1].out_shapes))

  notes = []
  slots = OPTIMIZER_SLOTS[optimizer]
  if exact_optimizer_state:
    opt_elements, num_trainable = _ExactOptimizerElements(
        rows, layer_params_list, slots, notes)
  else:
    opt_elements = [r.num_params * (slots if slots is not None else 1)
                    for r in rows]
    num_trainable = None
  plan = partitioning.Partition([r.flops for r in rows], num_partitions,
                                method=method)
  input_elements = [NumElements(shapes)] + [
      NumElements(m.out_shapes) for m in metas]
  partitions = _PartitionRows(plan, rows, input_elements, opt_elements,
                              num_micro_batches, p_bytes, a_bytes,
                              grad_sum_mode)
  return Report(
      layers=rows, partitions=partitions, input_shapes=shapes,
      batch_size=batch, num_partitions=num_partitions,
      num_micro_batches=num_micro_batches, optimizer=optimizer,
      param_dtype=tf.as_dtype(param_dtype).name,
      activation_dtype=tf.as_dtype(activation_dtype).name, method=method,
      imbalance=plan.imbalance, optimizer_exact=exact_optimizer_state,
      notes=notes, num_trainable_params=num_trainable,
      layer_inputs=layer_inputs)


def _ExactOptimizerElements(rows, layer_params_list, slots, notes):
  """Optimizer-state elements per layer and the trainable parameter count,
  from the weights the layers create (base_layer.AbstractVariables);
  appends a warning to `notes` where FPropMeta's counts differ."""
  opt_elements, mismatched, num_trainable = [], [], 0
  for r, p in zip(rows, layer_params_list):
    weights = WeightShapes(p)
    recorded = sum(int(np.prod(s, dtype=np.int64)) for _, s, _ in weights)
    if recorded != r.num_params:
      mismatched.append(f'{r.name} (FPropMeta {r.num_params}, weights '
                        f'{recorded})')
    trainable = [s for _, s, t in weights if t]
    num_trainable += sum(int(np.prod(s, dtype=np.int64)) for s in trainable)
    if slots is None:
      opt_elements.append(sum(_AdafactorSlots(s) for s in trainable))
    else:
      opt_elements.append(
          slots * sum(int(np.prod(s, dtype=np.int64)) for s in trainable))
  if mismatched:
    notes.append('WARNING: FPropMeta parameter counts differ from the '
                 'weights the layers create: ' + '; '.join(mismatched))
  return opt_elements, num_trainable


def _PartitionRows(plan, rows, input_elements, opt_elements, t, p_bytes,
                   a_bytes, grad_sum_mode) -> List[PartitionRow]:
  """Per partition of `plan`: its layers, weights and activation memory."""
  total = sum(plan.partition_costs)
  in_flight_1f1b = schedule_builders.Build('1f1b', len(plan.boundaries),
                                           t).NumSlots()
  partitions = []
  for k, (start, end) in enumerate(plan.boundaries):
    part = rows[start:end]
    n_params = sum(r.num_params for r in part)
    boundary = input_elements[start] * a_bytes        # all T micro-batches
    internal_all = sum(r.activation_bytes for r in part)
    internal_one = int(math.ceil(internal_all / t))
    boundary_one = int(math.ceil(boundary / t))
    in_flight = in_flight_1f1b[k]
    ofob_rc, ofob_norc = (
        int(simulator.ActivationPeak([in_flight], [boundary_one],
                                     [internal_one], rc)[0])
        for rc in (True, False))
    partitions.append(PartitionRow(
        index=k, start=start, end=end, layer_names=[r.name for r in part],
        flops=plan.partition_costs[k],
        share=plan.partition_costs[k] / total if total else 1.0 / len(
            plan.sizes),
        num_params=n_params, param_bytes=n_params * p_bytes,
        grad_bytes=n_params * p_bytes * grad_sum.GradSum(
            grad_sum_mode, t).num_levels,
        optimizer_bytes=sum(opt_elements[start:end]) * p_bytes,
        boundary_bytes=boundary, internal_bytes_per_micro_batch=internal_one,
        activation_bytes_recompute=boundary + internal_one,
        activation_bytes_no_recompute=boundary + internal_all,
        max_in_flight_1f1b=in_flight,
        activation_bytes_1f1b_recompute=ofob_rc,
        activation_bytes_1f1b_no_recompute=ofob_norc))
  return partitions
