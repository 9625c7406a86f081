"""tensorpipe.saved_activations: what a layer's backward keeps, traced on
specs; and the memory model's use of it (schedule_plan._StageBytes)."""

import tensorflow as tf

from tensorpipe import model_analysis
from tensorpipe import saved_activations
from tensorpipe import schedule_plan
from tensorpipe.layers import embedding
from tensorpipe.layers import keras_layer
from tensorpipe.layers import linear
from tensorpipe.layers import transformer

B, S, D, H, A = 4, 8, 16, 64, 2   # batch, sequence, model, hidden, heads
F32 = 4


class TraceTest(tf.test.TestCase):

  def testReluLayerKeepsItsInputAndOutput(self):
    # y = relu(x W + b): the gradient of W reads x, ReLU's reads y; nothing
    # else. Its one weight op's x and z are [B, 8] and [B, 16].
    saved = saved_activations.Trace(
        linear.FCLayer.Params().Set(name='fc', input_dim=8, output_dim=16),
        [[B, 8]])
    self.assertEqual(saved, saved_activations.Saved(
        own_bytes=0, input_kept=True, output_kept=True,
        weight_in_bytes=B * 8 * F32, weight_out_bytes=B * 16 * F32))

  def testLinearLayerDoesNotKeepItsOutput(self):
    saved = saved_activations.Trace(
        linear.FCLayer.Params().Set(name='fc', input_dim=8, output_dim=16,
                                    activation='NONE', bias=False),
        [[B, 8]])
    self.assertTrue(saved.input_kept)
    self.assertFalse(saved.output_kept)
    self.assertEqual(saved.own_bytes, 0)

  def testFeedForwardKeepsItsHidden(self):
    # The ReLU's output [B, S, H] is read by ReLU's gradient and by the
    # second matmul's weight gradient: one buffer, kept once at least.
    p = transformer.TransformerFeedForwardBlock.Params().Set(
        name='ff', model_dim=D, hidden_dim=H)
    saved = saved_activations.Trace(p, [[B, S, D]])
    self.assertGreaterEqual(saved.own_bytes, B * S * H * F32)
    # Not every intermediate: at most the hidden twice (before and after
    # the ReLU) and a few model-wide tensors.
    self.assertLess(saved.own_bytes, 2 * B * S * H * F32 + 8 * B * S * D * F32)

  def testAttentionKeepsItsProbabilities(self):
    p = transformer.TransformerAttentionBlock.Params().Set(
        name='att', model_dim=D, num_heads=A)
    saved = saved_activations.Trace(p, [[B, S, D]])
    # The softmax output [B, A, S, S] feeds the value product's gradient.
    self.assertGreaterEqual(saved.own_bytes, B * A * S * S * F32)

  def testWeightOpsReadingOneInputCountItOnce(self):
    # The q, k and v projections read one input [B, S, D], the output
    # projection the attention's result: the stash keeps two buffers of
    # the four weight ops' inputs; their outputs are four.
    p = transformer.TransformerAttentionBlock.Params().Set(
        name='att', model_dim=D, num_heads=A)
    saved = saved_activations.Trace(p, [[B, S, D]])
    self.assertEqual(saved.weight_in_bytes, 2 * B * S * D * F32)
    self.assertEqual(saved.weight_out_bytes, 4 * B * S * D * F32)

  def testAStackOfLikeLayersIsTracedOnce(self):
    calls = []
    real = saved_activations._Trace

    def Counting(*args):
      calls.append(args)
      return real(*args)
    saved_activations._cache.clear()
    saved_activations._Trace = Counting
    try:
      for i in range(3):
        saved_activations.Trace(linear.FCLayer.Params().Set(
            name=f'fc{i}', input_dim=8, output_dim=8), [[B, 8]])
    finally:
      saved_activations._Trace = real
    self.assertLen(calls, 1)

  def testAKerasLayerLeavesItsWeightOpsUnknown(self):
    # Its weight ops are bound to real weights only, so the abstract trace
    # sees none: the memory model then counts its input and output.
    p = keras_layer.KerasLayer.Params().Set(
        name='dense', keras_factory='keras.layers.Dense',
        keras_kwargs={'units': 16, 'activation': 'relu'}, input_shape=[8])
    saved = saved_activations.Trace(p, [[B, 8]])
    self.assertIsNone(saved.weight_in_bytes)
    self.assertIsNone(saved.weight_out_bytes)
    stage = schedule_plan._StageBytes(
        [schedule_plan._Layer(B * 8 * F32, B * 16 * F32, 544, saved)], 1)
    self.assertEqual((stage.xs, stage.dz), (B * 8 * F32, B * 16 * F32))

  def testALayerThatCannotBeTracedOnFloatSpecsGivesNone(self):
    # Ids are integers; the trace feeds float specs.
    p = embedding.EmbeddingLayer.Params().Set(name='emb', vocab_size=10,
                                              embedding_dim=4)
    self.assertIsNone(saved_activations.Trace(p, [[B, S]]))


class MemoryModelTest(tf.test.TestCase):

  def testStageCountsABoundaryBetweenTwoLayersOnce(self):
    # Two ReLU layers 8 -> 8 -> 8 at batch B, T=1: layer 0's output is
    # layer 1's input (both keep it: once), layer 1's output once.
    act = B * 8 * F32
    saved = saved_activations.Saved(0, True, True, act, act)
    layers = [schedule_plan._Layer(act, act, 288, saved)] * 2
    stage = schedule_plan._StageBytes(layers, 1)
    self.assertEqual(stage.internal, 2 * act)
    self.assertEqual((stage.dz, stage.xs), (2 * act, 2 * act))
    # Untraced layers: one output per layer, a weighted layer's input and
    # output for the stash.
    stage = schedule_plan._StageBytes(
        [schedule_plan._Layer(act, 2 * act, 288, None)] * 2, 2)
    self.assertEqual((stage.internal, stage.dz, stage.xs), (2 * act, 2 * act,
                                                           act))

  def testReportCarriesWhatEachLayerKeeps(self):
    layers = [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=8,
                                          output_dim=8) for i in range(2)]
    report = model_analysis.AnalyzeLayers(layers, [[B, 8]],
                                          exact_optimizer_state=False,
                                          activation_dtype=tf.bfloat16)
    # Traced in float32, counted in the report's activation dtype.
    self.assertEqual(report.Saved()[1].weight_in_bytes, B * 8 * 2)


if __name__ == '__main__':
  tf.test.main()
