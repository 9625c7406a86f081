"""Markdown tables of a benchmark run (printed and written to tables.md).

Usage:
  text = ReportText(report)      # a results.Report
"""

import os
from typing import Dict, List, Optional, Sequence

from tools import paths
from tools.benchmark_lib import results as results_lib


def _Mb(x: Optional[float]) -> str:
  return '-' if x is None else f'{x / 2**20:.0f}'


def _ErrorText(p: Optional[results_lib.Prediction]) -> str:
  """The prediction error cell, with what the error is of."""
  if p is None or p.error is None:
    return '-'
  text = f'{p.error * 100:+.0f}%'
  if p.source == 'isolated':
    text += ' (isolated costs)'
  if p.calibration_run:
    text += ' (fit)'
  if p.uncalibrated:
    text += ' (no K=1 fit: overheads 0)'
  return text


def MarkdownTable(results: Sequence[results_lib.Result]) -> str:
  """A markdown table of results (one row per setting)."""
  head = ('| model | setting | K | T | recompute | step ms | examples/s | '
          'speed-up | vs | peak RSS MiB above idle | activation peak MiB '
          '(TF allocator) | predicted ms | error (recompute settings: vs '
          'their recorded steps\' time) | error from isolated '
          'stage costs |')
  lines = [head, '|' + '---|' * (head.count('|') - 1)]
  any_paired = False
  for r in results:
    s, p, sp = r.setting, r.prediction, r.speedup
    pipe = r.pipelined
    sp_s = '-' if sp is None or sp.value is None else f'{sp.value:.2f}x'
    if sp is not None and sp.value is not None and sp.paired:
      sp_s += '*'
      any_paired = True
    pred = p.step_s if p else None
    err_i = p.error_isolated if p else None
    cells = [r.model, s.name, s.num_partitions if pipe else '-',
             s.num_micro_batches if pipe or s.num_micro_batches > 1 else '-',
             'yes' if s.recompute else 'no',
             f'{r.step_time_s * 1e3:.1f}', f'{r.examples_per_s:.0f}',
             sp_s, (sp.vs if sp else None) or '-',
             _Mb(r.memory.peak_above_idle_bytes),
             _Mb(r.memory.activation_peak_bytes),
             '-' if pred is None else f'{pred * 1e3:.1f}', _ErrorText(p),
             '-' if err_i is None else f'{err_i * 100:+.0f}%']
    lines.append('| ' + ' | '.join(str(c) for c in cells) + ' |')
  if any_paired:
    lines.append('\n\\* baseline timed in the same process, interleaved '
                 'step by step with the setting and with its threads (plain '
                 'next to a K-partition setting runs with K inter-op '
                 'threads).')
  return '\n'.join(lines)


def BreakdownTable(breakdown: Dict[str, float]) -> str:
  """Markdown table of a timeline breakdown (seconds -> ms and % of step)."""
  step = breakdown['step']
  lines = ['| part | ms | % of step |', '|---|---|---|']
  for key in ('forward', 'backward', 'recompute', 'bubble', 'load_imbalance',
              'setup', 'weight_update', 'backward_and_weight_update', 'step'):
    if key in breakdown:
      v = breakdown[key]
      lines.append(f'| {key} | {v * 1e3:.1f} | {100 * v / step:.0f}% |')
  return '\n'.join(lines)


def TargetsTable(rows: Sequence[results_lib.TargetRow]) -> str:
  """Markdown table of the targets: pass / FAIL / not run / explains."""
  lines = ['| target | measured | limit | result |', '|---|---|---|---|']
  for r in rows:
    m = '-' if r.measured is None else f'{r.measured:.3f}'
    res = {True: 'pass', False: 'FAIL', None: 'not run'}[r.passed]
    if r.info:
      res = 'explains' if r.measured is not None else 'not run'
    lines.append(f'| {r.target} | {m} | {r.limit} | {res} |')
  return '\n'.join(lines)


def _RepoRelative(path: str) -> str:
  """`path` relative to the repository when it is inside it."""
  rel = os.path.relpath(path, paths.REPO_ROOT)
  return path if rel.startswith('..') else rel


def ReportText(report: results_lib.Report) -> str:
  """The whole printed report (also written to tables.md) of a run."""
  out: List[str] = [MarkdownTable(report.results), '',
                    TargetsTable(report.targets)]
  for t in report.timelines:
    tl = t.timeline
    out.append(f'\nTimeline {t.model} {t.setting.name} (step '
               f"{tl.breakdown_s['step'] * 1e3:.1f} ms): "
               f'{_RepoRelative(tl.png)}, {_RepoRelative(tl.chrome_trace)}')
    out.append(BreakdownTable(tl.breakdown_s))
  if report.not_run:
    out.append('\nNot run (the child failed; its last error line):')
    out += [f"- {n['model']} {n['setting']}: {n['reason']}"
            for n in report.not_run]
  out.append(f'\nMachine: {report.cpu_count} cores; load average at start '
             f'{report.load_average_at_start:.2f}; wall time '
             f'{report.wall_time_s:.0f} s.')
  return '\n'.join(out) + '\n'
