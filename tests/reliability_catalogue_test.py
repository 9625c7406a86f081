"""Catalogue of bad inputs and faults run through the library, in-process.

Each case is a row of `CASES` with the id of the reliability probe
(../shared/notes/reliability-probe.md: the L* rows, T04 and T09 at library
level) or a new id (X*), and one expected outcome:

  error:   the call raises `error` with a one-line message that names the
           offending value (regex `value`) and says what to do (regex `fix`);
  warning: the call succeeds and logs one warning naming the value and fix;
  correct: the call succeeds and `check(test, result)` compares it with an
           oracle (the same layers unpipelined, or NumPy).

Oracles run in float64 where the claim is exactness, with tolerances that
scale with the values. The trainer-process cases of the probe (T*, C*, W*,
M*, R*, X1, H1, D*) belong to the trainer's catalogue, not here.
"""

import dataclasses
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from tensorpipe import devices
from tensorpipe import hyperparams
from tensorpipe import microbatch
from tensorpipe import overrides
from tensorpipe import pipeline
from tensorpipe import py_utils
from tensorpipe import test_utils
from tensorpipe.layers import composite
from tensorpipe.layers import conv
from tensorpipe.layers import dropout
from tensorpipe.layers import linear
from tensorpipe.layers import normalization
from tensorpipe.nested_map import NestedMap

test_utils.ConfigureTestDevices()

F64 = tf.float64
_NUM = test_utils.NUM_TEST_DEVICES  # logical CPUs: /CPU:0 .. /CPU:7


@dataclasses.dataclass(frozen=True)
class Case:
  """One bad input or fault and its expected outcome (see module docstring)."""
  id: str
  what: str
  run: Callable[[], Any]
  error: Optional[type] = None
  value: str = ''
  fix: str = ''
  warning: bool = False
  check: Optional[Callable[[tf.test.TestCase, Any], None]] = None

  @property
  def verdict(self) -> str:
    if self.error is not None:
      return 'clear error'
    return 'clear warning' if self.warning else 'correct'


# -- builders -----------------------------------------------------------------


def Convs(n, prefix='conv', channels=1, dtype=None):
  return [conv.Conv2DLayer.Params().Set(
      name=f'{prefix}{i}', filter_shape=(3, 3, channels, channels),
      dtype=dtype) for i in range(n)]


def FCs(n, dim=4, prefix='fc', dtype=F64, activation='TANH'):
  return [linear.FCLayer.Params().Set(
      name=f'{prefix}{i}', input_dim=dim, output_dim=dim, dtype=dtype,
      activation=activation) for i in range(n)]


def BN(name='bn', dim=4, dtype=F64):
  return normalization.BatchNormLayer.Params().Set(name=name, dim=dim,
                                                   dtype=dtype)


def Pipe(**kwargs):
  return pipeline.TensorPipeLayer.Params().Set(name='TP', **kwargs
                                               ).Instantiate()


def Seq(layer_ps):
  return composite.SequentialLayer.Params().Set(
      name='Seq', sub=list(layer_ps)).Instantiate()


def Split(layer_ps, k):
  n = len(layer_ps) // k
  return [layer_ps[i * n:(i + 1) * n] for i in range(k)]


def X(shape, seed=1, dtype=F64):
  return tf.random.stateless_normal(shape, [seed, 7], dtype=dtype)


def AssertClose(test, expected, actual):
  """Equal up to float64 rounding, scaled by the values' magnitude."""
  expected, actual = np.asarray(expected), np.asarray(actual)
  test.assertEqual(expected.shape, actual.shape)
  scale = max(float(np.max(np.abs(expected), initial=0.0)), 1.0)
  np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12 * scale)


def Training(fn):
  def Run():
    with py_utils.TrainingMode(True):
      return fn()
  return Run


# -- correct-behaviour cases --------------------------------------------------


def _PipeVsOracle(layer_ps, x, train=True, **pipe_kwargs):
  """(pipeline output, unpipelined output) on the same weights."""
  pipe, ref = Pipe(**pipe_kwargs), Seq(layer_ps)
  with py_utils.TrainingMode(train):
    return pipe.FPropDefaultTheta(x), ref.FPropDefaultTheta(x)


def MicroBatchSizeAlone():
  # BN over [16, 4] normalises each micro-batch: 4 groups of 4 examples.
  fc, bn = FCs(1, activation='NONE'), BN()
  pipe = Pipe(partitions=[fc, [bn]], micro_batch_size=4)
  x = X([16, 4])
  with py_utils.TrainingMode(True):
    out = pipe.FPropDefaultTheta(x)
  layer = pipe.PartitionLayers()[0][0]
  h = x.numpy() @ layer.vars.w.numpy() + layer.vars.b.numpy()
  groups = h.reshape(4, 4, 4)
  want = (groups - groups.mean(1, keepdims=True)) / np.sqrt(
      groups.var(1, keepdims=True) + 1e-3)
  whole = (h - h.mean(0)) / np.sqrt(h.var(0) + 1e-3)
  return out, want.reshape(16, 4), whole


def CheckMicroBatchSizeAlone(test, result):
  out, want, whole = result
  # Batch norm computes in float32 by design: the float64 oracle agrees to
  # float32 rounding of O(1) normalised values (a few 1e-7), not to 1e-12.
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-5)
  # Normalising over the whole batch (T=1) would be off by O(1).
  test.assertGreater(float(np.abs(out - whole).max()), 0.1)


def StaticLeaves():
  idp = lambda n: composite.IdentityLayer.Params().Set(name=n)
  pipe = Pipe(partitions=[[idp('a')], [idp('b')]], num_micro_batches=2)
  with py_utils.TrainingMode(True):
    return pipe.FPropDefaultTheta(NestedMap(x=X([16, 4]), n=None, i=3))


def CheckStaticLeaves(test, out):
  test.assertIsNone(out.n)
  test.assertEqual(out.i, 3)
  AssertClose(test, X([16, 4]), out.x)


def InputGradients():
  layer_ps = FCs(4)
  pipe, ref = Pipe(partitions=Split(layer_ps, 2), num_micro_batches=4), Seq(
      layer_ps)
  x = X([8, 4])
  grads = []
  for layer in (pipe, ref):
    with tf.GradientTape() as tape, py_utils.TrainingMode(True):
      tape.watch(x)
      loss = tf.reduce_sum(tf.square(layer.FPropDefaultTheta(x)))
    grads.append(tape.gradient(loss, x))
  return grads


def PlainCallKeepsMovingStats():
  pipe = Pipe(partitions=[[BN('bn0')], [BN('bn1')]], num_micro_batches=2)
  moving = [v for v in pipe.variables if 'moving' in v.name]
  before = [v.numpy().copy() for v in moving]
  out = pipe(X([8, 4]) + 3.0)
  with py_utils.EvalMode():
    want = pipe.FPropDefaultTheta(X([8, 4]) + 3.0)
  return before, [v.numpy() for v in moving], out, want


def CheckPlainCall(test, result):
  before, after, out, want = result
  test.assertLen(before, 4)
  for b, a in zip(before, after):
    np.testing.assert_array_equal(b, a)
  AssertClose(test, want, out)


def EvalModeMatchesSequential():
  layer_ps = [FCs(1, prefix='a')[0], BN('bn0'), FCs(1, prefix='b')[0],
              BN('bn1')]
  pipe = Pipe(partitions=Split(layer_ps, 2), num_micro_batches=4)
  ref = Seq(layer_ps)
  for layer in (pipe, ref):  # same non-trivial moving statistics in both
    for v in layer.variables:
      if 'moving_mean' in v.name:
        v.assign(tf.constant([0.5, -1.0, 2.0, 0.0], F64))
  with py_utils.EvalMode():
    return pipe.FPropDefaultTheta(X([8, 4])), ref.FPropDefaultTheta(X([8, 4]))


def NanPropagates():
  pipe = Pipe(partitions=Split(FCs(2), 2), num_micro_batches=2)
  x = X([4, 4]).numpy()
  x[1, 2] = np.nan
  out = pipe.FPropDefaultTheta(tf.constant(x)).numpy()
  return out


def CheckNan(test, out):
  # Row 1 depends on the NaN; the other rows do not.
  test.assertTrue(np.isnan(out[1]).all())
  test.assertFalse(np.isnan(out[[0, 2, 3]]).any())


def DynamicBatchInTfFunction():
  # autograph=False: autograph adds the traced call stack to any error
  # raised in a user's function; the library's own message is one line.
  pipe = Pipe(partitions=Split(FCs(2), 2), num_micro_batches=2)
  fn = tf.function(pipe.FPropDefaultTheta, autograph=False,
                   input_signature=[tf.TensorSpec([None, 4], F64)])
  return fn(X([4, 4]))


def SplitMergeBatchDimOne():
  x = np.arange(2 * 6 * 3, dtype=np.float64).reshape(2, 6, 3)
  stacked = microbatch.Split(tf.constant(x), 3, batch_dim=1)
  t1 = microbatch.Slice(stacked, 1)
  merged = microbatch.Merge(stacked, batch_dim=1)
  return t1, x[:, 2:4], merged, x


def CheckSplitMerge(test, result):
  t1, want_t1, merged, x = result
  np.testing.assert_array_equal(want_t1, t1)
  np.testing.assert_array_equal(x, merged)


def FloatInputCast():
  # float64 input into a float32 pipeline: cast to the layer dtype.
  layer_ps = FCs(2, dtype=tf.float32)
  out, ref = _PipeVsOracle(layer_ps, X([4, 4]),
                           partitions=Split(layer_ps, 2), num_micro_batches=2)
  return out, ref


def CheckFloatInputCast(test, result):
  out, ref = result
  test.assertEqual(out.dtype, tf.float32)
  # The same float32 ops on the same rows; only the kernels' blocking may
  # differ with the row count. Two layers of 4-term dot products of O(1)
  # values round to a few float32 ulps (eps 6e-8): 1e-5 leaves a margin.
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def IntInputCast():
  # Small integers are exact in float32: int32 and float32 inputs must give
  # bit-identical outputs.
  layer_ps = FCs(2, dtype=tf.float32)
  pipe = Pipe(partitions=Split(layer_ps, 2), num_micro_batches=2)
  x = tf.reshape(tf.range(16, dtype=tf.int32) % 5 - 2, [4, 4])
  return pipe.FPropDefaultTheta(x), pipe.FPropDefaultTheta(
      tf.cast(x, tf.float32))


def OverrideQuotedSemicolon():
  p = hyperparams.Params()
  p.Define('name', 'x', 'A name.')
  p.Define('steps', 1, 'Steps.')
  overrides.ApplyOverrides(p, "name='a;b'; steps=3")
  return p.name, p.steps


def TextRoundTrip():
  p = pipeline.TensorPipeLayer.Params().Set(
      name='TP', layers=FCs(2), num_partitions=2, input_shapes=[[4, 4]])
  q = pipeline.TensorPipeLayer.Params()
  q.layers = FCs(2)
  q.layers[1].output_dim = 7
  q.FromText(p.ToText())
  return p.TextDiff(q)


# -- error helpers -----------------------------------------------------------


def FromText(text, **defaults):
  p = pipeline.TensorPipeLayer.Params().Set(name='TP', layers=FCs(2),
                                            **defaults)
  return lambda: p.FromText(text)


def Override(text):
  p = hyperparams.Params()
  p.Define('task', pipeline.TensorPipeLayer.Params().Set(layers=FCs(2)),
           'The model.')
  return lambda: overrides.ApplyOverrides(p, text)


def SetAttr(obj, name, value):
  return lambda: setattr(obj, name, value)


def _FrozenParams():
  return FCs(1)[0].Instantiate().params


def _Fprop(layer_fn, *inputs, train=True):
  def Run():
    layer = layer_fn()
    with py_utils.TrainingMode(train):
      return layer.FPropDefaultTheta(*inputs)
  return Run


def _SecondLogicalCpuInit():
  devices.SetNumLogicalCpuDevices(test_utils.NUM_TEST_DEVICES + 3)


CASES = [
    # -- Params -------------------------------------------------------------
    Case('L01', 'misspelled key in Set',
         lambda: pipeline.TensorPipeLayer.Params().Set(num_micro_batch=4),
         hyperparams.UnknownParamError, r"'num_micro_batch'",
         r"Did you mean 'num_micro_batches'"),
    Case('L02', 'misspelled attribute',
         SetAttr(pipeline.TensorPipeLayer.Params(), 'num_partition', 4),
         hyperparams.UnknownParamError, r"'num_partition'",
         r"Did you mean 'num_partitions'"),
    Case('L22e', 'mutating the frozen params of a built layer',
         lambda: setattr(_FrozenParams(), 'output_dim', 8), TypeError,
         r"'output_dim'.*frozen", r'p\.Copy\(\)'),
    Case('X01', 'Define twice',
         lambda: pipeline.TensorPipeLayer.Params().Define('name', 1, 'x'),
         ValueError, r"'name' is already defined", r'set it with p\.name'),
    Case('X02', 'Instantiate without a class',
         lambda: hyperparams.InstantiableParams().Instantiate(), ValueError,
         r'cls is None', r'p\.cls = MyLayer'),
    Case('X03', 'layer without a name',
         lambda: linear.FCLayer.Params().Set(input_dim=2, output_dim=2
                                             ).Instantiate(),
         ValueError, r'name is empty', r'set a name'),
    Case('X04', "layer name with '/'",
         lambda: linear.FCLayer.Params().Set(name='a/b', input_dim=2,
                                             output_dim=2).Instantiate(),
         ValueError, r"'a/b'", r"without '/'"),
    Case('L17a', 'FromText: unparseable value',
         FromText('num_partitions : 4x'), ValueError,
         r"'num_partitions', '4x'", r'cannot parse'),
    Case('L17b', 'FromText: no colon', FromText('num_partitions 4'),
         ValueError, r"'num_partitions 4'", r'form "key : value"'),
    Case('L17c', 'FromText: unknown key', FromText('num_partition : 4'),
         hyperparams.UnknownParamError, r"'num_partition'",
         r"Did you mean 'num_partitions'"),
    Case('L17d', 'FromText: unterminated string',
         FromText("name : 'abc"), ValueError, r"'name'.*'abc",
         r'unterminated string'),
    Case('L17e', 'FromText: list index out of range',
         FromText('layers[5].input_dim : 3'), ValueError,
         r"'layers\[5\]\.input_dim'.*index 5", r'has 2 elements'),
    Case('L17f', 'FromText: float for an int', FromText('batch_dim : 2.5'),
         ValueError, r"'batch_dim'.*'2\.5'", r'write a value of type int'),
    Case('L17g', 'FromText: trailing text', FromText('batch_dim : 2 3'),
         ValueError, r"'batch_dim'.*' 3'", r'unexpected trailing text'),
    Case('L17h', 'FromText: unbalanced bracket',
         FromText('input_shapes : [[4, 4]'), ValueError,
         r"'input_shapes', '\[\[4, 4\]'", r'expected "," or'),
    Case('L17i', "FromText: 'True' for an int", FromText('batch_dim : True'),
         ValueError, r"'batch_dim'.*'True'.*bool", r'type int'),
    Case('L17k', 'FromText: 5000 nested brackets',
         FromText('input_shapes : ' + '[' * 5000 + ']' * 5000), ValueError,
         r"'input_shapes'.*more than 100 levels", r'flatten it'),
    Case('L17n', 'FromText: a value for a list of layer Params',
         FromText('layers : []'), ValueError,
         r"'layers' holds Params in a list of length 2.*'\[\]'",
         r'indexed keys, e\.g\. "layers\[0\]\.name : value"'),
    Case('L17n2', 'override: task.layers=[] (list of layer Params)',
         Override('task.layers=[]'), ValueError,
         r"'task\.layers' holds Params", r'indexed keys'),
    Case('L17p', "override: ';' inside a quoted value",
         OverrideQuotedSemicolon,
         check=lambda t, r: t.assertEqual(r, ('a;b', 3))),
    Case('L17q', 'FromText(ToText()) restores another config',
         TextRoundTrip, check=lambda t, diff: t.assertEqual(diff, '')),
    Case('T04a', "override without '='", Override('task.batch_dim'),
         ValueError, r"'task\.batch_dim'", r'form key=value'),
    Case('T04b', 'override without a value', Override('task.batch_dim='),
         ValueError, r"'task\.batch_dim='", r'no value after'),
    Case('T04c', 'override: unquoted string', Override('task.name=abc'),
         ValueError, r"'task\.name', 'abc'", r'quote strings'),
    Case('T04d', 'override: misspelled key', Override('task.batch_dm=1'),
         ValueError, r"'task\.batch_dm'", r"Did you mean 'batch_dim'"),
    # -- pipeline construction -----------------------------------------------
    Case('L03', "num_micro_batches='4'",
         lambda: Pipe(partitions=[Convs(1)], num_micro_batches='4'),
         TypeError, r"num_micro_batches.*'4' of type str",
         r'pass a Python int'),
    Case('L04', 'num_micro_batches=4.0',
         lambda: Pipe(partitions=[Convs(1)], num_micro_batches=4.0),
         TypeError, r'num_micro_batches.*4\.0 of type float',
         r'pass a Python int'),
    Case('L05', 'num_micro_batches=0',
         lambda: Pipe(partitions=[Convs(1)], num_micro_batches=0),
         ValueError, r'num_micro_batches=0', r'use num_micro_batches >= 1'),
    Case('L06', 'num_micro_batches=-2',
         lambda: Pipe(partitions=[Convs(1)], num_micro_batches=-2),
         ValueError, r'num_micro_batches=-2', r'use num_micro_batches >= 1'),
    Case('L08', 'num_micro_batches and micro_batch_size',
         lambda: Pipe(partitions=[Convs(1)], num_micro_batches=4,
                      micro_batch_size=4),
         ValueError, r'num_micro_batches=4 and micro_batch_size=4',
         r'set num_micro_batches=None to use micro_batch_size=4'),
    Case('L08b', 'micro_batch_size=True',
         lambda: Pipe(partitions=[Convs(1)], micro_batch_size=True),
         TypeError, r'micro_batch_size.*True of type bool',
         r'pass a Python int'),
    Case('L08c', 'micro_batch_size alone (num_micro_batches default)',
         MicroBatchSizeAlone, check=CheckMicroBatchSizeAlone),
    Case('L09', 'num_partitions > number of layers',
         lambda: Pipe(layers=FCs(8), num_partitions=9,
                      input_shapes=[[16, 4]]),
         ValueError, r'num_partitions=9.*\(8\)', r'num_partitions <= 8'),
    Case('L09b', 'num_partitions=0',
         lambda: Pipe(layers=FCs(2), num_partitions=0), ValueError,
         r'num_partitions=0', r'must be a positive int'),
    Case('L09c', 'num_partitions=True (bool)',
         lambda: Pipe(layers=FCs(2), num_partitions=True), ValueError,
         r'num_partitions=True', r'must be a positive int'),
    Case('L09d', "num_partitions='4'",
         lambda: Pipe(layers=FCs(4), num_partitions='4'), ValueError,
         r"num_partitions='4'", r'must be a positive int'),
    Case('L09e', 'automatic partitioning without input_shapes',
         lambda: Pipe(layers=FCs(4), num_partitions=2), ValueError,
         r'automatic partitioning into 2 partitions', r'set input_shapes'),
    Case('L09f', 'more partitions than devices',
         lambda: Pipe(partitions=[[p] for p in FCs(_NUM + 1)]), ValueError,
         rf'{_NUM + 1} partitions need {_NUM + 1} devices but only {_NUM}',
         rf'SetNumLogicalCpuDevices\({_NUM + 1}\)'),
    Case('L10', 'two devices for four partitions',
         lambda: Pipe(partitions=Split(FCs(4), 4), devices=['/CPU:0',
                                                            '/CPU:1']),
         ValueError, r"devices=\['/CPU:0', '/CPU:1'\] has 2 entries for 4",
         r'exactly one device per partition'),
    Case('L11', '/CPU:9 with 8 logical CPUs',
         lambda: Pipe(partitions=Split(Convs(4), 4),
                      devices=['/CPU:0', '/CPU:1', '/CPU:2', '/CPU:9']),
         ValueError, r"device '/CPU:9' does not exist.*'/device:CPU:7'",
         r'SetNumLogicalCpuDevices\(n\)'),
    Case('T09', '/GPU:5 on a host without it',
         lambda: Pipe(partitions=[Convs(1)], devices=['/GPU:5']),
         ValueError, r"device '/GPU:5' does not exist.*'/device:CPU:0'",
         r'use one of them'),
    Case('L11c', "device 'foo'",
         lambda: Pipe(partitions=[Convs(1)], devices=['foo']), ValueError,
         r"'foo' is not a valid device name", r'names like "/GPU:0"'),
    Case('L11d', 'remote device without a connected cluster',
         lambda: Pipe(partitions=[Convs(1)],
                      devices=['/job:worker/task:1/device:CPU:0']),
         ValueError, r"'/job:worker/task:1/device:CPU:0' does not exist",
         r'experimental_connect_to_cluster'),
    Case('L11e', 'devices given as one string',
         lambda: Pipe(partitions=[Convs(1)], devices='/CPU:0'), TypeError,
         r"devices='/CPU:0' is a string", r"give a list.*\['/CPU:0'\]"),
    Case('L12', 'partitions=[]', lambda: Pipe(partitions=[]), ValueError,
         r'partitions is empty', r'give K >= 1 lists'),
    Case('L13', 'partitions as a flat list of layer Params',
         lambda: Pipe(partitions=Convs(2)), TypeError,
         r"partitions\[0\] must be a list.*'conv0'",
         r'give K lists of layer Params'),
    Case('L13b', 'partitions nested three deep',
         lambda: Pipe(partitions=[[Convs(1)]]), TypeError,
         r"CreateChild\('partition_0_0'\).*got a list of 1",
         r'needs layer Params.*nesting level too many'),
    Case('L13c', 'an empty partition',
         lambda: Pipe(partitions=[Convs(1), []]), ValueError,
         r'partition 1 is empty', r'at least one layer'),
    Case('L13d', 'partitions and layers both set',
         lambda: Pipe(partitions=[Convs(1)], layers=Convs(1)), ValueError,
         r'set either `partitions`', r'not both'),
    Case('L13e', 'a str among the layers',
         lambda: Pipe(layers=['conv']), TypeError, r"got str: 'conv'",
         r'needs layer Params'),
    Case('L13f', 'duplicate layer names in different partitions',
         lambda: Pipe(partitions=[Convs(2), Convs(2)]), ValueError,
         r"'conv0' is used in partition 0 and in partition 1",
         r'must be unique.*rename one'),
    Case('L13g', 'duplicate layer names after automatic partitioning',
         lambda: Pipe(layers=Convs(2) + Convs(2), num_partitions=2,
                      input_shapes=[[4, 8, 8, 1]]),
         ValueError, r"'conv0' is used in partition 0 and in partition 1",
         r'rename one'),
    Case('L14', 'shapes that do not chain, with input_shapes',
         lambda: Pipe(partitions=[Convs(2), Convs(1, 'bad', channels=4)],
                      input_shapes=[[16, 8, 8, 1]]),
         ValueError, r"layer 2 \(Conv2DLayer 'bad0'\).*4",
         r'does not accept'),
    Case('L14d', 'input_shapes as one shape',
         lambda: Pipe(partitions=[Convs(1)], input_shapes=[16, 8, 8, 1]),
         ValueError, r'input_shapes=\[16, 8, 8, 1\] looks like one shape',
         r'give a list.*\[\[16, 8, 8, 1\]\]'),
    Case('L22a', 'batch_dim=-1',
         lambda: Pipe(partitions=[Convs(1)], batch_dim=-1), ValueError,
         r'batch_dim=-1', r'must be an int >= 0'),
    Case('L22b', "partition_method='greedy'",
         lambda: Pipe(layers=FCs(4), num_partitions=2, input_shapes=[[4, 4]],
                      partition_method='greedy'),
         ValueError, r"'greedy'", r"'min_max'"),
    Case('L22c', "recompute_impl='magic'",
         lambda: Pipe(partitions=[Convs(1)], recompute_impl='magic'),
         ValueError, r"recompute_impl='magic'", r'is not one of'),
    Case('L22d', 'input_shapes of the wrong rank',
         lambda: Pipe(partitions=[Convs(1)], input_shapes=[[16, 8, 8]]),
         ValueError, r"Conv2DLayer 'conv0'.*\(16, 8, 8\)",
         r'must be \[batch, height, width, channels\]'),
    # -- pipeline FProp --------------------------------------------------------
    Case('L07', 'batch 16, T=3',
         _Fprop(lambda: Pipe(partitions=[Convs(1)], num_micro_batches=3),
                tf.zeros([16, 8, 8, 1])),
         ValueError, r'batch size 16 is not divisible by num_micro_batches=3',
         r'multiple of 3'),
    Case('L08d', 'batch 16, micro_batch_size=5',
         _Fprop(lambda: Pipe(partitions=[Convs(1)], micro_batch_size=5),
                tf.zeros([16, 8, 8, 1])),
         ValueError, r'batch size 16 .* micro_batch_size=5',
         r'one of 1, 2, 4, 8, 16'),
    Case('L14b', 'shapes that do not chain, found at the first FProp',
         _Fprop(lambda: Pipe(partitions=[Convs(1), Convs(1, 'bad', 4)],
                             num_micro_batches=2), tf.zeros([4, 8, 8, 1])),
         ValueError, r"layer 1 \(Conv2DLayer 'bad0'\)", r'does not accept'),
    Case('L14c', 'three channels into a one-channel conv',
         _Fprop(lambda: Pipe(partitions=[Convs(1)]), tf.zeros([4, 8, 8, 3])),
         ValueError, r"Conv2DLayer 'conv0'.*3", r'does not accept'),
    Case('L16', 'NestedMap tensors disagree on the batch',
         _Fprop(lambda: Pipe(partitions=[[composite.IdentityLayer.Params()
                                          .Set(name='id')]],
                             num_micro_batches=2),
                NestedMap(x=tf.zeros([16, 2]), y=tf.zeros([8, 2]))),
         ValueError, r'x has 16 but .*y has 8',
         r'need the same batch size'),
    Case('L16d', 'NestedMap fed to a conv stack',
         _Fprop(lambda: Pipe(partitions=[Convs(1)]),
                NestedMap(image=tf.zeros([4, 8, 8, 1]))),
         ValueError, r"layer 0 \(Conv2DLayer 'conv0'\).*image",
         r'does not accept'),
    Case('L16b', 'None and int leaves in a NestedMap input', StaticLeaves,
         check=CheckStaticLeaves),
    Case('L16c', 'NestedMap holding no tensor',
         _Fprop(lambda: Pipe(partitions=[Convs(1)]), NestedMap(n=None)),
         ValueError, r'inputs hold no tensor', r'pass at least one tf.Tensor'),
    Case('L15', 'float64 input into a float32 pipeline', FloatInputCast,
         check=CheckFloatInputCast),
    Case('L15b', 'int32 input into a float32 pipeline', IntInputCast,
         check=lambda t, r: np.testing.assert_array_equal(r[0], r[1])),
    Case('L18', 'FProp batch 32 while input_shapes says 16',
         lambda: _PipeVsOracle(FCs(4), X([32, 4]), layers=FCs(4),
                               num_partitions=2, num_micro_batches=4,
                               input_shapes=[[16, 4]]),
         check=lambda t, r: AssertClose(t, r[1], r[0])),
    Case('L18b', 'batch 18 with T=4',
         _Fprop(lambda: Pipe(partitions=Split(FCs(2), 2),
                             num_micro_batches=4), X([18, 4])),
         ValueError, r'batch size 18 .* num_micro_batches=4',
         r'multiple of 4'),
    Case('L18c', 'tf.function with a dynamic batch size',
         DynamicBatchInTfFunction, ValueError,
         r'shape \[None, 4\]: its batch size .* not static',
         r'drop_remainder=True'),
    Case('L18d', 'rank-0 input',
         _Fprop(lambda: Pipe(partitions=Split(FCs(2), 2),
                             num_micro_batches=2), tf.constant(1.0, F64)),
         ValueError, r'shape \[\] \(rank 0\)', r'pass tensors with that axis'),
    Case('L18e', 'FProp without inputs',
         _Fprop(lambda: Pipe(partitions=[Convs(1)])), ValueError,
         r'FProp needs at least one input', r'at least one input'),
    Case('L19', 'T=32 > batch 16',
         _Fprop(lambda: Pipe(partitions=Split(FCs(2), 2),
                             num_micro_batches=32), X([16, 4])),
         ValueError, r'batch size 16 .* num_micro_batches=32',
         r'multiple of 32'),
    Case('L19b', 'T = batch, K=2, no batch norm, vs unpipelined',
         Training(lambda: _PipeVsOracle(FCs(4), X([8, 4]),
                                        partitions=Split(FCs(4), 2),
                                        num_micro_batches=8)),
         check=lambda t, r: AssertClose(t, r[1], r[0])),
    Case('L19d', 'T = batch with batch norm on [N, C] features',
         _Fprop(lambda: Pipe(partitions=[FCs(1), [BN()]],
                             num_micro_batches=16), X([16, 4])),
         value=r"BatchNormLayer 'bn' .* only 1 value", warning=True,
         fix=r'fewer num_micro_batches or a larger batch'),
    Case('L20', 'K=4, T=4 vs unpipelined (convs)',
         Training(lambda: _PipeVsOracle(
             Convs(8, dtype=F64), X([8, 8, 8, 1]),
             partitions=Split(Convs(8, dtype=F64), 4), num_micro_batches=4)),
         check=lambda t, r: AssertClose(t, r[1], r[0])),
    Case('L20b', 'gradients with respect to the inputs, K=2, T=4',
         InputGradients, check=lambda t, r: AssertClose(t, r[1], r[0])),
    Case('L21b', 'eval mode with batch norm, K=2, T=4 vs unpipelined',
         EvalModeMatchesSequential,
         check=lambda t, r: AssertClose(t, r[1], r[0])),
    Case('L21c', 'plain layer(x) call: eval mode, moving averages kept',
         PlainCallKeepsMovingStats, check=CheckPlainCall),
    Case('L25', 'NaN input', NanPropagates, check=CheckNan),
    # -- microbatch -----------------------------------------------------------
    Case('X10', 'Merge of outputs of two Splits',
         lambda: microbatch.Merge({'a': tf.zeros([2, 3]),
                                   'b': tf.zeros([4, 3])}),
         ValueError, r'a has 2 but b has 4', r'merge outputs of one Split'),
    Case('X11', 'Slice out of range',
         lambda: microbatch.Slice(tf.zeros([4, 2]), 4), ValueError,
         r't=4 is out of range', r'use 0 <= t < 4'),
    Case('X12', 'Slice with a float tensor index',
         lambda: microbatch.Slice(tf.zeros([4, 2]), tf.constant(1.0)),
         TypeError, r'got dtype .*float32', r'tf\.cast\(t, tf\.int32\)'),
    Case('X13', 'Split/Slice/Merge on batch_dim=1 vs NumPy',
         SplitMergeBatchDimOne, check=CheckSplitMerge),
    Case('X14', 'Split with batch_dim past the rank',
         lambda: microbatch.Split(tf.zeros([4]), 2, batch_dim=1), ValueError,
         r'shape \[4\] \(rank 1\).*batch_dim=1',
         r'pass tensors with that axis'),
    # -- NestedMap -------------------------------------------------------------
    Case('X20', 'NestedMap key that is not an identifier',
         lambda: NestedMap({'a b': 1}), ValueError, r"key 'a b'",
         r'use letters, digits and "_"'),
    Case('X21', 'NestedMap key clashing with a method',
         lambda: NestedMap(Flatten=1), ValueError, r"key 'Flatten'",
         r'rename it, e\.g\. "Flatten_"'),
    Case('X22', 'NestedMap missing attribute',
         lambda: NestedMap(images=1).image, AttributeError, r"'image'",
         r"Did you mean 'images'"),
    # -- devices ----------------------------------------------------------------
    Case('X30', 'SetNumLogicalCpuDevices(0)',
         lambda: devices.SetNumLogicalCpuDevices(0), ValueError,
         r'got 0', r'must be a positive int'),
    Case('X31', 'SetNumLogicalCpuDevices after TensorFlow started',
         _SecondLogicalCpuInit, RuntimeError,
         rf'already initialised with {_NUM} .* so {_NUM + 3} cannot',
         r'call tensorpipe\.SetNumLogicalCpuDevices\(\) at program start'),
    # -- layers -----------------------------------------------------------------
    Case('X40', 'batch norm dim=0',
         lambda: BN(dim=0).Instantiate(), ValueError, r'dim=0',
         r'must be a positive int'),
    Case('X41', 'batch norm decay=2',
         lambda: BN().Set(decay=2.0).Instantiate(), ValueError,
         r'decay=2\.0', r'in \[0, 1\]'),
    Case('X42', 'batch norm input with other channels',
         _Fprop(lambda: BN(dim=4).Instantiate(), X([8, 3])), ValueError,
         r'has 3 channels .* dim=4', r'set dim=3'),
    Case('X43', 'FC input_dim mismatch',
         _Fprop(lambda: FCs(1)[0].Instantiate(), X([8, 3])), ValueError,
         r'last dim 3 but input_dim=4', r'set input_dim=3'),
    Case('X44', 'dropout keep_prob=0',
         lambda: dropout.DropoutLayer.Params().Set(name='d', keep_prob=0.0
                                                   ).Instantiate(),
         ValueError, r'keep_prob=0\.0', r'\(0, 1\]'),
    Case('X45', 'unknown activation',
         lambda: FCs(1, activation='RELUU')[0].Instantiate(), ValueError,
         r"'RELUU'", r"'RELU'"),
    Case('X46', 'CreateChild with something that is not Params',
         lambda: composite.SequentialLayer.Params().Set(
             name='s', sub=[3]).Instantiate(),
         TypeError, r'got int: 3', r'needs layer Params'),
]


class ReliabilityCatalogueTest(tf.test.TestCase):

  def testCatalogueHasEnoughUniqueCases(self):
    ids = [c.id for c in CASES]
    self.assertLen(set(ids), len(ids))
    self.assertGreaterEqual(len(CASES), 45)

  def testEachCaseHasItsOutcome(self):
    for case in CASES:
      with self.subTest(case.id, what=case.what):
        self._Check(case)

  def _Check(self, case: Case) -> None:
    if case.error is not None:
      with self.assertRaises(case.error) as ctx:
        case.run()
      message = str(ctx.exception)
      self.assertNotIn('\n', message, 'not a one-line error')
      self.assertRegex(message, case.value)
      self.assertRegex(message, case.fix)
      return
    if case.warning:
      with self.assertLogs('absl', 'WARNING') as logs:
        case.run()
      self.assertLen(logs.records, 1)
      message = logs.records[0].getMessage()
      self.assertNotIn('\n', message)
      self.assertRegex(message, case.value)
      self.assertRegex(message, case.fix)
      return
    case.check(self, case.run())


def Counts():
  """{verdict: number of cases}, for the catalogue's report."""
  counts = {}
  for case in CASES:
    counts[case.verdict] = counts.get(case.verdict, 0) + 1
  return counts


if __name__ == '__main__':
  tf.test.main()
