"""tools/benchmark_lib/memory_check: the table (pure Python); the child
itself runs in tools/benchmark --memory_check."""

import unittest

from tools.benchmark_lib import memory_check

_MIB = 2**20


def _Row(schedule, recompute, measured, predicted, stash=0, weights=2):
  return dict(schedule=schedule, v=1, recompute=recompute,
              measured_bytes=measured * _MIB,
              predicted_bytes=predicted * _MIB, stash_bytes=stash * _MIB,
              weight_bytes=weights * _MIB)


class TableTest(unittest.TestCase):

  def testRatiosAndRange(self):
    text = memory_check.Table([
        dict(model='dense32mem', T=4, rows=[
            _Row('gpipe', True, 22, 20), _Row('zb_h1', False, 10, 20,
                                              stash=8)]),
        dict(model='conv16', T=4, rows=[_Row('1f1b', True, 19, 20)])])
    self.assertIn('| dense32mem | 1 | 4 | gpipe v=1 | on | 22.0 | 20.0 (0.0) '
                  '| 1.100 |', text)
    self.assertIn('| dense32mem | 1 | 4 | zb_h1 v=1 | off | 10.0 | 20.0 '
                  '(8.0) | 0.500 |', text)
    self.assertIn('dense32mem: measured / predicted 0.500 to 1.100, within '
                  '10% in 1 of 2', text)
    self.assertIn('conv16: measured / predicted 0.950 to 0.950, within 10% '
                  'in 1 of 1', text)
    self.assertIn('all: measured / predicted 0.500 to 1.100, within 10% in '
                  '2 of 3', text)


  def testTwoDevicesAreCheckedAgainstTheBracket(self):
    # Two devices share one allocator: 25 MiB lies between the fullest
    # device (20) and the sum (20 + 10); 35 does not.
    rows = [dict(_Row('1f1b', True, 25, 20), predicted_devices=[20 * _MIB,
                                                                10 * _MIB]),
            dict(_Row('gpipe', True, 35, 20), predicted_devices=[20 * _MIB,
                                                                 10 * _MIB])]
    text = memory_check.Table([dict(model='conv16', K=2, T=4, rows=rows)])
    self.assertIn('| conv16 | 2 | 4 | 1f1b v=1 | on | 25.0 | 20.0 to 30.0 '
                  '(0.0) | within (0.833 of the sum) |', text)
    self.assertIn('| conv16 | 2 | 4 | gpipe v=1 | on | 35.0 | 20.0 to 30.0 '
                  '(0.0) | outside (1.167 of the sum) |', text)
    self.assertIn('conv16: measured between the fullest device and the sum '
                  'of the devices in 1 of 2', text)


if __name__ == '__main__':
  unittest.main()
