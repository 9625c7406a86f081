"""Tiny AmoebaNets, their loss and the pipeline-vs-oracle check.

Shared by amoebanet_test.py and amoebanet_slow_test.py.
"""

import tensorflow as tf

from models import amoebanet
from tensorpipe import test_utils
from tensorpipe.layers import composite

BATCH = 4
SIZE = 16
CLASSES = 5


def TinyLayers(variant='D', **kw):
  args = dict(num_normal_cells=1, num_filters=8, num_classes=CLASSES,
              image_size=SIZE, small_stem=True, stem_filters=8,
              drop_path_keep_prob=0.6, dropout_keep_prob=0.7)
  args.update(kw)
  return amoebanet.AmoebaNetLayers(variant, **args)


def Sequential(layer_ps):
  return composite.SequentialLayer.Params().Set(
      name='Sequential', sub=layer_ps).Instantiate()


def Loss(out):
  """CE(logits) + 0.4 * CE(aux_logits), the AmoebaNet training loss."""
  labels = tf.range(BATCH) % CLASSES

  def Ce(logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))
  if isinstance(out, dict):
    return Ce(out['logits']) + amoebanet.AUX_LOSS_WEIGHT * Ce(out['aux_logits'])
  return Ce(out)


def Images(seed=1):
  return tf.random.stateless_normal([BATCH, SIZE, SIZE, 3], seed=[seed, 7])


def ComparePipelined(test, layer_ps, k, t, x):
  """Pipelined outputs, loss and gradients == the micro-batch oracle's
  (float64: see test_utils.AssertPipelineMatchesOracle)."""
  test_utils.AssertPipelineMatchesOracle(test, layer_ps, k, t, [x], Loss)
