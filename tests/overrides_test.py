"""Tests of tensorpipe/overrides.py: --model_params_override text and CSV
schedules recorded as their table."""

import os

import tensorflow as tf

from tensorpipe import base_experiment
from tensorpipe import lr_schedules
from tensorpipe import overrides
from tensorpipe import pipeline
from tensorpipe import synthetic_input
from tensorpipe import tasks
from tensorpipe.layers import conv
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.layers import pooling


class _Tiny(base_experiment.BaseExperiment):
  """Five layers in a 2-partition pipeline (trainer_lib_test's shape)."""

  def Train(self):
    return synthetic_input.SyntheticImageInput.Params().Set(
        name='train', batch_size=8, num_examples=64)

  def Test(self):
    return self.Train().Set(name='test', split='test', num_examples=16)

  def Task(self):
    layers = [
        conv.Conv2DLayer.Params().Set(name='conv1', filter_shape=(3, 3, 1, 4)),
        dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.8),
        conv.Conv2DLayer.Params().Set(name='conv2', filter_shape=(3, 3, 4, 4)),
        pooling.GlobalPoolingLayer.Params().Set(name='gap'),
        linear.FCLayer.Params().Set(name='logits', input_dim=4, output_dim=4,
                                    activation='NONE')]
    model = pipeline.TensorPipeLayer.Params().Set(
        name='TensorPipe', layers=layers, num_partitions=2,
        num_micro_batches=2, input_shapes=[[8, 8, 8, 1]])
    p = tasks.ClassificationTask.Params().Set(name='task', model=model,
                                              num_classes=4)
    p.train.max_steps = 6
    p.train.lr_schedule = lr_schedules.WarmupRsqrtDecay.Params().Set(
        peak=0.05, warmup_steps=2)
    return p


def _Params():
  return _Tiny().ModelParams()


class OverridesTest(tf.test.TestCase):

  def testParseOverrides(self):
    text = overrides.ParseOverrides(
        'task.train.max_steps=7; input.batch_size : 4\n# comment\n'
        "task.name='x'")
    self.assertEqual(text.splitlines(), [
        'task.train.max_steps : 7', 'input.batch_size : 4',
        "task.name : 'x'"])
    p = _Params()
    overrides.ApplyOverrides(
        p, 'task.model.num_micro_batches=4;task.train.lr_schedule.peak=0.1')
    self.assertEqual(p.task.model.num_micro_batches, 4)
    self.assertEqual(p.task.train.lr_schedule.peak, 0.1)

  def testCsvSchedulePathsAreRecordedAsTheirTable(self):
    """The trainer calls RecordCsvSchedules after the overrides: a path
    (relative ones resolved as the trainer resolves --logdir) becomes the
    table's text; names and recorded tables stay as they are."""
    folder = self.get_temp_dir()
    with open(os.path.join(folder, 'z.csv'), 'w', newline='') as f:
      f.write('0F0,0F1,,,0B0,,0B1\r\n,1F0,1F1,1B0,,1B1\r\n\r\n')
    p = _Params()
    overrides.ApplyOverrides(p, "task.model.schedule='runs/z.csv'")
    read = overrides.RecordCsvSchedules(
        p, lambda path: os.path.join(folder, os.path.basename(path)))
    self.assertEqual(read, ['runs/z.csv'])
    table = 'csv:0F0,0F1,,,0B0,,0B1/,1F0,1F1,1B0,,1B1'
    self.assertEqual(p.task.model.schedule, table)
    self.assertIn(f"task.model.schedule : '{table}'", p.ToText())
    self.assertEqual(overrides.RecordCsvSchedules(p), [])  # recorded
    p.task.model.schedule = '1f1b'
    self.assertEqual(overrides.RecordCsvSchedules(p), [])
    self.assertEqual(p.task.model.schedule, '1f1b')
    p.task.model.schedule = os.path.join(folder, 'gone.csv')
    with self.assertRaisesRegex(ValueError, r"schedule CSV '.*gone.csv' "
                                'cannot be read'):
      overrides.RecordCsvSchedules(p)

  def testIsCsvSchedulePathTellsAFileFromARecordedTableOrAName(self):
    """The one test of 'a CSV file to read' (the trainer records it, export
    checks that it is there)."""
    for value, is_path in (('z.csv', True), ('/runs/z.csv', True),
                           ('csv:0F0,0B0', False), ('csv:x.csv', False),
                           ('1f1b', False), ('zb_h1', False), (None, False)):
      self.assertEqual(overrides.IsCsvSchedulePath(value), is_path, value)

  def testOverrideErrorsAreClear(self):
    p = _Params()
    with self.assertRaisesRegex(ValueError, "Did you mean 'num_micro_batches'"):
      overrides.ApplyOverrides(p, 'task.model.num_micro_batch=4')
    with self.assertRaisesRegex(ValueError, "max_steps.*'ten'.*quote"):
      overrides.ApplyOverrides(p, 'task.train.max_steps=ten')
    with self.assertRaisesRegex(ValueError, 'max_steps.*type int'):
      overrides.ApplyOverrides(p, "task.train.max_steps='ten'")
    with self.assertRaisesRegex(ValueError, 'not of the form key=value'):
      overrides.ApplyOverrides(p, 'task.train.max_steps')
    with self.assertRaisesRegex(ValueError, 'has no value'):
      overrides.ApplyOverrides(p, 'task.train.max_steps=')
    self.assertEqual(p.task.train.max_steps, 6)  # unchanged after errors

  def testSemicolonInsideAQuotedOverrideValue(self):
    self.assertEqual(
        overrides.ParseOverrides(
            "task.name='a;b'; input.name=\"c;'d\";task.name='it\\'s;x'\n"
            "task.name='open;\ninput.batch_size=4").splitlines(),
        ["task.name : 'a;b'", 'input.name : "c;\'d"',
         "task.name : 'it\\'s;x'", "task.name : 'open;",
         'input.batch_size : 4'])
    p = _Params()
    overrides.ApplyOverrides(p, "task.name='a;b';task.train.max_steps=3")
    self.assertEqual((p.task.name, p.task.train.max_steps), ('a;b', 3))
    with self.assertRaisesRegex(ValueError, r"task.name.*unterminated"):
      overrides.ApplyOverrides(p, "task.name='open;\ninput.batch_size=4")

  def testOverrideOfAListOfLayerParamsFails(self):
    p = _Params()
    with self.assertRaisesRegex(
        ValueError, r"--model_params_override: FromText: 'task.model.layers' "
        r'holds Params in a list of length 5.*indexed keys, e.g. '
        r'"task.model.layers\[0\]'):
      overrides.ApplyOverrides(p, 'task.model.layers=[]')
    self.assertLen(p.task.model.layers, 5)

  def testDeeplyNestedOverrideIsAValueError(self):
    p = _Params()
    with self.assertRaisesRegex(ValueError, r'input_shapes.*more than 100 '
                                'levels'):
      overrides.ApplyOverrides(
          p, 'task.model.input_shapes=' + '[' * 5000 + ']' * 5000)


if __name__ == '__main__':
  tf.test.main()
