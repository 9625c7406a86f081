"""Tests for tensorpipe.hyperparams."""

import collections
import copy
import enum
import math
import pickle
import unittest

import tensorflow as tf

from tensorpipe import hyperparams
from tensorpipe import params_format


class Color(enum.Enum):
  RED = 1
  GREEN = 2


class Layer:
  """A stand-in layer: remembers the params it was built from."""

  def __init__(self, params, **kwargs):
    self.params = params
    self.kwargs = kwargs


class OtherLayer(Layer):
  pass


def Relu(x):
  return max(x, 0)


Point = collections.namedtuple('Point', ['x', 'y'])


def _LayerParams(dim=8):
  p = hyperparams.InstantiableParams(Layer)
  p.Define('dim', dim, 'Width, in units.')
  return p


def _ModelParams():
  p = hyperparams.Params()
  p.Define('learning_rate', 0.1, 'Learning rate.')
  p.Define('num_layers', 2, 'Number of layers.')
  p.Define('encoder', hyperparams.Params(), 'Encoder params.')
  p.encoder.Define('dim', 16, 'Encoder width, in units.')
  p.encoder.Define('inner', hyperparams.Params(), 'Innermost params.')
  p.encoder.inner.Define('rate', 0.5, 'Dropout rate.')
  return p


class ParamsDefineTest(unittest.TestCase):

  def testDefineAndAttributeAccess(self):
    p = hyperparams.Params()
    p.Define('foo', 1, 'A foo.')
    self.assertEqual(p.foo, 1)
    p.foo = 3
    self.assertEqual(p.foo, 3)
    self.assertEqual(p.Description('foo'), 'A foo.')

  def testDefineRequiresDescription(self):
    p = hyperparams.Params()
    for description in ('', '   ', None):
      with self.assertRaisesRegex(ValueError, 'description'):
        p.Define('foo', 1, description)
    self.assertNotIn('foo', p)

  def testDefineRejectsDuplicateName(self):
    p = hyperparams.Params()
    p.Define('foo', 1, 'A foo.')
    with self.assertRaisesRegex(ValueError, "'foo' is already defined"):
      p.Define('foo', 2, 'Again.')
    self.assertEqual(p.foo, 1)

  def testDefineRejectsInvalidNames(self):
    p = hyperparams.Params()
    for name in ('_hidden', '1abc', 'a.b', 'for', 'Copy', 'Set', ''):
      with self.assertRaisesRegex(ValueError, 'Invalid param name'):
        p.Define(name, 1, 'Bad.')
    self.assertEqual(len(p), 0)


class ParamsAccessTest(unittest.TestCase):

  def testUnknownKeyGivesDidYouMean(self):
    p = _ModelParams()
    with self.assertRaises(AttributeError) as ctx:
      _ = p.learnig_rate
    self.assertIsInstance(ctx.exception, hyperparams.UnknownParamError)
    self.assertIn("Did you mean 'learning_rate'", str(ctx.exception))
    with self.assertRaisesRegex(AttributeError, "Did you mean 'num_layers'"):
      p.num_layer = 3
    self.assertFalse(hasattr(p, 'num_layer'))

  def testUnknownKeyListsKnownKeysWhenFew(self):
    p = _ModelParams()
    with self.assertRaisesRegex(AttributeError, r"Known keys: \['encoder', "
                                r"'learning_rate', 'num_layers'\]"):
      p.Get('zzz')

  def testUnknownNestedKeyNamesFullPath(self):
    p = _ModelParams()
    with self.assertRaisesRegex(AttributeError,
                                r"'encoder.inner.rat'.*Did you mean 'rate'"):
      p.Set(**{'encoder.inner.rat': 0.1})

  def testSetReturnsSelfAndSetsMany(self):
    p = _ModelParams()
    self.assertIs(p.Set(learning_rate=0.2, num_layers=4), p)
    self.assertEqual((p.learning_rate, p.num_layers), (0.2, 4))

  def testSetDottedKeyReachesNestedParams(self):
    p = _ModelParams()
    p.Set(**{'encoder.dim': 32, 'encoder.inner.rate': 0.25})
    self.assertEqual(p.encoder.dim, 32)
    self.assertEqual(p.encoder.inner.rate, 0.25)
    self.assertEqual(p.Get('encoder.inner.rate'), 0.25)

  def testSetDottedKeyThroughNonParamsRaises(self):
    p = _ModelParams()
    with self.assertRaisesRegex(ValueError,
                                "'num_layers' is of type int, not Params"):
      p.Set(**{'num_layers.x': 1})

  def testSetIndexedKeyReachesListOfParams(self):
    p = hyperparams.Params()
    p.Define('layers', [_LayerParams(1), _LayerParams(2)], 'Layer params.')
    p.Set(**{'layers[1].dim': 5})
    self.assertEqual([l.dim for l in p.layers], [1, 5])
    self.assertEqual(p.Get('layers[1].dim'), 5)
    with self.assertRaisesRegex(ValueError, 'index 2 is out of range'):
      p.Set(**{'layers[2].dim': 5})

  def testSetIndexedKeyRebuildsTuples(self):
    p = hyperparams.Params()
    p.Define('pair', (_LayerParams(1), 7), 'A tuple holding params.')
    p.Set(**{'pair[1]': 9})
    self.assertIsInstance(p.pair, tuple)
    self.assertEqual(p.pair[1], 9)
    self.assertEqual(p.pair[0].dim, 1)

  def testDelete(self):
    p = _ModelParams()
    self.assertIs(p.Delete('num_layers', 'encoder.inner.rate'), p)
    self.assertNotIn('num_layers', p)
    self.assertNotIn('encoder.inner.rate', p)
    self.assertIn('encoder.dim', p)
    with self.assertRaisesRegex(AttributeError, 'num_layers'):
      p.Delete('num_layers')
    p.Define('num_layers', 3, 'Redefined after Delete.')
    self.assertEqual(p.num_layers, 3)

  def testContainsAcceptsDottedKeys(self):
    p = _ModelParams()
    self.assertIn('encoder.inner.rate', p)
    self.assertNotIn('encoder.inner.nope', p)
    self.assertNotIn('not a key', p)

  def testIterParamsInDefinitionOrder(self):
    p = _ModelParams()
    names = [name for name, _ in p]
    self.assertEqual(names, ['learning_rate', 'num_layers', 'encoder'])
    self.assertEqual(dict(p.IterParams())['num_layers'], 2)

  def testEqualityComparesValues(self):
    self.assertEqual(_ModelParams(), _ModelParams())
    other = _ModelParams().Set(**{'encoder.inner.rate': 0.3})
    self.assertNotEqual(_ModelParams(), other)
    self.assertNotEqual(_ModelParams(), 3)

  def testStrIsIndentedAndNested(self):
    p = _ModelParams()
    self.assertEqual(
        str(p), '{\n'
        '  learning_rate: 0.1\n'
        '  num_layers: 2\n'
        '  encoder: {\n'
        '    dim: 16\n'
        '    inner: {\n'
        '      rate: 0.5\n'
        '    }\n'
        '  }\n'
        '}')
    self.assertEqual(repr(p), str(p))


class ParamsCopyFreezeTest(unittest.TestCase):

  def testCopyIsDeep(self):
    p = _ModelParams()
    p.Define('sizes', [1, [2, 3]], 'Sizes.')
    p.Define('table', {'a': [1]}, 'A table.')
    q = p.Copy()
    self.assertEqual(p, q)
    q.encoder.inner.rate = 0.9
    q.sizes[1].append(4)
    q.table['a'].append(2)
    self.assertEqual(p.encoder.inner.rate, 0.5)
    self.assertEqual(p.sizes, [1, [2, 3]])
    self.assertEqual(p.table, {'a': [1]})
    self.assertIsNot(p.encoder, q.encoder)

  def testCopySharesClassesFunctionsAndDTypes(self):
    p = _LayerParams()
    p.Define('dtype', tf.float32, 'Dtype.')
    p.Define('activation', Relu, 'Activation.')
    q = p.Copy()
    self.assertIs(q.cls, Layer)
    self.assertIs(q.dtype, tf.float32)
    self.assertIs(q.activation, Relu)
    self.assertIs(copy.deepcopy(p).cls, Layer)

  def testCopyKeepsSubclass(self):
    q = _LayerParams().Copy()
    self.assertIsInstance(q, hyperparams.InstantiableParams)
    self.assertIsInstance(q.Instantiate(), Layer)

  def testFrozenParamsRejectWrites(self):
    p = _ModelParams()
    p.Define('layers', [_LayerParams()], 'Layers.')
    p.Freeze()
    self.assertTrue(p.IsFrozen())
    self.assertTrue(p.encoder.inner.IsFrozen())
    self.assertTrue(p.layers[0].IsFrozen())
    writes = [
        lambda: setattr(p, 'num_layers', 3),
        lambda: p.Set(num_layers=3),
        lambda: p.Set(**{'encoder.dim': 3}),
        lambda: setattr(p.encoder.inner, 'rate', 0.1),
        lambda: p.layers[0].Set(dim=3),
        lambda: p.Define('extra', 1, 'Extra.'),
        lambda: p.Delete('num_layers'),
        lambda: p.FromText('num_layers : 3'),
    ]
    for write in writes:
      with self.assertRaisesRegex(TypeError, r'frozen.*p\.Copy\(\)'):
        write()
    self.assertEqual(p.num_layers, 2)
    self.assertEqual(p.encoder.dim, 16)
    self.assertEqual(p.encoder.inner.rate, 0.5)
    self.assertEqual(p.layers[0].dim, 8)
    self.assertNotIn('extra', p)

  def testCopyOfFrozenIsMutable(self):
    p = _ModelParams().Freeze()
    q = p.Copy()
    self.assertFalse(q.IsFrozen())
    self.assertFalse(q.encoder.inner.IsFrozen())
    q.Set(**{'encoder.inner.rate': 0.3})
    self.assertEqual(q.encoder.inner.rate, 0.3)
    self.assertEqual(p.encoder.inner.rate, 0.5)

  def testPickleRoundTrip(self):
    p = _ModelParams()
    self.assertEqual(pickle.loads(pickle.dumps(p)), p)


class ParamsTextTest(unittest.TestCase):

  def _AllTypesParams(self):
    p = hyperparams.InstantiableParams(Layer)
    p.Define('count', 3, 'An int.')
    p.Define('neg', -7, 'A negative int.')
    p.Define('rate', 1e-5, 'A float.')
    p.Define('big', float('inf'), 'An infinite float.')
    p.Define('flag', True, 'A bool.')
    p.Define('nothing', None, 'None.')
    p.Define('name', 'it\'s "quoted"\n\ttab \\ slash', 'A tricky string.')
    p.Define('shape', [2, 3.5, None, 'x'], 'A list.')
    p.Define('pair', (1,), 'A one-tuple.')
    p.Define('table', {'a': [1, (2, 3)], 'b': {'c': None}}, 'A dict.')
    p.Define('color', Color.GREEN, 'An enum.')
    p.Define('dtype', tf.bfloat16, 'A dtype.')
    p.Define('dtypes', [tf.float32, tf.int32], 'Dtypes in a list.')
    p.Define('activation', Relu, 'A function.')
    p.Define('sub', hyperparams.Params(), 'Nested.')
    p.sub.Define('layer_cls', OtherLayer, 'A class.')
    return p

  def testToTextFormat(self):
    p = _ModelParams()
    p.Define('name', 'x', 'A string.')
    p.Define('dtype', tf.float32, 'A dtype.')
    p.Define('cls', Layer, 'A class.')
    self.assertEqual(
        p.ToText(),
        f'cls : type/{__name__}.Layer\n'
        'dtype : dtype:float32\n'
        'encoder.dim : 16\n'
        'encoder.inner.rate : 0.5\n'
        'learning_rate : 0.1\n'
        "name : 'x'\n"
        'num_layers : 2\n')

  def testToTextFromTextRoundTrip(self):
    source = self._AllTypesParams()
    source.Set(count=4, neg=-8, rate=2.5e-3, big=float('-inf'), flag=False,
               nothing=(1, 'a'), name='new \'"\\\n', shape=[[1], {'k': 2}],
               pair=(3, 4.0), table={'z': Point(1, 2)._asdict()['x']},
               color=Color.RED, dtype=tf.float16, dtypes=[tf.int64],
               activation=max, cls=OtherLayer, **{'sub.layer_cls': Layer})
    target = self._AllTypesParams()
    self.assertNotEqual(source, target)
    self.assertIs(target.FromText(source.ToText()), target)
    self.assertEqual(source, target)
    self.assertEqual(source.ToText(), target.ToText())
    self.assertIs(target.dtype, tf.float16)
    self.assertIs(target.cls, OtherLayer)
    self.assertIs(target.activation, max)
    self.assertIsInstance(target.pair, tuple)

  def testFromTextParsesNan(self):
    p = hyperparams.Params()
    p.Define('x', 1.0, 'A float.')
    p.FromText('x : nan')
    self.assertTrue(math.isnan(p.x))

  def testFromTextOwnTextNeverFails(self):

    class LocalLayer:
      pass

    p = self._AllTypesParams()
    p.Define('local_cls', LocalLayer, 'A class FromText cannot import.')
    p.Define('fn', lambda x: x, 'A lambda FromText cannot import.')
    p.Define('obj', object(), 'An arbitrary object.')
    text = p.ToText()
    p.FromText(text)
    self.assertEqual(p.ToText(), text)
    with self.assertRaisesRegex(ValueError, "'local_cls'.*cannot resolve"):
      p.FromText(f'local_cls : type/{__name__}.NoSuchClass')

  def testToTextOfPlainObjectsIsDeterministic(self):
    p = hyperparams.Params()
    p.Define('init', Layer(None, scale=2), 'An object without a repr.')
    text = p.ToText()
    self.assertEqual(
        text, f"init : {__name__}.Layer(kwargs={{'scale': 2}}, params=None)\n")
    self.assertEqual(p.TextDiff(p.Copy()), '')
    p.FromText(text)  # Unchanged, so it is not parsed.
    with self.assertRaisesRegex(ValueError, "cannot parse the value of 'init'"):
      p.FromText(f'init : {__name__}.Layer(kwargs={{}}, params=None)')

  def testFromTextIntoFloatAcceptsInt(self):
    p = _ModelParams()
    p.FromText('learning_rate : 3')
    self.assertEqual(p.learning_rate, 3.0)
    self.assertIsInstance(p.learning_rate, float)

  def testFromTextRejectsWrongType(self):
    p = _ModelParams()
    with self.assertRaisesRegex(
        ValueError, r"'num_layers' has type int \(value 2\), but the text "
        "'0.5' is of type float; write a value of type int"):
      p.FromText('num_layers : 0.5')
    with self.assertRaisesRegex(ValueError, "'encoder.dim' has type int"):
      p.FromText("encoder.dim : 'wide'")
    with self.assertRaisesRegex(ValueError, 'has type float'):
      p.FromText('learning_rate : True')
    with self.assertRaisesRegex(ValueError, 'has type int'):
      p.FromText('num_layers : 7\nencoder.dim : 0.5')
    self.assertEqual(p, _ModelParams())  # Nothing was set, not even line 1.

  def testFromTextNoneDefaultAcceptsAnyValue(self):
    p = hyperparams.Params()
    p.Define('a', None, 'Anything.')
    p.Define('b', None, 'Anything.')
    p.Define('c', 3, 'An int that may become None.')
    p.FromText(f'a : [1, 2]\nb : type/{__name__}.Layer\nc : None')
    self.assertEqual(p.a, [1, 2])
    self.assertIs(p.b, Layer)
    self.assertIsNone(p.c)

  def testFromTextUnknownKeyGivesDidYouMean(self):
    p = _ModelParams()
    with self.assertRaisesRegex(AttributeError,
                                r"'encoder.dimm'.*Did you mean 'dim'"):
      p.FromText('encoder.dimm : 4')

  def testFromTextRejectsMalformedLinesAndValues(self):
    p = _ModelParams()
    with self.assertRaisesRegex(ValueError, 'line 2.*"key : value"'):
      p.FromText('num_layers : 3\nnum_layers 4')
    with self.assertRaisesRegex(ValueError, "cannot parse the value of 'num"):
      p.FromText('num_layers : [1, 2')

  def testFromTextSkipsCommentsAndBlankLines(self):
    p = _ModelParams()
    p.FromText('# a comment\n\n  num_layers : 5  \n')
    self.assertEqual(p.num_layers, 5)

  def testTextLinesReadEveryValueToTextWrites(self):
    """The one parser of Params text: a key ends at the first ':', a value
    may hold ' : ', quotes, escapes and line-break characters (repr writes
    them escaped, so a value is one line)."""
    p = hyperparams.Params()
    p.Define('a', 'x : y', 'A string holding the separator.')
    p.Define('b', '', 'An empty string.')
    p.Define('c', 'line\nbreak\x1c\u2028', 'Line-break characters.')
    p.Define('d', {'k : 1': [1, (2,)]}, 'A dict.')
    p.Define('e', None, 'None.')
    p.Define('layers', [_LayerParams(3)], 'Flattened with an index.')
    text = p.ToText()
    self.assertEqual(params_format.TextLines(text), [
        (1, 'a', "'x : y'"),
        (2, 'b', "''"),
        (3, 'c', "'line\\nbreak\\x1c\\u2028'"),
        (4, 'd', "{'k : 1': [1, (2,)]}"),
        (5, 'e', 'None'),
        (6, 'layers[0].cls', f'type/{__name__}.Layer'),
        (7, 'layers[0].dim', '3'),
    ])
    self.assertEqual(params_format.TextValues(text)['a'], "'x : y'")
    q = p.Copy()
    q.Set(a='', b='z', c=None)
    q.FromText(text)  # every value parses back from its text
    self.assertEqual(q.ToText(), text)

  def testTextLinesSkipBlankAndCommentLinesAndRejectOtherForms(self):
    text = '# a comment\n\n  k : v  \nj:w\nk : last\n'
    self.assertEqual(params_format.TextLines(text),
                     [(3, 'k', 'v'), (4, 'j', 'w'), (5, 'k', 'last')])
    self.assertEqual(params_format.TextValues(text), {'k': 'last', 'j': 'w'})
    self.assertEqual(params_format.TextLines('k :\n')[0].value, '')
    for bad, number in (('k v', 1), ('k : 1\n: v', 2)):
      with self.assertRaisesRegex(ValueError, f'line {number}: .* is not of '
                                  'the form "key : value"'):
        params_format.TextLines(bad)
    self.assertEqual(params_format.TextLines('k v\n: v\nk : 1',
                                             skip_malformed=True),
                     [(3, 'k', '1')])
    self.assertIsNone(params_format.ParseTextLine('  # k : v'))
    self.assertEqual(params_format.ParseTextLine(' k : a : b '), ('k', 'a : b'))

  def testListsOfParamsAreFlattenedWithIndices(self):
    p = hyperparams.Params()
    p.Define('layers', [_LayerParams(1), _LayerParams(2)], 'Layers.')
    p.Define('partitions', [[_LayerParams(3)], [_LayerParams(4), 5]],
             'Layers per partition.')
    p.Define('empty', [], 'No layers.')
    text = p.ToText()
    self.assertEqual(
        text, 'empty : []\n'
        'layers[0].cls : type/%(m)s.Layer\n'
        'layers[0].dim : 1\n'
        'layers[1].cls : type/%(m)s.Layer\n'
        'layers[1].dim : 2\n'
        'partitions[0][0].cls : type/%(m)s.Layer\n'
        'partitions[0][0].dim : 3\n'
        'partitions[1][0].cls : type/%(m)s.Layer\n'
        'partitions[1][0].dim : 4\n'
        'partitions[1][1] : 5\n' % {'m': __name__})
    other = p.Copy()
    other.layers[1].dim = 20
    other.partitions[1][1] = 50
    p.FromText(other.ToText())
    self.assertEqual(p, other)

  def testFromTextRejectsListsOfParamsGivenAsOneValue(self):
    p = hyperparams.Params()
    p.Define('layers', [_LayerParams(1)], 'Layers.')
    p.Define('dim', 1, 'Width.')
    for text in ('layers : []', 'layers : [1, 2]', 'layers : None'):
      with self.assertRaisesRegex(
          ValueError, r"'layers' holds Params in a list of length 1.*"
          r"indexed keys.*layers\[0\]"):
        p.FromText('dim : 2\n' + text)
    self.assertEqual(len(p.layers), 1)
    self.assertEqual(p.dim, 1)  # all lines are checked before any is set
    p.FromText('layers[0].dim : 5')
    self.assertEqual(p.layers[0].dim, 5)

  def testFromTextDeepNestingIsAValueError(self):
    p = hyperparams.Params()
    p.Define('shape', None, 'Any value.')
    depth = params_format.MAX_TEXT_NESTING
    p.FromText('shape : ' + '[' * depth + ']' * depth)
    for n in (depth + 1, 5000):
      with self.assertRaisesRegex(
          ValueError, r"'shape'.*nests brackets more than 100 levels"):
        p.FromText('shape : ' + '[' * n + ']' * n)

  def testTextDiff(self):
    p = _ModelParams()
    q = _ModelParams()
    self.assertEqual(p.TextDiff(q), '')
    q.Set(num_layers=3, **{'encoder.inner.rate': 0.0})
    q.encoder.Delete('dim')
    q.Define('extra', 'e', 'Only in q.')
    self.assertEqual(
        p.TextDiff(q), '- encoder.dim : 16\n'
        '- encoder.inner.rate : 0.5\n'
        '+ encoder.inner.rate : 0.0\n'
        "+ extra : 'e'\n"
        '- num_layers : 2\n'
        '+ num_layers : 3\n')


class InstantiableParamsTest(unittest.TestCase):

  def testInstantiateCallsCls(self):
    p = _LayerParams(dim=4)
    layer = p.Instantiate(extra=1)
    self.assertIsInstance(layer, Layer)
    self.assertIs(layer.params, p)
    self.assertEqual(layer.kwargs, {'extra': 1})

  def testClsCanBeCalledDirectly(self):
    p = _LayerParams()
    self.assertIs(p.cls(p).params, p)

  def testInstantiateWithoutClsRaises(self):
    p = hyperparams.InstantiableParams()
    self.assertIsNone(p.cls)
    with self.assertRaisesRegex(ValueError, 'cls is None.*p.cls = MyLayer'):
      p.Instantiate()

  def testClsIsDocumented(self):
    self.assertIn('class to instantiate',
                  hyperparams.InstantiableParams().Description('cls'))


if __name__ == '__main__':
  unittest.main()
