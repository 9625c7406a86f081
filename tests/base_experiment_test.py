"""Tests of tensorpipe/base_experiment.py: the Params an experiment gives."""

import unittest

from tensorpipe import base_experiment
from tensorpipe import synthetic_input
from tensorpipe import tasks
from tensorpipe.layers import composite


class _Small(base_experiment.BaseExperiment):
  BATCH_SIZE = 8

  def Train(self):
    return synthetic_input.SyntheticImageInput.Params().Set(
        name='train', batch_size=self.BATCH_SIZE)

  def Test(self):
    return self.Train().Set(name='test', split='test')

  def Task(self):
    return tasks.ClassificationTask.Params().Set(
        name='task', num_classes=4, model=composite.IdentityLayer.Params())


class BaseExperimentTest(unittest.TestCase):

  def testModelParamsHoldTaskAndBothInputs(self):
    p = _Small().ModelParams()
    self.assertEqual(p.name, '_Small')
    self.assertEqual(p.task.num_classes, 4)
    self.assertEqual((p.input.split, p.eval_input.split), ('train', 'test'))

  def testKnobsOfASubclassReachTheParams(self):
    big = type('_Big', (_Small,), {'BATCH_SIZE': 32})()
    self.assertEqual(big.ModelParams().input.batch_size, 32)

  def testTaskWithInputOfEachDataSet(self):
    exp = _Small()
    self.assertEqual(exp.TaskWithInput('Train').input.split, 'train')
    self.assertEqual(exp.TaskWithInput('Test').input.split, 'test')
    # Dev defaults to the test input.
    self.assertEqual(exp.TaskWithInput('Dev').input.ToText(),
                     exp.Test().ToText())

  def testMissingMethodsNameTheClass(self):
    empty = base_experiment.BaseExperiment()
    for method in ('Train', 'Test', 'Task'):
      with self.subTest(method=method):
        with self.assertRaisesRegex(NotImplementedError,
                                    f'BaseExperiment.{method}'):
          getattr(empty, method)()


if __name__ == '__main__':
  unittest.main()
