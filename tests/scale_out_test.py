"""Tests for tensorpipe.scale_out: R replicas x K stages, worked out by hand."""

import unittest

from absl import flags
import tensorflow as tf

from tensorpipe import model_analysis
from tensorpipe import scale_out
from tensorpipe import schedule_builders
from tensorpipe import simulator
from tensorpipe.layers import linear
from tools import model_analysis as model_analysis_tool


def _GPipe(num_devices, num_micro_batches):
  return schedule_builders.Build('gpipe', num_devices, num_micro_batches)


def _Simulate(forward_costs, backward_costs, num_micro_batches, **kwargs):
  """SimulateSchedule of GPipe in the loop's lock step."""
  return simulator.SimulateSchedule(
      _GPipe(len(forward_costs), num_micro_batches), forward_costs,
      backward_costs, synchronous_ticks=True, **kwargs)


class DataParallelTest(unittest.TestCase):
  """R replicas x K stages, against the timelines worked out by hand."""

  def testRingAllReduceTime(self):
    # 2 (R - 1) / R x bytes / bandwidth + 2 (R - 1) latencies.
    self.assertEqual(scale_out.RingAllReduceTime(1e9, 4, 1e9), 1.5)
    self.assertEqual(scale_out.RingAllReduceTime(1e9, 2, 1e9), 1.0)
    self.assertEqual(scale_out.RingAllReduceTime(8e9, 8, 1e9, 0.5), 14.0 + 7.0)
    self.assertEqual(scale_out.RingAllReduceTime(1e9, 1, 1e9, 0.5), 0.0)
    with self.assertRaisesRegex(ValueError, 'num_replicas=0'):
      scale_out.RingAllReduceTime(1.0, 0, 1.0)
    with self.assertRaisesRegex(ValueError, 'bytes_per_second=0'):
      scale_out.RingAllReduceTime(1.0, 2, 0)

  def testAllReduceAfterTheBackwardOnOwnLinks(self):
    # The K=2, T=2 pipeline of testTwoPartitionsTwoMicroBatchesByHand ends
    # its backward at 9; stage 1's last cell ends at 7, stage 0's at 9.
    # R=2, 1 byte/s: A = 2 (R-1)/R x [2, 6] = [2, 6].
    #   time   0 ............ 9 .. 11 ....... 15
    #   k=0    pipeline       AR0
    #   k=1    pipeline       AR1..............
    res = scale_out.SimulateDataParallel(_GPipe(2, 2), [1, 1], [2, 2], [2, 6],
                                         2, 1.0,
                                         recompute=False, fixed_overhead=0.5)
    self.assertEqual(res.allreduce_times, (2.0, 6.0))
    self.assertEqual(res.allreduce_start, (9.0, 9.0))
    self.assertEqual(res.allreduce_end, (11.0, 15.0))
    self.assertEqual(res.step_time, 15.5)
    self.assertEqual(res.pipeline.step_time, 9.5)
    self.assertEqual(res.exposed_allreduce_time, 6.0)
    # Overlapped: AR1 from 7 to 13, AR0 from 9 to 11.
    self.assertEqual(res.overlapped_step_time, 13.5)
    self.assertEqual(res.Throughput(examples_per_replica=31), 2 * 31 / 15.5)

  def testWithTheIWSplitTheAllReduceWaitsForTheLastWCell(self):
    # zb_h1, K=2, T=2, f=1, b=2 split as I=1, W=1, no recompute:
    #   k=0  F0 F1 .  I0 W0 I1 W1      both devices' last W ends at 7,
    #   k=1  .  F0 I0 F1 I1 W0 W1      the pipeline's end.
    # A stage's gradients exist only after its last W: A = [2, 6] from 7,
    # so overlapping gains nothing (an I cell makes no weight gradient).
    res = scale_out.SimulateDataParallel(
        schedule_builders.Build('zb_h1', 2, 2), [1, 1], [2, 2], [2, 6], 2,
        1.0, recompute=False)
    self.assertEqual(res.pipeline.step_time, 7.0)
    self.assertEqual(res.allreduce_start, (7.0, 7.0))
    self.assertEqual(res.step_time, 13.0)
    self.assertEqual(res.overlapped_step_time, 13.0)

  def testSharedLinkSerialisesTheStages(self):
    # One link: AR1 (ready first on ties) 9..15, then AR0 15..17;
    # overlapped: AR1 7..13, AR0 13..15.
    res = scale_out.SimulateDataParallel(_GPipe(2, 2), [1, 1], [2, 2], [2, 6],
                                         2, 1.0,
                                         recompute=False, shared_link=True)
    self.assertEqual(res.allreduce_start, (15.0, 9.0))
    self.assertEqual(res.allreduce_end, (17.0, 15.0))
    self.assertEqual(res.step_time, 17.0)
    self.assertEqual(res.overlapped_step_time, 15.0)

  def testOneReplicaIsThePipeline(self):
    pipe = _Simulate([1.0, 3.0], [2.0, 1.0], 4, fixed_overhead=2.0)
    res = scale_out.SimulateDataParallel(_GPipe(2, 4), [1.0, 3.0], [2.0, 1.0],
                                         [1e9, 1e9], 1, 1e3,
                                         fixed_overhead=2.0)
    self.assertEqual(res.step_time, pipe.step_time)
    self.assertEqual(res.overlapped_step_time, pipe.step_time)
    self.assertEqual(res.allreduce_times, (0.0, 0.0))

  def testEqualStagesMatchTheClosedForm(self):
    # Equal costs: step = (T + K - 1)(f + r + b) + 2 (R-1)/R x G / bw.
    for k, t, r in ((1, 1, 2), (2, 4, 2), (4, 8, 8), (3, 2, 5)):
      res = scale_out.SimulateDataParallel(
          _GPipe(k, t), [1.0] * k, [2.0] * k, [100.0] * k, r, 10.0,
          recompute=True)
      self.assertAlmostEqual(
          res.step_time, (t + k - 1) * 4.0 + 2 * (r - 1) / r * 10.0,
          msg=(k, t, r))

  def testRejectsGradBytesNotOnePerStage(self):
    with self.assertRaisesRegex(ValueError, 'grad_bytes has 1 entries for 2 '
                                'stages'):
      scale_out.SimulateDataParallel(_GPipe(2, 2), [1, 1], [1, 1], [5], 2,
                                     1.0)
    with self.assertRaisesRegex(ValueError, 'grad_bytes'):
      scale_out.SimulateDataParallel(_GPipe(2, 2), [1, 1], [1, 1], [5, -1], 2,
                                     1.0)


class ScaleOutPlanTest(tf.test.TestCase):
  """R x K plans against step times worked out by hand."""

  def setUp(self):
    super().setUp()
    # Two equal partitions of two 8x8 FC layers: 144 weights = 576 gradient
    # bytes each. T=2, so a micro-batch forward of a partition is
    # FLOPs / 2; the device speed below makes it 1 s.
    fcs = [linear.FCLayer.Params().Set(name=f'fc{i}', input_dim=8,
                                       output_dim=8, activation='NONE')
           for i in range(4)]
    self.report = model_analysis.AnalyzeLayers(
        fcs, [[4, 8]], num_partitions=2, num_micro_batches=2,
        optimizer='sgd')
    self.f = self.report.partitions[0].flops / 2
    self.assertEqual([p.grad_bytes for p in self.report.partitions],
                     [576, 576])

  def testStepTimesByHand(self):
    # f = 1 s, backward 2 s + 1 s recompute: the K=2, T=2 pipeline takes
    # (T + K - 1)(1 + 3) = 12 s. Ring all-reduce of 576 B at 576 B/s:
    # R=2: 2 (1/2) = 1 s; R=4: 2 (3/4) = 1.5 s; + 2 x 0.25 s latency.
    a = scale_out.ScaleOutAssumptions(
        device_flops=self.f, link_bytes_per_s=576.0, link_latency_s=0.25)
    plan = scale_out.PlanScaleOut(self.report, [4, 2], a)
    self.assertEqual([r for r, _ in plan.results], [1, 2, 4])
    res = dict(plan.results)
    self.assertEqual(res[1].step_time, 12.0)
    self.assertEqual(res[2].step_time, 12.0 + 1.0 + 0.5)
    self.assertEqual(res[4].step_time, 12.0 + 1.5 + 1.5)
    self.assertEqual(res[4].allreduce_times, (3.0, 3.0))
    self.assertEqual(res[4].Throughput(4), 16 / 15.0)
    text = plan.ToText()
    self.assertIn('4 examples per replica in T=2 micro-batches', text)
    # R x K, devices, global batch, pipeline, bubble, all-reduce, step,
    # overlapped, examples/s, speed-up (16/15)/(4/12) = 3.2, efficiency 80%.
    self.assertRegex(text, r'4 x 2 +8 +16 +12,000 +\S+% +3,000 +15,000 +'
                     r'15,000 +1\.07 +3\.20x +80\.0%')
    self.assertIn('does not overlap them with the backward', text)

  def testSharedLinkAndNoRecompute(self):
    # No recompute: (T + K - 1)(1 + 2) = 9 s; both stages on one link:
    # 2 x 1 s one after the other at R=2.
    a = scale_out.ScaleOutAssumptions(
        device_flops=self.f, link_bytes_per_s=576.0, shared_link=True,
        recompute=False)
    res = dict(scale_out.PlanScaleOut(self.report, [2], a).results)
    self.assertEqual(res[2].pipeline.step_time, 9.0)
    self.assertEqual(res[2].step_time, 9.0 + 2.0)
    # Overlapped: stage 1's last backward cell ends at 7 (its all-reduce
    # 7..8), stage 0's at 9 (9..10).
    self.assertEqual(res[2].overlapped_step_time, 10.0)
    self.assertIn('per replica (one link shared by its stages)',
                  scale_out.PlanScaleOut(self.report, [2], a).ToText())

  def testBadValues(self):
    a = scale_out.ScaleOutAssumptions(device_flops=1.0,
                                           link_bytes_per_s=1.0)
    with self.assertRaisesRegex(ValueError, r'num_replicas=\[2, 0\]'):
      scale_out.PlanScaleOut(self.report, [2, 0], a)
    with self.assertRaisesRegex(ValueError, 'link_bytes_per_s=0 must be'):
      scale_out.ScaleOutAssumptions(device_flops=1.0, link_bytes_per_s=0)

  def testToolPrintsThePlan(self):
    fv = flags.FlagValues()
    model_analysis_tool.DefineFlags(fv)
    fv(['model_analysis', '--model=consistency', '--num_partitions=2',
        '--num_micro_batches=4', '--batch_size=8', '--num_replicas=8,2',
        '--link_gbps=8', '--device_tflops=0.5', '--link_latency_us=3'])
    text = model_analysis_tool.Run(fv)
    self.assertIn('assumed 0.5 TFLOP/s achieved per device, 8 Gb/s per '
                  'stage link, 3 us latency', text)
    for row in ('1 x 2', '2 x 2', '8 x 2'):
      self.assertRegex(text, rf'\n{row} ')
    # 8 Gb/s = 1e9 B/s; the gradients are tiny, so R=8 adds the latency of
    # 2 (R-1) = 14 messages: 42 us = 0.042 ms (plus < 0.001 ms of bytes).
    self.assertRegex(text, r'all-reduce R=8 ms\n[- ]+\n0 .* 0\.042\d?\n')
    fv.num_replicas = ['2', 'x']
    with self.assertRaisesRegex(ValueError, '--num_replicas=2,x must be '
                                'positive integers'):
      model_analysis_tool.Run(fv)


if __name__ == '__main__':
  tf.test.main()
