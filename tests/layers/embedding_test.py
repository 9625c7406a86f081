"""Tests of tensorpipe/layers/embedding.py against NumPy."""

import math

import numpy as np
import tensorflow as tf

from tensorpipe.layers import embedding
from tensorpipe.nested_map import NestedMap
from tests import weight_op_testlib


def _Positions(length, dim):
  """The sinusoids of Vaswani et al. 2017, one element at a time."""
  pe = np.zeros([length, dim])
  for t in range(length):
    for j in range(dim):
      angle = t / 10000.0 ** (2 * (j // 2) / dim)
      pe[t, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
  return pe


class PositionalEncodingTest(tf.test.TestCase):

  def testMatchesTheFormula(self):
    for dim in (6, 7):
      pe = embedding.PositionalEncoding(9, dim)
      self.assertEqual((pe.shape, pe.dtype), ((9, dim), np.float32))
      # Computed in float64, rounded once to float32.
      self.assertAllClose(pe, _Positions(9, dim), rtol=0, atol=1e-7)


class EmbeddingLayerTest(tf.test.TestCase):

  def _Layer(self, **kw):
    return embedding.EmbeddingLayer.Params().Set(
        name='emb', vocab_size=5, embedding_dim=4, dtype=tf.float64,
        **kw).Instantiate()

  def testLookupIsScaledRowsOfTheTable(self):
    ids = np.array([[0, 3, 3], [4, 1, 0]])
    for scale in (True, False):
      layer = self._Layer(scale_sqrt_depth=scale)
      table = layer.vars.emb.numpy()
      self.assertEqual(table.shape, (5, 4))
      want = table[ids] * (2.0 if scale else 1.0)    # sqrt(4)
      self.assertAllClose(layer.FPropDefaultTheta(tf.constant(ids)), want,
                          rtol=1e-12, atol=0)

  def testGradientIsADenseScatterAddOfTheOutputGradient(self):
    layer = self._Layer()
    ids = np.array([[0, 3, 3], [4, 1, 0]])
    dy = np.random.RandomState(0).randn(2, 3, 4)
    with tf.GradientTape() as tape:
      y = layer.FPropDefaultTheta(tf.constant(ids))
      loss = tf.reduce_sum(y * dy)
    grad = tape.gradient(loss, layer.vars.emb)
    self.assertIsInstance(grad, tf.Tensor)        # not tf.IndexedSlices
    want = np.zeros([5, 4])
    np.add.at(want, ids.reshape(-1), 2.0 * dy.reshape(-1, 4))
    self.assertAllClose(grad, want, rtol=1e-12, atol=1e-12)

  def testLookupIsAWeightOpThatSplitsBitForBit(self):
    """The lookup goes through py_utils.WeightOp (x = the ids): the W
    cell's scatter-add from the dz I kept gives the tape's bits."""
    ids = tf.constant([[0, 3, 3], [4, 1, 0]])
    calls = weight_op_testlib.AssertWeightOpsSplit(self, self._Layer(),
                                                   [ids], ['emb'])
    self.assertIs(calls[0].x, ids)

  def testFloatIdsRaise(self):
    with self.assertRaisesRegex(TypeError, 'ids must be integers'):
      self._Layer().FPropDefaultTheta(tf.zeros([2, 3]))

  def testFPropMeta(self):
    p = embedding.EmbeddingLayer.Params().Set(name='emb', vocab_size=5,
                                              embedding_dim=4)
    meta = p.cls.FPropMeta(p, tf.TensorShape([2, 3]))
    self.assertEqual(meta.out_shapes[0].as_list(), [2, 3, 4])
    self.assertEqual(meta.num_params, 20)
    with self.assertRaisesRegex(ValueError, 'embedding_dim=0 must be a '
                                'positive int'):
      p.Copy().Set(embedding_dim=0).Instantiate()


class TransformerEmbeddingLayerTest(tf.test.TestCase):

  def _Batch(self):
    rng = np.random.RandomState(1)
    return NestedMap(
        src_ids=tf.constant(rng.randint(0, 7, [2, 5]), tf.int32),
        src_paddings=tf.constant([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]],
                                 tf.float32),
        tgt_ids=tf.constant(rng.randint(0, 7, [2, 4]), tf.int32),
        tgt_labels=tf.constant(rng.randint(0, 7, [2, 4]), tf.int64),
        tgt_paddings=tf.constant([[0, 0, 1, 1], [0, 0, 0, 1]], tf.int32))

  def _Layer(self, **kw):
    return embedding.TransformerEmbeddingLayer.Params().Set(
        name='emb', vocab_size=7, model_dim=6, max_len=8, dtype=tf.float64,
        **kw).Instantiate()

  def _Expected(self, layer, table, ids):
    t = layer.children[table].vars.emb.numpy()
    return t[ids.numpy()] * math.sqrt(6) + _Positions(ids.shape[1], 6)

  def testSeparateTablesForSourceAndTarget(self):
    layer = self._Layer()
    batch = self._Batch()
    out = layer.FPropDefaultTheta(batch)
    self.assertAllClose(out.src_vecs,
                        self._Expected(layer, 'src_emb', batch.src_ids),
                        rtol=1e-6, atol=1e-6)
    self.assertAllClose(out.tgt_vecs,
                        self._Expected(layer, 'tgt_emb', batch.tgt_ids),
                        rtol=1e-6, atol=1e-6)
    self.assertEqual((out.tgt_paddings.dtype, out.tgt_labels.dtype),
                     (tf.float32, tf.int32))
    self.assertAllEqual(out.tgt_labels, batch.tgt_labels)

  def testSharedTableServesBothSides(self):
    layer = self._Layer(shared_embeddings=True)
    self.assertEqual(sorted(layer.children), ['emb', 'src_dropout',
                                              'tgt_dropout'])
    batch = self._Batch()
    out = layer.FPropDefaultTheta(batch)
    self.assertAllClose(out.src_vecs,
                        self._Expected(layer, 'emb', batch.src_ids),
                        rtol=1e-6, atol=1e-6)

  def testEveryLookupIsAWeightOp(self):
    """Two tables, or one shared table looked up twice (its W cells sum
    both lookups' scatter-adds)."""
    for shared, ops in ((False, ['src_emb.emb', 'tgt_emb.emb']),
                        (True, ['emb.emb', 'emb.emb'])):
      with self.subTest(shared=shared):
        weight_op_testlib.AssertWeightOpsSplit(
            self, self._Layer(shared_embeddings=shared), [self._Batch()], ops)

  def testLanguageModelBatch(self):
    layer = self._Layer(mode='lm')
    ids = tf.constant([[1, 2, 3]], tf.int32)
    out = layer.FPropDefaultTheta(NestedMap(
        ids=ids, labels=tf.constant([[2, 3, 0]]),
        paddings=tf.constant([[0.0, 0.0, 1.0]])))
    self.assertEqual(sorted(out), ['tgt_labels', 'tgt_paddings', 'tgt_vecs'])
    self.assertAllClose(out.tgt_vecs, self._Expected(layer, 'tgt_emb', ids),
                        rtol=1e-6, atol=1e-6)

  def testFPropMetaCountsTheTablesCreated(self):
    for kw in ({}, {'shared_embeddings': True}, {'src_vocab_size': 3},
               {'mode': 'lm'}):
      with self.subTest(**kw):
        layer = self._Layer(**kw)
        p = layer.params
        shapes = {k: v.shape for k, v in self._Batch().items()}
        if p.mode == 'lm':
          shapes = {'ids': [2, 4], 'labels': [2, 4], 'paddings': [2, 4]}
        meta = p.cls.FPropMeta(p, shapes)
        self.assertEqual(meta.num_params, sum(
            int(np.prod(v.shape)) for v in layer.variables))
        self.assertEqual(meta.out_shapes[0].tgt_vecs.as_list(), [2, 4, 6])

  def testErrorsNameTheFix(self):
    with self.assertRaisesRegex(ValueError, "missing \\['src_ids'"):
      self._Layer().FPropDefaultTheta(NestedMap(
          {k: v for k, v in self._Batch().items() if k != 'src_ids'}))
    with self.assertRaisesRegex(ValueError, 'src length 9 .*max_len=8'):
      batch = self._Batch()
      batch.src_ids = tf.zeros([2, 9], tf.int32)
      batch.src_paddings = tf.zeros([2, 9])
      self._Layer().FPropDefaultTheta(batch)
    with self.assertRaisesRegex(ValueError, 'shared_embeddings=True needs one '
                                'vocabulary'):
      self._Layer(shared_embeddings=True, src_vocab_size=3)
    with self.assertRaisesRegex(ValueError, "mode='mt'"):
      self._Layer(mode='mt')


if __name__ == '__main__':
  tf.test.main()
