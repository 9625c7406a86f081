"""Tests of tensorpipe/checks.py."""

import re
import unittest

from tensorpipe import checks


class CheckPositiveIntsTest(unittest.TestCase):

  def testAcceptsPositiveInts(self):
    checks.CheckPositiveInts('owner', a=1, b=2**40)
    checks.CheckPositiveInts('owner')     # nothing to check

  def testRejectsEverythingElseNamingOwnerKeyAndValue(self):
    for bad in (0, -3, 1.0, 2.5, '3', None, True, [1]):
      with self.subTest(bad=bad):
        with self.assertRaisesRegex(
            ValueError, '^FCLayer \'fc\': output_dim=' + re.escape(repr(bad))
            + ' must be a positive int$'):
          checks.CheckPositiveInts("FCLayer 'fc'", input_dim=4,
                                   output_dim=bad)

  def testFirstBadValueInGivenOrderIsReported(self):
    with self.assertRaisesRegex(ValueError, '^b=0 must'):
      checks.CheckPositiveInts('', a=1, b=0, c=-1)

  def testIsPositiveInt(self):
    self.assertEqual([checks.IsPositiveInt(v) for v in (1, 0, True, 1.0)],
                     [True, False, False, False])


if __name__ == '__main__':
  unittest.main()
