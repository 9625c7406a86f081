"""Tests for tensorpipe.layers.losses."""

import numpy as np
import tensorflow as tf

from tensorpipe.layers import losses


def _LogSoftmax(logits):
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _Logits(shape=(4, 5)):
  return tf.random.stateless_normal(shape, [1, 0], stddev=2.0)


class SoftmaxCrossEntropyLossTest(tf.test.TestCase):

  def testIntLabelsMatchNumpy(self):
    logits = _Logits()
    labels = tf.constant([0, 3, 4, 1])
    loss = losses.SoftmaxCrossEntropyLoss(logits, labels)
    expected = -_LogSoftmax(logits.numpy())[np.arange(4), labels.numpy()]
    self.assertAllClose(expected, loss)

  def testFloat64LogitsGiveAFloat64Loss(self):
    # Logits 1e3 apart by ~1e-5: float32 would be off by ~1e-5 relative.
    logits = 1000.0 + tf.random.stateless_normal([4, 5], [1, 0],
                                                 dtype=tf.float64) * 1e-5
    labels = tf.constant([2, 0, 1, 4])
    s, c = 0.1, 5
    loss = losses.SoftmaxCrossEntropyLoss(logits, labels, s, c)
    self.assertEqual(loss.dtype, tf.float64)
    target = np.eye(c)[labels.numpy()] * (1 - s) + s / c
    expected = -(target * _LogSoftmax(logits.numpy())).sum(-1)
    self.assertAllClose(loss, expected, rtol=1e-9, atol=1e-9)
    self.assertEqual(
        losses.SoftmaxCrossEntropyLoss(tf.cast(logits, tf.float32),
                                       labels).dtype, tf.float32)
    self.assertEqual(losses.TopKAccuracy(logits, labels).dtype, tf.float64)

  def testLabelSmoothingMatchesNumpyFormula(self):
    logits = _Logits()
    labels = np.array([2, 0, 1, 4])
    s, c = 0.1, 5
    targets = (1 - s) * np.eye(c)[labels] + s / c
    expected = -(targets * _LogSoftmax(logits.numpy())).sum(-1)
    loss = losses.SoftmaxCrossEntropyLoss(logits, tf.constant(labels),
                                          label_smoothing=s, num_classes=c)
    self.assertAllClose(expected, loss)

  def testIntAndOneHotLabelsAgree(self):
    logits = _Logits()
    labels = tf.constant([1, 1, 0, 4])
    for smoothing in (0.0, 0.2):
      with self.subTest(smoothing=smoothing):
        self.assertAllClose(
            losses.SoftmaxCrossEntropyLoss(logits, labels, smoothing),
            losses.SoftmaxCrossEntropyLoss(logits, tf.one_hot(labels, 5),
                                           smoothing))

  def testBfloat16LogitsGiveFloat32Loss(self):
    logits = _Logits()
    labels = tf.constant([0, 1, 2, 3])
    loss = losses.SoftmaxCrossEntropyLoss(tf.cast(logits, tf.bfloat16), labels)
    self.assertEqual(tf.float32, loss.dtype)
    self.assertAllClose(losses.SoftmaxCrossEntropyLoss(logits, labels), loss,
                        atol=0.05)

  def testBadArgumentsRaise(self):
    logits = _Logits()
    with self.assertRaisesRegex(ValueError, 'num_classes=6'):
      losses.SoftmaxCrossEntropyLoss(logits, tf.constant([0, 0, 0, 0]),
                                     num_classes=6)
    with self.assertRaisesRegex(ValueError, 'label_smoothing=1.0'):
      losses.SoftmaxCrossEntropyLoss(logits, tf.constant([0, 0, 0, 0]), 1.0)
    with self.assertRaisesRegex(ValueError, 'need rank 1'):
      losses.SoftmaxCrossEntropyLoss(logits, tf.zeros([4, 1], tf.int32))


class TopKAccuracyTest(tf.test.TestCase):

  def testMatchesNumpyRanking(self):
    logits = _Logits((6, 5))
    labels = tf.constant([0, 1, 2, 3, 4, 0])
    order = np.argsort(-logits.numpy(), axis=-1)
    for k in (1, 2, 5):
      with self.subTest(k=k):
        hits = [labels.numpy()[i] in order[i, :k] for i in range(6)]
        self.assertAllClose(np.mean(hits),
                            losses.TopKAccuracy(logits, labels, k))
        self.assertAllClose(np.array(hits, np.float32), losses.TopKAccuracy(
            logits, tf.one_hot(labels, 5), k, per_example=True))

  def testConstantLogitsAreNotAllCorrect(self):
    accuracy = losses.TopKAccuracy(tf.zeros([4, 3]), tf.constant([0, 1, 2, 1]))
    self.assertAllClose(0.25, accuracy)


class SoftmaxLayerTest(tf.test.TestCase):

  def testOutputsMatchFunctions(self):
    p = losses.SoftmaxLayer.Params().Set(name='softmax', num_classes=5,
                                         label_smoothing=0.1)
    layer = p.Instantiate()
    logits = _Logits()
    labels = tf.constant([4, 3, 2, 1])
    out = layer.FPropDefaultTheta(logits, labels)
    per_example = losses.SoftmaxCrossEntropyLoss(logits, labels, 0.1)
    self.assertAllClose(per_example, out.per_example_loss)
    self.assertAllClose(np.mean(per_example), out.loss)
    self.assertAllClose(
        np.mean(np.argmax(logits.numpy(), -1) == labels.numpy()), out.accuracy)
    self.assertAllEqual(logits, out.logits)
    meta = losses.SoftmaxLayer.FPropMeta(p, logits.shape, labels.shape)
    shapes = meta.out_shapes[0]
    for key in ('per_example_loss', 'loss', 'accuracy', 'logits'):
      self.assertEqual(shapes[key], out[key].shape, key)

  def testFPropMetaRaisesOnClassMismatch(self):
    p = losses.SoftmaxLayer.Params().Set(name='softmax', num_classes=10)
    with self.assertRaisesRegex(ValueError, r'\[batch, \.\.\., 10\]'):
      losses.SoftmaxLayer.FPropMeta(p, [4, 5])


if __name__ == '__main__':
  tf.test.main()
