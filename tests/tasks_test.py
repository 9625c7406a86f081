"""Tests of tensorpipe.tasks: losses and metrics against NumPy."""

import numpy as np
import tensorflow as tf

from tensorpipe import base_layer
from tensorpipe import py_utils
from tensorpipe import tasks
from tensorpipe import test_utils
from tensorpipe.layers import composite
from tensorpipe.layers import linear
from tensorpipe.nested_map import NestedMap

test_utils.ConfigureTestDevices()


def _LogSoftmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


class _AuxModel(base_layer.BaseLayer):
  """Returns NestedMap(logits, aux_logits) from two FC layers."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 4, 'Input and class dimension.')
    return p

  def __init__(self, params):
    super().__init__(params)
    d = self.params.dim
    self.CreateChild('main', linear.FCLayer.Params().Set(
        input_dim=d, output_dim=d, activation='NONE'))
    self.CreateChild('aux', linear.FCLayer.Params().Set(
        input_dim=d, output_dim=d, activation='NONE'))

  def FProp(self, theta, x):
    return NestedMap(logits=self.children.main.FProp(theta.main, x),
                     aux_logits=self.children.aux.FProp(theta.aux, x))


class _LogitsModel(base_layer.BaseLayer):
  """Sequence model: logits [b, L, V] = embedding of batch.ids (one-hot FC)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab', 5, 'Vocabulary size.')
    return p

  def __init__(self, params):
    super().__init__(params)
    v = self.params.vocab
    self.CreateChild('fc', linear.FCLayer.Params().Set(
        input_dim=v, output_dim=v, activation='NONE'))

  def FProp(self, theta, batch):
    x = tf.one_hot(batch.ids, self.params.vocab)
    return self.children.fc.FProp(theta.fc, x)


def _TransformerTask(vocab=16, smoothing=0.1, pipeline=False, **kwargs):
  """A SequenceTask on a tiny T(1, 16, 2) (without dropout); kwargs: its
  dtype / fprop_dtype. pipeline: a K=2, T=2 TensorPipeLayer training 1F1B."""
  from models import transformer  # pylint: disable=g-import-not-at-top
  sizes = dict(num_layers=1, hidden_dim=16, num_heads=2, model_dim=8,
               vocab_size=vocab, max_len=6, label_smoothing=smoothing,
               dropout=0.0)
  if pipeline:
    model = transformer.TransformerPipeline(2, 2, 4, 6, 6, **sizes).Set(
        schedule='1f1b')
  else:
    model = composite.SequentialLayer.Params().Set(
        sub=transformer.TransformerLayers(**sizes))
  return tasks.SequenceTask.Params().Set(
      name='task', vocab_size=vocab, model=model, **kwargs).Instantiate()


def _NmtBatch(vocab=16, example_weight=True):
  """A [4, 6] translation batch with padded tokens (and a padded row)."""
  rng = np.random.RandomState(7)
  src_paddings = np.zeros([4, 6], np.float32)
  src_paddings[1, 4:] = 1.0
  tgt_paddings = np.zeros([4, 6], np.float32)
  tgt_paddings[0, 3:] = 1.0
  tgt_paddings[2, 5:] = 1.0
  batch = NestedMap(
      src_ids=tf.constant(rng.randint(1, vocab, [4, 6]), tf.int32),
      src_paddings=tf.constant(src_paddings),
      tgt_ids=tf.constant(rng.randint(1, vocab, [4, 6]), tf.int32),
      tgt_labels=tf.constant(rng.randint(1, vocab, [4, 6]), tf.int32),
      tgt_paddings=tf.constant(tgt_paddings))
  if example_weight:
    batch.example_weight = tf.constant([1.0, 1.0, 1.0, 0.0])
  return batch


def _DecoderOutputAndSoftmax(task, batch):
  """(tgt_vecs below the softmax, the SequenceSoftmaxLayer and its theta):
  the Transformer's other layers run as they are."""
  layers = task.children.model.LayersWithTheta()
  args = (NestedMap({k: v for k, v in batch.items()
                     if k != 'example_weight'}),)
  for layer, theta in layers[:-1]:
    args = composite.AsArgs(layer.FProp(theta, *args))
  return composite.FromArgs(args).tgt_vecs, layers[-1]


def _TokenWeights(batch, dtype):
  """[b, L] weights of the real tokens of the real rows."""
  w = 1.0 - tf.cast(batch.tgt_paddings, dtype)
  if 'example_weight' in batch:
    w *= tf.cast(batch.example_weight, dtype)[:, tf.newaxis]
  return w


class TasksTest(tf.test.TestCase):

  def testClassificationLossSmoothingAuxAndTopK(self):
    p = tasks.ClassificationTask.Params().Set(
        name='task', num_classes=4, label_smoothing=0.2, aux_loss_weight=0.5,
        model=_AuxModel.Params())
    task = p.Instantiate()
    rng = np.random.RandomState(0)
    x = rng.randn(6, 4).astype(np.float32)
    labels = np.array([0, 1, 2, 3, 0, 1], np.int32)
    out = task.FPropDefaultTheta(NestedMap(image=tf.constant(x),
                                           label=tf.constant(labels)))
    m = task.children.model
    logits = x @ m.children.main.vars.w.numpy() + m.children.main.vars.b.numpy()
    aux = x @ m.children.aux.vars.w.numpy() + m.children.aux.vars.b.numpy()
    target = np.eye(4)[labels] * 0.8 + 0.05

    def Xent(lg):
      return float(np.mean(-(target * _LogSoftmax(lg)).sum(-1)))
    self.assertAllClose(float(out.loss), Xent(logits) + 0.5 * Xent(aux),
                        rtol=1e-5)
    self.assertAllClose(float(out.metrics.loss[0]), Xent(logits), rtol=1e-5)
    top1 = np.mean(logits.argmax(-1) == labels)
    self.assertAllClose(float(out.metrics.accuracy[0]), top1)
    self.assertAllClose(float(out.metrics.acc5[0]), 1.0)  # 4 classes <= 5
    self.assertEqual(float(out.metrics.accuracy[1]), 6.0)

  def testL2RegularisationCoversKernelsOnly(self):
    p = tasks.ClassificationTask.Params().Set(
        name='task', num_classes=4, model=_AuxModel.Params())
    p.train.l2_regularizer_weight = 0.1
    task = p.Instantiate()
    kernels = [v.numpy() for v in task.trainable_variables if v.shape.rank >= 2]
    want = 0.1 * sum(float((k ** 2).sum()) / 2 for k in kernels)
    self.assertAllClose(float(task.RegularizationLoss()), want, rtol=1e-5)
    batch = NestedMap(image=tf.ones([2, 4]), label=tf.constant([0, 1]))
    out = task.ComputeLoss(batch)
    plain = task.FPropDefaultTheta(batch)
    self.assertAllClose(float(out.loss), float(plain.loss) + want, rtol=1e-5)

  def testFloat64TaskComputesLossWeightsAndRegulariserInFloat64(self):
    # Logits near 1e3 apart by ~1e-6: float32 rounding would show at 1e-8.
    p = tasks.ClassificationTask.Params().Set(
        name='task', num_classes=4, label_smoothing=0.2, aux_loss_weight=0.5,
        model=_AuxModel.Params(), dtype=tf.float64)
    p.train.l2_regularizer_weight = 0.1
    task = p.Instantiate()
    rng = np.random.RandomState(0)
    x = 300.0 + rng.randn(6, 4) * 1e-3
    labels = np.array([0, 1, 2, 3, 0, 1], np.int32)
    weights = np.array([1, 1, 1, 1, 1, 0], np.float32)  # a padded last row
    out = task.FPropDefaultTheta(NestedMap(
        image=tf.constant(x), label=tf.constant(labels),
        example_weight=tf.constant(weights)))
    m = task.children.model
    logits = x @ m.children.main.vars.w.numpy() + m.children.main.vars.b.numpy()
    aux = x @ m.children.aux.vars.w.numpy() + m.children.aux.vars.b.numpy()
    target = np.eye(4)[labels] * 0.8 + 0.05

    def Xent(lg):
      return float(np.sum(-(target * _LogSoftmax(lg)).sum(-1) * weights) / 5)
    tol = test_utils.DEFAULT_RTOL[tf.float64]
    self.assertEqual(out.loss.dtype, tf.float64)
    self.assertEqual(out.logits.dtype, tf.float64)
    self.assertAllClose(out.loss, Xent(logits) + 0.5 * Xent(aux), rtol=tol,
                        atol=0)
    self.assertEqual(float(out.metrics.loss[1]), 5.0)
    reg = task.RegularizationLoss()
    self.assertEqual(reg.dtype, tf.float64)
    kernels = [v.numpy() for v in task.trainable_variables if v.shape.rank >= 2]
    self.assertAllClose(reg, 0.1 * sum((k ** 2).sum() / 2 for k in kernels),
                        rtol=tol, atol=0)
    # A float32 task keeps float32 throughout.
    p32 = p.Copy().Set(dtype=tf.float32)
    out32 = p32.Instantiate().FPropDefaultTheta(NestedMap(
        image=tf.constant(x, tf.float32), label=tf.constant(labels)))
    self.assertEqual(out32.loss.dtype, tf.float32)

  def testSequenceTaskMasksPaddingAndReportsPerplexity(self):
    p = tasks.SequenceTask.Params().Set(name='task', vocab_size=5,
                                        model=_LogitsModel.Params())
    task = p.Instantiate()
    ids = np.array([[1, 2, 3], [4, 0, 0]], np.int32)
    labels = np.array([[2, 3, 4], [1, 0, 0]], np.int32)
    paddings = np.array([[0, 0, 0], [0, 1, 1]], np.float32)
    out = task.FPropDefaultTheta(NestedMap(
        ids=tf.constant(ids), labels=tf.constant(labels),
        paddings=tf.constant(paddings)))
    fc = task.children.model.children.fc
    logits = np.eye(5)[ids] @ fc.vars.w.numpy() + fc.vars.b.numpy()
    nll = -np.take_along_axis(_LogSoftmax(logits), labels[..., None], -1)[..., 0]
    w = 1 - paddings
    want = float((nll * w).sum() / w.sum())
    self.assertAllClose(float(out.loss), want, rtol=1e-5)
    self.assertAllClose(float(out.metrics.log_pplx[0]), want, rtol=1e-5)
    self.assertEqual(float(out.metrics.num_tokens[0]), 4.0)
    acc = float(((logits.argmax(-1) == labels) * w).sum() / w.sum())
    self.assertAllClose(float(out.metrics.token_accuracy[0]), acc)
    post = task.PostProcessEvalMetrics({'log_pplx': want})
    self.assertAllClose(post['perplexity'], np.exp(want), rtol=1e-6)

  def testFloat64TransformerLossAndGradientsMatchFloat64Oracle(self):
    # Oracle: the layers below the softmax run as they are, then logits,
    # label-smoothed cross-entropy, token weights and their mean written out
    # in plain float64 TF. float32 anywhere in the task's loss (logits,
    # weights, sums, normaliser) would be off by ~1e-7 relative.
    s, rtol = 0.1, 1e-10
    for pipeline in (False, True):
      with self.subTest(pipeline=pipeline):
        task = _TransformerTask(smoothing=s, pipeline=pipeline,
                                dtype=tf.float64)
        # 1F1B trains on full batches (no example weights).
        batch = _NmtBatch(example_weight=not pipeline)
        with py_utils.TrainingMode(True), tf.GradientTape(
            persistent=True) as tape:
          out = task.FPropDefaultTheta(batch)
          x, (_, softmax) = _DecoderOutputAndSoftmax(task, batch)
          logits = tf.einsum('bld,dv->blv', x, softmax.logits.w) + (
              softmax.logits.b)
          targets = tf.one_hot(batch.tgt_labels, 16, dtype=tf.float64) * (
              1.0 - s) + s / 16
          xent = -tf.reduce_sum(targets * tf.nn.log_softmax(logits), -1)
          w = _TokenWeights(batch, tf.float64)
          want = tf.reduce_sum(xent * w) / tf.reduce_sum(w)
        self.assertEqual(out.loss.dtype, tf.float64)
        for name, (value, weight) in out.metrics.items():
          self.assertEqual((value.dtype, weight.dtype),
                           (tf.float64, tf.float64), msg=name)
        test_utils.AssertAllCloseScaled(self, out.loss, want, rtol)
        self.assertEqual(float(out.metrics.num_tokens[0]),
                         float(tf.reduce_sum(w)))
        nll = -tf.reduce_sum(tf.one_hot(batch.tgt_labels, 16,
                                        dtype=tf.float64) *
                             tf.nn.log_softmax(logits), -1)
        test_utils.AssertAllCloseScaled(
            self, out.metrics.log_pplx[0],
            tf.reduce_sum(nll * w) / tf.reduce_sum(w), rtol)
        variables = task.trainable_variables
        got = tape.gradient(out.loss, variables)
        expected = tape.gradient(want, variables)
        scale = max(test_utils.MaxAbs(g) for g in expected)
        for v, g, e in zip(variables, got, expected):
          test_utils.AssertAllCloseScaled(self, g, e, rtol, msg=v.name,
                                          scale=scale)
        if not pipeline:
          logits_got = task.Logits(batch)
          self.assertEqual(logits_got.dtype, tf.float64)
          test_utils.AssertAllCloseScaled(self, logits_got, logits, rtol)

  def testFloat64SequenceTaskOnLogitsMatchesNumpy(self):
    # A model returning logits (the task computes the loss): float64 logits,
    # token weights and sums; float32 would be off by ~1e-7 relative.
    p = tasks.SequenceTask.Params().Set(
        name='task', vocab_size=5, label_smoothing=0.2,
        model=_LogitsModel.Params(), dtype=tf.float64)
    task = p.Instantiate()
    fc = task.children.model.children.fc
    rng = np.random.RandomState(3)
    # Weights not representable in float32 (the initialiser's are).
    fc.vars.w.assign(rng.normal(size=[5, 5]))
    fc.vars.b.assign(rng.normal(size=[5]))
    ids = np.array([[1, 2, 3], [4, 0, 0], [2, 2, 1]], np.int32)
    labels = np.array([[2, 3, 4], [1, 0, 0], [0, 1, 2]], np.int32)
    paddings = np.array([[0, 0, 0], [0, 1, 1], [0, 0, 0]], np.float32)
    example_weight = np.array([1, 1, 0], np.float32)
    out = task.FPropDefaultTheta(NestedMap(
        ids=tf.constant(ids), labels=tf.constant(labels),
        paddings=tf.constant(paddings),
        example_weight=tf.constant(example_weight)))
    logits = np.eye(5)[ids] @ fc.vars.w.numpy() + fc.vars.b.numpy()
    targets = np.eye(5)[labels] * 0.8 + 0.2 / 5
    xent = -(targets * _LogSoftmax(logits)).sum(-1)
    w = (1.0 - paddings.astype(np.float64)) * example_weight[:, None]
    self.assertEqual(out.loss.dtype, tf.float64)
    for name, (value, weight) in out.metrics.items():
      self.assertEqual((value.dtype, weight.dtype), (tf.float64, tf.float64),
                       msg=name)
    self.assertAllClose(out.loss, (xent * w).sum() / w.sum(), rtol=1e-10,
                        atol=0)
    self.assertEqual(float(out.metrics.num_tokens[0]), 4.0)
    nll = -np.take_along_axis(_LogSoftmax(logits), labels[..., None],
                              -1)[..., 0]
    self.assertAllClose(out.metrics.log_pplx[0], (nll * w).sum() / w.sum(),
                        rtol=1e-10, atol=0)

  def testFloat32SequenceLossAndGradientsEqualExplicitFloat32Ops(self):
    # Bit for bit the float32 ops the sequence loss has always run
    # (written out here, the task's softmax layer's Logits excepted): a
    # float32 model is unchanged by the float64 path; bfloat16 activations
    # keep float32 sums.
    s = 0.1
    task = _TransformerTask(smoothing=s)
    batch = _NmtBatch()
    with py_utils.TrainingMode(True), tf.GradientTape(
        persistent=True) as tape:
      out = task.FPropDefaultTheta(batch)
      x, (softmax, theta) = _DecoderOutputAndSoftmax(task, batch)
      logits = softmax.Logits(theta, NestedMap(tgt_vecs=x))
      depth = tf.cast(tf.shape(logits)[-1], tf.float32)
      targets = tf.one_hot(batch.tgt_labels, 16, dtype=tf.float32) * (
          1.0 - s) + s / depth
      xent = tf.nn.softmax_cross_entropy_with_logits(labels=targets,
                                                     logits=logits)
      weights = 1.0 - batch.tgt_paddings
      per_example = tf.reduce_sum(xent * weights, axis=1)
      tokens = tf.reduce_sum(tf.reduce_sum(weights, axis=1) *
                             batch.example_weight)
      want = tf.reduce_sum(per_example * batch.example_weight) / tf.maximum(
          tokens, 1.0)
    self.assertEqual(out.loss.dtype, tf.float32)
    self.assertEqual(float(out.loss), float(want))
    self.assertAllEqual(out.metrics.num_tokens[0], tokens)
    variables = task.trainable_variables
    for v, g, e in zip(variables, tape.gradient(out.loss, variables),
                       tape.gradient(want, variables)):
      self.assertAllEqual(g, e, msg=v.name)
    # A model returning logits: the task's own float32 loss.
    lm = tasks.SequenceTask.Params().Set(
        name='task', vocab_size=5, label_smoothing=s,
        model=_LogitsModel.Params()).Instantiate()
    ids = tf.constant([[1, 2, 3], [4, 0, 0], [2, 2, 1]])
    paddings = tf.constant([[0.0, 0, 0], [0, 1, 1], [0, 0, 0]])
    labels = tf.constant([[2, 3, 4], [1, 0, 0], [0, 1, 2]])
    example_weight = tf.constant([1.0, 1.0, 0.0])
    with tf.GradientTape(persistent=True) as tape:
      out = lm.FPropDefaultTheta(NestedMap(
          ids=ids, labels=labels, paddings=paddings,
          example_weight=example_weight))
      logits = lm.children.model.FPropDefaultTheta(NestedMap(ids=ids))
      targets = tf.one_hot(labels, 5, dtype=tf.float32) * (1.0 - s) + s / (
          tf.cast(tf.shape(logits)[-1], tf.float32))
      weights = (1.0 - paddings) * example_weight[:, tf.newaxis]
      want = tf.reduce_sum(tf.nn.softmax_cross_entropy_with_logits(
          labels=targets, logits=logits) * weights) / tf.maximum(
              tf.reduce_sum(weights), 1.0)
    self.assertEqual(out.loss.dtype, tf.float32)
    self.assertEqual(float(out.loss), float(want))
    for v, g, e in zip(lm.trainable_variables,
                       tape.gradient(out.loss, lm.trainable_variables),
                       tape.gradient(want, lm.trainable_variables)):
      self.assertAllEqual(g, e, msg=v.name)
    bf16 = _TransformerTask(smoothing=s, fprop_dtype=tf.bfloat16)
    out = bf16.FPropDefaultTheta(batch)
    for name, (value, weight) in out.metrics.items():
      self.assertEqual((value.dtype, weight.dtype), (tf.float32, tf.float32),
                       msg=name)
    self.assertEqual(bf16.Logits(batch).dtype, tf.float32)

  def testSequenceTaskAcceptsPerExampleLossModels(self):
    class _SumsModel(base_layer.BaseLayer):

      def FProp(self, theta, batch):
        del theta
        return NestedMap(per_example_loss=tf.constant([3.0, 1.0]),
                         per_example_tokens=tf.constant([2.0, 2.0]),
                         per_example_correct=tf.constant([1.0, 2.0]))
    task = tasks.SequenceTask.Params().Set(
        name='task', vocab_size=5, model=_SumsModel.Params()).Instantiate()
    out = task.FPropDefaultTheta(NestedMap(ids=tf.zeros([2, 2], tf.int32)))
    self.assertAllClose(float(out.loss), 1.0)
    self.assertAllClose(float(out.metrics.token_accuracy[0]), 0.75)
    # Without per_example_log_pplx the loss is unsmoothed: log_pplx = loss.
    self.assertAllClose(float(out.metrics.log_pplx[0]), 1.0)

    class _SmoothedModel(_SumsModel):

      def FProp(self, theta, batch):
        out = super().FProp(theta, batch)
        out.per_example_log_pplx = tf.constant([2.0, 0.4])
        return out
    task = tasks.SequenceTask.Params().Set(
        name='task', vocab_size=5,
        model=_SmoothedModel.Params()).Instantiate()
    out = task.FPropDefaultTheta(NestedMap(ids=tf.zeros([2, 2], tf.int32)))
    self.assertAllClose(float(out.loss), 1.0)        # the smoothed loss
    self.assertAllClose(float(out.metrics.log_pplx[0]), 0.6)  # 2.4 / 4

  def testTransformerLogitsAndGreedyDecode(self):
    from models import transformer  # pylint: disable=g-import-not-at-top
    from tensorpipe import synthetic_input  # pylint: disable=g-import-not-at-top
    model = transformer.TransformerPipeline(
        2, 2, 4, 6, 6, num_layers=1, hidden_dim=16, num_heads=2, model_dim=8,
        vocab_size=16, max_len=6, label_smoothing=0.0, dropout=0.0)
    task = tasks.SequenceTask.Params().Set(
        name='task', vocab_size=16, model=model).Instantiate()
    inp = synthetic_input.SyntheticSequenceInput.Params().Set(
        task='nmt', batch_size=4, max_length=6, split='test').Instantiate()
    batch = next(iter(inp.Dataset()))
    # The unpipelined logits give the pipeline's loss.
    out = task.FPropDefaultTheta(batch)
    logits = task.Logits(batch).numpy()
    labels = batch.tgt_labels.numpy()
    w = 1 - batch.tgt_paddings.numpy()
    nll = -np.take_along_axis(_LogSoftmax(logits), labels[..., None], -1)[..., 0]
    self.assertAllClose(float(out.loss), (nll * w).sum() / w.sum(), rtol=1e-5)
    # Greedy decoding: each token is the argmax given the decoded prefix.
    hyp = task.GreedyDecode(batch).numpy()
    for i in range(6):
      ids = np.zeros_like(hyp)
      ids[:, 0] = batch.tgt_ids.numpy()[:, 0]
      ids[:, 1:i + 1] = hyp[:, :i]
      step = NestedMap(batch)
      step.tgt_ids = tf.constant(ids)
      step.tgt_paddings = tf.zeros_like(batch.tgt_paddings)
      want = task.Logits(step).numpy()[:, i].argmax(-1)
      self.assertAllEqual(hyp[:, i], want, msg=f'position {i}')

  def testLogitsSameForPipelinedAndSequentialModels(self):
    """Logits chain the model's layers (LayersWithTheta) whatever holds
    them; the softmax layer gives its Logits instead of its loss."""
    from models import transformer  # pylint: disable=g-import-not-at-top
    from tensorpipe import synthetic_input  # pylint: disable=g-import-not-at-top
    layers = transformer.TransformerLayers(
        num_layers=1, hidden_dim=16, num_heads=2, model_dim=8, vocab_size=16,
        max_len=6, label_smoothing=0.0, dropout=0.0)
    models = {
        'pipeline': transformer.TransformerPipeline(
            2, 2, 4, 6, 6, num_layers=1, hidden_dim=16, num_heads=2,
            model_dim=8, vocab_size=16, max_len=6, label_smoothing=0.0,
            dropout=0.0),
        'sequential': composite.SequentialLayer.Params().Set(sub=layers)}
    batch = next(iter(synthetic_input.SyntheticSequenceInput.Params().Set(
        task='nmt', batch_size=4, max_length=6, split='test'
    ).Instantiate().Dataset()))
    logits = {}
    for name, model in models.items():
      task = tasks.SequenceTask.Params().Set(
          name='task', vocab_size=16, model=model).Instantiate()
      logits[name] = task.Logits(batch).numpy()
      self.assertEqual(logits[name].shape, (4, 6, 16))
      # The same loss as the model's own (in-pipeline) softmax layer.
      labels = batch.tgt_labels.numpy()
      w = 1 - batch.tgt_paddings.numpy()
      nll = -np.take_along_axis(_LogSoftmax(logits[name]), labels[..., None],
                                -1)[..., 0]
      self.assertAllClose(float(task.FPropDefaultTheta(batch).loss),
                          (nll * w).sum() / w.sum(), rtol=1e-5)
    # Layers are named (and seeded) by their own names: same weights.
    self.assertAllClose(logits['pipeline'], logits['sequential'], rtol=1e-6,
                        atol=1e-6)

  def testBfloat16ActivationsKeepFloat32LossAndWeights(self):
    p = tasks.ClassificationTask.Params().Set(
        name='task', num_classes=4, model=_AuxModel.Params(),
        fprop_dtype=tf.bfloat16)
    task = p.Instantiate()
    self.assertTrue(all(v.dtype == tf.float32 for v in task.variables))
    batch = NestedMap(image=tf.ones([2, 4]), label=tf.constant([0, 1]))
    with tf.GradientTape() as tape:
      out = task.ComputeLoss(batch)
    self.assertEqual(out.loss.dtype, tf.float32)
    ref = tasks.ClassificationTask.Params().Set(
        name='task', num_classes=4, model=_AuxModel.Params()).Instantiate()
    # Same weights (same seeds), bfloat16 rounding only.
    self.assertAllClose(float(out.loss),
                        float(ref.FPropDefaultTheta(batch).loss), rtol=2e-2)
    grads = tape.gradient(out.loss, task.trainable_variables)
    self.assertTrue(all(g.dtype == tf.float32 for g in grads))

  def testAggregateMetricsIsWeighted(self):
    agg = tasks.BaseTask.AggregateMetrics([{'acc': (1.0, 1.0)},
                                           {'acc': (0.0, 3.0)}])
    self.assertAllClose(agg['acc'], 0.25)

  def testBadParamsRaise(self):
    with self.assertRaisesRegex(ValueError, 'p.model is None'):
      tasks.ClassificationTask.Params().Set(name='t', num_classes=3
                                            ).Instantiate()
    with self.assertRaisesRegex(ValueError, 'num_classes=1'):
      tasks.ClassificationTask.Params().Set(
          name='t', num_classes=1,
          model=composite.IdentityLayer.Params()).Instantiate()
    with self.assertRaisesRegex(ValueError, 'label_smoothing=1.0'):
      tasks.ClassificationTask.Params().Set(
          name='t', num_classes=3, label_smoothing=1.0,
          model=composite.IdentityLayer.Params()).Instantiate()


if __name__ == '__main__':
  tf.test.main()
