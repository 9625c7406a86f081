"""Tests of models/amoebanet.py: shapes, parameter counts, pipelining."""

import numpy as np
import tensorflow as tf

from models import amoebanet
from models import amoebanet_cells
from models import model_utils
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe.layers import composite
from tests.models import amoebanet_testlib as testlib

test_utils.ConfigureTestDevices()

class AmoebaNetParamCountTest(tf.test.TestCase):

  def testFPropMetaCountsEqualCreatedVariables(self):
    for variant in ('B', 'D'):
      with self.subTest(variant=variant):
        layer_ps = testlib.TinyLayers(variant)
        shape = [testlib.BATCH, testlib.SIZE, testlib.SIZE, 3]
        model = testlib.Sequential(layer_ps)
        all_vars = sum(int(np.prod(v.shape)) for v in model.variables)
        trainable = sum(int(np.prod(v.shape))
                        for v in model.trainable_variables)
        self.assertEqual(model_utils.NumParams(layer_ps, shape), all_vars)
        self.assertEqual(model_utils.NumTrainableParams(layer_ps, shape),
                         trainable)

  def testImageNetStemCountsEqualCreatedVariables(self):
    layer_ps = amoebanet.AmoebaNetLayers('D', 1, 8, num_classes=testlib.CLASSES,
                                         image_size=80)
    model = testlib.Sequential(layer_ps)
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    self.assertEqual(model_utils.NumTrainableParams(layer_ps, [1, 80, 80, 3]),
                     trainable)

  def testPaperTableOneSizes(self):
    """GPipe Table 1: AmoebaNet-D(6, 208) 82M, (6, 416) 318M, (6, 544) 542M,
    (12, 544) 1.05B, (24, 512) 1.8B; AmoebaNet-B(6, 512) 557M (the 84.3%
    model). Counted from FPropMeta alone, within 1%."""
    for variant, l, f, paper in [('D', 6, 208, 82e6), ('D', 6, 416, 318e6),
                                 ('D', 6, 544, 542e6), ('D', 12, 544, 1.05e9),
                                 ('D', 24, 512, 1.8e9), ('B', 6, 512, 557e6)]:
      n = model_utils.NumTrainableParams(
          amoebanet.AmoebaNetLayers(variant, l, f), [1, 224, 224, 3])
      self.assertAllClose(n, paper, rtol=0.025, msg=f'{variant}({l}, {f})')


class AmoebaNetShapesTest(tf.test.TestCase):

  def testFPropMetaShapesEqualRealShapes(self):
    for variant, kw in (('D', {}), ('B', dict(small_stem=False,
                                              image_size=80))):
      with self.subTest(variant=variant):
        layer_ps = testlib.TinyLayers(variant, **kw)
        size = kw.get('image_size', testlib.SIZE)
        x = tf.random.stateless_normal([2, size, size, 3], seed=[1, 2])
        model = testlib.Sequential(layer_ps)
        args = (x,)
        shapes = (x.shape,)
        for layer, lp in zip(model.children.sub, layer_ps):
          args = composite.AsArgs(layer.FPropDefaultTheta(*args))
          shapes = lp.cls.FPropMeta(lp, *shapes).out_shapes
          self.assertEqual(
              [list(s) for s in tf.nest.flatten(shapes)],
              [list(a.shape) for a in tf.nest.flatten(args)], msg=lp.name)
        self.assertEqual(sorted(args[0].keys()), ['aux_logits', 'logits'])
        self.assertEqual(args[0].logits.shape, [2, testlib.CLASSES])

  def testWithoutAuxHeadOutputIsLogits(self):
    model = testlib.Sequential(testlib.TinyLayers(aux_head=False))
    out = model.FPropDefaultTheta(testlib.Images())
    self.assertEqual(out.shape, [testlib.BATCH, testlib.CLASSES])


# A cheap genotype (identities, pools and 1x1 convolutions) with the same
# mechanics as B and D: strided inputs of reduction cells, a factorized
# reduction of an unused input state, drop-path on non-identity operations.
CHEAP_OPS = ['none', 'avg_pool_3x3', 'max_pool_3x3', 'none', '1x1', 'none',
             'avg_pool_3x3', 'none', 'max_pool_2x2', 'none']
CHEAP_GENOTYPE = dict(
    normal=(CHEAP_OPS, [0, 1, 1, 0, 2, 2, 1, 3, 4, 0], [1, 1, 1, 1, 1, 0, 0]),
    reduction=(CHEAP_OPS, [0, 0, 2, 0, 2, 3, 0, 4, 5, 0],
               [1, 0, 1, 1, 1, 1, 0]))


class AmoebaNetPipelineTest(tf.test.TestCase):

  def testPipelineMatchesUnpipelined(self):
    """Cells carry (prev, cur) and the aux logits across the boundaries;
    drop-path and dropout are on; BN uses micro-batch statistics. (The B and
    D genotypes are compared in amoebanet_slow_test.py.)"""
    # The trainer sets the drop-path progress from the step: a tensor.
    with amoebanet_cells.DropPathProgress(tf.constant(0.5)):
      testlib.ComparePipelined(self, testlib.TinyLayers(CHEAP_GENOTYPE), 4,
                               2, testlib.Images())


class AmoebaNetErrorsTest(tf.test.TestCase):

  def testBadArgumentsRaise(self):
    with self.assertRaisesRegex(ValueError, r"variant='C'.*\['B', 'D'\]"):
      amoebanet.AmoebaNetLayers('C')
    with self.assertRaisesRegex(ValueError,
                                'num_filters=20.*multiple of 8.*24'):
      amoebanet.AmoebaNetLayers('D', 6, 20)
    with self.assertRaisesRegex(ValueError, "unknown cell operation 'conv_9'"):
      amoebanet_cells.OperationParams('op', 'conv_9', 4, 4, 1)
    with self.assertRaisesRegex(ValueError,
                                r'image_size=8.*3x3.*aux_head=False'):
      amoebanet.AmoebaNetLayers('D', 1, 8, image_size=8, small_stem=True)

  def testStridedOperationsHalveTheMap(self):
    for op in ('none', '1x1', '3x3', '1x7_7x1', 'max_pool_2x2',
               'avg_pool_3x3', 'separable_5x5_2', 'dil_2_separable_5x5_2'):
      p = amoebanet_cells.OperationParams('op', op, 6, 8, 2)
      meta = p.cls.FPropMeta(p, tf.TensorShape([2, 7, 7, 6]))
      self.assertEqual(meta.out_shapes[0].as_list(), [2, 4, 4, 8], msg=op)


class DropPathTest(tf.test.TestCase):

  def _Cell(self, keep):
    ops, idx, used = amoebanet.GENOTYPES['D']['normal']
    return amoebanet_cells.NASCellLayer.Params().Set(
        name='cell', operations=ops, hiddenstate_indices=idx,
        used_hiddenstates=used, num_filters=4, cur_channels=4,
        prev_channels=4, cell_num=3, total_num_cells=4,
        drop_path_keep_prob=keep).Instantiate()

  def testMasksIndependentOfMicroBatches(self):
    cell = self._Cell(0.5)
    x = tf.ones([8, 2, 2, 3])
    with py_utils.StepSeed(3):
      whole = cell._DropPath(x, 0.5, 1)
      parts = []
      for t in range(4):
        with py_utils.ExampleOffset(2 * t):
          parts.append(cell._DropPath(x[2 * t:2 * t + 2], 0.5, 1))
    self.assertAllEqual(tf.concat(parts, 0), whole)
    per_example = whole[:, 0, 0, 0].numpy()
    self.assertAllEqual(whole, np.ones([8, 2, 2, 3]) *
                        per_example[:, None, None, None])
    self.assertEqual(set(per_example.tolist()), {0.0, 2.0})

  def testScheduleAndProgress(self):
    prev = tf.random.stateless_normal([16, 4, 4, 4], seed=[1, 1])
    cur = tf.random.stateless_normal([16, 4, 4, 4], seed=[2, 2])
    cell = self._Cell(0.5)
    plain = self._Cell(1.0)
    with py_utils.EvalMode():
      self.assertIsNone(cell._KeepProb())
    # Last cell, full progress: keep = 1 - 1 * (4 / 4) * 0.5.
    self.assertAllClose(cell._KeepProb(), 0.5)
    with amoebanet_cells.DropPathProgress(0.5):
      self.assertAllClose(cell._KeepProb(), 0.75)
    with amoebanet_cells.DropPathProgress(0.0):
      off = cell.FProp(plain.theta, prev, cur)[1]
    with self.assertRaisesRegex(TypeError, 'read_value'):
      with amoebanet_cells.DropPathProgress(tf.Variable(0.5)):
        pass
    self.assertAllClose(off, plain.FProp(plain.theta, prev, cur)[1])
    self.assertNotAllClose(cell.FProp(plain.theta, prev, cur)[1], off)

  def testRecomputeRedrawsTheForwardsMasksWithTheForwardsProgress(self):
    """The trainer takes the gradient outside its DropPathProgress block:
    the recomputing backward pass must drop the forward's paths with the
    forward's keep probabilities (the progress is part of the context that
    the recompute restores). recompute=False, whose backward reuses the
    forward's masks, is the reference."""
    ops, idx, used = CHEAP_GENOTYPE['normal']
    cell = amoebanet_cells.NASCellLayer.Params().Set(
        operations=ops, hiddenstate_indices=idx, used_hiddenstates=used,
        num_filters=4, total_num_cells=2, drop_path_keep_prob=0.5,
        dtype=tf.float64)
    # Two cells: [b, 4, 4, 4] -> (cur, [b, 4, 4, 8]) -> (.., [b, 4, 4, 8]).
    layer_ps = [
        cell.Copy().Set(name='cell0', cur_channels=4, prev_channels=None,
                        cell_num=0),
        cell.Copy().Set(name='cell1', cur_channels=8, prev_channels=4,
                        cell_num=1)]
    x = tf.random.stateless_normal([4, 4, 4, 4], [1, 2], dtype=tf.float64)
    weights = tf.random.stateless_normal([4, 4, 4, 8], [3, 4],
                                         dtype=tf.float64)
    grads = {}
    for recompute in (False, True):
      pipe = pipeline.TensorPipeLayer.Params().Set(
          name='TensorPipe', layers=layer_ps, num_partitions=2,
          num_micro_batches=2, input_shapes=[x.shape.as_list()],
          recompute=recompute).Instantiate()
      variables = test_utils.VariablesByName(pipe)
      names = sorted(n for n, v in variables.items() if v.trainable)

      @tf.function(autograph=False)
      def Step(x, pipe=pipe, variables=variables, names=names):
        with tf.GradientTape() as tape:
          with py_utils.StepSeed(3), py_utils.DropPathProgress(
              tf.constant(0.5)):
            loss = tf.reduce_sum(pipe.FPropDefaultTheta(x)[1] * weights)
        return tape.gradient(loss, [variables[n] for n in names])
      grads[recompute] = dict(zip(names, Step(x)))
    self.assertEqual(sorted(grads[True]), sorted(grads[False]))
    for name, want in grads[False].items():
      # float64, the same ops in the same order.
      self.assertAllClose(grads[True][name], want, rtol=1e-12, atol=1e-12,
                          msg=name)


if __name__ == '__main__':
  tf.test.main()
