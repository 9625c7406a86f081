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
from typing import Any, Dict, Optional

from tools import paths
from tools.benchmark_lib import results as results_lib
from tools.benchmark_lib import settings

_CHILD = 'from tools.benchmark_lib import runner; runner.ChildMain()'


def RunJsonChild(code: str, request: Any, prefix: str, timeout_s: float,
                 what: str, env: Optional[Dict[str, str]] = None) -> Any:
  """Runs `python -c code json(request)` from the repository root (on
  PYTHONPATH, TF's C++ logs quiet, `env` added) and returns the JSON of the
  stdout line that starts with `prefix`.

  Raises:
    RuntimeError: no such line: "<what> failed (exit N)" and the stderr tail.
    subprocess.TimeoutExpired: the child ran past `timeout_s`.
  """
  full = dict(os.environ)
  full['PYTHONPATH'] = paths.REPO_ROOT + (
      os.pathsep + full['PYTHONPATH'] if full.get('PYTHONPATH') else '')
  full.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  full.update(env or {})
  proc = subprocess.run(
      [sys.executable, '-c', code, json.dumps(request)],
      capture_output=True, text=True, timeout=timeout_s, env=full,
      cwd=paths.REPO_ROOT, check=False)
  for line in proc.stdout.splitlines():
    if line.startswith(prefix):
      return json.loads(line[len(prefix):])
  raise RuntimeError(f'{what} failed (exit {proc.returncode}):\n'
                     f'{proc.stderr[-3000:]}')


def RunSettingSubprocess(model: str, setting_name: str, timeout_s: float = 600,
                         **kwargs: Any) -> results_lib.Result:
  """Runs runner.RunSetting in a fresh Python process and returns its result.

  Args:
    model: built-in model name or registered experiment key.
    setting_name: e.g. 'K2-T8-rc' (settings.ParseSetting).
    timeout_s: the child's time limit (subprocess.TimeoutExpired after it).
    **kwargs: the other arguments of runner.RunSetting (steps, warmup,
      partition_costs, timeline_dir, learning_rate, pair_with,
      step_profile_steps, remote_workers, switching_ramps, cpu_pids,
      one_pass_cells).

  Raises:
    ValueError: an unknown setting name (before starting anything).
    RuntimeError: the child failed, with its stderr tail.
    subprocess.TimeoutExpired: the child ran past `timeout_s`.
  """
  settings.ParseSetting(setting_name)
  request = dict(model=model, setting_name=setting_name, **kwargs)
  # TF's default CPU allocator keeps no statistics here (get_memory_info
  # raises); its BFC allocator does: the activation peak of the memory
  # target comes from them.
  env = {'TF_CPU_ALLOCATOR_USE_BFC':
         os.environ.get('TF_CPU_ALLOCATOR_USE_BFC', 'true')}
  return results_lib.Result.FromJson(RunJsonChild(
      _CHILD, request, results_lib.RESULT_LINE_PREFIX, timeout_s,
      f'benchmark setting {setting_name!r} of {model!r}', env))


def FailureReason(error: BaseException) -> str:
  """The last error line of a failed child (`RunSettingSubprocess`'s
  RuntimeError), e.g. "ValueError: ... needs recompute=True ...", or the
  error's own first line."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  errors = [line for line in lines if re.match(r'^\w+(Error|Exception)\b:',
                                               line)]
  return (errors or lines or [type(error).__name__])[-1]
