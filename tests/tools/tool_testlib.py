"""Runs a tools/ binary as `python -m tools.<name>` in a fresh process.

Shared by the tests of the binaries (tests/tools/*_test.py).
"""

import os
import subprocess
import sys

# The repository root (the folder holding tools/).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def RunTool(name: str, *args: str,
            timeout_s: float = 600) -> subprocess.CompletedProcess:
  """Runs tools/<name>.py with `args`; returns the finished process (text
  stdout and stderr, any exit status)."""
  return subprocess.run(
      [sys.executable, '-m', f'tools.{name}', *args], cwd=ROOT,
      capture_output=True, text=True, timeout=timeout_s, check=False)
