"""Evaluation covers every example: the last partial batch is padded, masked.

Each test evaluates a split whose size is not a multiple of the batch size
with Trainer.Evaluate and compares with the same metric computed unpadded, on
all the split's examples at once (one batch of the split's size, run through
the model's layers unpipelined).
"""

import numpy as np
import tensorflow as tf

from tensorpipe import base_experiment
from tensorpipe import base_input
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
from tensorpipe.layers import linear
from tensorpipe.layers import losses
from tensorpipe.layers import pooling

test_utils.ConfigureTestDevices()

RTOL = test_utils.DEFAULT_RTOL[tf.float32]


def _Recipe(p):
  p.train.optimizer = optimizers.Adam.Params()
  p.train.lr_schedule = lr_schedules.Constant.Params().Set(value=1e-3)
  return p


class _Images(base_experiment.BaseExperiment):
  """13 test images in batches of 8 (K=2, T=2): the second batch has 5."""

  NUM_EXAMPLES = 13

  def Train(self):
    return synthetic_input.SyntheticImageInput.Params().Set(
        name='train', batch_size=8, num_examples=64)

  def Test(self):
    return self.Train().Set(name='test', split='test',
                            num_examples=self.NUM_EXAMPLES)

  def Task(self):
    layers = [
        conv.Conv2DLayer.Params().Set(name='conv1', filter_shape=(3, 3, 1, 4),
                                      batch_norm=True),
        pooling.GlobalPoolingLayer.Params().Set(name='gap'),
        linear.FCLayer.Params().Set(name='logits', input_dim=4, output_dim=4,
                                    activation='NONE')]
    model = pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe', layers=layers, num_partitions=2,
        num_micro_batches=2, input_shapes=[[8, 8, 8, 1]])
    return _Recipe(tasks.ClassificationTask.Params().Set(
        name='task', model=model, num_classes=4, label_smoothing=0.1))


class _Sequences(base_experiment.BaseExperiment):
  """11 test sequences in batches of 4 (K=2, T=2): the last batch has 3."""

  TASK = 'lm'
  NUM_EXAMPLES = 11

  def Train(self):
    return synthetic_input.SyntheticSequenceInput.Params().Set(
        name='train', task=self.TASK, batch_size=4, max_length=6,
        num_examples=16)

  def Test(self):
    return self.Train().Set(name='test', split='test',
                            num_examples=self.NUM_EXAMPLES)

  def Task(self):
    from models import transformer  # pylint: disable=g-import-not-at-top
    kw = dict(num_layers=1, hidden_dim=16, num_heads=2, model_dim=8,
              vocab_size=16, max_len=6, label_smoothing=0.0)
    if self.TASK == 'lm':
      model = transformer.TransformerLmPipeline(2, 2, 4, 6, **kw)
    else:
      model = transformer.TransformerPipeline(2, 2, 4, 6, 6, **kw)
    return _Recipe(tasks.SequenceTask.Params().Set(name='task', vocab_size=16,
                                                   model=model))


def _WholeSplit(trainer, num_examples):
  """The eval split as one batch of all its examples, without weights."""
  p = trainer.params.eval_input.Copy().Set(batch_size=num_examples)
  batch = next(iter(p.Instantiate().Dataset()))
  np.testing.assert_array_equal(batch[base_input.EXAMPLE_WEIGHT],
                                np.ones([num_examples]))
  return tasks.BaseTask.SplitExampleWeights(batch)[0]


def _Unpipelined(task, batch):
  """The model's output on `batch`, its layers run one after the other."""
  args = (batch,)
  for layer, theta in task.children.model.LayersWithTheta():
    args = composite.AsArgs(layer.FProp(theta, *args))
  return composite.FromArgs(args)


class PadBatchTest(tf.test.TestCase):

  def testLastBatchIsPaddedWithItsLastRowAndWeighedZero(self):
    inp = synthetic_input.SyntheticSequenceInput.Params().Set(
        split='test', batch_size=4, num_examples=6).Instantiate()
    batches = list(inp.Dataset())
    self.assertLen(batches, 2)
    self.assertEqual(inp.Dataset().element_spec['ids'].shape.as_list(),
                     [4, 8])
    self.assertAllEqual(batches[0][base_input.EXAMPLE_WEIGHT], [1, 1, 1, 1])
    self.assertAllEqual(batches[1][base_input.EXAMPLE_WEIGHT], [1, 1, 0, 0])
    last = batches[1]['ids'].numpy()
    self.assertAllEqual(last[2], last[1])
    self.assertAllEqual(last[3], last[1])
    self.assertAllEqual(decode_metrics.RealRows(batches[1]),
                        [True, True, False, False])
    # A repeating (training) input keeps full batches and has no weights.
    train = inp.params.Copy().Set(split='train').Instantiate()
    self.assertNotIn(base_input.EXAMPLE_WEIGHT, train.Dataset().element_spec)


class EvalCoverageTest(tf.test.TestCase):

  def testClassificationMetricsCoverEveryImage(self):
    exp = _Images()
    trainer = trainer_lib.Trainer(exp.ModelParams(), self.get_temp_dir(),
                                  log_fn=lambda _: None)
    # Larger logits: per-image losses spread, so that leaving images out (or
    # counting padding) changes the mean by far more than the tolerance.
    fc = trainer.task.children.model.LayersWithTheta()[-1][0]
    fc.vars.w.assign(fc.vars.w * 30.0)
    metrics = trainer.Evaluate(restore=False)
    self.assertEqual(metrics['num_batches'], 2.0)
    self.assertEqual(metrics['num_examples'], 13.0)
    batch = _WholeSplit(trainer, 13)
    with py_utils.EvalMode():
      logits = _Unpipelined(trainer.task, batch.image)
    xent = losses.SoftmaxCrossEntropyLoss(logits, batch.label, 0.1, 4).numpy()
    hits = losses.TopKAccuracy(logits, batch.label, 1,
                               per_example=True).numpy()
    test_utils.AssertAllCloseScaled(self, metrics['loss'], xent.mean(), RTOL)
    self.assertAllClose(metrics['accuracy'], hits.mean(), atol=1e-6)
    # What dropping or not masking the padding would report differs.
    self.assertGreater(abs(xent[:8].mean() - xent.mean()),
                       5 * RTOL * abs(xent.mean()))
    padded = np.concatenate([xent, [xent[-1]] * 3])
    self.assertGreater(abs(padded.mean() - xent.mean()),
                       5 * RTOL * abs(xent.mean()))

  def testLanguageModelPerplexityCoversEverySequence(self):
    trainer = trainer_lib.Trainer(_Sequences().ModelParams(),
                                  self.get_temp_dir(), log_fn=lambda _: None)
    metrics = trainer.Evaluate(restore=False)
    self.assertEqual(metrics['num_batches'], 3.0)
    self.assertEqual(metrics['num_examples'], 11.0)
    batch = _WholeSplit(trainer, 11)
    with py_utils.EvalMode():
      logits = trainer.task.Logits(batch)
    xent = losses.SoftmaxCrossEntropyLoss(logits, batch.labels).numpy()
    weights = 1.0 - batch.paddings.numpy()
    want = (xent * weights).sum() / weights.sum()
    test_utils.AssertAllCloseScaled(self, metrics['log_pplx'], want, RTOL)
    test_utils.AssertAllCloseScaled(self, metrics['perplexity'],
                                    np.exp(want), RTOL)
    first_8 = (xent[:8] * weights[:8]).sum() / weights[:8].sum()
    self.assertGreater(abs(first_8 - want), 5 * RTOL * want)

  def testBleuCoversEverySentenceOnce(self):
    exp = type('Nmt', (_Sequences,), {'TASK': 'nmt', 'NUM_EXAMPLES': 10})()
    trainer = trainer_lib.Trainer(exp.ModelParams(), self.get_temp_dir(),
                                  log_fn=lambda _: None)
    metrics = trainer.Evaluate(restore=False)
    self.assertEqual(metrics['num_examples'], 10.0)
    batch = _WholeSplit(trainer, 10)
    inp = trainer.EvalInput()
    with py_utils.EvalMode():
      decoded = trainer.task.GreedyDecode(batch).numpy()
    hyps = [inp.IdsToString(row) for row in decoded]
    refs = [inp.IdsToString(row) for row in batch.tgt_labels.numpy()]
    self.assertAllClose(metrics['bleu'], decode_metrics.ComputeBleu(hyps, refs))
    # Two padding rows decoded as sentences would change the corpus BLEU.
    self.assertNotAlmostEqual(
        decode_metrics.ComputeBleu(hyps + hyps[-1:] * 2, refs + refs[-1:] * 2),
        decode_metrics.ComputeBleu(hyps, refs), places=3)


if __name__ == '__main__':
  tf.test.main()
