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
    cls = model_registry.GetClass('consistency.Consistency4x8')
    self.assertEqual(cls.__name__, 'Consistency4x8')
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

  def testKeyWithoutItsModuleOrWithASpaceSuggestsTheReadmesAlias(self):
    """--model=Consistency16 (the README's name without its module) and a
    key with a trailing space: the suggestion is the key to type."""
    for key in ('Consistency16', 'consistency.Consistency16 ',
                'consistency16'):
      with self.assertRaisesRegex(
          ValueError, r"^no experiment registered as '[\w.]+ ?'"
          r"(?P<space> \(it has spaces around it; drop them\))?\. Did you "
          "mean 'consistency.Consistency16'"):
        model_registry.GetClass(key)
    with self.assertRaisesRegex(ValueError, r"' \(it has spaces around"):
      model_registry.GetClass('consistency.Consistency16 ')

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
    with self.assertRaisesRegex(TypeError, 'no Train.. method; subclass '
                                r'tensorpipe\.base_experiment\.BaseExperiment'):
      model_registry.RegisterSingleTaskModel(type('NoTrain', (), {
          'Task': lambda self: None}))

  def testClassNamesFollowOneScheme(self):
    # <Model><K>x<T>: a CapWords model name, K partitions, T micro-batches.
    for key in model_registry.ListKeys():
      self.assertRegex(key.rsplit('.', 1)[1],
                       r'^[A-Z][A-Za-z0-9]*[A-Za-z]\d+x\d+$')

  def testOldKeysAreAliasesOfTheRenamedExperiments(self):
    aliases = model_registry.Aliases()
    renamed = {'consistency.Consistency16': 'consistency.Consistency4x8',
               'consistency.Consistency16K1': 'consistency.Consistency1x8',
               'image.imagenet.AmoebaNetB_18x512_8x32':
                   'image.imagenet.AmoebaNetBLarge8x32',
               'lm.brown.TransformerLm4x8Short':
                   'lm.brown.TransformerLmShort4x8',
               'lm.brown.TransformerLm1x8Short':
                   'lm.brown.TransformerLmShort1x8',
               'nmt.bible.TransformerEnEs4x8Short':
                   'nmt.bible.TransformerEnEsShort4x8',
               'nmt.bible.TransformerEnEs1x8Short':
                   'nmt.bible.TransformerEnEsShort1x8'}
    for data_set in ('birdsnap', 'cifar10', 'cifar100', 'fgvc_aircraft',
                     'food101', 'imagenet', 'oxford_pets', 'stanford_cars'):
      renamed[f'image.{data_set}.AmoebaNetB_4x8'] = (
          f'image.{data_set}.AmoebaNetB4x8')
    self.assertEqual(aliases, renamed)
    keys = model_registry.ListKeys()
    for old, new in renamed.items():
      self.assertNotIn(old, keys)
      self.assertIs(model_registry.GetClass(old),
                    model_registry.GetClass(new))
    p = model_registry.GetParams('image.cifar10.AmoebaNetB_4x8', 'Test')
    self.assertEqual(p.ToText(), model_registry.GetParams(
        'image.cifar10.AmoebaNetB4x8', 'Test').ToText())

  def testAliasResolvesInAFreshProcess(self):
    # The lookup imports the alias's module on demand, as for a key.
    code = ('from tensorpipe import model_registry; print(model_registry.'
            'GetClass("image.imagenet.AmoebaNetB_18x512_8x32").__name__)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, check=True, cwd='.').stdout
    self.assertEqual(out.strip(), 'AmoebaNetBLarge8x32')

  def testBadAliasesRaise(self):
    cls = type('Aliased4x8', (_Exp,), {'__module__': 'params.fake_alias'})
    self.addCleanup(model_registry._registry.pop, 'fake_alias.Aliased4x8',  # pylint: disable=protected-access
                    None)
    self.addCleanup(model_registry._aliases.pop, 'fake_alias.Old_4x8', None)  # pylint: disable=protected-access
    unregistered = type('Other4x8', (_Exp,), {'__module__': 'params.fake'})
    with self.assertRaisesRegex(ValueError, 'Other4x8 is not registered'):
      model_registry.RegisterAlias('Old', unregistered)
    model_registry.RegisterSingleTaskModel(cls)
    model_registry.RegisterAlias('Old_4x8', cls)
    model_registry.RegisterAlias('Old_4x8', cls)      # again: no change
    self.assertIs(model_registry.GetClass('fake_alias.Old_4x8'), cls)
    with self.assertRaisesRegex(ValueError, "'fake_alias.Aliased4x8' is "
                                'already the key'):
      model_registry.RegisterAlias('Aliased4x8', cls)
    with self.assertRaisesRegex(ValueError, 'must be a class name'):
      model_registry.RegisterAlias('a.b', cls)
    clash = type('Old_4x8', (_Exp,), {'__module__': 'params.fake_alias'})
    with self.assertRaisesRegex(ValueError, 'already an alias'):
      model_registry.RegisterSingleTaskModel(clash)

  def testGetParamsGivesTaskAndInputOfTheDataSet(self):
    p = model_registry.GetParams('consistency.Consistency4x8', 'Train')
    self.assertEqual(p.input.split, 'train')
    self.assertEqual(p.task.train.max_steps, 50)
    p = model_registry.GetParams('consistency.Consistency4x8', 'Test')
    self.assertEqual(p.input.split, 'test')
    with self.assertRaisesRegex(ValueError, 'dataset='):
      model_registry.GetParams('consistency.Consistency4x8', 'Validation')

  def testImportingTheRegistryImportsNoExperiment(self):
    code = ('import sys; from tensorpipe import model_registry; '
            'print(sorted(m for m in sys.modules if m == "params" or '
            'm.startswith("params.")))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, check=True, cwd='.').stdout
    self.assertEqual(out.strip(), '[]')


if __name__ == '__main__':
  unittest.main()
