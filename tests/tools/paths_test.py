"""Tests of tools/paths.py: the repository root and user-relative paths."""

import os
import unittest
from unittest import mock

from tools import paths


class UserPathTest(unittest.TestCase):

  def testRelativePathIsTakenFromBazelsWorkingDirectory(self):
    with mock.patch.dict(os.environ, {'BUILD_WORKING_DIRECTORY': '/home/u'}):
      self.assertEqual(paths.UserPath('logs/a'), '/home/u/logs/a')
      self.assertEqual(paths.UserPath('../b'), '/home/u/../b')

  def testRelativePathIsTakenFromTheWorkingDirectoryOutsideBazel(self):
    env = {k: v for k, v in os.environ.items()
           if k != 'BUILD_WORKING_DIRECTORY'}
    with mock.patch.dict(os.environ, env, clear=True):
      self.assertEqual(paths.UserPath('logs/a'),
                       os.path.join(os.getcwd(), 'logs/a'))

  def testAbsolutePathIsKept(self):
    with mock.patch.dict(os.environ, {'BUILD_WORKING_DIRECTORY': '/home/u'}):
      self.assertEqual(paths.UserPath('/data/x'), '/data/x')

  def testHomeIsExpanded(self):
    with mock.patch.dict(os.environ, {'HOME': '/home/me',
                                      'BUILD_WORKING_DIRECTORY': '/w'}):
      self.assertEqual(paths.UserPath('~/runs'), '/home/me/runs')


class RepoRootTest(unittest.TestCase):

  def testRepoRootHoldsTheTopLevelPackages(self):
    for name in ('tensorpipe', 'models', 'params', 'tools'):
      self.assertTrue(os.path.isdir(os.path.join(paths.REPO_ROOT, name)),
                      name)


if __name__ == '__main__':
  unittest.main()
