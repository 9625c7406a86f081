"""Smoke test of the build and test setup (Bazel and pytest).

Checks the pinned TensorFlow is the one running, that the tests run in the
project's venv and that `import tensorpipe` finds the package (and not the
Bazel workspace root, which is also called tensorpipe).
"""
import os
import subprocess
import sys
import unittest

import tensorflow as tf

import tensorpipe


class BuildSmokeTest(unittest.TestCase):

  def test_tensorflow_version(self):
    self.assertEqual(tf.__version__, '2.21.0')

  def test_tensorflow_runs(self):
    self.assertEqual(int(tf.reduce_sum(tf.range(5))), 10)

  def test_runs_in_venv(self):
    self.assertNotEqual(sys.prefix, sys.base_prefix, sys.executable)

  def test_imports_tensorpipe_package(self):
    init = tensorpipe.__file__
    self.assertIsNotNone(init, 'tensorpipe resolved to a namespace package')
    package_dir = os.path.dirname(os.path.abspath(init))
    self.assertEqual(os.path.basename(package_dir), 'tensorpipe')
    # The package folder holds its BUILD file; the repo root holds WORKSPACE.
    self.assertFalse(os.path.exists(os.path.join(package_dir, 'WORKSPACE')))

  def test_pure_python_modules_import_without_tensorflow(self):
    # tensorpipe/__init__.py imports its top-level names on first use: the
    # schedule floor, the simulator, Params and the run's life-cycle modules
    # start without TensorFlow's ~5 s import (a dozen test targets do).
    pure = ('tensorpipe.hyperparams', 'tensorpipe.schedules',
            'tensorpipe.schedule_builders', 'tensorpipe.schedule_program',
            'tensorpipe.simulator', 'tensorpipe.partitioning',
            'tensorpipe.peer_wait', 'tensorpipe.preemption',
            'tensorpipe.worker_agreement', 'tensorpipe.checks',
            'tensorpipe.logdir', 'tensorpipe.model_registry')
    code = ('import sys\n' + ''.join(f'import {m}\n' for m in pure) +
            'print(sorted(m for m in sys.modules if m == "tensorflow" or '
            'm.startswith("keras")))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    self.assertEqual(out.strip(), '[]')

  def test_top_level_names_resolve(self):
    self.assertIs(tensorpipe.TensorPipeLayer,
                  tensorpipe.pipeline.TensorPipeLayer)
    self.assertIs(tensorpipe.Params, tensorpipe.hyperparams.Params)
    self.assertEqual(tensorpipe.layers.__name__, 'tensorpipe.layers')
    with self.assertRaisesRegex(AttributeError, "no attribute 'nope'"):
      tensorpipe.nope  # pylint: disable=pointless-statement

  def test_every_top_level_name_resolves_to_its_module(self):
    # Every lazily imported name, not only the three above: a wrong module
    # in the table would otherwise surface only in the user's first call.
    for name in tensorpipe.__all__:
      with self.subTest(name=name):
        value = getattr(tensorpipe, name)
        if name != 'layers':
          module = getattr(value, '__module__', None)
          self.assertIsNotNone(module, name)
          self.assertIs(getattr(sys.modules[module], name), value)


if __name__ == '__main__':
  unittest.main()
