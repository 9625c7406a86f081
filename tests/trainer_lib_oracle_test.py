"""trainer_lib against oracles: an unpipelined model, clipping, metrics.

The pipeline's own K=1 is still a TensorPipeLayer with T micro-batches, so a
"K=1 equals K=2" comparison can hide a bug shared by both. Here the same
layers also train without any TensorPipeLayer (`_MicroBatchedSequential`,
written with plain slicing), and the trainer's clipping and eval metrics are
checked against tf.clip_by_global_norm on oracle gradients and NumPy.
"""

import os

import numpy as np
import tensorflow as tf

from tensorpipe import base_experiment
from tensorpipe import decode_metrics
from tensorpipe import lr_schedules
from tensorpipe import optimizers
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import synthetic_input
from tensorpipe import tasks
from tensorpipe import test_utils
from tensorpipe import trainer_lib
from tensorpipe.layers import composite
from tensorpipe.layers import conv
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.layers import pooling

# No trainer_lib.EnableDeterminism here: it is process-wide, and op
# determinism makes tf.timestamp (timeline tests in the same pytest process)
# fail. The comparisons below allow for float32 reordering anyway.
test_utils.ConfigureTestDevices()

_BATCH = 8
_CLASSES = 8


class _MicroBatchedSequential(composite.SequentialLayer):
  """The unpipelined model: `sub` applied to one micro-batch at a time.

  GPipe's semantics without a TensorPipeLayer: batch norm normalises with
  each micro-batch's statistics and updates its moving averages once, from
  those of the whole mini-batch; dropout masks are per example. The slicing
  is plain indexing (no tensorpipe.microbatch), the batch on axis 0.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('num_micro_batches', 1, 'T, micro-batches per mini-batch.')
    return p

  def FProp(self, theta, x):
    num_mb = self.params.num_micro_batches
    size = int(x.shape[0]) // num_mb
    outs = []
    with py_utils.CollectBatchStats() as collected:
      for t in range(num_mb):
        with py_utils.ExampleOffset(t * size):
          outs.append(super().FProp(theta, x[t * size:(t + 1) * size]))
    merged = {}  # id(layer) -> (layer, stats of all micro-batches)
    for layer, stats in collected:
      key = id(layer)
      merged[key] = (layer, merged[key][1].Merge(stats) if key in merged
                     else stats)
    for layer, stats in merged.values():
      py_utils.AddBatchStats(layer, stats)
    return tf.concat(outs, 0)


def _Layers(keep_prob=0.8):
  return [
      conv.Conv2DLayer.Params().Set(name='conv1', filter_shape=(3, 3, 1, 4),
                                    batch_norm=True),
      dropout.DropoutLayer.Params().Set(name='drop', keep_prob=keep_prob),
      conv.Conv2DLayer.Params().Set(name='conv2', filter_shape=(3, 3, 4, 4),
                                    filter_stride=(2, 2), batch_norm=True),
      pooling.GlobalPoolingLayer.Params().Set(name='gap'),
      linear.FCLayer.Params().Set(name='logits', input_dim=4,
                                  output_dim=_CLASSES, activation='NONE')]


def _Model(kind, keep_prob, num_micro_batches=2):
  """'plain' (no TensorPipeLayer) or 'K<k>' (a pipeline of k partitions)."""
  if kind == 'plain':
    return _MicroBatchedSequential.Params().Set(
        name='Sequential', sub=_Layers(keep_prob),
        num_micro_batches=num_micro_batches)
  return pipeline.TensorPipeLayer.Params().Set(
      name='TensorPipe', layers=_Layers(keep_prob),
      num_partitions=int(kind[1:]),
      num_micro_batches=num_micro_batches, input_shapes=[[_BATCH, 8, 8, 1]])


class _Exp(base_experiment.BaseExperiment):
  """Conv-BN, dropout, FC on 8x8 synthetic images; the model is a knob."""

  MODEL = 'K2'
  KEEP_PROB = 0.8
  OPTIMIZER = None
  LR_SCHEDULE = None
  CLIP = 5.0
  L2 = 1e-3

  def Train(self):
    return synthetic_input.SyntheticImageInput.Params().Set(
        name='train', batch_size=_BATCH, num_examples=64, shuffle_buffer=32,
        num_classes=_CLASSES)

  def Test(self):
    return self.Train().Set(name='test', split='test', num_examples=16)

  def Task(self):
    p = tasks.ClassificationTask.Params().Set(
        name='task', model=_Model(self.MODEL, self.KEEP_PROB),
        num_classes=_CLASSES)
    tp = p.train
    tp.optimizer = self.OPTIMIZER or optimizers.RMSProp.Params()
    tp.lr_schedule = (self.LR_SCHEDULE or
                      lr_schedules.WarmupRsqrtDecay.Params().Set(
                          peak=0.05, warmup_steps=2))
    tp.l2_regularizer_weight = self.L2
    tp.grad_norm_clip = self.CLIP
    tp.max_steps = 6
    return p


def _Trainer(logdir, **knobs):
  """A Trainer of _Exp with the given knobs, its weights freshly initialised."""
  exp = type('Exp', (_Exp,), {k.upper(): v for k, v in knobs.items()})()
  trainer = trainer_lib.Trainer(exp.ModelParams(), logdir,
                                log_fn=lambda _: None)
  trainer.RestoreLatest()  # none there: builds the optimizer's slots
  return trainer


def _ModelVariables(trainer):
  """The model's variables (weights and moving averages) by layer path."""
  return {name: v.numpy() for name, v in test_utils.VariablesByName(
      trainer.task.children.model).items()}


class TrainerMatchesUnpipelinedModelTest(tf.test.TestCase):

  def testStepsEqualThoseOfTheModelWithoutPipeline(self):
    # Four steps of RMSProp with warm-up, L2 and dropout, K=2 and the same
    # layers without a TensorPipeLayer: every loss and, after the steps,
    # every weight and moving average. (K=1 equals K=2: trainer_lib_test.)
    batches = None
    losses, weights = {}, {}
    for model in ('plain', 'K2'):
      trainer = _Trainer(os.path.join(self.get_temp_dir(), model),
                         model=model)
      if batches is None:
        batches = list(trainer.TrainInput().Dataset().take(4))
      losses[model] = np.array([float(trainer.TrainStep(b)['loss'])
                                for b in batches])
      weights[model] = _ModelVariables(trainer)
    self.assertTrue(any('moving' in name for name in weights['plain']))
    # The pipeline's micro-batch gradients may add up in another order than
    # the tape's sum over the oracle's slices: float32 rounding (eps 6e-8
    # relative per operation) grown over four steps stays far below these.
    self.assertAllClose(losses['K2'], losses['plain'], rtol=1e-5, atol=0)
    self.assertEqual(sorted(weights['K2']), sorted(weights['plain']))
    for name, want in weights['plain'].items():
      test_utils.AssertAllCloseScaled(self, weights['K2'][name], want, 1e-4,
                                      msg=name)


class GradientClippingTest(tf.test.TestCase):

  def _OracleGrads(self, trainer, batch):
    """Loss gradients of the model's weights, from the layers unpipelined."""
    # Dropout seeds its masks by layer path: the layers sit under 'model'
    # as in the task.
    ref = composite.SequentialLayer.Params().Set(name='oracle', sub=[
        composite.SequentialLayer.Params().Set(name='model', sub=_Layers())
    ]).Instantiate()
    ref_vars = test_utils.VariablesByName(ref.children.sub[0])
    model_vars = test_utils.VariablesByName(trainer.task.children.model)
    self.assertEqual(sorted(ref_vars), sorted(model_vars))
    for name, var in ref_vars.items():
      var.assign(model_vars[name])
    labels = batch['label']

    def Loss(logits):
      return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=labels, logits=logits))
    # The trainer's first step: training mode, step seed 0.
    with py_utils.TrainingMode(True), py_utils.StepSeed(0):
      _, _, grads = test_utils.MicroBatchOracle(ref, 2, Loss, batch['image'])
    names = {v.ref(): n for n, v in ref_vars.items()}
    return {names[v.ref()]: g.numpy()
            for v, g in zip(ref.trainable_variables, grads)}

  def _Step(self, trainer, batch):
    """One TrainStep: (its grad_norm, the change of every model variable)."""
    before = _ModelVariables(trainer)
    out = trainer.TrainStep(batch)
    after = _ModelVariables(trainer)
    return float(out['grad_norm']), {n: after[n] - before[n] for n in after}

  def _AssertStep(self, delta, grads, lr, clip):
    """delta == -lr * tf.clip_by_global_norm(grads, clip) (clip None: none)."""
    names = sorted(grads)
    clipped = [tf.constant(grads[n]) for n in names]
    if clip is not None:
      clipped, _ = tf.clip_by_global_norm(clipped, clip)
    scale = lr * test_utils.MaxAbs(clipped)
    for name, g in zip(names, clipped):
      test_utils.AssertAllCloseScaled(self, delta[name], -lr * g.numpy(),
                                      1e-4, msg=name, scale=scale)

  def testClippedStepEqualsClipByGlobalNormOfTheOracleGradients(self):
    lr = 0.1
    knobs = dict(l2=0.0, model='K2',
                 optimizer=optimizers.SGD.Params().Set(momentum=0.0),
                 lr_schedule=lr_schedules.Constant.Params().Set(value=lr))
    # Without clipping: the step is -lr * the oracle's gradients.
    trainer = _Trainer(os.path.join(self.get_temp_dir(), 'none'), clip=None,
                       **knobs)
    batch = next(iter(trainer.TrainInput().Dataset()))
    grads = self._OracleGrads(trainer, batch)
    norm = float(tf.linalg.global_norm(list(grads.values())))
    self.assertGreater(norm, 0.0)
    grad_norm, delta = self._Step(trainer, batch)
    self.assertAllClose(grad_norm, norm, rtol=1e-5)
    self._AssertStep(delta, grads, lr, clip=None)
    # Clipped to a quarter of the norm: every gradient scaled by 1/4.
    clip = 0.25 * norm
    trainer = _Trainer(os.path.join(self.get_temp_dir(), 'clip'), clip=clip,
                       **knobs)
    grad_norm, delta = self._Step(trainer, batch)
    self.assertAllClose(grad_norm, norm, rtol=1e-5)  # reported unclipped
    self._AssertStep(delta, grads, lr, clip=clip)


class TrainingProgressTest(tf.test.TestCase):

  def testSgdStepLowersTheLossByLrTimesTheSquaredGradNorm(self):
    # First order: L(w - lr g) = L(w) - lr |g|^2 + O(lr^2). Without dropout
    # both steps see the same function of the weights.
    lr = 0.01
    trainer = _Trainer(
        self.get_temp_dir(), model='K2', keep_prob=1.0, clip=None, l2=0.0,
        optimizer=optimizers.SGD.Params().Set(momentum=0.0),
        lr_schedule=lr_schedules.Constant.Params().Set(value=lr))
    batch = next(iter(trainer.TrainInput().Dataset()))
    first = trainer.TrainStep(batch)
    second = trainer.TrainStep(batch)
    drop = float(first['loss']) - float(second['loss'])
    want = lr * float(first['grad_norm'])**2
    self.assertAllClose(drop, want, rtol=0.1)


class BleuTest(tf.test.TestCase):

  def testCorpusBleuEqualsHandComputedValues(self):
    # BLEU = BP * (p1 p2 p3 p4)^(1/4), p_n = matched n-grams / hypothesis
    # n-grams summed over the corpus, BP = exp(1 - ref_len / hyp_len) for
    # hypotheses shorter than the references.
    cases = [
        (['a b c d e f'], ['a b c d e f'], 1.0),
        (['a b c d e f'], ['a b c d e g'],
         (5 / 6 * 4 / 5 * 3 / 4 * 2 / 3)**0.25),
        (['a b c d e'], ['a b c d e f g h'], np.exp(1 - 8 / 5)),
        # Counts pooled over sentences, not a mean of sentence scores.
        (['a b c d e f', 'a b c d e f'], ['a b c d e f', 'a b c d e g'],
         (11 / 12 * 9 / 10 * 7 / 8 * 5 / 6)**0.25),
    ]
    for hyps, refs, want in cases:
      self.assertAllClose(decode_metrics.ComputeBleu(hyps, refs), 100 * want,
                          rtol=1e-9, msg=(hyps, refs))


class EvalMetricsTest(tf.test.TestCase):

  def testAccuracyTop5AndLossEqualNumpyOnTheSameLogits(self):
    trainer = _Trainer(self.get_temp_dir(), model='K2')
    metrics = trainer.Evaluate(restore=False)
    logits, labels = [], []
    for batch in trainer.EvalInput().Dataset():
      with py_utils.EvalMode():
        logits.append(trainer.task.FPropDefaultTheta(batch).logits.numpy())
      labels.append(batch['label'].numpy())
    logits = np.concatenate(logits).astype(np.float64)
    labels = np.concatenate(labels)
    self.assertEqual(logits.shape, (16, _CLASSES))
    # Rank of the label's logit among the classes (0 = the largest).
    label_logit = logits[np.arange(len(labels)), labels]
    rank = (logits > label_logit[:, None]).sum(1)
    self.assertEqual(metrics['accuracy'], np.mean(rank < 1))
    self.assertEqual(metrics['acc5'], np.mean(rank < 5))
    self.assertNotEqual(np.mean(rank < 1), np.mean(rank < 5))
    log_z = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1))
    xent = log_z + logits.max(1) - label_logit
    self.assertAllClose(metrics['loss'], xent.mean(), rtol=1e-5)


if __name__ == '__main__':
  tf.test.main()
