"""Placeholder for the consistency tool (the lead replaces this file)."""
from absl import app

import tensorpipe  # noqa: F401  (checks the import path under `bazel run`)


def main(argv):
  print('placeholder', *argv[1:])


if __name__ == '__main__':
  app.run(main)
