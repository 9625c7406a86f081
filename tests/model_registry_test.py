"""Tests of tensorpipe.model_registry."""

import subprocess
import sys
import unittest

from tensorpipe import base_experiment
from tensorpipe import model_registry


class _Exp(base_experiment.BaseExperiment):

  def Train(self):
    from tensorpipe import synthetic_input  # pylint: disable=g-import-not-at-top
    return synthetic_input.SyntheticImageInput.Params()

  def Test(self):
    return self.Train().Set(split='test')

  def Task(self):
    from tensorpipe import hyperparams  # pylint: disable=g-import-not-at-top
    p = hyperparams.Params()
    p.Define('x', 1, 'A value.')
    return p


class ModelRegistryTest(unittest.TestCase):

  def testKeyIsModulePathBelowParamsPlusClassName(self):
    cls = model_registry.GetClass('consistency.Consistency16')
    self.assertEqual(cls.__name__, 'Consistency16')
    self.assertEqual(cls.__module__, 'params.consistency')
    cls = model_registry.GetClass('image.fashion_mnist.ResNet4x8')
    self.assertEqual(cls.__module__, 'params.image.fashion_mnist')

  def testListKeysHasEveryExperimentFamily(self):
    keys = model_registry.ListKeys()
    for prefix in ('consistency.', 'image.fashion_mnist.', 'image.cifar10.',
                   'image.imagenet.', 'nmt.bible.', 'lm.brown.'):
      self.assertTrue(any(k.startswith(prefix) for k in keys), (prefix, keys))
    self.assertIn('image.fashion_mnist.AmoebaNetD4x8', keys)
    self.assertIn('image.fashion_mnist.ResNet1x8', keys)

  def testUnknownKeyListsCloseMatches(self):
    with self.assertRaisesRegex(ValueError,
                                "image.fashion_mnist.ResNet4x8"):
      model_registry.GetClass('image.fashion_mnist.ResNet4x9')
    with self.assertRaisesRegex(ValueError, 'no experiment registered'):
      model_registry.GetClass('nothing.like.this')

  def testDuplicateKeyRaises(self):
    first = type('Dup', (_Exp,), {'__module__': 'params.fake_mod'})
    self.addCleanup(model_registry._registry.pop, 'fake_mod.Dup', None)  # pylint: disable=protected-access
    model_registry.RegisterSingleTaskModel(first)
    self.assertIs(model_registry.GetClass('fake_mod.Dup'), first)
    other = type('Dup', (_Exp,), {'__module__': 'params.fake_mod',
                                  '__qualname__': 'Other.Dup'})
    with self.assertRaisesRegex(ValueError, 'already registered'):
      model_registry.RegisterSingleTaskModel(other)

  def testRegisterRejectsNonExperiments(self):
    with self.assertRaises(TypeError):
      model_registry.RegisterSingleTaskModel(object)

  def testGetParamsGivesTaskAndInputOfTheDataSet(self):
    p = model_registry.GetParams('consistency.Consistency16', 'Train')
    self.assertEqual(p.input.split, 'train')
    self.assertEqual(p.task.train.max_steps, 50)
    p = model_registry.GetParams('consistency.Consistency16', 'Test')
    self.assertEqual(p.input.split, 'test')
    with self.assertRaisesRegex(ValueError, 'dataset='):
      model_registry.GetParams('consistency.Consistency16', 'Validation')

  def testImportingTheRegistryImportsNoExperiment(self):
    code = ('import sys; from tensorpipe import model_registry; '
            'print(sorted(m for m in sys.modules if m == "params" or '
            'm.startswith("params.")))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, check=True, cwd='.').stdout
    self.assertEqual(out.strip(), '[]')


if __name__ == '__main__':
  unittest.main()
