"""Starts one benchmark setting in a fresh Python process (parent side).

A fresh process per setting lets runner.RunSetting set TensorFlow's thread
pools and logical devices before TensorFlow starts, and keeps each setting's
memory figures its own.

Usage:
  r = RunSettingSubprocess('tiny', 'K2-T2-rc', steps=2, pair_with=['plain'])
  r.step_time_s, r.paired['plain'].step_time_s
"""

import json
import os
import re
import subprocess
import sys
from typing import Any

from tools import paths
from tools.benchmark_lib import results as results_lib
from tools.benchmark_lib import settings

_CHILD = 'from tools.benchmark_lib import runner; runner.ChildMain()'


def RunSettingSubprocess(model: str, setting_name: str, timeout_s: float = 600,
                         **kwargs: Any) -> results_lib.Result:
  """Runs runner.RunSetting in a fresh Python process and returns its result.

  Args:
    model: built-in model name or registered experiment key.
    setting_name: e.g. 'K2-T8-rc' (settings.ParseSetting).
    timeout_s: the child's time limit (subprocess.TimeoutExpired after it).
    **kwargs: the other arguments of runner.RunSetting (steps, warmup,
      partition_costs, timeline_dir, learning_rate, pair_with,
      step_profile_steps, remote_workers).

  Raises:
    ValueError: an unknown setting name (before starting anything).
    RuntimeError: the child failed, with its stderr tail.
    subprocess.TimeoutExpired: the child ran past `timeout_s`.
  """
  settings.ParseSetting(setting_name)
  request = dict(model=model, setting_name=setting_name, **kwargs)
  env = dict(os.environ)
  env['PYTHONPATH'] = paths.REPO_ROOT + (
      os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else '')
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  # TF's default CPU allocator keeps no statistics here (get_memory_info
  # raises); its BFC allocator does: the activation peak of the memory
  # target comes from them.
  env.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
  proc = subprocess.run(
      [sys.executable, '-c', _CHILD, json.dumps(request)],
      capture_output=True, text=True, timeout=timeout_s, env=env,
      cwd=paths.REPO_ROOT, check=False)
  for line in proc.stdout.splitlines():
    if line.startswith(results_lib.RESULT_LINE_PREFIX):
      payload = line[len(results_lib.RESULT_LINE_PREFIX):]
      return results_lib.Result.FromJson(json.loads(payload))
  raise RuntimeError(f'benchmark setting {setting_name!r} of {model!r} '
                     f'failed (exit {proc.returncode}):\n'
                     f'{proc.stderr[-3000:]}')


def FailureReason(error: BaseException) -> str:
  """The last error line of a failed child (`RunSettingSubprocess`'s
  RuntimeError), e.g. "ValueError: ... needs recompute=True ...", or the
  error's own first line."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  errors = [line for line in lines if re.match(r'^\w+(Error|Exception)\b:',
                                               line)]
  return (errors or lines or [type(error).__name__])[-1]
