"""Fixed ramps against switching ramps (tools/benchmark --ramp_check).

The engine runs a loss-inside table's short switching loops (the ramps
before and after the steady loop, at most `schedule_program.
FIXED_RAMP_TICKS` ticks) once, with every tick's cells fixed in the graph,
instead of one tf.switch_case per tick (`schedule_program.RAMP_TICKS`, the
default), and each F, B and I cell as a function of its own
(`schedule_program.ISOLATED_CELLS`), which makes fixed ramps exact.
This check times three forms of one setting in one process, in rotation
(`runner.RunSetting(switching_ramps=True)`): the default; twins, the same
pipeline with its weights copied, traced with RAMP_TICKS = 0 (switching
ramps) and with RAMP_TICKS = 0 and the F, B and I cells inline (the engine
before the isolation: switching ramps were then the default, as fixed
ramps were not exact on every model). One process, so the ratios are not
moved by the machine's drift between processes. The twins are traced
after: their trace times leave out the process's one-time costs, which
the first trace pays.

Usage:
  python -m tools.benchmark --ramp_check --models=dense4w256,xfmr8 \
      --settings=K2-T8-1f1b-rc,K2-T8-zbv-rc
"""

from typing import Dict, List, Sequence

from tools.benchmark_lib import settings

SWITCHING_RAMPS = 'switching-ramps'
INLINE_CELLS = 'switching-ramps-inline-cells'
# The twins: name -> whether their F, B and I cells are isolated.
TWINS = {SWITCHING_RAMPS: True, INLINE_CELLS: False}


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
  its twins (`TWINS`)."""
  twin = result.paired[SWITCHING_RAMPS]
  before = result.paired[INLINE_CELLS]
  return dict(model=model, setting=result.setting.name,
              ramp_ticks=ticks[0], ticks=ticks[1],
              fixed_ms=result.step_time_s * 1e3,
              switching_ms=twin.step_time_s * 1e3,
              inline_ms=before.step_time_s * 1e3,
              ratio=result.step_time_s / twin.step_time_s,
              isolation=twin.step_time_s / before.step_time_s,
              over_before=result.step_time_s / before.step_time_s,
              trace_fixed_s=result.trace_s,
              trace_switching_s=result.paired_trace_s[SWITCHING_RAMPS])


def Table(rows: Sequence[Dict[str, object]]) -> str:
  """Markdown table of `Row`s: fixed (the default), switching, and
  switching with the F, B and I cells inline (before)."""
  out = ['| model | setting | ramp ticks / ticks | fixed ms | switching ms '
         '| before ms | fixed / switching | isolation (switching / before) '
         '| fixed / before | trace s, fixed / switching |',
         '|---|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    out.append(
        f'| {r["model"]} | {r["setting"]} | {r["ramp_ticks"]} / '
        f'{r["ticks"]} | {r["fixed_ms"]:.2f} | {r["switching_ms"]:.2f} | '
        f'{r["inline_ms"]:.2f} | {r["ratio"]:.3f} | '
        f'{r["isolation"]:.3f} | {r["over_before"]:.3f} | '
        f'{r["trace_fixed_s"]:.1f} / {r["trace_switching_s"]:.1f} |')
  return '\n'.join(out)
