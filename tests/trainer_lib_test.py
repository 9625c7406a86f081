"""Tests of tensorpipe.trainer_lib on synthetic data (tiny pipelined models)."""

import json
import os

import numpy as np
import tensorflow as tf

from tensorpipe import base_experiment
from tensorpipe import hyperparams
from tensorpipe import lr_schedules
from tensorpipe import optimizers
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import synthetic_input
from tensorpipe import tasks
from tensorpipe import test_utils
from tensorpipe import trainer_lib
from tensorpipe.layers import conv
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.layers import pooling

test_utils.ConfigureTestDevices()
trainer_lib.EnableDeterminism(1234)


class _Tiny(base_experiment.BaseExperiment):
  """Conv-BN, dropout and FC on 8x8 synthetic images."""

  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 2
  BATCH_SIZE = 8

  def Train(self):
    return synthetic_input.SyntheticImageInput.Params().Set(
        name='train', batch_size=self.BATCH_SIZE, num_examples=64,
        shuffle_buffer=32)

  def Test(self):
    return self.Train().Set(name='test', split='test', num_examples=16)

  def Task(self):
    layers = [
        conv.Conv2DLayer.Params().Set(name='conv1', filter_shape=(3, 3, 1, 4),
                                      batch_norm=True),
        dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.8),
        conv.Conv2DLayer.Params().Set(name='conv2', filter_shape=(3, 3, 4, 4),
                                      filter_stride=(2, 2), batch_norm=True),
        pooling.GlobalPoolingLayer.Params().Set(name='gap'),
        linear.FCLayer.Params().Set(name='logits', input_dim=4, output_dim=4,
                                    activation='NONE')]
    model = pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe', layers=layers, num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=self.NUM_MICRO_BATCHES,
        input_shapes=[[self.BATCH_SIZE, 8, 8, 1]])
    p = tasks.ClassificationTask.Params().Set(name='task', model=model,
                                              num_classes=4)
    tp = p.train
    tp.optimizer = optimizers.RMSProp.Params()
    tp.lr_schedule = lr_schedules.WarmupRsqrtDecay.Params().Set(
        peak=0.05, warmup_steps=2)
    tp.l2_regularizer_weight = 1e-3
    tp.grad_norm_clip = 5.0
    tp.max_steps = 6
    tp.save_interval_steps = 3
    tp.summary_interval_steps = 2
    tp.log_interval_steps = 2
    return p


def _Weights(trainer):
  return {v.name + str(i): v.numpy()
          for i, v in enumerate(trainer.task.variables)}


class TrainerLibTest(tf.test.TestCase):

  def _Trainer(self, logdir, k=2, log=None):
    exp = type('Tiny', (_Tiny,), {'NUM_PARTITIONS': k})()
    return trainer_lib.Trainer(exp.ModelParams(), logdir,
                               log_fn=(log.append if log is not None else
                                       lambda _: None))

  def testResumeReachesTheWeightsOfAnUninterruptedRun(self):
    base = self.get_temp_dir()
    log = []
    full = self._Trainer(os.path.join(base, 'full'), log=log)
    full.Train()
    # Interrupted: 4 steps (checkpoint at 3, and at the end: 4), then a new
    # trainer (a restarted process) on the same logdir trains to 6.
    first = self._Trainer(os.path.join(base, 'resumed'))
    first.Train(max_steps=4)
    second = self._Trainer(os.path.join(base, 'resumed'))
    self.assertEqual(int(second.global_step.numpy()), 0)
    second.Train()
    self.assertEqual(int(second.global_step.numpy()), 6)
    want, got = _Weights(full), _Weights(second)
    self.assertEqual(sorted(want), sorted(got))
    for name in want:
      self.assertAllEqual(got[name], want[name], msg=name)
    # Moving BN statistics are among the restored variables.
    self.assertTrue(any('moving' in n for n in want), sorted(want))
    # Progress lines carry loss, examples/s and ETA.
    progress = [line for line in log if line.startswith('step 2/6')]
    self.assertLen(progress, 1)
    self.assertRegex(progress[0], r'loss \d.*examples/s.*ETA')

  def testWritesParamsSummariesAndEvalMetrics(self):
    logdir = self.get_temp_dir()
    trainer = self._Trainer(logdir)
    trainer.Train(max_steps=2)
    text = open(os.path.join(logdir, trainer_lib.PARAMS_FILE)).read()
    self.assertIn('task.train.max_steps : 6', text)
    restored = _Tiny().ModelParams()
    restored.FromText(text)  # the file is valid Params text
    metrics = trainer.Evaluate()
    self.assertEqual(metrics['num_batches'], 2.0)
    for key in ('accuracy', 'acc5', 'loss'):
      self.assertIn(key, metrics)
    saved = json.load(open(os.path.join(logdir, trainer_lib.EVAL_FILE)))
    self.assertEqual(saved['step'], 2)
    tags = set()
    for f in tf.io.gfile.glob(os.path.join(logdir, 'train', '*')):
      for event in tf.compat.v1.train.summary_iterator(f):
        tags.update(v.tag for v in event.summary.value)
    for tag in ('loss', 'accuracy', 'learning_rate', 'grad_norm',
                'step_time', 'examples_per_sec'):
      self.assertIn(tag, tags)

  def testK1AndK2GiveTheSameLosses(self):
    # Training-level transparency: the same steps, K=1 and K=2 (same T).
    losses = {}
    for k in (1, 2):
      trainer = self._Trainer(os.path.join(self.get_temp_dir(), f'k{k}'), k=k)
      it = iter(trainer.TrainInput().Dataset())
      trainer.RestoreLatest()
      losses[k] = [float(trainer.TrainStep(next(it))['loss'])
                   for _ in range(4)]
    self.assertAllClose(losses[1], losses[2], rtol=1e-5, atol=0)
    # Both against a model without TensorPipeLayer, and the loss decrease of
    # a step against the gradient norm: trainer_lib_oracle_test.py.

  def testTranslationEvalReportsBleuAndPerplexity(self):
    from models import transformer  # pylint: disable=g-import-not-at-top

    class _Nmt(base_experiment.BaseExperiment):

      def Train(self):
        return synthetic_input.SyntheticSequenceInput.Params().Set(
            task='nmt', batch_size=4, max_length=6, num_examples=8)

      def Test(self):
        return self.Train().Set(split='test')

      def Task(self):
        model = transformer.TransformerPipeline(
            2, 2, 4, 6, 6, num_layers=1, hidden_dim=16, num_heads=2,
            model_dim=8, vocab_size=16, max_len=6)
        return tasks.SequenceTask.Params().Set(name='task', vocab_size=16,
                                               model=model)
    trainer = trainer_lib.Trainer(_Nmt().ModelParams(), self.get_temp_dir(),
                                  log_fn=lambda _: None)
    metrics = trainer.Evaluate()
    # The BLEU of the model's own greedy decodes of the eval batches
    # against their labels (the untrained model matches a few words).
    inp = trainer.EvalInput()
    hyps, refs = [], []
    for batch in inp.Dataset():
      with py_utils.EvalMode():
        decoded = trainer.task.GreedyDecode(batch).numpy()
      hyps += [inp.IdsToString(row) for row in decoded]
      refs += [inp.IdsToString(row) for row in batch.tgt_labels.numpy()]
    want = trainer_lib.ComputeBleu(hyps, refs)
    self.assertGreater(want, 0.0)
    self.assertAllClose(metrics['bleu'], want)
    self.assertAllClose(metrics['perplexity'], np.exp(metrics['log_pplx']))
    self.assertEqual(metrics['num_batches'], 2.0)

  def testComputeBleu(self):
    self.assertAllClose(trainer_lib.ComputeBleu(
        ['the cat sat on the mat'], ['the cat sat on the mat']), 100.0)
    # No word in common: no matching unigram, BLEU 0 (hand-computed values
    # of partial matches: trainer_lib_oracle_test.py).
    self.assertEqual(trainer_lib.ComputeBleu(
        ['a dog ran far away'], ['the cat sat on the mat']), 0.0)

  def testParseOverrides(self):
    text = trainer_lib.ParseOverrides(
        'task.train.max_steps=7; input.batch_size : 4\n# comment\n'
        "task.name='x'")
    self.assertEqual(text.splitlines(), [
        'task.train.max_steps : 7', 'input.batch_size : 4',
        "task.name : 'x'"])
    p = _Tiny().ModelParams()
    trainer_lib.ApplyOverrides(
        p, 'task.model.num_micro_batches=4;task.train.lr_schedule.peak=0.1')
    self.assertEqual(p.task.model.num_micro_batches, 4)
    self.assertEqual(p.task.train.lr_schedule.peak, 0.1)

  def testOverrideErrorsAreClear(self):
    p = _Tiny().ModelParams()
    with self.assertRaisesRegex(ValueError, "Did you mean 'num_micro_batches'"):
      trainer_lib.ApplyOverrides(p, 'task.model.num_micro_batch=4')
    with self.assertRaisesRegex(ValueError, "max_steps.*'ten'.*quote"):
      trainer_lib.ApplyOverrides(p, 'task.train.max_steps=ten')
    with self.assertRaisesRegex(ValueError, 'max_steps.*type int'):
      trainer_lib.ApplyOverrides(p, "task.train.max_steps='ten'")
    with self.assertRaisesRegex(ValueError, 'not of the form key=value'):
      trainer_lib.ApplyOverrides(p, 'task.train.max_steps')
    with self.assertRaisesRegex(ValueError, 'has no value'):
      trainer_lib.ApplyOverrides(p, 'task.train.max_steps=')
    self.assertEqual(p.task.train.max_steps, 6)  # unchanged after errors

  def testSemicolonInsideAQuotedOverrideValue(self):
    self.assertEqual(
        trainer_lib.ParseOverrides(
            "task.name='a;b'; input.name=\"c;'d\";task.name='it\\'s;x'\n"
            "task.name='open;\ninput.batch_size=4").splitlines(),
        ["task.name : 'a;b'", 'input.name : "c;\'d"',
         "task.name : 'it\\'s;x'", "task.name : 'open;",
         'input.batch_size : 4'])
    p = _Tiny().ModelParams()
    trainer_lib.ApplyOverrides(p, "task.name='a;b';task.train.max_steps=3")
    self.assertEqual((p.task.name, p.task.train.max_steps), ('a;b', 3))
    with self.assertRaisesRegex(ValueError, r"task.name.*unterminated"):
      trainer_lib.ApplyOverrides(p, "task.name='open;\ninput.batch_size=4")

  def testOverrideOfAListOfLayerParamsFails(self):
    p = _Tiny().ModelParams()
    with self.assertRaisesRegex(
        ValueError, r"--model_params_override: FromText: 'task.model.layers' "
        r'holds Params in a list of length 5.*indexed keys, e.g. '
        r'"task.model.layers\[0\]'):
      trainer_lib.ApplyOverrides(p, 'task.model.layers=[]')
    self.assertLen(p.task.model.layers, 5)

  def testDeeplyNestedOverrideIsAValueError(self):
    p = _Tiny().ModelParams()
    with self.assertRaisesRegex(ValueError, r'input_shapes.*more than 100 '
                                'levels'):
      trainer_lib.ApplyOverrides(
          p, 'task.model.input_shapes=' + '[' * 5000 + ']' * 5000)


  def testBadTrainSettingsRaise(self):
    p = _Tiny().ModelParams()
    p.task.train.save_interval_steps = 0
    with self.assertRaisesRegex(ValueError, 'save_interval_steps=0'):
      trainer_lib.Trainer(p, self.get_temp_dir())


if __name__ == '__main__':
  tf.test.main()
