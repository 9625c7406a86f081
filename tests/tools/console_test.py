"""Tests for tools/console.py: the binaries' console without library noise."""

import logging
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

# Imported as a binary run with --tf_logs would import it: the test process
# keeps TF_CPP_MIN_LOG_LEVEL as it is (its other tests' children inherit it).
_ARGV, sys.argv = sys.argv, ['console_test', '--tf_logs']
from tools import console  # pylint: disable=g-import-not-at-top
sys.argv = _ARGV

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


class ConsoleTest(unittest.TestCase):

  def _Child(self, *args):
    """A child that imports tools.console with a fake `tensorflow` whose
    import writes a load notice and a real line to file descriptor 2 (as
    TensorFlow's C++ code does), then prints TF_CPP_MIN_LOG_LEVEL."""
    with tempfile.TemporaryDirectory() as fake:
      os.makedirs(os.path.join(fake, 'tensorflow'))
      with open(os.path.join(fake, 'tensorflow', '__init__.py'), 'w') as f:
        f.write(textwrap.dedent('''
            import os
            os.write(2, b'I0000 00:00 port.cc:153] oneDNN custom operations '
                        b'are on. You may see ...\\n')
            os.write(2, b'E0000 something real went wrong\\n')
            '''))
      script = ('import sys, os; sys.path.insert(0, sys.argv[1]); '
                'sys.argv = ["tool"] + sys.argv[2:]; '
                'from tools import console; '
                'print(os.environ.get("TF_CPP_MIN_LOG_LEVEL"))')
      env = {k: v for k, v in os.environ.items()
             if k != 'TF_CPP_MIN_LOG_LEVEL'}
      env['PYTHONPATH'] = ROOT
      return subprocess.run([sys.executable, '-c', script, fake, *args],
                            capture_output=True, text=True, timeout=60,
                            env=env, check=False)

  def testLoadNoticesDroppedOtherLinesKept(self):
    out = self._Child()
    self.assertEqual(out.returncode, 0, out.stderr)
    self.assertEqual(out.stdout.strip(), '3')
    self.assertNotIn('oneDNN custom operations', out.stderr)
    self.assertIn('E0000 something real went wrong', out.stderr)

  def testTfLogsFlagKeepsEverything(self):
    out = self._Child('--tf_logs')
    self.assertEqual(out.returncode, 0, out.stderr)
    self.assertEqual(out.stdout.strip(), 'None')

  def testLibraryInfoLinesDroppedOwnLinesAndWarningsKept(self):
    drop = console._DropLibraryInfo()  # pylint: disable=protected-access

    def Record(level, path, name='absl'):
      return logging.LogRecord(name, level, path, 1, 'msg', (), None)
    tfds = os.path.join('x', 'tensorflow_datasets', 'core', 'reader.py')
    ours = os.path.join('x', 'tensorpipe', 'trainer_lib.py')
    self.assertFalse(drop.filter(Record(logging.INFO, tfds)))
    self.assertFalse(drop.filter(Record(logging.INFO, ours, 'tensorflow')))
    self.assertTrue(drop.filter(Record(logging.INFO, ours)))
    self.assertTrue(drop.filter(Record(logging.WARNING, tfds)))


  def testOneLineJoinsTheMessageWithoutAutoGraphFrames(self):
    self.assertEqual(console.OneLine(ValueError('bad value\n  use 3 ')),
                     'bad value use 3')
    autograph = ('in user code:\n\n    File "x.py", line 5, in f  *\n'
                 '        raise ValueError("boom")\n\n'
                 '    ValueError: boom\n')
    self.assertEqual(console.OneLine(ValueError(autograph)), 'boom')
    self.assertEqual(console.OneLine(KeyError()), 'KeyError')


if __name__ == '__main__':
  unittest.main()
