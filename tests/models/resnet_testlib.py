"""Tiny ResNets, their loss and the pipeline-vs-oracle check.

Shared by resnet_test.py and resnet_slow_test.py.
"""

import tensorflow as tf

from models import resnet
from tensorpipe import test_utils
from tensorpipe.layers import composite

BATCH = 4
SIZE = 8
CLASSES = 5


def TinyLayers(depth=50, **kw):
  return resnet.ResNetLayers(depth, num_classes=CLASSES, width=2,
                             input_shape=(None, SIZE, SIZE, 3),
                             small_stem=True, **kw)


def TrimmedLayers():
  """Tiny ResNet-50's stem, first stage (a projection and two identity
  blocks) and the second stage's first (strided) block, then the head: keeps
  the test fast; the whole model is compared in resnet_slow_test.py."""
  layer_ps = TinyLayers()
  blocks = layer_ps[1:5]
  head = layer_ps[-1].Copy().Set(input_dim=4 * 2 * 2)
  return [layer_ps[0]] + blocks + [layer_ps[-2], head]


def Sequential(layer_ps):
  return composite.SequentialLayer.Params().Set(
      name='Sequential', sub=layer_ps).Instantiate()


def Loss(logits):
  labels = tf.range(BATCH) % CLASSES
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=logits))


def Images(seed=1):
  return tf.random.stateless_normal([BATCH, SIZE, SIZE, 3], seed=[seed, 5])


def ComparePipelined(test, layer_ps, k, t, x):
  """Pipelined outputs, loss and gradients == the micro-batch oracle's
  (float64: see test_utils.AssertPipelineMatchesOracle)."""
  test_utils.AssertPipelineMatchesOracle(test, layer_ps, k, t, [x], Loss)
