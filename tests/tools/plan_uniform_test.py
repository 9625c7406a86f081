"""tools/benchmark_lib/plan_uniform: the uniform cut and the table (pure
Python); the child itself runs in tools/benchmark --plan_uniform."""

import unittest

from tools.benchmark_lib import plan_uniform


class UniformCutTest(unittest.TestCase):

  def testRunsOfEqualCountTheFirstOnesLonger(self):
    self.assertEqual(plan_uniform.UniformCut(16, 2),
                     [range(0, 8), range(8, 16)])
    self.assertEqual(plan_uniform.UniformCut(10, 4),
                     [range(0, 3), range(3, 6), range(6, 8), range(8, 10)])
    self.assertEqual(plan_uniform.UniformCut(3, 3),
                     [range(0, 1), range(1, 2), range(2, 3)])

  def testTooFewLayers(self):
    with self.assertRaisesRegex(ValueError, '3 layers cannot be cut into 4 '
                                'non-empty partitions; use a smaller K'):
      plan_uniform.UniformCut(3, 4)


def _Result(uniform, balanced, planner, tt=8, recompute=True):
  return dict(model='taper16', K=2, T=tt, recompute=recompute,
              measured_s=dict(uniform=uniform, balanced=balanced,
                              planner=planner),
              measured_cpu_s=dict(uniform=1.0, balanced=1.0, planner=1.0),
              pick=['zb_h1', 1], predicted_s=0.031,
              cuts=dict(uniform=[[0, 8], [8, 16]],
                        balanced=[[0, 12], [12, 16]],
                        planner=[[0, 12], [12, 16]]),
              load_average=0.5)


class TableTest(unittest.TestCase):

  def testRatiosAndRange(self):
    with_auto = _Result(0.036, 0.033, 0.030)
    with_auto['measured_s']['planner_rc_auto'] = 0.024
    with_auto['picks'] = dict(planner=['zb_h1', 1, True],
                              planner_rc_auto=['1f1b', 1, False])
    with_auto['predicted'] = dict(planner=0.031, planner_rc_auto=0.025)
    text = plan_uniform.Table([with_auto,
                               _Result(0.050, 0.048, 0.040, 16, False)])
    self.assertIn('| taper16 | 2 | 8 | on | 36.0 | 33.0 | zb_h1 v=1 | '
                  '30.0 / 31.0 | 1.20x | 1.09x | 1f1b v=1 norc, 24.0 / '
                  '25.0, 1.50x |', text)
    self.assertIn('| taper16 | 2 | 16 | off | 50.0 | 48.0 |', text)
    self.assertIn('| 1.25x | 1.04x | - |', text)
    self.assertIn('uniform / planner: 1.20x to 1.25x over 2 settings', text)
    self.assertIn("uniform / planner with recompute='auto': 1.50x to 1.50x "
                  'over 1 settings', text)
    self.assertIn('taper16 T=8 uniform [[0, 8], [8, 16]], balanced '
                  '[[0, 12], [12, 16]]', text)


if __name__ == '__main__':
  unittest.main()
