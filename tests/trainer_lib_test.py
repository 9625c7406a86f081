"""Tests of tensorpipe.trainer_lib on synthetic data (tiny pipelined models)."""

import json
import os
import re
import shutil
import socket
import tempfile
import threading
from unittest import mock

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import config as tf_config  # pylint: disable=g-direct-tensorflow-import

from tensorpipe import base_experiment
from tensorpipe import base_layer
from tensorpipe import checkpoints
from tensorpipe import decode_metrics
from tensorpipe import distribute
from tensorpipe import finite_check
from tensorpipe import hyperparams
from tensorpipe import logdir as logdir_lib
from tensorpipe import lr_schedules
from tensorpipe import optimizers
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import run_checkpoints
from tensorpipe import summaries
from tensorpipe import synthetic_input
from tensorpipe import tasks
from tensorpipe import test_utils
from tensorpipe import trainer_lib
from tensorpipe.layers import conv
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.layers import normalization
from tensorpipe.layers import pooling

test_utils.ConfigureTestDevices()


def setUpModule():
  # Op determinism is process-wide and makes tf.timestamp fail: on for this
  # module's tests only, so that other test files in the same pytest process
  # (tools/test.sh --all) keep their timelines.
  trainer_lib.EnableDeterminism(1234)


def tearDownModule():
  tf_config.disable_op_determinism()


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
    text = open(os.path.join(logdir, logdir_lib.PARAMS_FILE)).read()
    self.assertIn('task.train.max_steps : 6', text)
    restored = _Tiny().ModelParams()
    restored.FromText(text)  # the file is valid Params text
    metrics = trainer.Evaluate()
    self.assertEqual(metrics['num_batches'], 2.0)
    for key in ('accuracy', 'acc5', 'loss'):
      self.assertIn(key, metrics)
    saved = json.load(open(os.path.join(logdir, summaries.EVAL_FILE)))
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
    metrics = trainer.Evaluate(restore=False)
    # The BLEU of the model's own greedy decodes of the eval batches
    # against their labels (the untrained model matches a few words).
    inp = trainer.EvalInput()
    hyps, refs = [], []
    for batch in inp.Dataset():
      with py_utils.EvalMode():
        decoded = trainer.task.GreedyDecode(batch).numpy()
      hyps += [inp.IdsToString(row) for row in decoded]
      refs += [inp.IdsToString(row) for row in batch.tgt_labels.numpy()]
    want = decode_metrics.ComputeBleu(hyps, refs)
    self.assertGreater(want, 0.0)
    self.assertAllClose(metrics['bleu'], want)
    self.assertAllClose(metrics['perplexity'], np.exp(metrics['log_pplx']))
    self.assertEqual(metrics['num_batches'], 2.0)

  def testRecomputedBatchNormStatsAreThoseOfTheTrainingBatches(self):
    logdir = tempfile.mkdtemp(dir=self.get_temp_dir())
    exp = type('Tiny', (_Tiny,), {'NUM_PARTITIONS': 1,
                                  'NUM_MICRO_BATCHES': 1})()
    log = []
    trainer = trainer_lib.Trainer(exp.ModelParams(), logdir,
                                  log_fn=log.append)
    trainer.Train()
    bns = [layer for layer in base_layer.Layers(trainer.task)
           if isinstance(layer, normalization.BatchNormLayer)]
    self.assertLen(bns, 2)
    batches = list(trainer.TrainInput().Dataset().take(2))
    conv1 = [l for l in base_layer.Layers(trainer.task)
             if l.params.name == 'conv1'][0]
    # One batch: conv1's batch norm then normalises that batch in eval mode
    # exactly as in training (its input does not depend on dropout).
    self.assertEqual(trainer.RecomputeBatchNormStats(1), 2)
    with py_utils.TrainingMode(True):
      want = conv1.FPropDefaultTheta(batches[0].image)
    got = conv1.FPropDefaultTheta(batches[0].image)  # eval: moving stats
    self.assertAllClose(got, want, rtol=1e-4, atol=1e-4)
    # Two batches: the averages of the two batches' mean and variance.
    self.assertEqual(trainer.RecomputeBatchNormStats(2), 2)
    means, variances = [], []
    for batch in batches:
      with py_utils.TrainingMode(True), \
          py_utils.CollectBatchStats() as collected:
        trainer.task.FPropDefaultTheta(batch)
      stats = {id(layer): s.MeanAndVariance() for layer, s in collected}
      means.append([stats[id(bn)][0] for bn in bns])
      variances.append([stats[id(bn)][1] for bn in bns])
    for i, bn in enumerate(bns):
      self.assertAllClose(bn.vars.moving_mean,
                          (means[0][i] + means[1][i]) / 2, rtol=1e-5)
      self.assertAllClose(bn.vars.moving_variance,
                          (variances[0][i] + variances[1][i]) / 2, rtol=1e-5)
      self.assertNotAllClose(means[0][i], means[1][i])
    self.assertIn('recomputed from 2 training batches', log[-1])
    with self.assertRaisesRegex(ValueError, r'num_batches=0 must be an int '
                                r'>= 1'):
      trainer.RecomputeBatchNormStats(0)

  def testStopVoteStopsEveryWorkerAfterTheSameStep(self):
    """The multi-worker stop vote: TrainStep sums every replica's stop flag
    in the step's all-reduce (here 2 replicas in one process); with other
    processes only that sum decides (preemption.StopAgreed, its table in
    preemption_test.py)."""
    p = _Tiny().ModelParams()  # the smallest replicated step
    p.task.model.Set(num_partitions=1, layers=[
        pooling.GlobalPoolingLayer.Params().Set(name='gap'),
        linear.FCLayer.Params().Set(name='logits', input_dim=1, output_dim=4,
                                    activation='NONE')])
    topology = distribute.LocalTopology([['/CPU:0'], ['/CPU:1']])
    trainer = trainer_lib.Trainer(p, self.get_temp_dir(), topology=topology,
                                  log_fn=lambda _: None)
    batch = next(iter(trainer.TrainInput().Dataset()))
    for flag, votes in ((True, 2.0), (False, 0.0)):
      values = trainer._RunStep(batch, flag)  # pylint: disable=protected-access
      self.assertEqual(float(values[distribute.STOP_VOTES]), votes)

  def testBadTrainSettingsRaise(self):
    p = _Tiny().ModelParams()
    p.task.train.save_interval_steps = 0
    with self.assertRaisesRegex(ValueError, 'save_interval_steps=0'):
      trainer_lib.Trainer(p, self.get_temp_dir())


def _TinyParams(**train):
  p = _Tiny().ModelParams()
  p.task.train.Set(**train)
  return p


def _CheckpointValues(prefix):
  reader = tf.train.load_checkpoint(prefix)
  return {k: reader.get_tensor(k)
          for k, dtype in reader.get_variable_to_dtype_map().items()
          if dtype.is_floating}


class TrainerRecoveryTest(tf.test.TestCase):
  """Damaged checkpoints, the logdir lock, params history, NaN, bad inputs."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.base = tempfile.mkdtemp()
    # The reference: 6 uninterrupted steps; and a run stopped after step 4
    # (checkpoints 3 and 4) that tests copy and damage.
    full = trainer_lib.Trainer(_TinyParams(), os.path.join(cls.base, 'full'),
                               log_fn=lambda _: None)
    full.Train()
    cls.want = _Weights(full)
    trainer_lib.Trainer(_TinyParams(), os.path.join(cls.base, 'four'),
                        log_fn=lambda _: None).Train(max_steps=4)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.base, ignore_errors=True)
    super().tearDownClass()

  def _CopyOfFour(self):
    logdir = os.path.join(tempfile.mkdtemp(dir=self.base), 'run')
    shutil.copytree(os.path.join(self.base, 'four'), logdir)
    return logdir

  def _Trainer(self, logdir, params=None, log=None, **kwargs):
    return trainer_lib.Trainer(
        params or _TinyParams(), logdir,
        log_fn=log.append if log is not None else lambda _: None, **kwargs)

  def _AssertTrainsToTheUninterruptedWeights(self, trainer):
    trainer.Train()
    self.assertEqual(int(trainer.global_step.numpy()), 6)
    got = _Weights(trainer)
    self.assertEqual(sorted(got), sorted(self.want))
    for name in self.want:
      self.assertAllEqual(got[name], self.want[name], msg=name)

  def testDamagedStateFileUsesTheCheckpointFilesOnDisk(self):
    for content in (b'garbage {{{ not a state', b''):
      with self.subTest(content=content):
        logdir = self._CopyOfFour()
        state = os.path.join(logdir, 'checkpoints', 'checkpoint')
        with open(state, 'wb') as f:
          f.write(content)
        log = []
        trainer = self._Trainer(logdir, log=log)
        # Read-only restore (no lock): the newest intact checkpoint.
        self.assertEqual(os.path.basename(trainer.RestoreLatest()), 'ckpt-4')
        self.assertEqual(int(trainer.global_step.numpy()), 4)
        self.assertTrue(any(state in line and 'damaged' in line
                            for line in log), log)
        # Training repairs the state file (keeping the bad one) and resumes.
        self._AssertTrainsToTheUninterruptedWeights(trainer)
        with open(state + '.bad', 'rb') as f:
          self.assertEqual(f.read(), content)
        self.assertEqual(
            os.path.basename(tf.train.latest_checkpoint(
                os.path.dirname(state))), 'ckpt-6')

  def testDamagedNewestCheckpointFallsBackToTheNewestIntactOne(self):
    def Truncate(path):
      with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) // 2)

    def FlipBytes(path):
      with open(path, 'r+b') as f:
        f.seek(os.path.getsize(path) // 2)
        data = f.read(16)
        f.seek(os.path.getsize(path) // 2)
        f.write(bytes(b ^ 0xff for b in data))

    cases = [('ckpt-4.data-00000-of-00001', Truncate),
             ('ckpt-4.data-00000-of-00001', FlipBytes),
             ('ckpt-4.index', FlipBytes),
             ('ckpt-4.index', os.remove)]
    for i, (name, damage) in enumerate(cases):
      with self.subTest(file=name, damage=damage.__name__):
        logdir = self._CopyOfFour()
        path = os.path.join(logdir, 'checkpoints', name)
        damage(path)
        log = []
        trainer = self._Trainer(logdir, log=log)
        self.assertEqual(os.path.basename(trainer.RestoreLatest()), 'ckpt-3')
        warnings = [line for line in log if 'skipping checkpoint' in line]
        self.assertLen(warnings, 1)
        self.assertIn(path, warnings[0])
        if i == 0:  # the same resume for all: train once (tracing is slow)
          self._AssertTrainsToTheUninterruptedWeights(trainer)

  def testNoUsableCheckpointFailsNamingTheFiles(self):
    logdir = self._CopyOfFour()
    ckpt_dir = os.path.join(logdir, 'checkpoints')
    for n in (3, 4):
      os.remove(os.path.join(ckpt_dir, f'ckpt-{n}.index'))
    before = sorted(os.listdir(ckpt_dir))
    trainer = self._Trainer(logdir)
    with self.assertRaisesRegex(
        checkpoints.CheckpointError,
        r'no usable checkpoint in .*checkpoints: ckpt-4: .*ckpt-4\.index is '
        r'missing; ckpt-3: .*ckpt-3\.index is missing\. Move the damaged'):
      trainer.Train()
    self.assertEqual(sorted(os.listdir(ckpt_dir)), before)  # nothing saved
    self.assertEqual(int(trainer.global_step.numpy()), 0)

  def testKilledSaveLeftoversAreRemovedAtStart(self):
    logdir = self._CopyOfFour()
    ckpt_dir = os.path.join(logdir, 'checkpoints')
    os.makedirs(os.path.join(ckpt_dir, 'ckpt-5_temp'))
    with open(os.path.join(ckpt_dir, 'ckpt-5_temp',
                           'part-00000-of-00001.data-00000-of-00001'),
              'w') as f:
      f.write('partial')
    with open(os.path.join(ckpt_dir, 'checkpoint.tmp0a1b2c'), 'w') as f:
      f.write('partial')
    log = []
    self._AssertTrainsToTheUninterruptedWeights(self._Trainer(logdir,
                                                              log=log))
    self.assertNotIn('ckpt-5_temp', os.listdir(ckpt_dir))
    self.assertNotIn('checkpoint.tmp0a1b2c', os.listdir(ckpt_dir))
    self.assertTrue(any('ckpt-5_temp' in line for line in log), log)

  def testSecondTrainerOnALockedLogdirFailsAndAReaderIsAllowed(self):
    logdir = self._CopyOfFour()
    holder = self._Trainer(logdir)
    holder.Lock()
    try:
      second = self._Trainer(logdir)
      with self.assertRaisesRegex(
          logdir_lib.LogdirLockedError,
          rf'in use: a trainer, PID {os.getpid()} on host '
          rf'{re.escape(socket.gethostname())} .*\(this process\)'):
        second.Train()
      self.assertEqual(int(second.global_step.numpy()), 0)  # not restored
      # Evaluation takes no lock and restores the newest checkpoint.
      metrics = self._Trainer(logdir).Evaluate()
      self.assertEqual(metrics['num_batches'], 2.0)
      with open(os.path.join(logdir, summaries.EVAL_FILE)) as f:
        self.assertEqual(json.load(f)['step'], 4)
    finally:
      holder.Unlock()
    self.assertFalse(os.path.exists(os.path.join(logdir,
                                                 logdir_lib.LOCK_FILE)))

  def testNonChiefTakesNoLockAndWritesNothing(self):
    logdir = os.path.join(tempfile.mkdtemp(dir=self.base), 'run')
    chief = self._Trainer(logdir)
    chief.Lock()
    try:
      worker = self._Trainer(logdir, is_chief=False)
      worker.Train(max_steps=2)
      self.assertEqual(int(worker.global_step.numpy()), 2)
      self.assertEqual(sorted(os.listdir(logdir)), [logdir_lib.LOCK_FILE])
    finally:
      chief.Unlock()

  def testAnotherModelsCheckpointIsRefusedAndParamsTxtKept(self):
    logdir = self._CopyOfFour()
    params_file = os.path.join(logdir, logdir_lib.PARAMS_FILE)
    with open(params_file) as f:
      original = f.read()
    wider = _TinyParams()
    wider.task.num_classes = 5
    wider.task.model.layers[-1].output_dim = 5
    renamed = _TinyParams()
    renamed.task.model.layers[2].name = 'conv2b'
    cases = [
        (wider, r'holds a run of _Tiny whose params.txt differs from these '
         r'Params in task.model.layers\[4\].output_dim, task.num_classes; its '
         r'variables differ from this model.s: model/model/logits/b: shape '
         r'\[5\] here, \[4\] in the checkpoint'),
        (renamed, r'holds a run of _Tiny .*its variables differ from this '
         r'model.s: .*model/model/conv2b/w \(not in the checkpoint\).*'
         r'model/model/conv2/bn/beta \(only in the checkpoint\)'),
    ]
    for params, message in cases:
      with self.subTest(message=message[:30]):
        with self.assertRaisesRegex(
            checkpoints.IncompatibleCheckpointError, message):
          self._Trainer(logdir, params=params).Train()
        with open(params_file) as f:
          self.assertEqual(f.read(), original)
        self.assertFalse(os.path.exists(os.path.join(logdir, 'params.4.txt')))
    self.assertEqual(sorted(os.listdir(os.path.join(logdir, 'checkpoints'))),
                     sorted(os.listdir(os.path.join(self.base, 'four',
                                                    'checkpoints'))))

  def testChangedHyperParametersAreLoggedAndKept(self):
    logdir = self._CopyOfFour()
    params_file = os.path.join(logdir, logdir_lib.PARAMS_FILE)
    with open(params_file) as f:
      original = f.read()
    changed = _TinyParams(l2_regularizer_weight=0.0)
    log = []
    self._Trainer(logdir, params=changed, log=log).Train(max_steps=5)
    with open(os.path.join(logdir, 'params.4.txt')) as f:
      self.assertEqual(f.read(), original)
    with open(params_file) as f:
      self.assertEqual(f.read(), changed.ToText())
    diff = [line for line in log if 'kept as params.4.txt' in line]
    self.assertLen(diff, 1)
    self.assertIn('task.train.l2_regularizer_weight: 0.001 -> 0.0', diff[0])
    # An unchanged resume writes no history.
    self._Trainer(logdir, params=changed).Train(max_steps=5)
    self.assertEqual(sorted(f for f in os.listdir(logdir) if 'params' in f),
                     ['params.4.txt', 'params.txt'])

  def testLargerMaxStepsExtendsTheRunWithoutAParamsChange(self):
    # The run stopped at step 4 of max_steps=6, extended to 7: the same run.
    logdir = self._CopyOfFour()
    longer = _TinyParams(max_steps=7)
    log = []
    self._Trainer(logdir, params=longer, log=log).Train()
    self.assertEqual([line for line in log if 'differ' in line], [])
    self.assertEqual(sorted(f for f in os.listdir(logdir) if 'params' in f),
                     ['params.txt'])
    with open(os.path.join(logdir, logdir_lib.PARAMS_FILE)) as f:
      self.assertEqual(f.read(), longer.ToText())

  def testNonFiniteUpdateIsNeverSaved(self):
    # lr 1e39 is inf in float32: the first update makes every weight NaN/Inf
    # while the loss before it is finite.
    inf_lr = lr_schedules.Constant.Params().Set(value=1e39)
    fresh = os.path.join(tempfile.mkdtemp(dir=self.base), 'run')
    trainer = self._Trainer(fresh, params=_TinyParams(
        lr_schedule=inf_lr, save_interval_steps=1))
    with self.assertRaisesRegex(
        finite_check.NonFiniteError,
        r'training stopped at step 1: the update made weights or optimizer '
        r'slots non-finite \(model/\S+, .*\); no checkpoint was saved; lower the '
        'learning rate'):
      trainer.Train()
    self.assertIsNone(tf.train.latest_checkpoint(
        os.path.join(fresh, 'checkpoints')))
    # Resumed with the same lr: it stops at step 5; ckpt-4 stays the latest.
    logdir = self._CopyOfFour()
    trainer = self._Trainer(logdir, params=_TinyParams(
        lr_schedule=inf_lr, save_interval_steps=1))
    with self.assertRaisesRegex(
        finite_check.NonFiniteError,
        'step 5: .*the newest checkpoint, ckpt-4, is finite and stays the '
        'latest'):
      trainer.Train()
    latest = tf.train.latest_checkpoint(os.path.join(logdir, 'checkpoints'))
    self.assertEqual(os.path.basename(latest), 'ckpt-4')
    for key, value in _CheckpointValues(latest).items():
      self.assertTrue(np.all(np.isfinite(value)), key)

  def testEvaluationWithoutCheckpointIsRefused(self):
    logdir = os.path.join(tempfile.mkdtemp(dir=self.base), 'typo')
    with self.assertRaisesRegex(checkpoints.NoCheckpointError,
                                'no checkpoint in .*typo/checkpoints: nothing '
                                'to evaluate'):
      self._Trainer(logdir).Evaluate()
    self.assertFalse(os.path.exists(logdir))  # nothing created or written

  def testEvaluationOfARepeatingInputNeedsEvalSteps(self):
    p = _TinyParams()
    p.eval_input.repeat = True
    trainer = self._Trainer(self._CopyOfFour(), params=p)
    outcome = []

    def Evaluate():
      try:
        outcome.append(trainer.Evaluate(restore=False))
      except ValueError as e:
        outcome.append(e)
    thread = threading.Thread(target=Evaluate, daemon=True)
    thread.start()
    thread.join(120)
    self.assertFalse(thread.is_alive(), 'Evaluate did not end')
    self.assertIsInstance(outcome[0], ValueError)
    self.assertRegex(str(outcome[0]), 'repeats forever .* set --eval_steps=N')
    self.assertEqual(trainer.Evaluate(eval_steps=3, restore=False)[
        'num_batches'], 3.0)

  def testEvaluationOfAReadOnlyLogdirStillReports(self):
    logdir = self._CopyOfFour()
    # Paths that cannot be written, also for root: a file where the summary
    # folder goes and a folder where the metrics file goes.
    with open(os.path.join(logdir, 'eval'), 'w') as f:
      f.write('not a folder')
    os.makedirs(os.path.join(logdir, summaries.EVAL_FILE))
    log = []
    metrics = self._Trainer(logdir, log=log).Evaluate()
    self.assertEqual(metrics['num_batches'], 2.0)
    self.assertTrue(any('could not write the eval results' in line
                        for line in log), log)

  def testInputsThatDoNotFitTheModelFailBeforeTracing(self):
    key = _TinyParams()
    key.task.input_key = 'img'
    micro = _TinyParams()
    micro.task.model.num_micro_batches = 3
    eval_micro = _TinyParams()
    eval_micro.eval_input.batch_size = 5
    cases = [
        (key, False, r"task.input_key='img' is not a key of the input "
         r"batches; they have \['image', 'label'\]"),
        (micro, False, r'input.batch_size=8 does not fit the pipeline '
         r'task.model: batch size 8 is not divisible by num_micro_batches=3'),
        (eval_micro, True, r'eval_input.batch_size=5 does not fit'),
    ]
    for p, with_eval, message in cases:
      with self.subTest(message=message[:30]):
        logdir = os.path.join(tempfile.mkdtemp(dir=self.base), 'run')
        trainer = self._Trainer(logdir, params=p)
        eval_fn = (lambda step: None) if with_eval else None
        with self.assertRaisesRegex(ValueError, message):
          trainer.Train(eval_fn=eval_fn)
        self.assertIsNone(trainer._train_fn)  # nothing traced
        self.assertFalse(os.path.exists(os.path.join(logdir, 'params.txt')))

  def testFailedCheckpointWriteKeepsTheLatest(self):
    logdir = self._CopyOfFour()
    trainer = self._Trainer(logdir)

    def Full(*unused_args, **unused_kwargs):
      raise tf.errors.ResourceExhaustedError(
          None, None, 'ckpt-6_temp/part-00000-of-00001.data-00000-of-00001; '
          'No space left on device')
    with mock.patch.object(tf.train.CheckpointManager, 'save', Full):
      with self.assertRaisesRegex(
          run_checkpoints.CheckpointWriteError,
          r'could not write the checkpoint of step 6 in .*: .*No space left '
          r'on device; the last checkpoint, ckpt-4, is intact\. Free space'):
        trainer.Train()
    self.assertEqual(os.path.basename(tf.train.latest_checkpoint(
        os.path.join(logdir, 'checkpoints'))), 'ckpt-4')

  def testGradNormClipZeroOrNoneIsOffAndNegativeIsRejected(self):
    losses = {}
    for clip in (None, 0, 0.05):
      trainer = self._Trainer(os.path.join(tempfile.mkdtemp(dir=self.base),
                                           'run'),
                              params=_TinyParams(grad_norm_clip=clip))
      it = iter(trainer.TrainInput().Dataset())
      values = [trainer.TrainStep(next(it)) for _ in range(3)]
      losses[clip] = [float(v['loss']) for v in values]
      norms = [float(v['grad_norm']) for v in values]
    self.assertEqual(losses[None], losses[0])
    self.assertGreater(min(norms), 0.05)  # so the 0.05 clip is active
    self.assertNotEqual(losses[None][1:], losses[0.05][1:])
    for bad in (-0.01, -1.0, float('inf'), 'x', True):
      with self.subTest(clip=bad):
        with self.assertRaisesRegex(ValueError,
                                    'grad_norm_clip=.* must be a finite '
                                    'number > 0 .*or 0 / None for no '
                                    'clipping'):
          self._Trainer(self.base, params=_TinyParams(grad_norm_clip=bad))

  def testBadEvalAndCheckpointSettingsRaise(self):
    cases = [
        (dict(eval_steps=0), r'task.train.eval_steps=0 \(or --eval_steps\) '
         'must be an int >= 1'),
        (dict(eval_steps=-1), 'eval_steps=-1'),
        (dict(max_checkpoints_to_keep=0),
         'max_checkpoints_to_keep=0 must be an int >= 1 \\(or None'),
        (dict(eval_interval_steps=-1), 'eval_interval_steps=-1'),
        (dict(max_steps=True), 'max_steps=True'),
    ]
    for train, message in cases:
      with self.subTest(**train):
        with self.assertRaisesRegex(ValueError, message):
          self._Trainer(self.base, params=_TinyParams(**train))
    trainer = self._Trainer(self._CopyOfFour())
    with self.assertRaisesRegex(ValueError, 'eval_steps=0 must be an int >= '
                                '1'):
      trainer.Evaluate(eval_steps=0)


if __name__ == '__main__':
  tf.test.main()
