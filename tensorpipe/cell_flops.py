"""Weight-gradient FLOPs of each cell of a traced schedule-engine step.

The zero-bubble schedules (zb_h1, zb_v) split a stage's backward pass into
an input-gradient cell (I) and a deferred weight-gradient cell (W)
(schedule_engine.py); a weight gets its gradient in W only when its op is a
`py_utils.WeightOp` (keras_weight_ops.py for Keras layers). This module
measures where the weight-gradient work of a traced step runs:

  graph = cell_flops.Trace(Step, *specs)  # Step: pipeline.FPropLossAndGrads
  cells = schedule_program.Compile(schedule).cells
  per_cell = cell_flops.WeightGradientFlopsPerCell(graph, cells)
  share = cell_flops.WShare(per_cell)

A cell's weight-gradient FLOPs are those (flops.OpFlops) of the ops its
outputs need only for its weight-gradient sums (an AddN onto a running sum
that comes in as an argument: grad_sum.Accumulate), not for any other
output (activations, input gradients, the (x, dz) kept for W); reading
the kept (x, dz) back (TensorListGetItem) is data movement, 0 FLOPs.
`WeightGradientOpsPerCell` gives the same FLOPs per Keras layer and op
type: what stays in I.
"""

import collections
import re
from typing import Dict, Sequence, Tuple

import tensorflow as tf

from tensorpipe import flops
from tensorpipe import schedule_program

# (op, stage) of one cell: ('I', 1), ('W', 3), ...
Cell = Tuple[str, int]

# Reads of the tensors a cell kept (TensorArray): data movement, 0 FLOPs
# as flops.py counts reshapes and slices.
_READS = frozenset(['TensorListGetItem', 'TensorListStack',
                    'TensorListGather', 'TensorListPopBack'])

# WeightGradientOpsOf's layer of the ops outside every layer: the AddN
# that adds a gradient onto its running sum (grad_sum.Accumulate).
SUMS = '(gradient sums)'
# ... and of the others: a W cell's vjp of fn(x, w) of its weight ops.
REPLAYS = '(weight ops)'


def _Ancestors(tensors) -> set:
  seen, todo = set(), [t.op for t in tensors]
  while todo:
    op = todo.pop()
    if op not in seen:
      seen.add(op)
      todo += [t.op for t in op.inputs] + list(op.control_inputs)
  return seen


def WeightGradientOps(graph) -> list:
  """The ops of a cell's graph that its outputs need only for its
  weight-gradient sums (see the module docstring), in graph order."""
  sums = {op for op in graph.get_operations() if op.type == 'AddN' and any(
      t.op.type == 'Placeholder' for t in op.inputs)}

  def Source(t):
    op = t.op
    while op.type == 'Identity' and op.inputs:
      op = op.inputs[0].op
    return op
  grads = [t for t in graph.outputs if Source(t) in sums]
  taken = {id(t) for t in grads}
  others = [t for t in graph.outputs if id(t) not in taken] + [
      op.outputs[0] for op in graph.control_outputs if op.outputs]
  only = _Ancestors(grads) - _Ancestors(others)
  return [op for op in graph.get_operations() if op in only]


def _Flops(op) -> float:
  """flops.OpFlops, but 0 for reading a kept tensor (data movement)."""
  return 0.0 if op.type in _READS else flops.OpFlops(op)


def CellWeightGradientFlops(graph) -> float:
  """The FLOPs (flops.OpFlops) of a cell's weight-gradient work."""
  return sum((_Flops(op) for op in WeightGradientOps(graph)), 0.0)


def _Layer(op) -> str:
  """The Keras layer an op differentiates, from its name scopes: those
  after the pipeline's `segment_<n>` scope, without the op's own two, the
  call scope Keras repeats (`name/name_1`) and the `_1` its sublayers'
  scopes take in a second call ('transformer_layer_0/feedforward_output_dense'
  of '.../segment_1/transformer_layer_0/transformer_layer_0_1/
  feedforward_output_dense_1/BiasAdd/BiasAddGrad'). An op outside every
  segment: SUMS (an AddN onto a running gradient sum) or REPLAYS."""
  parts = op.name.split('/')
  starts = [i for i, p in enumerate(parts) if re.fullmatch(r'segment_\d+', p)]
  if not starts:
    return SUMS if op.type == 'AddN' else REPLAYS
  scopes = []
  for part in parts[starts[0] + 1:-2]:
    if not scopes or part != scopes[-1] + '_1':
      scopes.append(part)
  if not scopes:
    return op.type
  return '/'.join(scopes[:1] + [re.sub(r'_1$', '', p) for p in scopes[1:]])


def WeightGradientOpsOf(graph) -> Dict[Tuple[str, str], float]:
  """{(Keras layer, op type): FLOPs} of a cell's weight-gradient ops (the
  layer as `_Layer` names it: e.g. ('transformer_layer_0/
  feedforward_layer_norm', 'Mul'), or (SUMS, 'AddN'))."""
  out = collections.defaultdict(float)
  for op in WeightGradientOps(graph):
    n = _Flops(op)
    if n:
      out[(_Layer(op), op.type)] += n
  return dict(out)


def _CellGraphs(graph, cells: Sequence[Sequence[Cell]]):
  """(cell, its branch function's graph) of every cell traced into `graph`
  (device d's switch_case_<d>: branch b > 0 runs cells[d][b - 1])."""
  todo, seen = [graph], set()
  while todo:
    # FuncGraph._functions: the functions traced into a graph (TF 2.21).
    for name, f in getattr(todo.pop(), '_functions', {}).items():
      sub = getattr(f, 'graph', None)
      if sub is None or name in seen:
        continue
      seen.add(name)
      todo.append(sub)
      m = re.search(r'switch_case(?:_(\d+))?_indexed_case_branch(\d+)_', name)
      if m and int(m.group(2)):
        yield cells[int(m.group(1) or 0)][int(m.group(2)) - 1], sub


def WeightGradientFlopsPerCell(graph, cells: Sequence[Sequence[Cell]]
                               ) -> Dict[Cell, float]:
  """{(op, stage): weight-gradient FLOPs of one such cell} of a traced
  schedule-engine step.

  Args:
    graph: the step's traced graph (`Trace`); the cells are the branch
      functions of its switching loops (device d's switch_case_<d>, branch
      b > 0 runs cells[d][b - 1]).
    cells: schedule_program.Compile(schedule).cells.

  Raises:
    AssertionError: a cell traced twice (several loops) with other FLOPs.
    ValueError: no cell found (a step traced with its ramps fixed, not
      by `Trace`): an empty result would read as no work anywhere.
  """
  found = {}
  for cell, sub in _CellGraphs(graph, cells):
    n = CellWeightGradientFlops(sub)
    assert found.setdefault(cell, n) == n, (cell, found[cell], n)
  if not found and any(cells):
    raise ValueError(
        'WeightGradientFlopsPerCell found none of the cells '
        f'{sorted({c for row in cells for c in row})} as a switch_case '
        'branch of the graph: trace the step with cell_flops.Trace, which '
        'keeps every ramp switching (schedule_program.RampTicks(0)) and '
        'the cells inline (schedule_program.IsolatedCells(False))')
  return found


def WeightGradientOpsPerCell(graph, cells: Sequence[Sequence[Cell]]
                             ) -> Dict[Cell, Dict[Tuple[str, str], float]]:
  """As WeightGradientFlopsPerCell, per cell {(Keras layer, op type):
  FLOPs} (WeightGradientOpsOf)."""
  return {cell: WeightGradientOpsOf(sub)
          for cell, sub in _CellGraphs(graph, cells)}


def WShare(per_cell: Dict[Cell, float]) -> float:
  """The fraction of the weight-gradient FLOPs that W cells run (of those
  of W and I cells); nan when there are none."""
  w = sum(n for (op, _), n in per_cell.items() if op == 'W')
  i = sum(n for (op, _), n in per_cell.items() if op == 'I')
  return w / (w + i) if w + i else float('nan')


def Trace(fn, *specs: tf.TensorSpec) -> tf.Graph:
  """fn's traced graph (autograph off), for WeightGradientFlopsPerCell:
  every ramp switches on its table there (`schedule_program.RampTicks`),
  so each cell of a ramp is a branch function of its own, and a B or I
  cell's ops sit in its branch, not in a function of their own
  (`schedule_program.IsolatedCells`). The cells are those the engine
  runs either way."""
  with schedule_program.RampTicks(0), \
      schedule_program.IsolatedCells(False):
    return tf.function(fn, autograph=False).get_concrete_function(
        *specs).graph
