"""SavedModel export (tensorpipe/export.py) of a tiny trained run.

A tiny experiment with batch norm and dropout (K=2 partitions, T=2
micro-batches, synthetic 6x6 images) trains two steps with the trainer,
with a model override as --model_params_override would give it. Its export,
on one device and pipelined, is loaded in a fresh process that cannot import
tensorpipe (tests/export_testlib.py); the signature's logits and
probabilities must equal the trainer's eval-mode outputs for request batches
of 5 and 13 rows (not divisible by T or by the serving chunk) and 0 rows.
Bad input (no params.txt, no checkpoint, another experiment's params.txt or
checkpoint, a non-empty export folder, placements and chunk sizes that do
not fit) ends in one clear error each.

The reference runs the pipeline in eval mode on the same rows. Per row the
exported graph does the same float32 arithmetic, but kernels may block the
sums differently for other batch sizes: outputs agree to a few float32 ulps
of the largest logit; 1e-5 of it is the bound asked for serving.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from tensorpipe import base_experiment
from tensorpipe import checkpoints
from tensorpipe import export
from tensorpipe import export_run
from tensorpipe import lr_schedules
from tensorpipe import optimizers
from tensorpipe import overrides
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import schedule_auto
from tensorpipe import synthetic_input
from tensorpipe import tasks
from tensorpipe import test_utils
from tensorpipe import trainer_lib
from tensorpipe.layers import conv
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.nested_map import NestedMap
from tests import export_testlib

test_utils.ConfigureTestDevices()

_RTOL = 1e-5
_OVERRIDE = 'task.model.layers[0].bn_tpl.epsilon=0.5'
_KEY = 'tests.export_test.Tiny'


class Tiny(base_experiment.BaseExperiment):
  """conv+BN, dropout, conv+BN, FC on 6x6x1 images; K=2, T=2, batch 8."""

  FILTERS = 4
  NUM_PARTITIONS = 2

  def Train(self):
    return synthetic_input.SyntheticImageInput.Params().Set(
        name='train', split='train', batch_size=8, image_shape=(6, 6, 1),
        num_classes=3, num_examples=64)

  def Test(self):
    return self.Train().Set(name='test', split='test', num_examples=32)

  def Task(self):
    f = self.FILTERS
    layers = [
        conv.Conv2DLayer.Params().Set(name='conv1', filter_shape=(3, 3, 1, f),
                                      batch_norm=True),
        dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.5),
        conv.Conv2DLayer.Params().Set(name='conv2', filter_shape=(3, 3, f, f),
                                      batch_norm=True),
        linear.FlattenLayer.Params().Set(name='flat'),
        linear.FCLayer.Params().Set(name='logits', input_dim=36 * f,
                                    output_dim=3, activation='NONE')]
    model = pipeline.TensorPipeLayer.Params().Set(
        name='pipe', layers=layers, num_partitions=self.NUM_PARTITIONS,
        num_micro_batches=2, input_shapes=[[8, 6, 6, 1]])
    p = tasks.ClassificationTask.Params().Set(name='task', model=model,
                                              num_classes=3)
    p.train.optimizer = optimizers.SGD.Params().Set(momentum=0.9)
    p.train.lr_schedule = lr_schedules.Constant.Params().Set(value=0.1)
    p.train.max_steps = 2
    return p


class Wide(Tiny):
  """Another experiment: the same layers, twice the filters."""
  FILTERS = 8


def _Images(n, seed):
  return tf.random.stateless_normal([n, 6, 6, 1], seed=[seed, 7]).numpy()


class ExportTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(prefix='export_test_',
                               dir=os.environ.get('TEST_TMPDIR'))
    cls.logdir = os.path.join(cls.tmp, 'run')
    p = Tiny().ModelParams()
    overrides.ApplyOverrides(p, _OVERRIDE)
    cls.trainer = trainer_lib.Trainer(p, cls.logdir, log_fn=lambda _: None)
    cls.trainer.Train()
    cls.batches = [{'image': _Images(5, 1)}, {'image': _Images(13, 2)},
                   {'image': _Images(0, 3)}]

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def _TrainerLogits(self, images, training=False):
    """The trainer's task in eval mode (its Evaluate step), through the
    pipeline; rows padded to a multiple of T=2 and sliced off again.

    training=True: batch statistics and dropout, the moving averages left
    as they are (the statistics are collected, not applied).
    """
    n = len(images)
    padded = np.concatenate([images, np.zeros([n % 2, 6, 6, 1],
                                              np.float32)])
    if not len(padded):
      return np.zeros([0, 3], np.float32)
    batch = NestedMap(image=tf.constant(padded),
                      label=tf.zeros([len(padded)], tf.int32))
    with py_utils.TrainingMode(training), py_utils.CollectBatchStats():
      out = self.trainer.task.FPropDefaultTheta(batch)
    return out.logits.numpy()[:n]

  def _Export(self, name, **kwargs):
    export_dir = os.path.join(self.tmp, name)
    result = export_run.ExportRun(Tiny().ModelParams(), _KEY, self.logdir,
                                  export_dir, log_fn=lambda _: None, **kwargs)
    self.assertEqual(result.step, 2)
    self.assertEqual(checkpoints.CheckpointNumber(result.checkpoint), 2)
    return export_dir

  def _AssertServesTrainerEvalOutputs(self, export_dir):
    loaded = export_testlib.RunInCleanProcess(export_dir, self.batches,
                                              self.tmp)
    self.assertEqual(loaded.modules, [])
    self.assertEqual(loaded.inputs, {'image': [[None, 6, 6, 1], 'float32']})
    self.assertEqual(loaded.output_names, ['logits', 'probabilities'])
    for batch, got in zip(self.batches, loaded.outputs):
      want = self._TrainerLogits(batch['image'])
      self.assertEqual(got['logits'].shape, want.shape)
      scale = max(test_utils.MaxAbs(want), 1.0)
      test_utils.AssertAllCloseScaled(self, got['logits'], want, _RTOL,
                                      scale=scale)
      self.assertAllClose(got['probabilities'],
                          tf.nn.softmax(want).numpy(), rtol=0, atol=_RTOL)
    # The comparison can fail: training mode (batch statistics, dropout)
    # gives other logits for the same rows.
    images = self.batches[1]['image']
    train = self._TrainerLogits(images, training=True)
    self.assertGreater(np.max(np.abs(train - loaded.outputs[1]['logits'])),
                       0.1)
    return loaded

  def _OpDevices(self, export_dir):
    """Devices named by the ops of the SavedModel's functions."""
    sm = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, 'saved_model.pb'), 'rb') as f:
      sm.ParseFromString(f.read())
    found = set()
    for fdef in sm.meta_graphs[0].graph_def.library.function:
      found.update(tf.DeviceSpec.from_string(n.device).device_index
                   for n in fdef.node_def if n.device)
    found.discard(None)  # '/device:CPU:*' of the variables' save functions
    return found

  def testOneDeviceExportServesTheTrainersEvalOutputs(self):
    export_dir = self._Export('one_device')
    self._AssertServesTrainerEvalOutputs(export_dir)
    self.assertEqual(self._OpDevices(export_dir), {0})
    with open(os.path.join(export_dir, export.INFO_FILE)) as f:
      info = json.load(f)
    self.assertEqual((info['model'], info['step'], info['mode']),
                     (_KEY, 2, 'one_device'))
    # The run's params.txt (with the override) travels with the export.
    with open(os.path.join(export_dir, export.PARAMS_COPY)) as f:
      self.assertIn('task.model.layers[0].bn_tpl.epsilon : 0.5', f.read())

  def testRawSignatureChecksTheRequestThenPreprocesses(self):
    # serving_raw takes uint8 images of any rank: a wrong rank or shape
    # gets an error naming the expected shape, with oneDNN on, and the
    # serving process goes on to the next request.
    export_dir = os.path.join(self.tmp, 'raw')
    export.ExportModel(
        self.trainer.task.children.model, export_dir,
        {'image': tf.TensorSpec([None, 6, 6, 1], tf.float32)},
        raw=export.RawImages('image', (6, 6, 1),
                             lambda x: tf.cast(x, tf.float32) / 255.0 - 0.5))
    raw = np.random.RandomState(5).randint(0, 256, (5, 6, 6, 1)).astype(
        np.uint8)
    requests = [{'image': raw}, {'image': raw[0]}, {'image': raw[:, :5]},
                {'image': raw.astype(np.uint8)[:3]}]
    onednn = os.environ.get('TF_ENABLE_ONEDNN_OPTS')
    os.environ['TF_ENABLE_ONEDNN_OPTS'] = '1'
    try:
      loaded = export_testlib.RunInCleanProcess(
          export_dir, requests, self.tmp, signature=export.RAW_SIGNATURE_KEY)
    finally:
      if onednn is None:
        del os.environ['TF_ENABLE_ONEDNN_OPTS']
      else:
        os.environ['TF_ENABLE_ONEDNN_OPTS'] = onednn
    self.assertEqual(loaded.inputs, {'image': [None, 'uint8']})
    self.assertEqual(sorted(loaded.errors), [1, 2])
    for i, shape in ((1, '[6 6 1]'), (2, '[5 5 6 1]')):
      self.assertIn('request image must have shape [batch, 6, 6, 1] '
                    '(uint8); got shape', loaded.errors[i])
      self.assertIn(shape, loaded.errors[i])
    want = self._TrainerLogits(raw.astype(np.float32) / 255.0 - 0.5)
    scale = max(test_utils.MaxAbs(want), 1.0)
    test_utils.AssertAllCloseScaled(self, loaded.outputs[0]['logits'], want,
                                    _RTOL, scale=scale)
    test_utils.AssertAllCloseScaled(self, loaded.outputs[3]['logits'],
                                    want[:3], _RTOL, scale=scale)
    cli = os.path.join(os.path.dirname(sys.executable), 'saved_model_cli')
    shown = subprocess.run(
        [cli, 'show', '--dir', export_dir, '--tag_set', 'serve'],
        capture_output=True, text=True, timeout=120, check=False)
    self.assertEqual(shown.returncode, 0, shown.stderr[-2000:])
    self.assertIn(export.RAW_SIGNATURE_KEY, shown.stdout)
    self.assertIn('serving_default', shown.stdout)

  def testPipelinedExportServesTheTrainersEvalOutputs(self):
    # Chunks of 4 rows (T=2 micro-batches of 2): 5 rows are 2 chunks, 13 are
    # 4, the padding rows are dropped.
    export_dir = self._Export('pipelined', pipelined=True,
                              serving_batch_size=4)
    self._AssertServesTrainerEvalOutputs(export_dir)
    self.assertEqual(self._OpDevices(export_dir), {0, 1})
    with open(os.path.join(export_dir, export.INFO_FILE)) as f:
      info = json.load(f)
    self.assertEqual((info['mode'], info['serving_batch_size']),
                     ('pipelined', 4))
    self.assertLen(info['devices'], 2)

  def testExportHonoursTheRunsOverrides(self):
    """The run trained with epsilon 0.5 in its first batch norm: a model
    built from the experiment alone (epsilon 1e-3) computes other logits,
    so an export that ignored params.txt would fail the tests above."""
    task = Tiny().Task().Instantiate()
    ckpt = tf.train.Checkpoint(model=task)
    ckpt.restore(tf.train.latest_checkpoint(
        os.path.join(self.logdir, 'checkpoints'))).expect_partial()
    images = self.batches[1]['image'][:12]
    with py_utils.EvalMode():
      plain = task.children.model.FPropDefaultTheta(tf.constant(images))
    self.assertGreater(np.max(np.abs(plain.numpy() -
                                     self._TrainerLogits(images))), 1e-3)

  def _CsvRun(self, name, schedule):
    """A logdir of the trained run whose params.txt has `schedule`."""
    logdir = os.path.join(self.tmp, name)
    shutil.copytree(os.path.join(self.logdir, 'checkpoints'),
                    os.path.join(logdir, 'checkpoints'))
    p = Tiny().ModelParams()
    overrides.ApplyOverrides(p, _OVERRIDE)
    p.task.model.schedule = schedule
    with open(os.path.join(logdir, 'params.txt'), 'w') as f:
      f.write(p.ToText())
    return logdir

  def testCsvScheduleRunsExportWithoutTheFile(self):
    """A run trained with schedule='z.csv' records the table itself
    (overrides.RecordCsvSchedules): it exports once the file is gone. A
    run of before, whose params.txt names the path, fails naming the key
    and the fix, then exports with the override naming a copy."""
    table = '0F0,0F1,,,0B0,,0B1\r\n,1F0,1F1,1B0,,1B1\r\n'
    path = os.path.join(self.tmp, 'z.csv')
    with open(path, 'w', newline='') as f:
      f.write(table)
    p = Tiny().ModelParams()
    p.task.model.schedule = path
    self.assertEqual(overrides.RecordCsvSchedules(p), [path])
    recorded = p.task.model.schedule
    self.assertEqual(recorded, 'csv:0F0,0F1,,,0B0,,0B1/,1F0,1F1,1B0,,1B1')
    new_run = self._CsvRun('csv_new', recorded)
    old_run = self._CsvRun('csv_old', path)
    copy = os.path.join(self.tmp, 'copy_of_z.csv')
    os.replace(path, copy)
    quiet = lambda _: None  # pylint: disable=unnecessary-lambda-assignment
    for logdir in (new_run, old_run):  # one device: no table needed
      export_run.ExportRun(Tiny().ModelParams(), _KEY, logdir,
                           os.path.join(logdir, 'one'), log_fn=quiet)
    # Pipelined: the stages are placed as the table says.
    export_run.ExportRun(Tiny().ModelParams(), _KEY, new_run,
                         os.path.join(new_run, 'pipe'), log_fn=quiet,
                         pipelined=True)
    with self.assertRaisesRegex(
        export.ExportError,
        r"task.model.schedule='.*z.csv' \(.*params.txt\) cannot be read: "
        r'.*--model_params_override="task.model.schedule=\'/path/to/'):
      export_run.ExportRun(Tiny().ModelParams(), _KEY, old_run,
                           os.path.join(old_run, 'pipe'), pipelined=True)
    result = export_run.ExportRun(
        Tiny().ModelParams(), _KEY, old_run, os.path.join(old_run, 'pipe'),
        log_fn=quiet, pipelined=True,
        params_override=f"task.model.schedule='{copy}'")
    self.assertEqual((result.step, result.mode), (2, 'pipelined'))
    with self.assertRaisesRegex(ValueError, 'model_params_override.*'
                                'shedule'):
      export_run.RunParams(Tiny().ModelParams(), old_run, _KEY,
                           params_override="task.model.shedule='x.csv'")

  def testAnExperimentsAutoSettingsTakeTheRunsResolvedValues(self):
    """The trainer writes params.txt with the planner's picks
    (schedule_auto.ResolveAutoIn); the experiment still says 'auto'."""
    exp = Tiny().ModelParams()
    exp.task.model.Set(schedule='auto', recompute='auto')
    run = exp.Copy()
    schedule_auto.ResolveAutoIn(run, lambda _: None)
    self.assertIsInstance(run.task.model.recompute, bool)
    logdir = os.path.join(self.tmp, 'auto_run')
    os.makedirs(logdir)
    with open(os.path.join(logdir, 'params.txt'), 'w') as f:
      f.write(run.ToText())
    got = export_run.RunParams(exp, logdir, _KEY)
    self.assertEqual(got.task.model.schedule, run.task.model.schedule)
    self.assertIs(got.task.model.recompute, run.task.model.recompute)
    # An override may ask for 'auto' again.
    got = export_run.RunParams(exp, logdir, _KEY,
                               params_override="task.model.recompute='auto'")
    self.assertEqual(got.task.model.recompute, 'auto')

  def testNonEmptyExportDirIsRefusedUnlessOverwrite(self):
    export_dir = os.path.join(self.tmp, 'taken')
    os.makedirs(export_dir)
    with open(os.path.join(export_dir, 'keep.txt'), 'w') as f:
      f.write('x')
    with self.assertRaisesRegex(export.ExportError,
                                'not empty.*--overwrite'):
      export_run.ExportRun(Tiny().ModelParams(), _KEY, self.logdir, export_dir)
    self.assertEqual(os.listdir(export_dir), ['keep.txt'])
    export_run.ExportRun(Tiny().ModelParams(), _KEY, self.logdir, export_dir,
                         overwrite=True, log_fn=lambda _: None)
    self.assertIn('saved_model.pb', os.listdir(export_dir))
    self.assertNotIn('keep.txt', os.listdir(export_dir))
    self.assertEqual([n for n in os.listdir(self.tmp) if '.tmp' in n], [])

  def testLogdirWithoutParamsIsRefused(self):
    empty = tempfile.mkdtemp(dir=self.tmp)
    with self.assertRaisesRegex(export.ExportError,
                                'params.txt does not exist.*not a trainer'):
      export_run.ExportRun(Tiny().ModelParams(), _KEY, empty,
                           os.path.join(self.tmp, 'x1'))

  def testLogdirWithoutCheckpointIsRefused(self):
    logdir = tempfile.mkdtemp(dir=self.tmp)
    shutil.copy(os.path.join(self.logdir, 'params.txt'), logdir)
    with self.assertRaisesRegex(checkpoints.NoCheckpointError,
                                'no checkpoint in .*train first'):
      export_run.ExportRun(Tiny().ModelParams(), _KEY, logdir,
                           os.path.join(self.tmp, 'x2'))
    self.assertFalse(os.path.exists(os.path.join(self.tmp, 'x2')))

  def testAnotherExperimentsRunIsRefused(self):
    with self.assertRaisesRegex(export.ExportError,
                                "experiment 'Tiny'.*not of --model=w.Wide"):
      export_run.ExportRun(Wide().ModelParams(), 'w.Wide', self.logdir,
                           os.path.join(self.tmp, 'x3'))
    # Same class name, other layers: params.txt does not fit its keys.
    p = Tiny().ModelParams()
    p.task.model.layers.append(linear.FCLayer.Params().Set(
        name='extra', input_dim=3, output_dim=3))
    with self.assertRaisesRegex(export.ExportError,
                                r'does not fit .*layers\[5\]'):
      export_run.ExportRun(p, _KEY, self.logdir, os.path.join(self.tmp, 'x4'))

  def testCheckpointOfAnotherModelIsRefused(self):
    # params.txt of Tiny, checkpoint of Wide (twice the filters).
    logdir = tempfile.mkdtemp(dir=self.tmp)
    shutil.copy(os.path.join(self.logdir, 'params.txt'), logdir)
    wide = Wide().Task().Instantiate()
    tf.train.Checkpoint(model=wide).write(
        os.path.join(logdir, 'checkpoints', 'ckpt-1'))
    with self.assertRaisesRegex(checkpoints.IncompatibleCheckpointError,
                                r'conv1/w: shape \[3, 3, 1, 4\] here, '
                                r'\[3, 3, 1, 8\] in the checkpoint'):
      export_run.ExportRun(Tiny().ModelParams(), _KEY, logdir,
                           os.path.join(self.tmp, 'x5'))

  def testPipelinedChunkMustSplitIntoTheMicroBatches(self):
    with self.assertRaisesRegex(export.ExportError,
                                'serving_batch_size=3 does not fit'):
      self._Export('x6', pipelined=True, serving_batch_size=3)

  def testServingDevicesMustFitTheModel(self):
    p = Tiny().Task()
    p.model.partitions = [p.model.layers[:2], p.model.layers[2:]]
    p.model.layers = None
    with self.assertRaisesRegex(export.ExportError,
                                'split by hand into 2.*cannot be served on 3'):
      export_run.SetServingDevices(p, None, num_partitions=3)
    p = Tiny().Task()
    with self.assertRaisesRegex(export.ExportError, '9 devices for a model '
                                'of 5 layers'):
      export_run.SetServingDevices(p, None, num_partitions=9)
    export_run.SetServingDevices(p, ['/CPU:2', '/CPU:3'])
    self.assertEqual((p.model.num_partitions, p.model.devices),
                     (2, ['/CPU:2', '/CPU:3']))


if __name__ == '__main__':
  tf.test.main()
