"""The planner against GPipe with uniform cuts, on an uneven model.

`tools/benchmark --plan_uniform` runs, for each model of --models and each
T of --plan_check_ts, one child process (one intra-op thread, K inter-op
threads, K logical CPU devices, as --plan_check) that builds three
pipelines of the same layers at K and T, with the same recompute setting
(and with recompute on a fourth):

  uniform   GPipe, the layers cut by count (`UniformCut`: K runs of
            L / K layers), what a user who does not weigh the layers gets
  balanced  GPipe, the layers cut by TensorPipeLayer's own partitioning
            (FLOPs, min-max), to tell the cut's share from the schedule's
  planner   schedule='auto' with a profile of the model measured in the
            same process (`cell_profile.ProfileLayer`, calibrated on one
            step per execution mode, saved as plan_profile): the schedule
            and v the planner picks, on the cut it makes (its measured
            cells: `schedule_auto.CutCosts`)
  planner_rc_auto  (recompute on only) the same with recompute='auto' and
            no memory budget: the planner may also drop the recompute

and times their training steps in turn, one step each per round (median of
--steps rounds, wall and CPU). The parent prints per (model, T) the
steps, the picks with their predicted steps, and uniform / planner (the
issue's bar: at least 1.2x on a deliberately uneven model; the built-in
`taper16` has widths 256 -> 1024, its last 8 layers 77% of the FLOPs).

  python -m tools.benchmark --plan_uniform --models=taper16 \
      --plan_check_ts=4,8,16
"""

import itertools
import os
import tempfile
from typing import Any, Callable, Dict, List, Sequence

def UniformCut(num_layers: int, num_partitions: int) -> List[range]:
  """The layers' indices cut by count into K contiguous runs (the first
  L mod K runs one longer).

  Raises:
    ValueError: fewer layers than partitions.
  """
  if num_layers < num_partitions:
    raise ValueError(f'{num_layers} layers cannot be cut into '
                     f'{num_partitions} non-empty partitions; use a smaller '
                     'K (--plan_check_k)')
  q, r = divmod(num_layers, num_partitions)
  starts = [k * q + min(k, r) for k in range(num_partitions + 1)]
  return [range(a, b) for a, b in zip(starts, starts[1:])]


def Measure(model: str, tt: int, steps: int, reps: int,
             recompute: bool = True, num_partitions: int = 2
             ) -> Dict[str, Any]:
  """The child's work (module docstring); TF not yet started."""
  # pylint: disable=g-import-not-at-top
  from tensorpipe import cell_profile, cost_model, schedule_auto
  from tools.benchmark_lib import plan_check, runner, settings
  # pylint: enable=g-import-not-at-top
  kk = num_partitions
  layer_ps, shape, x = plan_check.ChildInputs(model, kk)
  rc = 'rc' if recompute else 'norc'
  setting = settings.ParseSetting(f'K{kk}-T{tt}-{rc}')
  profiled = runner.BuildLayer(
      settings.ParseSetting(f'K{kk}-T{tt}-1f1b-{rc}'), layer_ps, shape)
  # With recompute the planner_rc_auto layer ranks both settings.
  modes = [m for m, (_, mrc) in cost_model.MODES.items()
           if recompute or not mrc]
  profile = cell_profile.ProfileLayer(profiled, (x,), reps,
                                      calibrate=True, calibrate_modes=modes)
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'profile.json')
    profile.Save(path)
    planner_p = runner.PipelineParams(setting, layer_ps, shape).Set(
        schedule=schedule_auto.AUTO, plan_profile=path)
    variants = {'planner': planner_p}
    if recompute:
      variants['planner_rc_auto'] = planner_p.Copy().Set(
          recompute=schedule_auto.AUTO)
    plans = {k: schedule_auto.PlanFor(q) for k, q in variants.items()}
    layers = {
        'uniform': runner.PipelineParams(setting, layer_ps, shape).Set(
            layers=None, partitions=[
                [layer_ps[i] for i in run]
                for run in UniformCut(len(layer_ps), kk)]).Instantiate(),
        'balanced': runner.BuildLayer(setting, layer_ps, shape),
        **{k: q.Instantiate() for k, q in variants.items()}}
  wall, cpu = plan_check.TimeInTurn(
      {k: runner.StepFn(v, x, 1e-3) for k, v in layers.items()}, x, steps)
  picks = {k: [layers[k].params.schedule,
               layers[k].params.num_stages_per_device or 1,
               layers[k].params.recompute] for k in plans}
  return dict(
      model=model, T=tt, K=kk, recompute=recompute,
      measured_s=wall, measured_cpu_s=cpu,
      pick=picks['planner'][:2], picks=picks,
      predicted={k: plan.best.step_s if plan.best else float('nan')
                 for k, plan in plans.items()},
      predicted_s=plans['planner'].best.step_s,
      cuts={k: [[a, b] for a, b in cell_profile.StageCut(v)]
            for k, v in layers.items()},
      load_average=os.getloadavg()[0])


def Run(models: Sequence[str], ts: Sequence[int], steps: int, reps: int,
        log: Callable[[str], None] = print,
        recompute: Sequence[bool] = (True,),
        num_partitions: int = 2) -> List[Dict[str, Any]]:
  """One child per (model, T, recompute setting), in turn (module
  docstring)."""
  from tools.benchmark_lib import plan_check  # pylint: disable=g-import-not-at-top
  out = []
  for model, tt, rc in itertools.product(models, ts, recompute):
    res = plan_check.Spawn(dict(
        action='uniform', model=model, tt=tt, steps=steps, reps=reps,
        recompute=rc, num_partitions=num_partitions), 1800)
    log(f'{model} T={tt}{"" if rc else " norc"}: ' + ', '.join(
        f'{k} {v * 1e3:.1f} ms' for k, v in res['measured_s'].items()) +
        f'; picks {res.get("picks", res["pick"])}')
    out.append(res)
  return out


def Table(results: Sequence[Dict[str, Any]]) -> str:
  """Markdown: one row per (model, T), then the worst and best ratio."""
  lines = ['| model | K | T | recompute | GPipe, uniform cut ms | GPipe, '
           'balanced cut ms | planner\'s pick | its step ms measured / '
           'predicted | uniform / planner | uniform / balanced | '
           "recompute='auto': pick, ms measured / predicted, uniform / it |",
           '|---|---|---|---|---|---|---|---|---|---|---|']
  ratios, auto_ratios = [], []
  for r in results:
    m = r['measured_s']
    ratios.append(m['uniform'] / m['planner'])
    auto = '-'
    if 'planner_rc_auto' in m:
      s, v, rc = r['picks']['planner_rc_auto']
      auto_ratios.append(m['uniform'] / m['planner_rc_auto'])
      auto = (f'{s} v={v}{"" if rc else " norc"}, '
              f'{m["planner_rc_auto"] * 1e3:.1f} / '
              f'{r["predicted"]["planner_rc_auto"] * 1e3:.1f}, '
              f'{auto_ratios[-1]:.2f}x')
    lines.append(
        f'| {r["model"]} | {r["K"]} | {r["T"]} | '
        f'{"on" if r["recompute"] else "off"} | {m["uniform"] * 1e3:.1f} | '
        f'{m["balanced"] * 1e3:.1f} | {r["pick"][0]} v={r["pick"][1]} | '
        f'{m["planner"] * 1e3:.1f} / {r["predicted_s"] * 1e3:.1f} | '
        f'{ratios[-1]:.2f}x | {m["uniform"] / m["balanced"]:.2f}x | '
        f'{auto} |')
  for what, rs in (('planner', ratios),
                   ("planner with recompute='auto'", auto_ratios)):
    if rs:
      lines += ['', f'uniform / {what}: {min(rs):.2f}x to {max(rs):.2f}x '
                f'over {len(rs)} settings (the bar: 1.2x)']
  lines += ['', 'cuts (stage [start, end) of the layers): ' + '; '.join(
      f'{r["model"]} T={r["T"]} ' + ', '.join(
          f'{k} {c}' for k, c in r['cuts'].items()) for r in results)]
  return '\n'.join(lines)
