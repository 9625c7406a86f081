"""tools/export.py end to end on the README's default experiment (slow).

The trainer binary trains image.fashion_mnist.ResNet4x8 for a few steps on
the real Fashion-MNIST with a model override (batch norm epsilon of the
first layer) and evaluates one batch of 256 test images; the export binary
writes it on one device and pipelined over 4 devices; a fresh process that
cannot import tensorpipe loads each SavedModel with tf.saved_model.load.
Its logits on those 256 images equal the trainer's eval-mode logits (the
restored task's eval step, run here) within 1e-5 of the largest logit, its
probabilities give the trainer's eval accuracy, and a 5-row request (not a
multiple of T=8) gives the same rows. The raw-image signature, fed the
stored uint8 test images, gives the trainer's accuracy on the whole test
split. Bad input through the binary: one line `export: error: ...` each,
exit code 2, no traceback.
"""

import json
import os
import shutil
import tempfile
import unittest

import numpy as np
import tensorflow as tf

from tensorpipe import model_registry
from tensorpipe import overrides
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe import trainer_lib
from tests import export_testlib
from tests.tools import tool_testlib

_MODEL = 'image.fashion_mnist.ResNet4x8'
_OVERRIDES = ('task.model.layers[0].bn_tpl.epsilon=0.5; '
              'eval_input.batch_size=256')
_STEPS = 4
_RTOL = 1e-5
test_utils.ConfigureTestDevices()


def _Fails(test, result, message):
  test.assertEqual(result.returncode, 2, result.stderr[-3000:])
  errors = [line for line in result.stderr.splitlines()
            if line.startswith('export: error: ')]
  test.assertLen(errors, 1, result.stderr[-3000:])
  test.assertIn(message, errors[0])
  test.assertNotIn('Traceback', result.stderr)


class ExportSlowTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(prefix='export_slow_',
                               dir=os.environ.get('TEST_TMPDIR'))
    cls.logdir = os.path.join(cls.tmp, 'fmnist')
    cls.trained = None

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def _Train(self):
    """Trains once per class (the first test that needs it)."""
    test_utils.CheckPrepared(self, 'fashion_mnist')
    if type(self).trained is None:
      result = tool_testlib.RunTool(
          'trainer', f'--model={_MODEL}', f'--logdir={self.logdir}',
          f'--max_steps={_STEPS}', '--eval_steps=1',
          f'--model_params_override={_OVERRIDES}')
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
      type(self).trained = True
    return self.logdir

  def _Export(self, export_dir, *flags, model=_MODEL, logdir=None):
    return tool_testlib.RunTool(
        'export', f'--model={model}', f'--logdir={logdir or self.logdir}',
        f'--export_dir={export_dir}', *flags)

  def _TrainerEval(self):
    """(images, labels, logits) of the trainer's eval step on its first eval
    batch (256 test images), with the run's weights and Params."""
    p = model_registry.GetExperiment(_MODEL).ModelParams()
    overrides.ApplyOverrides(p, _OVERRIDES)
    trainer = trainer_lib.Trainer(p, self.logdir, log_fn=lambda _: None)
    trainer.RestoreForEval()
    batch = next(iter(trainer.EvalInput().Dataset()))
    with py_utils.EvalMode():
      logits = trainer.task.FPropDefaultTheta(batch).logits.numpy()
    return batch['image'].numpy(), batch['label'].numpy(), logits

  def testExportsServeTheTrainersEvalOutputsWithoutTensorpipe(self):
    self._Train()
    with open(os.path.join(self.logdir, 'eval_metrics.json')) as f:
      metrics = json.load(f)
    self.assertEqual(metrics['step'], _STEPS)
    images, labels, want = self._TrainerEval()
    self.assertEqual(images.shape, (256, 28, 28, 1))
    scale = max(1.0, test_utils.MaxAbs(want))
    for name, flags in (('one_device', ()), ('pipelined', ('--devices=4',))):
      export_dir = os.path.join(self.tmp, name)
      result = self._Export(export_dir, *flags)
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
      loaded = export_testlib.RunInCleanProcess(
          export_dir, [{'image': images}, {'image': images[:5]},
                       {'image': images[:0]}], self.tmp)
      self.assertEqual(loaded.modules, [])
      self.assertEqual(loaded.inputs, {'image': [[None, 28, 28, 1],
                                                 'float32']})
      got = loaded.outputs[0]
      diff = np.max(np.abs(got['logits'] - want))
      self.assertLessEqual(diff, _RTOL * scale, f'{name}: logits differ by '
                           f'{diff} (largest logit {scale})')
      self.assertAllClose(got['probabilities'], tf.nn.softmax(want),
                          rtol=0, atol=_RTOL)
      accuracy = np.mean(np.argmax(got['probabilities'], 1) == labels)
      self.assertAlmostEqual(accuracy, metrics['accuracy'], places=6)
      # A request of 5 rows (not a multiple of T=8) and one of none.
      self.assertLessEqual(
          np.max(np.abs(loaded.outputs[1]['logits'] - want[:5])),
          _RTOL * scale)
      self.assertEqual(loaded.outputs[2]['logits'].shape, (0, 10))
      with open(os.path.join(export_dir, 'assets.extra',
                             'tensorpipe_export.json')) as f:
        info = json.load(f)
      self.assertEqual((info['model'], info['step']), (_MODEL, _STEPS))
      self.assertLen(info['devices'], 4 if flags else 1)

  def testRawSignatureGivesTheTrainersAccuracyOnTheWholeTestSplit(self):
    # serving_raw takes the TFDS test images as stored (uint8) and applies
    # the eval preprocessing itself; over all 10,000 test images its
    # accuracy is the trainer's evaluation of the same checkpoint.
    self._Train()
    export_dir = os.path.join(self.tmp, 'raw_one_device')
    result = self._Export(export_dir)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    p = model_registry.GetExperiment(_MODEL).ModelParams()
    overrides.ApplyOverrides(p, _OVERRIDES)
    p.task.train.eval_steps = None  # the whole split
    trainer = trainer_lib.Trainer(p, self.logdir, log_fn=lambda _: None)
    metrics = trainer.Evaluate()
    self.assertEqual(metrics['num_examples'], 10000)
    raw = list(trainer.EvalInput()._Read().batch(500).as_numpy_iterator())  # pylint: disable=protected-access
    labels = np.concatenate([b['label'] for b in raw])
    loaded = export_testlib.RunInCleanProcess(
        export_dir, [{'image': b['image']} for b in raw], self.tmp,
        signature='serving_raw')
    self.assertEqual(loaded.inputs, {'image': [None, 'uint8']})
    self.assertEqual(loaded.errors, {})
    predicted = np.concatenate([o['probabilities'].argmax(1)
                                for o in loaded.outputs])
    accuracy = np.mean(predicted == labels)
    print(f'serving_raw accuracy {accuracy:.4f}, trainer '
          f'{metrics["accuracy"]:.4f} (10,000 test images)')
    self.assertLessEqual(abs(accuracy - metrics['accuracy']), 1e-4)

  def testBadInputEndsInOneLineEach(self):
    logdir = self._Train()
    # A logdir with params.txt and no checkpoint.
    no_ckpt = os.path.join(self.tmp, 'no_ckpt')
    os.makedirs(no_ckpt)
    shutil.copy(os.path.join(logdir, 'params.txt'), no_ckpt)
    _Fails(self, self._Export(os.path.join(self.tmp, 'e1'), logdir=no_ckpt),
           'NoCheckpointError: no checkpoint in')
    # params.txt of this run, the checkpoint of another experiment.
    other = os.path.join(self.tmp, 'other_ckpt')
    os.makedirs(other)
    shutil.copy(os.path.join(logdir, 'params.txt'), other)
    task = model_registry.GetExperiment(
        'consistency.Consistency16').ModelParams().task.Instantiate()
    tf.train.Checkpoint(model=task).write(
        os.path.join(other, 'checkpoints', 'ckpt-3'))
    _Fails(self, self._Export(os.path.join(self.tmp, 'e2'), logdir=other),
           'IncompatibleCheckpointError')
    # --model is not the run's experiment.
    _Fails(self, self._Export(os.path.join(self.tmp, 'e3'),
                              model='image.fashion_mnist.AmoebaNetD4x8'),
           "holds a run of experiment 'ResNet4x8'")
    # A non-empty export folder, refused unless --overwrite.
    taken = os.path.join(self.tmp, 'taken')
    os.makedirs(taken)
    with open(os.path.join(taken, 'notes.txt'), 'w') as f:
      f.write('mine')
    _Fails(self, self._Export(taken), 'is not empty')
    self.assertEqual(os.listdir(taken), ['notes.txt'])
    result = self._Export(taken, '--overwrite')
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn('saved_model.pb', os.listdir(taken))
    # Flags.
    _Fails(self, self._Export(os.path.join(self.tmp, 'e4'), '--devices=x'),
           '--devices=')
    _Fails(self, self._Export(os.path.join(self.tmp, 'e5'), '--devices=4',
                              '--serving_batch_size=12'),
           'not divisible by num_micro_batches=8')
    for name in ('e1', 'e2', 'e3', 'e4', 'e5'):
      self.assertFalse(os.path.exists(os.path.join(self.tmp, name)), name)


if __name__ == '__main__':
  unittest.main()
