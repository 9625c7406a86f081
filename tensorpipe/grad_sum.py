"""How a partition sums its weight gradients over the T micro-batches.

GPipe's and 1F1B's backward passes hand each partition one weight gradient
per micro-batch, micro-batch T-1 first and 0 last (schedule_program.Labels
gives 1F1B the same order). Two ways to add them up:

* 'sequential' (default): one running sum, ((g_{T-1} + g_{T-2}) + ...) + g_0.
  One buffer the size of the partition's weights.
* 'pairwise': a binary tree over the micro-batches in that order,
  e.g. T = 8: ((g7 + g6) + (g5 + g4)) + ((g3 + g2) + (g1 + g0)), built as the
  gradients arrive with a binary counter: level i holds the sum of a block of
  2^i micro-batches until its sibling block is complete. T.bit_length()
  buffers the size of the weights (4 at T = 8).

Why a tree: data parallelism then changes no bit. With R replicas (R a power
of two) that each run T / R micro-batches of consecutive rows, replica r's
tree is a subtree of the single-process tree over all T micro-batches, and
the all-reduce of R = 2 adds the two halves exactly as the single process's
root does (a + b == b + a in floating point). So R = 2 x T = 4 trains with
the very gradients of R = 1 x T = 8 (tensorpipe/distribute.py adds the
regulariser's gradient after the all-reduce for the same reason), and runs
stay bitwise equal instead of drifting apart at float32 rounding (measured:
1e-4 relative after a few dozen steps of the batch-norm ResNet with the
sequential sum). For larger R the all-reduce's own order (ring or tree, the
collective implementation's choice) decides.

Usage (inside a backward loop; `t` is the micro-batch of the mini-batch,
an int or an int32 scalar tensor):

  acc = GradSum('pairwise', T)
  state = acc.Init(weights)            # flat list of tensors
  state = acc.Add(state, grads, t)     # once per micro-batch, t = T-1 .. 0
  total = acc.Total(state)             # flat list, one per weight
"""

from typing import Any, List, Sequence

import tensorflow as tf

MODES = ('sequential', 'pairwise')


def _Add(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
  """a + b as one addition of the tree, whatever surrounds it.

  In a graph, Grappler's arithmetic optimizer merges a tree of additions
  into one AddN, which sums its inputs one after another in an order of its
  own: measured with TF 2.21, the unrolled tree over T = 4 became a running
  sum, and Total at T = 7 gave L2 + (L1 + L0). A Snapshot after each
  addition (it forwards its input's buffer when it can) is not merged.
  """
  return Apart(a + b)


def Apart(x: tf.Tensor) -> tf.Tensor:
  """x behind a Snapshot: an addition that reads it is not merged with
  the additions that made x (it forwards x's buffer when it can, else
  copies). Grappler's arithmetic optimizer merges a tree of additions
  into one AddN where an inner node has no other reader; that AddN sums
  its inputs in its own order. Measured with TF 2.21: a weight read
  twice in one stage has its two uses' gradients added by the tape, and
  the running sum's AddN next to it in one function became one AddN of
  three; a tied table's per-stage totals (tied_weights.SumInOrder) were
  merged with the last running sum where both sat in one graph."""
  return tf.raw_ops.Snapshot(input=x)


_ADDITIONS = ('Add', 'AddV2', 'AddN')  # the ops Grappler merges


def ApartIfSum(x: tf.Tensor) -> tf.Tensor:
  """`Apart(x)` where an addition made x (through Identity ops: only an
  addition is merged with the one that reads it), else x itself: no op,
  and none of the per-op cost a Snapshot per weight adds to a cell."""
  op = x.op
  while op.type == 'Identity':
    op = op.inputs[0].op
  return Apart(x) if op.type in _ADDITIONS else x


def CheckMode(mode: Any, where: str) -> None:
  """ValueError naming `where` if mode is not one of MODES."""
  if mode not in MODES:
    raise ValueError(f'{where}: grad_sum={mode!r} is not one of {MODES}; '
                     "use 'sequential' (default, one buffer) or 'pairwise' "
                     '(a tree: replicated runs equal the single-process one '
                     'bit for bit)')


def Accumulate(total: tf.Tensor, grad: tf.Tensor) -> tf.Tensor:
  """total + grad, as an AddN of the two (the same bits as an AddV2).

  Grappler's remapper (with oneDNN on) takes an AddV2 of a MatMul's output
  and a [1, N] tensor for a bias add and fuses the two into one
  _FusedMatMul, whose kernel then fails at run time ("bias must be
  1-dimensional"): the weight gradient of an FC layer with input_dim=1,
  x^T dy of shape [1, N], added to its running sum. It does not fuse AddN.
  """
  return tf.math.add_n([total, grad])


class GradSum:
  """Sums one partition's per-micro-batch weight gradients (see module)."""

  def __init__(self, mode: str, num_micro_batches: int):
    CheckMode(mode, 'GradSum')
    self.mode = mode
    self.num_micro_batches = int(num_micro_batches)
    self.num_levels = (self.num_micro_batches.bit_length()
                       if mode == 'pairwise' else 1)

  def Init(self, weights: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """The empty state for `weights` (flat): zeros, num_levels copies."""
    return [tf.zeros_like(w) for _ in range(self.num_levels) for w in weights]

  def _Levels(self, state: Sequence[tf.Tensor]) -> List[List[tf.Tensor]]:
    n = len(state) // self.num_levels
    return [list(state[i * n:(i + 1) * n]) for i in range(self.num_levels)]

  def Add(self, state: Sequence[tf.Tensor], grads: Sequence[tf.Tensor],
          t: Any) -> List[tf.Tensor]:
    """Adds micro-batch t's gradients (the (T-1-t)-th to arrive)."""
    if self.mode == 'sequential':
      return [Accumulate(a, g) for a, g in zip(state, grads)]
    count = self.num_micro_batches - 1 - t   # gradients already added
    levels = self._Levels(state)
    v = list(grads)
    new_levels = []
    for i, level in enumerate(levels):
      # v reaches level i iff the lowest i bits of count are all ones; it is
      # stored there if bit i is 0, else merged with the block stored there
      # and carried on.
      block = 2 ** i
      if isinstance(count, int):
        reaches = (count + 1) % block == 0
        bit = (count // block) % 2 == 1
        store, carry = reaches and not bit, reaches and bit
        new_levels.append(list(v) if store else level)
        if carry:
          v = [_Add(a, b) for a, b in zip(level, v)]
        continue
      reaches = tf.equal((count + 1) % block, 0)
      bit = tf.equal((count // block) % 2, 1)
      store = tf.logical_and(reaches, tf.logical_not(bit))
      carry = tf.logical_and(reaches, bit)
      new_levels.append(tf.cond(store, lambda v=v: list(v),
                                lambda level=level: list(level)))
      if i + 1 < len(levels):
        v = tf.cond(carry,
                    lambda v=v, level=level: [_Add(a, b)
                                              for a, b in zip(level, v)],
                    lambda v=v: list(v))
    return [x for level in new_levels for x in level]

  def Total(self, state: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """The sum over all T micro-batches: the levels the bits of T occupy,
    highest first (one level when T is a power of two)."""
    if self.mode == 'sequential':
      return list(state)
    total = None
    levels = self._Levels(state)
    for i in reversed(range(self.num_levels)):
      if (self.num_micro_batches >> i) & 1:
        total = (list(levels[i]) if total is None else
                 [_Add(a, b) for a, b in zip(total, levels[i])])
    return total
