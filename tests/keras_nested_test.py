"""keras_hub models as given, dict inputs and outputs, nested functional models.

keras_nested.Flatten rebuilds a model whose config is not its graph as one
functional graph over the same layers; TensorPipeModel then cuts it like any
functional model. Checked against plain Keras in float64 (rtol 1e-9: the
pipeline runs the same ops per row, only the rows are grouped differently).
"""

import functools
import os

import keras
import keras_hub
import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import keras_graph_costs
from tensorpipe import keras_nested
from tensorpipe import keras_pipeline
from tensorpipe import test_utils
from tests import export_testlib

test_utils.ConfigureTestDevices()

_VOCAB, _LEN, _N = 40, 6, 8


def _Gpt2(num_layers=2):
  keras.utils.set_random_seed(1)
  return keras_hub.models.GPT2Backbone(
      vocabulary_size=_VOCAB, num_layers=num_layers, num_heads=2,
      hidden_dim=8, intermediate_dim=16, max_sequence_length=_LEN,
      dropout=0.0, dtype='float64')


def _Batch(rows=_N, seed=0):
  rng = np.random.default_rng(seed)
  mask = np.ones((rows, _LEN), 'int32')
  mask[::3, -2:] = 0  # some padded rows
  return {'token_ids': rng.integers(0, _VOCAB, (rows, _LEN)).astype('int32'),
          'padding_mask': mask}


class KerasHubBackboneTest(tf.test.TestCase):

  def testGpt2BackboneAsGivenPipelinesAtK2LikeKeras(self):
    backbone = _Gpt2()
    self.assertFalse(keras_nested._HasGraphConfig(backbone))  # pylint: disable=protected-access
    pipe = keras_pipeline.TensorPipeModel(
        backbone, num_partitions=2, num_micro_batches=2, batch_size=_N)
    report = pipe.graph_pipeline.Report()
    self.assertIn('2 segments', report)
    # The cut falls between the transformer blocks, inside the backbone.
    self.assertRegex(report, r'segment 1: nodes \d+\.\.\d+ \(transformer_')
    x = _Batch()
    want = backbone.predict(x, batch_size=_N, verbose=0)
    got = pipe.predict(x, batch_size=_N, verbose=0)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    # Dict inputs keyed by name, in any order; a missing key is named.
    swapped = {'padding_mask': x['padding_mask'], 'token_ids': x['token_ids']}
    np.testing.assert_array_equal(pipe.predict(swapped, batch_size=_N,
                                               verbose=0), got)
    with self.assertRaisesRegex(ValueError, 'padding_mask'):
      pipe.predict({'token_ids': x['token_ids']}, batch_size=_N, verbose=0)

  def testBertAndGemmaBackbonesPipelineLikeKeras(self):
    # Their graphs hold call arguments Keras serialises as objects: BERT's
    # pooled output indexes x[:, 0, :] (slices), Gemma multiplies by a
    # constant tensor; both are rebuilt as Keras's functional loader does.
    rng = np.random.default_rng(2)
    bert = keras_hub.models.BertBackbone(
        vocabulary_size=_VOCAB, num_layers=2, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=_LEN, num_segments=2,
        dropout=0.0, dtype='float64')
    gemma = keras_hub.models.GemmaBackbone(
        vocabulary_size=_VOCAB, num_layers=2, num_query_heads=2,
        num_key_value_heads=1, hidden_dim=8, intermediate_dim=16, head_dim=4,
        dropout=0.0, dtype='float64')
    x = _Batch()
    for backbone, extra in ((bert, {'segment_ids': rng.integers(
        0, 2, (_N, _LEN)).astype('int32')}), (gemma, {})):
      pipe = keras_pipeline.TensorPipeModel(
          backbone, num_partitions=2, num_micro_batches=2, batch_size=_N)
      want = backbone.predict(dict(x, **extra), batch_size=_N, verbose=0)
      got = pipe.predict(dict(x, **extra), batch_size=_N, verbose=0)
      tf.nest.map_structure(functools.partial(
          np.testing.assert_allclose, rtol=1e-9, atol=1e-12), got, want)

  def testModelWhoseLayerCannotGiveItsConfigIsNamedInOneLine(self):
    # keras_hub 0.32's Llama layers read an attribute they never set in
    # get_config(): Keras cannot save the model, nor can it be read here.
    llama = keras_hub.models.LlamaBackbone(
        vocabulary_size=_VOCAB, num_layers=1, num_query_heads=2,
        num_key_value_heads=1, hidden_dim=8, intermediate_dim=16)
    with self.assertRaisesRegex(
        ValueError, r"^layer 'transformer_layer_0' \(LlamaTransformerDecoder"
        r"\): get_config\(\) fails \(AttributeError: .*rope_scaling_factor.*"
        r"Keras could not save it either\); fix or override"):
      keras_pipeline.TensorPipeModel(llama, num_partitions=2,
                                     num_micro_batches=2, batch_size=_N)

  def testFitEqualsKerasFitAndWeightsRoundTrip(self):
    backbone, twin = _Gpt2(), _Gpt2()
    twin.set_weights(backbone.get_weights())
    pipe = keras_pipeline.TensorPipeModel(
        backbone, num_partitions=2, num_micro_batches=2, batch_size=_N)
    self.assertLen(pipe.get_weights(), len(backbone.get_weights()))
    for a, b in zip(pipe.get_weights(), backbone.get_weights()):
      np.testing.assert_array_equal(a, b)
    x = _Batch()
    y = np.random.default_rng(1).normal(size=(_N, _LEN, 8))
    for model in (pipe, twin):
      model.compile(keras.optimizers.SGD(0.1), 'mse')
      model.fit(x, y, batch_size=_N, epochs=2, shuffle=False, verbose=0)
    trained = twin.get_weights()
    moved = [not np.array_equal(a, b)
             for a, b in zip(trained, backbone.get_weights())]
    self.assertGreater(sum(moved), len(moved) // 2)  # training moved them
    for a, b in zip(pipe.get_weights(), trained):
      np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    # Keras' own model takes the pipeline's weights, and to_keras is the
    # keras_hub class again with them.
    backbone.set_weights(pipe.get_weights())
    plain = pipe.to_keras()
    self.assertIsInstance(plain, keras_hub.models.GPT2Backbone)
    np.testing.assert_allclose(plain.predict(x, batch_size=_N, verbose=0),
                               twin.predict(x, batch_size=_N, verbose=0),
                               rtol=1e-9, atol=1e-12)

  def testConfigStoresTheKerasHubClassAndRebuildsTheGraph(self):
    pipe = keras_pipeline.TensorPipeModel(
        _Gpt2(), num_partitions=2, num_micro_batches=2, batch_size=_N)
    config = pipe.get_config()
    self.assertEqual(config['layers']['class_name'], 'GPT2Backbone')
    again = keras_pipeline.TensorPipeModel.from_config(config)
    again.set_weights(pipe.get_weights())
    x = _Batch()
    np.testing.assert_array_equal(
        again.predict(x, batch_size=_N, verbose=0),
        pipe.predict(x, batch_size=_N, verbose=0))
    self.assertEqual(again.graph_pipeline.Report(),
                     pipe.graph_pipeline.Report())
    # A stored class Keras cannot find is named, with the fix.
    unknown = dict(config, layers=dict(
        config['layers'], class_name='NoSuchBackbone', module='nowhere',
        registered_name='nowhere>NoSuchBackbone'))
    with self.assertRaisesRegex(ValueError, r"'NoSuchBackbone' cannot be "
                                r'rebuilt .*import the package'):
      keras_pipeline.TensorPipeModel.from_config(unknown)


def _CausalLm():
  """A 2-block GPT-2 causal LM: its head calls the token embedding again
  (ReversibleEmbedding, reverse=True; one tied table)."""
  return keras_hub.models.GPT2CausalLM(backbone=_Gpt2(), preprocessor=None)


class TiedCausalLmTest(tf.test.TestCase):
  """The token table is owned by stage 0 and read by stage 1."""

  def _Pipe(self, lm, schedule='gpipe'):
    return keras_pipeline.TensorPipeModel(
        lm, num_partitions=2, num_micro_batches=2, batch_size=_N,
        schedule=schedule)

  def testFitEqualsKerasFitUnderGPipe1F1BAndZbH1(self):
    x = _Batch(2 * _N)
    y = np.roll(x['token_ids'], -1, axis=1)
    twin = _CausalLm()
    twin.compile(keras.optimizers.SGD(0.5), keras.losses.
                 SparseCategoricalCrossentropy(from_logits=True))
    twin.fit(x, y, batch_size=_N, epochs=1, shuffle=False, verbose=0)
    want = twin.get_weights()
    table = [w.path for w in twin.weights].index('token_embedding/embeddings')
    for schedule in ('gpipe', '1f1b', 'zb_h1'):
      with self.subTest(schedule=schedule):
        lm = _CausalLm()
        pipe = self._Pipe(lm, schedule)
        report = pipe.graph_pipeline.Report()
        # The cut falls inside the backbone; the table is on both devices.
        self.assertRegex(report, r'segment 1: nodes \d+\.\.\d+ '
                         r'\(transformer_layer_1 \.\. token_embedding\)')
        self.assertIn('tied: token_embedding (320 weights) is held on the '
                      'devices of segments 0, 1', report)
        self.assertIn('its gradient crosses once per step', report)
        pipe.compile(keras.optimizers.SGD(0.5), keras.losses.
                     SparseCategoricalCrossentropy(from_logits=True))
        pipe.fit(x, y, batch_size=_N, epochs=1, shuffle=False, verbose=0)
        got = pipe.get_weights()
        self.assertFalse(np.array_equal(got[table],
                                        lm.get_weights()[table]))
        for a, b in zip(got, want):
          np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)

  def testTheTableIsStoredOnceAndRoundTrips(self):
    lm = _CausalLm()
    pipe = self._Pipe(lm)
    paths = [p for p in base_layer.VariablesByPath(pipe.pipeline)
             if p.startswith('token_embedding')]
    self.assertEqual(paths, ['token_embedding/embeddings'])
    self.assertLen(pipe.get_weights(), len(lm.get_weights()))  # 36
    pipe.set_weights([w * 1.5 for w in lm.get_weights()])
    lm.set_weights(pipe.get_weights())  # Keras' own model takes them
    plain = pipe.to_keras()
    self.assertIsInstance(plain, keras_hub.models.GPT2CausalLM)
    self.assertLen(plain.get_weights(), len(lm.get_weights()))
    x = _Batch()
    want = lm.predict(x, batch_size=_N, verbose=0)
    np.testing.assert_array_equal(pipe.predict(x, batch_size=_N, verbose=0),
                                  want)
    np.testing.assert_array_equal(plain.predict(x, batch_size=_N, verbose=0),
                                  want)
    # The export holds Keras' 36 variables (one table) and serves the same.
    path = os.path.join(self.get_temp_dir(), 'export')
    pipe.export(path)
    stored = {n.split('/')[1] for n, _ in tf.train.list_variables(
        os.path.join(path, 'variables', 'variables'))
              if n.startswith('model_variables/')}
    self.assertLen(stored, len(lm.get_weights()))
    serve = tf.saved_model.load(path).signatures['serving_default']
    (served,) = serve(**{k: tf.constant(v) for k, v in x.items()}).values()
    np.testing.assert_array_equal(served.numpy(), want)
    # A checkpoint written at K=2 (one table entry) restores at K=1.
    prefix = tf.train.Checkpoint(model=pipe.pipeline).write(
        os.path.join(self.get_temp_dir(), 'ckpt'))
    self.assertLen([n for n, _ in tf.train.list_variables(prefix)
                    if 'token_embedding' in n], 1)
    one = keras_pipeline.TensorPipeModel(
        _CausalLm(), num_partitions=1, num_micro_batches=2, batch_size=_N)
    tf.train.Checkpoint(model=one.pipeline).read(prefix).assert_consumed()
    np.testing.assert_array_equal(one.predict(x, batch_size=_N, verbose=0),
                                  want)

  def testASharedLayerWithStateIsRefusedWithTheFix(self):
    x = keras.Input((4,))
    norm = keras.layers.BatchNormalization(name='bn')
    h = keras.layers.Dense(4, name='d1')(norm(x))
    h = keras.layers.Dense(4, name='d2')(h)
    model = keras.Model(x, norm(h))
    with self.assertRaisesRegex(ValueError, r"'bn' is called in several "
                                r'pipeline stages .*non-trainable.*keep its '
                                r'calls in one partition'):
      keras_pipeline.TensorPipeModel(model, num_partitions=2,
                                     num_micro_batches=2, batch_size=4,
                                     cut_after=['d1'])


class SequenceCostTest(tf.test.TestCase):

  def testBlocksNotEmbeddingsCarryTheCostAtTheModelsLength(self):
    backbone = _Gpt2(num_layers=4)
    pipe = keras_pipeline.TensorPipeModel(
        backbone, num_partitions=2, num_micro_batches=2, batch_size=_N)
    built = pipe.graph_pipeline
    self.assertEqual(built.costs.sequence_length, _LEN)  # max_sequence_length
    self.assertIn(f'unknown dims counted as {_LEN}', built.Report())
    flops = {n.layer: f for n, f in zip(built.graph.nodes, built.costs.flops)}
    blocks = [flops[f'transformer_layer_{i}'] for i in range(4)]
    self.assertEqual(len(set(blocks)), 1)  # identical blocks, counted alike
    self.assertGreater(blocks[0], 10 * flops['token_embedding'])
    # Two blocks a side: the cut falls at the middle block, not next to the
    # embeddings.
    self.assertRegex(built.Report(),
                     r'segment 1: nodes \d+\.\.\d+ \(transformer_layer_2 ')
    # Attention is quadratic in the length: twice the length, more than
    # twice a block's FLOPs; bytes of a cut tensor count the length.
    graph = built.graph
    at = {n: keras_graph_costs.Analyse(graph, n) for n in (_LEN, 2 * _LEN)}
    index = [n.layer for n in graph.nodes].index('transformer_layer_0')
    self.assertGreater(at[2 * _LEN].flops[index], 2 * at[_LEN].flops[index])
    key = graph.nodes[index].OutputKey(0)
    self.assertEqual(at[2 * _LEN].Bytes(key, 1), 2 * at[_LEN].Bytes(key, 1))
    with self.assertRaisesRegex(ValueError, 'sequence_length=0'):
      keras_graph_costs.Analyse(graph, 0)


class NestedFunctionalTest(tf.test.TestCase):

  def _Nested(self):
    keras.utils.set_random_seed(2)
    inner_in = keras.Input((6,), dtype='float64')
    h = keras.layers.Dense(6, activation='tanh', name='in_a',
                           dtype='float64')(inner_in)
    h = keras.layers.Dense(6, activation='tanh', name='in_b',
                           dtype='float64')(h)
    inner = keras.Model(inner_in, h, name='inner')
    x = keras.Input((5,), dtype='float64', name='x')
    h = keras.layers.Dense(6, name='first', dtype='float64')(x)
    h = inner(h)
    out = keras.layers.Dense(3, name='last', dtype='float64')(h)
    return keras.Model({'x': x}, out, name='outer')  # dict input

  def testNestedModelIsInlinedSoACutFallsInsideIt(self):
    model = self._Nested()
    self.assertTrue(keras_nested.NeedsFlattening(model))
    flat = keras_nested.Flatten(model)
    self.assertEqual([l.name for l in flat.model.layers],
                     ['x', 'first', 'in_a', 'in_b', 'last'])
    for layer in flat.model.layers[1:]:  # the user's objects, not copies
      self.assertTrue(any(layer is l for l in model.layers +
                          model.get_layer('inner').layers))
    pipe = keras_pipeline.TensorPipeModel(
        model, num_partitions=2, num_micro_batches=2, batch_size=4,
        cut_after=['in_a'])
    x = {'x': np.random.default_rng(3).normal(size=(4, 5))}
    np.testing.assert_allclose(pipe.predict(x, batch_size=4, verbose=0),
                               model.predict(x, batch_size=4, verbose=0),
                               rtol=1e-9, atol=1e-12)
    self.assertLen(pipe.get_weights(), len(model.get_weights()))

  def testLayerNamesThatWouldCollideAreNamed(self):
    inner_in = keras.Input((4,))
    inner = keras.Model(inner_in, keras.layers.Dense(4, name='d')(inner_in))
    x = keras.Input((4,), name='x')
    model = keras.Model({'x': x}, inner(keras.layers.Dense(4, name='d')(x)))
    with self.assertRaisesRegex(ValueError, 'share names.*unique names'):
      keras_nested.Flatten(model)

  def testPlainFunctionalModelNeedsNoFlattening(self):
    x = keras.Input((4,))
    model = keras.Model(x, keras.layers.Dense(2)(x))
    self.assertFalse(keras_nested.NeedsFlattening(model))
    # A nested functional model in a plain one stays one node
    # (keras_graph_test.testNestedModelIsOneNodeKeptWhole).
    self.assertFalse(keras_nested.NeedsFlattening(keras.Model(
        x, keras.Model(x, keras.layers.Dense(2)(x))(x))))
    self.assertTrue(keras_nested.NeedsFlattening(_Gpt2(1)))
    self.assertFalse(keras_nested.NeedsFlattening(keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(2)])))


def _DictModel():
  """Dict inputs and dict outputs whose keys are not the layers' names."""
  def Dense(units, i, **kw):
    return keras.layers.Dense(
        units, kernel_initializer=keras.initializers.GlorotUniform(i),
        name=f'dense{i}', dtype='float64', **kw)
  title = keras.Input((3,), name='title', dtype='float64')
  body = keras.Input((4,), name='body', dtype='float64')
  h = keras.layers.Concatenate(dtype='float64')([title, body])
  h = Dense(6, 1, activation='tanh')(Dense(6, 0, activation='tanh')(h))
  return keras.Model({'title': title, 'body': body},
                     {'urgency': Dense(1, 2)(h), 'team': Dense(3, 3)(h)},
                     name='tickets')


def _DictBatch(rows, seed=2):
  """Inputs of float32 values (Keras' array adapter casts to floatx)."""
  rng = np.random.RandomState(seed)
  normal = lambda d: rng.normal(size=(rows, d)).astype('float32').astype(
      'float64')
  x = {'title': normal(3), 'body': normal(4)}
  y = {'urgency': rng.normal(size=(rows, 1)),
       'team': rng.randint(0, 3, size=rows)}
  return x, y


def _DictPipe():
  return keras_pipeline.TensorPipeModel(_DictModel(), num_partitions=2,
                                        num_micro_batches=2, batch_size=_N)


class DictInputsAndOutputsTest(tf.test.TestCase):

  def _AssertClose(self, got, want, rtol):
    self.assertCountEqual(got, want)
    for key in want:
      test_utils.AssertAllCloseScaled(self, got[key], want[key], rtol,
                                      msg=key)

  def testKeyedByNameThroughFitEvaluatePredictConfigAndExport(self):
    def Compile(m):
      m.compile(keras.optimizers.SGD(0.125), loss={
          'urgency': keras.losses.MeanSquaredError(dtype='float64'),
          'team': keras.losses.SparseCategoricalCrossentropy(
              from_logits=True, dtype='float64')},
                loss_weights={'urgency': 0.5, 'team': 1.0},
                metrics={'team': ['accuracy']})
      return m
    plain, pipe = Compile(_DictModel()), Compile(_DictPipe())
    self.assertEqual(pipe.output_names, plain.output_names)
    x, y = _DictBatch(2 * _N)
    fit = dict(batch_size=_N, epochs=1, shuffle=False, verbose=0)
    got = pipe.fit(x, y, **fit).history
    self.assertCountEqual(got, ['loss', 'urgency_loss', 'team_loss',
                                'team_accuracy'])
    # Keras logs float32 means; the weights are float64.
    self._AssertClose(got, plain.fit(x, y, **fit).history, 1e-6)
    for g, w, v in zip(pipe.get_weights(), plain.get_weights(),
                       plain.weights):
      test_utils.AssertAllCloseScaled(self, g, w, 1e-9, msg=v.path)
    x, y = _DictBatch(_N + 3, seed=4)  # a batch T does not divide
    run = dict(batch_size=_N, verbose=0)
    self._AssertClose(pipe.evaluate(x, y, return_dict=True, **run),
                      plain.evaluate(x, y, return_dict=True, **run), 1e-6)
    want = plain.predict(x, **run)
    self._AssertClose(pipe.predict(x, **run), want, 1e-9)
    again = keras_pipeline.TensorPipeModel.from_config(pipe.get_config())
    again.set_weights(pipe.get_weights())
    self._AssertClose(again.predict(x, **run), want, 1e-9)
    tmp = self.get_temp_dir()
    loaded = export_testlib.RunInCleanProcess(
        pipe.export(f'{tmp}/dict_model'), [x], tmp)
    self.assertEqual(loaded.modules, [])
    self.assertEqual(loaded.inputs, {'title': [[None, 3], 'float64'],
                                     'body': [[None, 4], 'float64']})
    self._AssertClose(loaded.outputs[0], want, 1e-9)

if __name__ == '__main__':
  tf.test.main()
