"""tools/torch_peer: its pure helpers and the missing-torch exit (no torch)."""

import sys
import unittest

from absl import app

from tests.tools import tool_testlib
from tools import torch_peer
from tools import torch_peer_worker as worker


class MissingTorchTest(unittest.TestCase):

  def testExitsTwoWithOneLine(self):
    # This test's interpreter (the project's .venv) has no torch.
    proc = tool_testlib.RunTool(
        'torch_peer', f'--torch_python={sys.executable}', timeout_s=120)
    self.assertEqual(proc.returncode, 2, proc.stderr)
    self.assertEqual(proc.stdout, '')
    lines = proc.stderr.strip().splitlines()
    self.assertEqual(len(lines), 1, proc.stderr)
    self.assertIn('python -m venv /tmp/torchenv && /tmp/torchenv/bin/pip '
                  'install torch==2.13.0 numpy absl-py', lines[0])

  def testNoSuchInterpreter(self):
    self.assertIsNone(torch_peer.TorchVersion('/nonexistent/python3'))


class HelpersTest(unittest.TestCase):

  def testModelsWithoutATorchTwinAreRefused(self):
    torch_peer.CheckModels(['dense16', 'conv16'])
    with self.assertRaisesRegex(app.UsageError, "'xfmr8' has no torch twin"):
      torch_peer.CheckModels(['dense16', 'xfmr8'])
    with self.assertRaisesRegex(app.UsageError, "'taper16' has no torch twin"):
      torch_peer.CheckModels(['taper16'])
    with self.assertRaisesRegex(app.UsageError, "'nope' is not a built-in"):
      torch_peer.CheckModels(['nope'])

  def testStageBounds(self):
    self.assertEqual(worker.StageBounds(16, 2), [(0, 8), (8, 16)])
    self.assertEqual(worker.StageBounds(16, 4),
                     [(0, 4), (4, 8), (8, 12), (12, 16)])
    with self.assertRaisesRegex(ValueError, 'do not cut into 3 equal'):
      worker.StageBounds(16, 3)

  def testRankStages(self):
    self.assertEqual(worker.RankStages(2, 1, 'loop'), [[0], [1]])
    self.assertEqual(worker.RankStages(2, 2, 'loop'), [[0, 2], [1, 3]])
    self.assertEqual(worker.RankStages(2, 2, 'v'), [[0, 3], [1, 2]])
    self.assertEqual(worker.RankStages(4, 2, 'v'),
                     [[0, 7], [1, 6], [2, 5], [3, 4]])

  def testScheduleMap(self):
    self.assertEqual(
        {k: v[:2] for k, v in worker.TORCH_SCHEDULES.items()},
        {'gpipe': ('ScheduleGPipe', 1), '1f1b': ('Schedule1F1B', 1),
         'interleaved_1f1b': ('ScheduleInterleaved1F1B', 2),
         'zb_h1': ('ScheduleInterleavedZeroBubble', 1),
         'zb_v': ('ScheduleZBVZeroBubble', 2)})

  def testTensorPipeSetting(self):
    self.assertEqual(torch_peer.TensorPipeSetting('gpipe', 2, 4, False),
                     'K2-T4-norc')
    self.assertEqual(torch_peer.TensorPipeSetting('1f1b', 2, 4, True),
                     'K2-T4-1f1b-rc')
    self.assertEqual(torch_peer.TensorPipeSetting('interleaved_1f1b', 2, 8,
                                                  False), 'K2-T8-i2-norc')
    self.assertEqual(torch_peer.TensorPipeSetting('zb_h1', 2, 8, True),
                     'K2-T8-zbh1-rc')
    self.assertEqual(torch_peer.TensorPipeSetting('zb_v', 2, 8, False),
                     'K2-T8-zbv-norc')
    with self.assertRaisesRegex(ValueError, 'no torch peer'):
      torch_peer.TensorPipeSetting('dualpipe', 2, 4, False)

  def testSameOrder(self):
    # ZB-H1, K=2, T=2, as torch's ZB1P with one stage per rank prints it.
    torch_orders = [['0F0', '0F1', '0I0', '0W0', '0I1', '0W1'],
                    ['1F0', '1I0', '1F1', '1I1', '1W0', '1W1']]
    self.assertEqual(torch_peer.SameOrder('zb_h1', 2, 2, torch_orders),
                     'yes')
    self.assertEqual(torch_peer.SameOrder('zb_h1', 2, 2, torch_orders[::-1]),
                     'no')
    self.assertIsNone(torch_peer.SameOrder('zb_h1', 2, 2, []))
    # torch's GPipe runs the backward first micro-batch first.
    gpipe = [['0F0', '0F1', '0B0', '0B1'], ['1F0', '1F1', '1B0', '1B1']]
    self.assertEqual(torch_peer.SameOrder('gpipe', 2, 2, gpipe), 'reordered')
    self.assertEqual(torch_peer.SameOrder('1f1b', 2, 2, gpipe), 'reordered')

  def testErrorLine(self):
    text = ('Traceback (most recent call last):\n  File "x.py"\n'
            'ValueError: bad T\n\nsome log line\n')
    self.assertEqual(torch_peer.ErrorLine(text), 'ValueError: bad T')
    self.assertEqual(torch_peer.ErrorLine('just this\n'), 'just this')
    self.assertEqual(torch_peer.ErrorLine(
        '[rank0]: Traceback\n[rank0]: RuntimeError: gloo closed\n[rank0]:\n'),
                     'RuntimeError: gloo closed')

  def testTableAndSummary(self):
    rows = [dict(model='dense16', schedule='1f1b', torch_class='Schedule1F1B',
                 T=4, recompute=False, tensorpipe_s=0.0800, torch_s=0.1000,
                 same_order='yes'),
            dict(model='conv16', schedule='zb_v',
                 torch_class='ScheduleZBVZeroBubble', T=8, recompute=True,
                 tensorpipe_s=0.1200, torch_s=0.1000, same_order='no'),
            dict(model='conv16', schedule='gpipe',
                 torch_class='ScheduleGPipe', T=8, recompute=True,
                 tensorpipe_s=0.05, torch_error='RuntimeError: boom')]
    text = torch_peer.Table(rows)
    self.assertIn('| dense16 | 1f1b (Schedule1F1B) | 4 | off | 80.0 | 100.0 '
                  '| 0.80 | yes |', text)
    self.assertIn('| conv16 | zb_v (ScheduleZBVZeroBubble) | 8 | on | 120.0 '
                  '| 100.0 | 1.20 | no |', text)
    self.assertIn('| conv16 | gpipe (ScheduleGPipe) | 8 | on | 50.0 | - | - '
                  '| - |', text)
    self.assertIn('- conv16 gpipe T=8 torch: RuntimeError: boom', text)
    self.assertEqual(torch_peer.Summary(rows),
                     'TensorPipe <= torch in 1 of 2 cells; ratio median 1.00, '
                     'range 0.80 to 1.20')
    self.assertEqual(torch_peer.Summary(rows[2:]),
                     'no cell has both step times')


if __name__ == '__main__':
  unittest.main()
