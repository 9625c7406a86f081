"""Fixed ramps against switching ramps (tools/benchmark --ramp_check).

The engine can run a loss-inside table's short switching loops (the
ramps before and after the steady loop, at most `schedule_program.
FIXED_RAMP_TICKS` ticks) once, with every tick's cells fixed in the graph,
instead of one tf.switch_case per tick (`schedule_program.RAMP_TICKS`: off
by default, as fixed ramps are not exact on every model). This check
times both forms of one setting in one process, in rotation
(`runner.RunSetting(switching_ramps=True)`: the setting traced with fixed
ramps, its twin the same pipeline, its weights copied, traced with
RAMP_TICKS = 0),
so the ratio is not moved by the machine's drift between processes. The
twin is traced second: its trace time leaves out the process's one-time
costs, which the first trace pays.

Usage:
  python -m tools.benchmark --ramp_check --models=dense4w256,xfmr8 \
      --settings=K2-T8-1f1b-rc,K2-T8-zbv-rc
"""

from typing import Dict, List, Sequence

from tools.benchmark_lib import settings

SWITCHING_RAMPS = 'switching-ramps'


def CheckSetting(setting: settings.Setting) -> None:
  """ValueError unless the setting has ramps to fix: pipelined, the loss
  inside (not GPipe) and recompute on (without it the table is unrolled)."""
  if (setting.kind != 'pipe' or setting.schedule == 'gpipe' or
      not setting.recompute):
    raise ValueError(
        f'--ramp_check times a loss-inside schedule with recompute, whose '
        f'ramps the engine runs with fixed cells; {setting.name!r} is not '
        'one: use e.g. K2-T8-1f1b-rc, K2-T8-zbh1-rc, K2-T8-i2-rc or '
        'K2-T8-zbv-rc')


def RampTicks(setting: settings.Setting) -> List[int]:
  """[ticks in ramps run with fixed cells, ticks in the table]."""
  from tensorpipe import schedule_program  # pylint: disable=g-import-not-at-top
  program = schedule_program.Compile(settings.ScheduleTable(setting))
  loops = schedule_program.Loops(
      program.branch, 0, program.num_ticks,
      unroll_ramps=schedule_program.FIXED_RAMP_TICKS)
  steady = schedule_program.Loops(program.branch, 0, program.num_ticks)
  steady_ticks = sum(x.end - x.first for x in steady if x.steady)
  fixed = sum(x.end - x.first for x in loops if x.steady) - steady_ticks
  return [fixed, program.num_ticks]


def Row(model: str, result, ticks: Sequence[int]) -> Dict[str, object]:
  """One row of the table from a `results.Result` of the setting run with
  its switching twin."""
  twin = result.paired[SWITCHING_RAMPS]
  return dict(model=model, setting=result.setting.name,
              ramp_ticks=ticks[0], ticks=ticks[1],
              fixed_ms=result.step_time_s * 1e3,
              switching_ms=twin.step_time_s * 1e3,
              ratio=result.step_time_s / twin.step_time_s,
              trace_fixed_s=result.trace_s,
              trace_switching_s=result.paired_trace_s[SWITCHING_RAMPS])


def Table(rows: Sequence[Dict[str, object]]) -> str:
  """Markdown table of `Row`s."""
  out = ['| model | setting | ramp ticks / ticks | fixed ms | switching ms '
         '| fixed / switching | trace s, fixed / switching |',
         '|---|---|---|---|---|---|---|']
  for r in rows:
    out.append(
        f'| {r["model"]} | {r["setting"]} | {r["ramp_ticks"]} / '
        f'{r["ticks"]} | {r["fixed_ms"]:.2f} | {r["switching_ms"]:.2f} | '
        f'{r["ratio"]:.3f} | {r["trace_fixed_s"]:.1f} / '
        f'{r["trace_switching_s"]:.1f} |')
  return '\n'.join(out)
