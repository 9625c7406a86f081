"""Smoke test of the build and test setup (Bazel and pytest).

Checks the pinned TensorFlow is the one running, that the tests run in the
project's venv and that `import tensorpipe` finds the package (and not the
Bazel workspace root, which is also called tensorpipe).
"""
import os
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


if __name__ == '__main__':
  unittest.main()
