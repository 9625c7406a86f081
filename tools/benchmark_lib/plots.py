"""PNG plots of a benchmark run: speed-up, memory and a step's Gantt chart.

Matplotlib with the non-interactive Agg backend (no display needed).

Usage:
  PlotSpeedup(results, 'dense16', 'speedup_dense16.png')
  PlotGantt(events, num_partitions=4, marks=marks, path='timeline.png')
"""

import os
import re
from typing import Any, Dict, Sequence

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from tools.benchmark_lib import results as results_lib  # pylint: disable=wrong-import-position

_PHASE_COLORS = {'forward': '#4c72b0', 'recompute': '#dd8452',
                 'backward': '#55a868'}


def PlotGantt(events: Sequence[Any], num_partitions: int,
              marks: Dict[str, float], path: str, title: str = '') -> None:
  """PNG Gantt chart: one row per device, colour by phase, label t.

  Args:
    events: timeline.Event-like records (phase, k, t, start, end).
    num_partitions: K, the number of rows.
    marks: named times; 'step_start' (the origin) and 'step_end' are drawn.
    path: PNG file to write.
    title: the chart's title.
  """
  origin = marks.get('step_start', min(e.start for e in events))
  fig, ax = plt.subplots(figsize=(12, 1.0 + 0.6 * num_partitions))
  for e in events:
    left, width = (e.start - origin) * 1e3, (e.end - e.start) * 1e3
    ax.barh(e.k, width, left=left, color=_PHASE_COLORS[e.phase],
            edgecolor='black', linewidth=0.3, height=0.8)
    if width > 0:
      ax.text(left + width / 2, e.k, str(e.t), ha='center', va='center',
              fontsize=6, color='white')
  for name in ('step_start', 'step_end'):
    if name in marks:
      ax.axvline((marks[name] - origin) * 1e3, color='gray', ls='--', lw=0.8)
  ax.set_yticks(range(num_partitions))
  ax.set_yticklabels([f'device {k}' for k in range(num_partitions)])
  ax.invert_yaxis()
  ax.set_xlabel('time in the step (ms); number = micro-batch t')
  handles = [plt.Rectangle((0, 0), 1, 1, color=c)
             for c in _PHASE_COLORS.values()]
  ax.legend(handles, list(_PHASE_COLORS), loc='upper right', fontsize=7,
            ncol=3)
  ax.set_title(title)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def PlotSpeedup(results: Sequence[results_lib.Result], model: str,
                path: str) -> None:
  """Speed-up vs K, one line per (T, recompute), and the naive baselines."""
  def Value(r):
    return r.speedup.value if r.speedup else None
  rs = [r for r in results if r.model == model and r.pipelined and Value(r)
        and r.setting.name[0] == 'K'
        and r.setting.recompute_impl == 'explicit']
  fig, ax = plt.subplots(figsize=(6, 4))
  for t in sorted({r.num_micro_batches for r in rs}):
    for rc in (True, False):
      pts = sorted((r.num_partitions, Value(r)) for r in rs
                   if r.num_micro_batches == t and r.setting.recompute == rc)
      if pts:
        ax.plot(*zip(*pts), marker='o', ls='-' if rc else ':',
                label=f'T={t}{" recompute" if rc else ""}')
  for suffix, style in (('', '-'), ('-serial', ':')):
    naive = sorted((r.num_partitions, Value(r)) for r in results
                   if r.model == model and Value(r)
                   and re.match(rf'^naive-\d+{suffix}$', r.setting.name))
    if naive:
      ax.plot(*zip(*naive), marker='x', color='black', ls=style,
              label=f'naive-K{suffix}')
  ax.axhline(1.0, color='gray', lw=0.8)
  ax.set_xlabel('K (partitions = logical CPU devices)')
  ax.set_ylabel(f'speed-up vs {rs[0].speedup.vs if rs else "baseline"} '
                '(same process and threads)')
  ax.set_title(f'{model}: throughput speed-up ({os.cpu_count()} cores)')
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def PlotMemory(results: Sequence[results_lib.Result], model: str,
               path: str) -> None:
  """Peak RSS above idle per setting (bar chart)."""
  rs = [r for r in results if r.model == model]
  fig, ax = plt.subplots(figsize=(max(5, 0.45 * len(rs)), 4))
  ax.bar(range(len(rs)),
         [r.memory.peak_above_idle_bytes / 2**20 for r in rs],
         color=['#dd8452' if r.setting.recompute else '#4c72b0' for r in rs])
  ax.set_xticks(range(len(rs)))
  ax.set_xticklabels([r.setting.name for r in rs], rotation=60, fontsize=7,
                     ha='right')
  ax.set_ylabel('peak RSS above idle (MiB)')
  ax.set_title(f'{model}: peak memory per setting (orange = recompute)')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
