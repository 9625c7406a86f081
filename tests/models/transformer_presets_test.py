"""The paper's Transformer sizes: head_dim, presets and their parameter counts.

Counts come from FPropMeta (models/transformer.py, tensorpipe/model_analysis):
nothing of the billion-parameter models is allocated.
"""

import numpy as np
import tensorflow as tf

from models import transformer
from tensorpipe import model_analysis
from tensorpipe.layers import composite

# The paper's own numbers are rounded (400M, 1.3B, 6B): 5% covers that.
PAPER_TOLERANCE = 0.05


def _Count(layers) -> int:
  return model_analysis.AnalyzeLayers(
      layers, transformer.TranslationInputShapes(1, 16, 16),
      exact_optimizer_state=False).num_params


class HeadDimTest(tf.test.TestCase):

  TINY = dict(num_layers=2, hidden_dim=32, num_heads=4, model_dim=16,
              vocab_size=50, max_len=16)

  def testHeadDimSetsTheAttentionWidth(self):
    # 4 heads of 8 dimensions: width 32, twice the model dimension.
    d, w, h, v, n = 16, 32, 32, 50, 2
    attention = 4 * d * w + 3 * w + d + 2 * d   # projections, biases, LN
    ff = 2 * d * h + h + d + 2 * d
    expected = (v * d + n * (attention + ff) + n * (2 * attention + ff) +
                d * v + v)
    layers = transformer.TransformerLayers(head_dim=8, **self.TINY)
    self.assertEqual(_Count(layers), expected)
    built = composite.SequentialLayer.Params().Set(
        name='model', sub=layers).Instantiate()
    self.assertEqual(sum(int(np.prod(x.shape)) for x in built.variables),
                     expected)
    # 3 n attentions (encoder self, decoder self and cross), each [D, 32].
    wq = [x.shape.as_list() for x in built.variables
          if x.name.endswith('/wq:0')]  # variables are named by path
    self.assertEqual(wq, [[d, w]] * (3 * n))

  def testHeadDimOfModelDimOverHeadsIsTheDefault(self):
    # model_dim = heads x head_dim stays available: head_dim=None or D / A.
    default = _Count(transformer.TransformerLayers(**self.TINY))
    self.assertEqual(_Count(transformer.TransformerLayers(
        head_dim=16 // 4, **self.TINY)), default)
    lm = dict(self.TINY)
    self.assertEqual(
        model_analysis.AnalyzeLayers(
            transformer.TransformerLmLayers(head_dim=4, **lm),
            transformer.LmInputShapes(1, 16),
            exact_optimizer_state=False).num_params,
        model_analysis.AnalyzeLayers(
            transformer.TransformerLmLayers(**lm),
            transformer.LmInputShapes(1, 16),
            exact_optimizer_state=False).num_params)

  def testHeadDimLiftsTheDivisibilityRule(self):
    with self.assertRaisesRegex(ValueError, 'not divisible by num_heads=3'):
      transformer.TransformerLayers(**dict(self.TINY, num_heads=3))
    layers = transformer.TransformerLayers(head_dim=5,
                                           **dict(self.TINY, num_heads=3))
    self.assertGreater(_Count(layers), 0)
    for bad in (0, -64, 6.5, '64'):
      with self.assertRaisesRegex(ValueError, f'head_dim={bad!r}'):
        transformer.TransformerLayers(head_dim=bad, **self.TINY)


class PaperPresetsTest(tf.test.TestCase):

  def testPresetCountsAreWithinFivePercentOfThePaper(self):
    self.assertLen(transformer.PAPER_TRANSFORMERS, 4)
    counts = {}
    for name, t in transformer.PAPER_TRANSFORMERS.items():
      counts[name] = _Count(transformer.PaperTransformerLayers(name))
      self.assertLessEqual(abs(counts[name] / t.paper_params - 1),
                           PAPER_TOLERANCE,
                           msg=f'{name}: {counts[name]:,} vs the paper\'s '
                           f'{t.paper_params:g}')
    # The paper calls both "1.3B": with 64-dimensional heads they agree to
    # the 2 x 24 - 2 x 12 extra LayerNorms and biases.
    a, b = counts['T(12, 16384, 32)'], counts['T(24, 8192, 16)']
    self.assertLess(abs(a - b) / a, 1e-3)

  def testWidthOfModelDimMissesThePaper(self):
    # The other reading (width D = 1024 for every A) cannot give the table:
    # the A = 32 models fall more than 10% short.
    for name in ('T(12, 16384, 32)', 'T(64, 16384, 32)'):
      t = transformer.PAPER_TRANSFORMERS[name]
      ours = _Count(transformer.PaperTransformerLayers(name, head_dim=None))
      self.assertLess(ours / t.paper_params, 0.9, msg=name)

  def testPresetKnobs(self):
    name = 'T(6, 8192, 16)'
    shared = _Count(transformer.PaperTransformerLayers(name))
    separate = _Count(transformer.PaperTransformerLayers(
        name, shared_embeddings=False))
    self.assertEqual(separate - shared,
                     transformer.PAPER_VOCAB_SIZE * transformer.PAPER_MODEL_DIM)
    with self.assertRaisesRegex(ValueError, r"unknown Transformer preset "
                                r"'T\(6, 8192, 8\)'.*T\(64, 16384, 32\)"):
      transformer.PaperTransformerLayers('T(6, 8192, 8)')


if __name__ == '__main__':
  tf.test.main()
