"""Tests for tensorpipe.errors: the text of each wrapped error form."""

import unittest

from tensorpipe import errors

# What TF raises for a failed eager op.
_TF_OP = ('{{function_node __wrapped__Reshape_device_/job:localhost/replica:0/'
          'task:0/device:CPU:0}} Input to reshape is a tensor with 3 values, '
          'but the requested shape has 2 [Op:Reshape] name: r')
# What AutoGraph raises for an error in a converted function.
_AUTOGRAPH = '''in user code:

    File "/work/x.py", line 5, in f  *
        raise ValueError('batch size 30 is not divisible by 8')

    ValueError: batch size 30 is not divisible by 8
'''
# What Keras 3.15 raises for an error in a layer's symbolic call.
_KERAS = ("Exception encountered when calling L.call().\n\n\x1b[1mCould not "
          "automatically infer the output shape / dtype of 'l' (of type L). "
          'Error encountered:\n\ninner problem\nsecond line\x1b[0m\n\n'
          'Arguments received by L.call():\n  • args=(1,)')


class FirstLineTest(unittest.TestCase):

  def testPlainMessageGivesItsFirstLine(self):
    self.assertEqual(errors.FirstLine(ValueError('  first\nsecond ')), 'first')

  def testTensorFlowOpWrappingRemoved(self):
    self.assertEqual(
        errors.FirstLine(RuntimeError(_TF_OP)),
        'Input to reshape is a tensor with 3 values, but the requested shape '
        'has 2')

  def testAutoGraphPreambleRemoved(self):
    self.assertEqual(errors.FirstLine(ValueError(_AUTOGRAPH)),
                     'batch size 30 is not divisible by 8')
    # Another type's prefix in the last line is kept.
    self.assertEqual(errors.FirstLine(TypeError(_AUTOGRAPH)),
                     'ValueError: batch size 30 is not divisible by 8')

  def testKerasWrapperRemoved(self):
    self.assertEqual(errors.FirstLine(ValueError(_KERAS)), 'inner problem')
    only_wrappers = ('Exception encountered when calling L.call().\n'
                     'Arguments received by L.call():\n  • x=1')
    self.assertEqual(errors.FirstLine(ValueError(only_wrappers)),
                     'Exception encountered when calling L.call().')

  def testEmptyMessageGivesTheTypeAndLimitCuts(self):
    self.assertEqual(errors.FirstLine(KeyError()), 'KeyError')
    self.assertEqual(errors.FirstLine(ValueError('x' * 500)), 'x' * 300)
    self.assertEqual(errors.FirstLine(ValueError('abcdef'), limit=3), 'abc')


class MessageTest(unittest.TestCase):

  def testAutoGraphGivesTheOriginalMessageOnly(self):
    self.assertEqual(errors.Message(ValueError(_AUTOGRAPH)),
                     'batch size 30 is not divisible by 8')

  def testOtherMessagesAreStrippedWhole(self):
    self.assertEqual(errors.Message(ValueError(' a\n b \n')), 'a\n b')
    self.assertEqual(errors.Message(RuntimeError(_TF_OP)), _TF_OP)


if __name__ == '__main__':
  unittest.main()
