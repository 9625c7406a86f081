"""Tests for tools/benchmark_lib/step_profile: a step's time with no kernel
running, from a profiler trace (synthetic traces with known answers, and
one real trace of a small tf.function)."""

import tempfile
import unittest

import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from tools.benchmark_lib import results as results_lib
from tools.benchmark_lib import settings
from tools.benchmark_lib import step_profile

_NS = 1000  # picoseconds per nanosecond


def _Space(lines):
  """An XSpace of one plane: lines = [(name, [(event, start_ns, dur_ns)])]."""
  space = xplane_pb2.XSpace()
  plane = space.planes.add(name='/host:CPU')
  ids = {}
  for i, (line_name, events) in enumerate(lines):
    line = plane.lines.add(id=i, name=line_name, timestamp_ns=1000)
    for name, start, dur in events:
      if name not in ids:
        ids[name] = len(ids) + 1
        plane.event_metadata[ids[name]].id = ids[name]
        plane.event_metadata[ids[name]].name = name
      line.events.add(metadata_id=ids[name], offset_ps=start * _NS,
                      duration_ps=dur * _NS)
  return space


class UnionTest(unittest.TestCase):

  def testOverlapsCountOnceAndGapsNotAtAll(self):
    self.assertEqual(step_profile.UnionLength([]), 0)
    self.assertEqual(step_profile.UnionLength([(0, 10), (20, 30)]), 20)
    self.assertEqual(step_profile.UnionLength([(0, 10), (5, 15)]), 15)
    self.assertEqual(step_profile.UnionLength([(5, 15), (0, 10), (1, 2)]),
                     15)
    self.assertEqual(step_profile.UnionLength([(0, 30), (10, 20)]), 30)
    self.assertEqual(step_profile.UnionLength([(0, 10), (10, 20)]), 20)

  def testKernelEventsAreOpColonType(self):
    kernel = step_profile.IsKernelEvent
    self.assertTrue(kernel('MatMul_3:_MklMatMul'))
    self.assertTrue(kernel('while/body/_1/cond/Relu:Relu'))
    self.assertFalse(kernel('ExecutorState::Process'))
    self.assertFalse(kernel('ThreadpoolListener::Record'))
    self.assertFalse(kernel('EagerLocalExecute: __inference_Step_45'))
    self.assertFalse(kernel('step'))


class FromXSpaceTest(unittest.TestCase):

  def testTwoThreadsOneStep(self):
    # Step window [0, 100) ns on the Python thread; thread A runs kernels
    # [10, 40) and [30, 50), thread B [45, 70) and one outside the step
    # [120, 130); the runtime's own event [0, 100) on A is not a kernel.
    space = _Space([
        ('python3', [('step', 0, 100),
                     ('EagerLocalExecute: __inference_Step_1', 0, 100)]),
        ('tf_Compute/1', [('ExecutorState::Process', 0, 100),
                          ('a:MatMul', 10, 30), ('b:Relu', 30, 20)]),
        ('tf_Compute/2', [('c:AddN', 45, 25), ('d:AddN', 120, 10)]),
    ])
    [p] = step_profile.FromXSpace(space)
    self.assertAlmostEqual(p.wall_s, 100e-9)
    # Kernels: union of [10, 50) and [45, 70) = [10, 70): 60 ns.
    self.assertAlmostEqual(p.kernel_s, 60e-9)
    self.assertAlmostEqual(p.no_kernel_s, 40e-9)
    self.assertEqual(len(p.busy_s), 2)
    self.assertAlmostEqual(p.busy_s[0], 40e-9)
    self.assertAlmostEqual(p.busy_s[1], 25e-9)
    self.assertEqual(p.kernels, 3)

  def testEachStepGetsItsOwnWindowAndClippedKernels(self):
    space = _Space([
        ('python3', [('step', 200, 100), ('step', 0, 100)]),
        ('tf_Compute/1', [('a:MatMul', 90, 20), ('b:MatMul', 250, 10)]),
    ])
    first, second = step_profile.FromXSpace(space)
    self.assertAlmostEqual(first.kernel_s, 10e-9)   # [90, 100) of [90, 110)
    self.assertAlmostEqual(second.kernel_s, 10e-9)  # [250, 260)
    self.assertAlmostEqual(second.no_kernel_s, 90e-9)

  def testMedianIsFieldByField(self):
    ps = [step_profile.StepProfile(w, k, w - k, busy, n) for w, k, busy, n in
          ((3.0, 1.0, (1.0,), 5), (5.0, 2.0, (2.0, 1.0), 7),
           (4.0, 4.0, (4.0, 3.0), 6))]
    m = step_profile.Median(ps)
    self.assertEqual((m.wall_s, m.kernel_s, m.no_kernel_s), (4.0, 2.0, 2.0))
    self.assertEqual(m.busy_s, (2.0, 1.0))
    self.assertEqual(m.kernels, 6)
    with self.assertRaisesRegex(ValueError, 'no step profiles'):
      step_profile.Median([])

  def testJsonRoundTripThroughAResult(self):
    p = step_profile.StepProfile(4e-3, 3e-3, 1e-3, (3e-3, 1e-3), 42)
    r = results_lib.Result(
        model='tiny', setting=settings.ParseSetting('K2-T4-1f1b-rc'),
        batch=8, step_time_s=3e-3, memory=results_lib.Memory(0, 0, 0, True),
        step_profile=p)
    self.assertEqual(results_lib.Result.FromJson(r.ToJson()).step_profile,
                     p)


class TableTest(unittest.TestCase):

  def testTicksOfTheSettingsTables(self):
    ticks = lambda name: step_profile.Ticks(settings.ParseSetting(name))
    self.assertEqual(ticks('plain'), 0)
    self.assertEqual(ticks('K2-T8-1f1b-rc'), 2 * (8 + 2 - 1))
    self.assertEqual(ticks('K2-T8-rc'), 2 * (8 + 2 - 1))  # GPipe F + B
    self.assertGreater(ticks('K2-T8-zbv-rc'), ticks('K2-T8-zbh1-rc'))

  def testExtraNoKernelTimePerExtraTickAgainstTheFirstSetting(self):
    p = lambda no_kernel: step_profile.StepProfile(
        0.02, 0.02 - no_kernel, no_kernel, (0.01,), 100)
    rows = [dict(model='m', setting='K2-T8-1f1b-rc', ticks=18,
                 step_time_s=0.02, profile=p(0.0018)),
            dict(model='m', setting='K2-T8-zbv-rc', ticks=28,
                 step_time_s=0.02, profile=p(0.0038))]
    text = step_profile.Table(rows)
    # 1F1B: 1.8 ms over 18 ticks = 100 us per tick; ZB-V: 2 ms more over
    # 10 more ticks = 200 us per extra tick.
    first, second = text.splitlines()[2:]
    self.assertIn('| 1.80 | 100 |  |', first)
    self.assertIn('| 3.80 | 136 | 200 |', second)


class RealTraceTest(unittest.TestCase):

  def testAStepOfThreeMatMulsHasThemAsKernels(self):
    w = tf.random.stateless_normal([64, 64], seed=[1, 2])

    @tf.function
    def Step(x):
      for _ in range(3):
        x = tf.matmul(x, w)
      return tf.reduce_sum(x)
    x = tf.ones([8, 64])
    Step(x)
    with tempfile.TemporaryDirectory() as logdir:
      profiles = step_profile.Run(lambda: Step(x).numpy(), 2, logdir)
    self.assertEqual(len(profiles), 2)
    for p in profiles:
      # 3 matmuls and the sum (the constant w may be folded in).
      self.assertGreaterEqual(p.kernels, 4)
      self.assertLess(p.kernels, 10)
      self.assertGreater(p.kernel_s, 0.0)
      self.assertLessEqual(p.kernel_s, p.wall_s)
      self.assertAlmostEqual(p.no_kernel_s, p.wall_s - p.kernel_s)
      self.assertLessEqual(max(p.busy_s), p.kernel_s + 1e-12)
    with self.assertRaisesRegex(ValueError, 'steps=0'):
      step_profile.Run(lambda: None, 0, '/tmp/unused')


if __name__ == '__main__':
  unittest.main()
