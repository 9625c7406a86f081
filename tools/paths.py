"""Paths of the tools: the repository root and user-given path flags.

`bazel run //tools:x` starts a binary inside its runfiles tree, not where the
user typed the command; Bazel names that folder in $BUILD_WORKING_DIRECTORY.
A relative path flag (--logdir=logs/a) means a path relative to it, as it
does for `python -m tools.x` run from the shell's directory.

Usage:
  logdir = paths.UserPath(FLAGS.logdir)
"""

import os

# The folder holding tensorpipe/, models/, params/ and tools/ (under
# `bazel run`, the workspace's folder in the runfiles tree).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def UserPath(path: str) -> str:
  """An absolute path for a path flag, relative to where the user ran the
  binary: $BUILD_WORKING_DIRECTORY under `bazel run`, else the working
  directory. A leading '~' is expanded; absolute paths are kept."""
  path = os.path.expanduser(path)
  if os.path.isabs(path):
    return path
  return os.path.join(os.environ.get('BUILD_WORKING_DIRECTORY', os.getcwd()),
                      path)
