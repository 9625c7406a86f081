"""End-to-end tests of the trainer binary (subprocesses; slow).

- A run SIGKILLed inside a checkpoint write (between data file and index)
  and restarted reaches exactly the weights of an uninterrupted run of the
  same number of steps; so does a run stopped by SIGTERM (it saves the step
  it reached and exits 143 with one line). SIGKILLs at random points (at
  least 10: start-up, tracing, between steps, saves) are in
  tests/tools/trainer_faults_slow_test.py (--slow), which replaced this
  file's single kill between steps.
- K=1 and K=4 (same T, same seed) give the same per-step losses.
- Bad flags and override text fail with a clear message, no traceback.
- The README's default experiment trains and evaluates on the real prepared
  Fashion-MNIST (a few steps).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
import tensorflow as tf

from tensorpipe import model_registry
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe import trainer_lib
from tensorpipe.layers import composite

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_MODEL = 'consistency.Consistency16'
# The in-process checks below build the experiments' pipelines (K <= 4).
test_utils.ConfigureTestDevices()


def _TrainerCmd(logdir, *extra):
  return [sys.executable, '-m', 'tools.trainer', f'--model={_MODEL}',
          f'--logdir={logdir}', '--mode=train', '--max_steps=24',
          '--model_params_override=task.train.save_interval_steps=4; '
          'task.train.summary_interval_steps=1; '
          'task.train.log_interval_steps=1', *extra]


def _Run(cmd, check=True):
  return subprocess.run(cmd, cwd=_REPO, capture_output=True, text=True,
                        check=check, timeout=600)


def _Weights(logdir):
  reader = tf.train.load_checkpoint(os.path.join(logdir, 'checkpoints'))
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if name.startswith('model/') or name.startswith('optimizer/')}


def _Losses(logdir):
  out = {}
  for f in tf.io.gfile.glob(os.path.join(logdir, 'train', 'events*')):
    for event in tf.compat.v1.train.summary_iterator(f):
      for v in event.summary.value:
        if v.tag == 'loss':
          out[event.step] = float(tf.make_ndarray(v.tensor))
  return [out[s] for s in sorted(out)]


def _WaitForLine(path, pattern, proc, timeout_s=300):
  """The first match of `pattern` in the file `path` while `proc` runs."""
  deadline = time.time() + timeout_s
  while time.time() < deadline and proc.poll() is None:
    with open(path) as f:
      found = re.search(pattern, f.read())
    if found:
      return found
    time.sleep(0.01)
  return None


class TrainerSlowTest(unittest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.shared = tempfile.mkdtemp(prefix='trainer_slow_shared_',
                                  dir=os.environ.get('TEST_TMPDIR'))
    cls._full = None

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.shared, True)
    super().tearDownClass()

  def _FullRun(self):
    """Logdir of the uninterrupted 24-step run (trained once per class)."""
    if TrainerSlowTest._full is None:
      full = os.path.join(self.shared, 'full')
      _Run(_TrainerCmd(full))
      TrainerSlowTest._full = full
    return TrainerSlowTest._full

  def _AssertWeightsEqualFullRun(self, logdir):
    want, got = _Weights(self._FullRun()), _Weights(logdir)
    self.assertEqual(sorted(want), sorted(got))
    self.assertTrue(any('conv' in n for n in want))
    for name in want:
      np.testing.assert_array_equal(got[name], want[name], err_msg=name)

  def setUp(self):
    # A fresh folder per test, removed afterwards: a reused one would let a
    # later run resume stale checkpoints.
    self.tmp = tempfile.mkdtemp(prefix='trainer_slow_',
                                dir=os.environ.get('TEST_TMPDIR'))
    self.addCleanup(shutil.rmtree, self.tmp, True)

  def testSigtermSavesTheStepReachedAndTheResumeEqualsUninterruptedRun(self):
    self._FullRun()
    logdir = os.path.join(self.tmp, 'stopped')
    log = os.path.join(self.tmp, 'stopped.log')
    with open(log, 'w') as out:
      proc = subprocess.Popen(_TrainerCmd(logdir), cwd=_REPO,
                              stdout=out, stderr=subprocess.STDOUT)
    self.addCleanup(proc.wait, 60)
    self.addCleanup(lambda: proc.poll() is None and proc.kill())
    # After the first step (which traces; ~40 ms per step after it).
    self.assertTrue(_WaitForLine(log, r'\(first step, ', proc),
                    'the run ended before its first step was logged')
    proc.send_signal(signal.SIGTERM)
    t0 = time.time()
    proc.wait(timeout=60)
    seconds = time.time() - t0
    with open(log) as f:
      text = f.read()
    self.assertEqual(proc.returncode, 143, text[-3000:])
    self.assertNotIn('Traceback', text)
    stopped = re.search(r'trainer: stopped by SIGTERM at step (\d+); saved '
                        r'ckpt-(\d+); run the same command to resume', text)
    self.assertTrue(stopped, text[-3000:])
    step = int(stopped.group(1))
    self.assertEqual(int(stopped.group(2)), step)
    self.assertLess(step, 24)
    self.assertEqual(tf.train.latest_checkpoint(os.path.join(
        logdir, 'checkpoints')).rsplit('-', 1)[1], str(step))
    print(f'SIGTERM to exit: {seconds:.2f} s (stopped at step {step})')
    self.assertLess(seconds, 30)
    out = _Run(_TrainerCmd(logdir))
    self.assertIn(f'at step {step}', out.stderr)  # it resumed
    self._AssertWeightsEqualFullRun(logdir)

  def testKillDuringACheckpointWriteThenResumeEqualsUninterruptedRun(self):
    # Deterministic: the trainer SIGKILLs itself in the save of step 8,
    # between ckpt-8's data file and its index (checkpoints.TestKillInSave).
    self._FullRun()
    logdir = os.path.join(self.tmp, 'killed_in_save')
    env = dict(os.environ, TENSORPIPE_TEST_KILL_DURING_SAVE='8')
    out = subprocess.run(_TrainerCmd(logdir), cwd=_REPO, env=env,
                         capture_output=True, text=True, timeout=600,
                         check=False)
    self.assertEqual(out.returncode, -signal.SIGKILL, out.stderr[-3000:])
    ckpt_dir = os.path.join(logdir, 'checkpoints')
    names = os.listdir(ckpt_dir)
    self.assertIn('ckpt-8.data-00000-of-00001', names)
    self.assertNotIn('ckpt-8.index', names)
    self.assertTrue(tf.train.latest_checkpoint(ckpt_dir).endswith('ckpt-4'))
    out = _Run(_TrainerCmd(logdir))
    self.assertIn('at step 4', out.stderr)  # resumed from the intact ckpt-4
    self._AssertWeightsEqualFullRun(logdir)

  def testK1AndK4GiveTheLossesOfTheModelWithoutPipeline(self):
    losses = {}
    for model in ('consistency.Consistency16K1', 'consistency.Consistency16'):
      logdir = os.path.join(self.tmp, model)
      _Run([sys.executable, '-m', 'tools.trainer', f'--model={model}',
            f'--logdir={logdir}', '--mode=train', '--max_steps=10',
            '--num_cpu_devices=4',
            '--model_params_override=task.train.summary_interval_steps=1'])
      losses[model] = _Losses(logdir)
    k1, k4 = losses.values()
    self.assertEqual(len(k1), 10)
    np.testing.assert_allclose(k4, k1, rtol=1e-5, atol=0)
    # "K=1" is still a pipeline of 8 micro-batches: the reference is the
    # same layers without a TensorPipeLayer, trained here in-process on the
    # same batches (the binary's seed; the model has no batch norm, so one
    # whole-batch pass is GPipe's semantics). Only float32 sums differ in
    # order, over 10 steps of SGD with momentum.
    p = model_registry.GetExperiment(_MODEL).ModelParams()
    p.task.model = composite.SequentialLayer.Params().Set(
        name='Sequential', sub=list(p.task.model.layers))
    tf.random.set_seed(1234)
    trainer = trainer_lib.Trainer(p, os.path.join(self.tmp, 'plain'),
                                  log_fn=lambda _: None)
    trainer.RestoreLatest()
    batches = iter(trainer.TrainInput().Dataset())
    plain = [float(trainer.TrainStep(next(batches))['loss'])
             for _ in range(10)]
    np.testing.assert_allclose(k1, plain, rtol=1e-5, atol=0)
    np.testing.assert_allclose(k4, plain, rtol=1e-5, atol=0)
    # The losses barely move in 10 steps; the weights and momenta do.
    trainer.SaveCheckpoint()
    want = _Weights(os.path.join(self.tmp, 'plain'))
    self.assertTrue(any('conv' in name for name in want))
    for model in losses:
      got = _Weights(os.path.join(self.tmp, model))
      self.assertEqual(sorted(got), sorted(want))
      for name, value in want.items():
        np.testing.assert_allclose(
            got[name], value, rtol=1e-5,
            atol=1e-5 * np.abs(value).max(), err_msg=f'{model} {name}')

  def testDefaultExperimentTrainsAndEvaluatesOnRealFashionMnist(self):
    test_utils.CheckPrepared(self, 'fashion_mnist')
    logdir = os.path.join(self.tmp, 'fmnist')
    result = _Run([sys.executable, '-m', 'tools.trainer',
                   '--model=image.fashion_mnist.ResNet4x8',
                   f'--logdir={logdir}', '--max_steps=4', '--eval_steps=2',
                   '--model_params_override='
                   'task.train.summary_interval_steps=2'])
    self.assertIn('step 4/4', result.stderr)
    # A healthy run's console: the trainer's own lines only, no C++ lines
    # of TensorFlow (E0000 cuInit on a machine without GPU, load notices)
    # and no INFO lines of TFDS or TensorFlow (tools/console.py).
    for line in result.stderr.splitlines():
      self.assertNotRegex(line, r'^[IWE]0000 |absl::InitializeLog|'
                          r'dataset_info\.py|reader\.py|functional_saver|'
                          r'INFO:tensorflow', msg=result.stderr[-3000:])
    with open(os.path.join(logdir, 'eval_metrics.json')) as f:
      metrics = json.load(f)
    self.assertEqual(metrics['step'], 4)
    self._AssertAccuracyOfTheLogits(
        'image.fashion_mnist.ResNet4x8', logdir, metrics, batches=2)
    with open(os.path.join(logdir, 'params.txt')) as f:
      params = f.read()
    self.assertIn('num_partitions : 4', params)
    self.assertIn('num_micro_batches : 8', params)
    self.assertTrue(_Losses(logdir), 'no loss summaries written')
    # Eval with batch-norm statistics recomputed from training batches:
    # other metrics, and the checkpoint keeps the trained averages.
    ckpt = tf.train.latest_checkpoint(os.path.join(logdir, 'checkpoints'))
    stored = {name: tf.train.load_variable(ckpt, name)
              for name, _ in tf.train.list_variables(ckpt)
              if 'moving_mean' in name}
    self.assertTrue(stored)
    result = _Run([sys.executable, '-m', 'tools.trainer',
                   '--model=image.fashion_mnist.ResNet4x8',
                   f'--logdir={logdir}', '--mode=eval', '--eval_steps=2',
                   '--recompute_bn_stats=2'])
    self.assertIn('recomputed from 2 training batches', result.stderr)
    with open(os.path.join(logdir, 'eval_metrics.json')) as f:
      recomputed = json.load(f)
    self.assertEqual(recomputed['step'], 4)
    self.assertNotAlmostEqual(recomputed['loss'], metrics['loss'], places=4)
    self.assertEqual(
        tf.train.latest_checkpoint(os.path.join(logdir, 'checkpoints')), ckpt)
    for name, value in stored.items():
      np.testing.assert_array_equal(tf.train.load_variable(ckpt, name), value)

  def _AssertAccuracyOfTheLogits(self, model, logdir, metrics, batches):
    """metrics' top-1 / top-5 accuracy == NumPy's on the restored model's
    logits of the first `batches` eval batches."""
    trainer = trainer_lib.Trainer(
        model_registry.GetExperiment(model).ModelParams(), logdir,
        log_fn=lambda _: None)
    trainer.RestoreLatest()
    top1, top5 = [], []
    for batch in trainer.EvalInput().Dataset().take(batches):
      with py_utils.EvalMode():
        logits = trainer.task.FPropDefaultTheta(batch).logits.numpy()
      labels = batch['label'].numpy()
      label_logit = logits[np.arange(len(labels)), labels]
      rank = (logits > label_logit[:, None]).sum(1)  # 0: the largest
      top1 += list(rank < 1)
      top5 += list(rank < 5)
    self.assertAlmostEqual(metrics['accuracy'], np.mean(top1), places=6)
    self.assertAlmostEqual(metrics['acc5'], np.mean(top5), places=6)

  def testBadFlagsGiveClearErrors(self):
    logdir = os.path.join(self.tmp, 'bad')
    cases = [
        ([f'--model={_MODEL[:-1]}', f'--logdir={logdir}'], 'Did you mean'),
        ([f'--model={_MODEL}', f'--logdir={logdir}',
          '--model_params_override=task.train.max_step=3'],
         "Did you mean 'max_steps'"),
        ([f'--model={_MODEL}', f'--logdir={logdir}',
          '--model_params_override=task.train.max_steps=x'], 'quote strings'),
        (['--model=image.fashion_mnist.ResNet4x8', f'--logdir={logdir}',
          '--model_params_override=input.data_dir="/nonexistent"'],
         'tools/prepare_data.sh'),
        ([f'--logdir={logdir}'], '--model is required'),
        ([f'--model={_MODEL}', f'--logdir={logdir}', '--mode=train',
          '--recompute_bn_stats=2'], 'needs --mode=eval or train_and_eval'),
    ]
    for flags, message in cases:
      out = _Run([sys.executable, '-m', 'tools.trainer', *flags], check=False)
      self.assertEqual(out.returncode, 2, (flags, out.stderr[-2000:]))
      self.assertIn(message, out.stderr)
      self.assertNotIn('Traceback', out.stderr)


if __name__ == '__main__':
  unittest.main()
