"""Tests of tensorpipe.model_analysis and tools/model_analysis.py."""

import contextlib
import io
import time

from absl import app
from absl import flags
import numpy as np
import psutil
import tensorflow as tf

from tensorpipe import model_analysis
from tensorpipe import scale_out
from tensorpipe.layers import composite
from tensorpipe.layers import conv
from tensorpipe.layers import linear
from tensorpipe.layers import normalization
from models import consistency_cnn
from models import transformer
from tools import model_analysis as model_analysis_tool


def CreatedVariables(layer_params):
  """(path, shape, trainable) of the variables the layers really create."""
  layer = composite.SequentialLayer.Params().Set(
      name='model', sub=layer_params).Instantiate()
  return layer.variables


def NumCreated(layer_params) -> int:
  return sum(int(np.prod(v.shape)) for v in CreatedVariables(layer_params))


def SmallImageLayers():
  """A small CNN with batch norm (non-trainable statistics) and an FC head."""
  return [
      conv.Conv2DLayer.Params().Set(name='c1', filter_shape=(3, 3, 3, 4),
                                    batch_norm=True),
      conv.Conv2DLayer.Params().Set(name='c2', filter_shape=(3, 3, 4, 8),
                                    filter_stride=(2, 2)),
      linear.FlattenLayer.Params().Set(name='flat'),
      linear.FCLayer.Params().Set(name='fc', input_dim=4 * 4 * 8,
                                  output_dim=10, activation='NONE'),
  ]


TINY = dict(num_layers=2, hidden_dim=32, num_heads=4, model_dim=16,
            vocab_size=50, max_len=16)


class _ReadsItsWeightLayer(linear.FCLayer):
  """An FCLayer that uses its weight's value while being built."""

  def __init__(self, params):
    super().__init__(params)
    self._initial_norm = tf.norm(self.vars.w)


class ParameterCountTest(tf.test.TestCase):

  def _Check(self, layers, input_shapes):
    report = model_analysis.AnalyzeLayers(layers, input_shapes)
    self.assertEqual(report.num_params, NumCreated(layers))
    self.assertEqual(report.notes, [])  # FPropMeta agrees with the weights
    return report

  def testTransformerCountsEqualCreatedVariables(self):
    shapes = transformer.TranslationInputShapes(4, 6, 5)
    for kw in (dict(), dict(shared_embeddings=False),
               dict(shared_embeddings=False, src_vocab_size=30),
               dict(pre_layer_norm=True)):
      self._Check(transformer.TransformerLayers(**TINY, **kw), shapes)
    self._Check(transformer.TransformerLmLayers(**TINY),
                transformer.LmInputShapes(4, 5))

  def testTransformerCountMatchesClosedForm(self):
    d, h, v, n = 16, 32, 50, 2
    attention = 4 * d * d + 4 * d + 2 * d      # projections + LayerNorm
    ff = 2 * d * h + h + d + 2 * d
    expected = (v * d + n * (attention + ff) + n * (2 * attention + ff) +
                d * v + v)
    report = model_analysis.AnalyzeLayers(
        transformer.TransformerLayers(**TINY),
        transformer.TranslationInputShapes(4, 6, 5))
    self.assertEqual(report.num_params, expected)

  def testImageAndConsistencyCountsEqualCreatedVariables(self):
    self._Check(SmallImageLayers(), [[2, 8, 8, 3]])
    self._Check(consistency_cnn.ConsistencyLayers(4), [[2, 8, 8, 1]])

  def testAmoebaNetAndResNetCountsEqualCreatedVariables(self):
    try:
      from models import amoebanet  # pylint: disable=g-import-not-at-top
      from models import resnet  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      self.skipTest(f'image models not available: {e}')
    self._Check(amoebanet.AmoebaNetLayers(
        'D', num_normal_cells=1, num_filters=8, num_classes=5, image_size=16,
        small_stem=True, stem_filters=8), [[2, 16, 16, 3]])
    self._Check(resnet.ResNetLayers(50, num_classes=5, width=4,
                                    input_shape=(None, 16, 16, 3),
                                    small_stem=True), [[2, 16, 16, 3]])

  def testWeightShapesRecordWithoutCreatingVariables(self):
    layers = transformer.TransformerLayers(**TINY)
    recorded = [w for p in layers for w in model_analysis.WeightShapes(p)]
    created = CreatedVariables(layers)
    self.assertEqual(sorted(s for _, s, _ in recorded),
                     sorted(v.shape.as_list() for v in created))
    # The recording was undone: building a layer creates variables again.
    self.assertNotEmpty(CreatedVariables(layers[:1]))


class PartitionPlanTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.layers = transformer.TransformerLayers(**TINY)
    self.shapes = transformer.TranslationInputShapes(8, 6, 5)

  def testPlanCoversLayersAndSums(self):
    report = model_analysis.AnalyzeLayers(
        self.layers, self.shapes, num_partitions=3, num_micro_batches=4)
    parts = report.partitions
    self.assertLen(parts, 3)
    self.assertEqual(parts[0].start, 0)
    self.assertEqual(parts[-1].end, len(self.layers))
    for a, b in zip(parts, parts[1:]):
      self.assertEqual(a.end, b.start)
    self.assertEqual(sum(p.num_params for p in parts), report.num_params)
    self.assertAllClose(sum(p.flops for p in parts), report.flops)
    self.assertAllClose(sum(p.share for p in parts), 1.0)
    mean = report.flops / 3
    self.assertAllClose(report.imbalance, max(p.flops for p in parts) / mean)
    for p in parts:
      self.assertEqual(p.param_bytes, 4 * p.num_params)
      self.assertEqual(p.optimizer_bytes, 2 * 4 * p.num_params)  # adam

  def testRecomputeNeedsLessActivationMemoryForManyMicroBatches(self):
    for t in (1, 2, 4, 8):
      report = model_analysis.AnalyzeLayers(
          self.layers, self.shapes, num_partitions=2, num_micro_batches=t)
      for p in report.partitions:
        if t == 1:
          self.assertEqual(p.activation_bytes_recompute,
                           p.activation_bytes_no_recompute)
        else:
          self.assertLess(p.activation_bytes_recompute,
                          p.activation_bytes_no_recompute)
        internal = sum(r.activation_bytes
                       for r in report.layers[p.start:p.end])
        self.assertEqual(p.activation_bytes_no_recompute,
                         p.boundary_bytes + internal)

  def testOptimizerState(self):
    fc = [linear.FCLayer.Params().Set(name='fc', input_dim=6, output_dim=3)]
    bn = [normalization.BatchNormLayer.Params().Set(name='bn', dim=5)]
    expected = {'sgd': 0, 'momentum': 21, 'rmsprop': 42, 'adam': 42,
                'adafactor': (6 + 3) + 3}
    for optimizer, elements in expected.items():
      report = model_analysis.AnalyzeLayers(fc, [[2, 6]], optimizer=optimizer)
      self.assertEqual(report.partitions[0].optimizer_bytes, 4 * elements,
                       msg=optimizer)
    # Moving statistics of batch norm get no optimizer state.
    report = model_analysis.AnalyzeLayers(bn, [[2, 5]], optimizer='adam')
    self.assertEqual(report.num_params, 20)
    self.assertEqual(report.num_trainable_params, 10)
    self.assertEqual(report.partitions[0].optimizer_bytes, 4 * 2 * 10)

  def testPairwiseGradSumCountsItsBuffers(self):
    fc = [linear.FCLayer.Params().Set(name='fc', input_dim=6, output_dim=3)]
    for t, levels in ((1, 1), (4, 3), (8, 4), (6, 3)):
      report = model_analysis.AnalyzeLayers(fc, [[24, 6]],
                                            num_micro_batches=t,
                                            grad_sum_mode='pairwise')
      self.assertEqual(report.partitions[0].grad_bytes, 4 * 21 * levels,
                       msg=f'T={t}')
    seq = model_analysis.AnalyzeLayers(fc, [[24, 6]], num_micro_batches=8)
    self.assertEqual(seq.partitions[0].grad_bytes, 4 * 21)
    # What the replicas all-reduce is one gradient per weight either way.
    assumptions = scale_out.ScaleOutAssumptions(
        device_flops=1e12, link_bytes_per_s=1e9)
    pairwise = model_analysis.AnalyzeLayers(fc, [[24, 6]],
                                            num_micro_batches=8,
                                            grad_sum_mode='pairwise')
    plans = [scale_out.PlanScaleOut(r, [2], assumptions)
             for r in (seq, pairwise)]
    self.assertEqual(plans[0].results, plans[1].results)
    with self.assertRaisesRegex(ValueError, "grad_sum='tree' is not one of"):
      model_analysis.AnalyzeLayers(fc, [[24, 6]], grad_sum_mode='tree')

  def testDtypes(self):
    report = model_analysis.AnalyzeLayers(
        self.layers, self.shapes, param_dtype='bfloat16',
        activation_dtype=tf.bfloat16, optimizer='sgd')
    self.assertEqual(report.partitions[0].param_bytes, 2 * report.num_params)
    self.assertEqual(report.layers[1].activation_bytes,
                     2 * model_analysis.NumElements(
                         report.layers[1].out_shapes))

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, r'batch size 8 is not divisible '
                                r'by num_micro_batches=3'):
      model_analysis.AnalyzeLayers(self.layers, self.shapes,
                                   num_micro_batches=3)
    with self.assertRaisesRegex(ValueError, "optimizer='lamb'"):
      model_analysis.AnalyzeLayers(self.layers, self.shapes, optimizer='lamb')
    with self.assertRaisesRegex(ValueError, 'num_partitions=7'):
      model_analysis.AnalyzeLayers(self.layers, self.shapes, num_partitions=7)
    with self.assertRaisesRegex(ValueError, 'looks like one shape'):
      model_analysis.AnalyzeLayers(SmallImageLayers(), [2, 8, 8, 3])
    with self.assertRaisesRegex(ValueError, r"layer 0 .*'c2'.*3 channels"):
      model_analysis.AnalyzeLayers(SmallImageLayers()[1:], [[2, 8, 8, 3]])

  def testLayerThatCannotBeBuiltAbstractlyNamesTheFix(self):
    p = _ReadsItsWeightLayer.Params().Set(name='fc', input_dim=6,
                                          output_dim=3)
    with self.assertRaisesRegex(ValueError, "_ReadsItsWeightLayer 'fc' cannot "
                                'be built with abstract variables.*'
                                'exact_optimizer_state=False'):
      model_analysis.AnalyzeLayers([p], [[2, 6]])
    report = model_analysis.AnalyzeLayers([p], [[2, 6]], optimizer='adam',
                                          exact_optimizer_state=False)
    self.assertFalse(report.optimizer_exact)
    self.assertEqual(report.partitions[0].optimizer_bytes, 4 * 2 * (18 + 3))

  def testToTextPrintsTables(self):
    report = model_analysis.AnalyzeLayers(
        self.layers, self.shapes, num_partitions=2, num_micro_batches=2,
        optimizer='momentum')
    text = report.ToText()
    for piece in ('enc0', 'TransformerDecoderLayer', 'Partition plan',
                  'load imbalance', 'momentum', 'K=2', 'T=2'):
      self.assertIn(piece, text)
    self.assertLen([l for l in text.splitlines() if l.startswith('1  ')], 2)
    short = report.ToText(max_layer_rows=2)
    self.assertIn('more)', short)


class LargeModelTest(tf.test.TestCase):

  def testSixBillionTransformerIsAnalysedQuicklyWithoutAllocating(self):
    process = psutil.Process()
    rss_before = process.memory_info().rss
    start = time.perf_counter()
    layers = transformer.TransformerLayers(
        num_layers=64, hidden_dim=16384, num_heads=32, model_dim=1024,
        vocab_size=64000, max_len=256)
    report = model_analysis.AnalyzeLayers(
        layers, transformer.TranslationInputShapes(64, 256, 256),
        num_partitions=8, num_micro_batches=16, optimizer='adafactor')
    text = report.ToText()
    elapsed = time.perf_counter() - start
    grown = process.memory_info().rss - rss_before
    self.assertLen(report.layers, 130)
    self.assertGreater(report.num_params, 5e9)
    self.assertLess(grown, 200 * 2**20)
    self.assertLess(elapsed, 20.0)
    self.assertIn('dec63', text)
    # Float32 weights alone exceed 20 GB: nothing of that size was allocated.
    self.assertGreater(sum(p.param_bytes for p in report.partitions), 2e10)


class ToolTest(tf.test.TestCase):

  def _Flags(self, *argv):
    fv = flags.FlagValues()
    model_analysis_tool.DefineFlags(fv)
    fv(['model_analysis'] + list(argv))
    return fv

  def _Run(self, *argv):
    return model_analysis_tool.Run(self._Flags(*argv))

  def testMainPrintsConsistencyReport(self):
    fv = self._Flags('--model=consistency', '--num_partitions=2',
                     '--num_micro_batches=4', '--batch_size=8')
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      model_analysis_tool.main(['model_analysis'], flag_values=fv)
    text = out.getvalue()
    self.assertIn('consistency CNN: 16 Conv2DLayers', text)
    self.assertIn('K=2 partitions, T=4 micro-batches of 2', text)
    bad = self._Flags('--model=consistency', '--num_micro_batches=3',
                      '--batch_size=8')
    with self.assertRaisesRegex(app.UsageError, 'num_micro_batches=3'):
      model_analysis_tool.main(['model_analysis'], flag_values=bad)

  def testConsistencyModel(self):
    text = self._Run('--model=consistency', '--num_partitions=4',
                     '--num_micro_batches=8', '--batch_size=16',
                     '--optimizer=sgd')
    self.assertIn('consistency CNN: 16 Conv2DLayers', text)
    self.assertIn('conv15', text)
    self.assertIn('load imbalance (max / mean partition FLOPs): 1.000', text)
    self.assertIn('[16,8,8,1]', text)

  def testTransformerModel(self):
    text = self._Run('--model=transformer', '--L=2', '--H=64', '--A=4',
                     '--D=32', '--vocab=100', '--seq_len=8', '--batch_size=4',
                     '--num_partitions=2')
    self.assertIn('Transformer T(2, 64, 4)', text)
    report = model_analysis.AnalyzeLayers(
        transformer.TransformerLayers(2, 64, 4, 32, 100, max_len=8),
        transformer.TranslationInputShapes(4, 8, 8))
    self.assertIn(f'({report.num_params:,};', text)

  def testPaperTransformersTable(self):
    text = self._Run('--model=paper_transformers')
    self.assertIn('attention width 64 x A', text)
    counts = model_analysis_tool.PaperTransformerCounts()
    self.assertEqual([n for n, _, _ in counts],
                     list(transformer.PAPER_TRANSFORMERS))
    for name, ours, paper in counts:
      self.assertIn(f'{name:<18} {ours:>15,}', text)
      self.assertLessEqual(abs(ours / paper - 1), 0.05, msg=name)
    # --head_dim=0: width D, the reading that misses the table.
    wide = self._Run('--model=paper_transformers', '--head_dim=0')
    self.assertIn('attention width D = 1024', wide)
    self.assertIn('-16.3%', wide)

  def testTransformerHeadDimFlag(self):
    text = self._Run('--model=transformer', '--L=1', '--H=64', '--A=4',
                     '--D=32', '--vocab=100', '--seq_len=8', '--batch_size=4',
                     '--head_dim=16')
    self.assertIn('attention width 64', text)
    report = model_analysis.AnalyzeLayers(
        transformer.TransformerLayers(1, 64, 4, 32, 100, max_len=8,
                                      head_dim=16),
        transformer.TranslationInputShapes(4, 8, 8))
    self.assertIn(f'({report.num_params:,};', text)

  def testUnknownModelRaises(self):
    with self.assertRaisesRegex(ValueError, "unknown model 'vgg'"):
      model_analysis_tool.ModelSpec('vgg')


if __name__ == '__main__':
  tf.test.main()
