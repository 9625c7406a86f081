"""Tests for tensorpipe/cell_flops.py on small traced cells.

A whole step (a keras_hub GPT-2 under zb_v) is counted by
tests/tools/keras_benchmark_test.py and
tests/keras_hub_zero_bubble_slow_test.py.
"""

import math

import tensorflow as tf

from tensorpipe import cell_flops

_X = tf.TensorSpec([4, 3], tf.float32)
_DZ = tf.TensorSpec([4, 5], tf.float32)
_SUM = tf.TensorSpec([3, 5], tf.float32)


def _Cell(x, dz, running):
  """A W-like cell: dw = x^T dz onto a running sum, and one other output."""
  with tf.name_scope('segment_1/transformer_layer_0/transformer_layer_0_1/'
                     'feedforward_output_dense_1/MatMul'):
    dw = tf.matmul(x, dz, transpose_a=True)
  return tf.add_n([running, dw]), x * 2.0


class CellFlopsTest(tf.test.TestCase):

  def testCountsOnlyWhatTheGradientSumsNeed(self):
    graph = cell_flops.Trace(_Cell, _X, _DZ, _SUM)
    self.assertCountEqual(
        [op.type for op in cell_flops.WeightGradientOps(graph)
         if op.type not in ('Placeholder', 'Identity')], ['MatMul', 'AddN'])
    # dw: 2 x 3 x 4 x 5; the sum onto the running one: 15. Not x * 2.
    self.assertEqual(cell_flops.CellWeightGradientFlops(graph), 120 + 15)

  def testNamesTheKerasLayerOfEachOp(self):
    graph = cell_flops.Trace(_Cell, _X, _DZ, _SUM)
    self.assertEqual(cell_flops.WeightGradientOpsOf(graph), {
        ('transformer_layer_0/feedforward_output_dense', 'MatMul'): 120.0,
        (cell_flops.SUMS, 'AddN'): 15.0})

  def testAGraphWithoutCellBranchesIsRefused(self):
    # A step traced with its ramps fixed has no branch per cell: counting
    # it would give no cell at all, read as no work.
    graph = cell_flops.Trace(_Cell, _X, _DZ, _SUM)
    with self.assertRaisesRegex(ValueError, r"none of the cells \[\('I', 0\), "
                                r"\('W', 0\)\].*cell_flops.Trace"):
      cell_flops.WeightGradientFlopsPerCell(graph, [[('W', 0), ('I', 0)]])

  def testWShare(self):
    self.assertAlmostEqual(cell_flops.WShare(
        {('F', 0): 7.0, ('I', 0): 1.0, ('W', 0): 6.0, ('W', 1): 3.0}), 0.9)
    self.assertTrue(math.isnan(cell_flops.WShare({('F', 0): 1.0})))


if __name__ == '__main__':
  tf.test.main()
