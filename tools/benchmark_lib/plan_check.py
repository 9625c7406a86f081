"""The planner's accuracy: predicted vs measured step of every schedule.

`tools/benchmark --plan_check` runs, for each model of --models and each T
of --plan_check_ts, one child process (one intra-op thread, K = 2 inter-op
threads, 2 logical CPU devices: the benchmark's pipelined settings) that

  1. builds the five schedules of `schedule_plan.ALL` at K=2 with recompute
     (K2-T<t>-rc, -1f1b-rc, -i2-rc, -zbh1-rc, -zbv-rc),
  2. profiles the model (`cell_profile.ProfileLayer`: per-layer cells, tick
     and transfer cost) before and after the timed steps, and averages,
  3. times the five training steps in turn, one step each per round
     (median of --steps rounds), and
  4. predicts each with `cost_model.Predict` in the shared regime (the
     logical devices share the process's thread pools) on the cut the
     layer made, and ranks them with `schedule_auto.Rank` (the pick).

The parent prints per schedule the measured and predicted step, the
error, both ratios to 1F1B, and per (model, T) whether the planner's pick
is within 3% of the fastest measured schedule; then the median and worst
|error| over all rows.

  python -m tools.benchmark --plan_check --models=dense16,conv16
  python -m tools.benchmark --profile --models=dense16 --profile_setting=K2-T8-rc
"""

import json
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, List, Sequence

from tools import paths

RESULT_PREFIX = 'PLAN_CHECK_RESULT '
SUFFIXES = ('rc', '1f1b-rc', 'i2-rc', 'zbh1-rc', 'zbv-rc')
_CHILD = 'from tools.benchmark_lib import plan_check; plan_check.ChildMain()'


def _Average(a: Any, b: Any) -> Any:
  """The mean of two cost_model.Profiles, cell by cell."""
  from tensorpipe import cost_model  # pylint: disable=g-import-not-at-top
  mean = lambda x, y: (x + y) / 2
  return cost_model.Profile(
      tuple(cost_model.LayerCost(*[mean(getattr(x, f), getattr(y, f)) for f in
                                   ('forward', 'backward', 'input_grad',
                                    'weight_grad', 'out_bytes')])
            for x, y in zip(a.layers, b.layers)),
      a.micro_batch_rows, mean(a.tick_s, b.tick_s),
      mean(a.transfer_s_per_byte, b.transfer_s_per_byte), a.input_bytes,
      a.num_cores)


def _Measure(model: str, tt: int, steps: int, reps: int) -> Dict[str, Any]:
  """The child's work (module docstring); TF not yet started."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from tensorpipe import cell_profile, cost_model, devices, model_analysis
  from tensorpipe import schedule_auto, schedule_builders
  from tools.benchmark_lib import runner, settings
  # pylint: enable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(2)
  devices.SetNumLogicalCpuDevices(2)
  layer_ps, shape = runner.BuiltinLayers(model)
  x = tf.random.stateless_uniform(shape, seed=[1, 2])
  names = [f'K2-T{tt}-{s}' for s in SUFFIXES]
  parsed = {n: settings.ParseSetting(n) for n in names}
  layers = {n: runner.BuildLayer(parsed[n], layer_ps, shape) for n in names}
  before = cell_profile.ProfileLayer(layers[names[0]], (x,), reps)
  fns = {n: runner.StepFn(layers[n], x, 1e-3) for n in names}
  for fn in fns.values():
    for _ in range(2):
      fn(x)[0].numpy()
  times = {n: [] for n in names}
  for i in range(steps):
    for n in names[i % len(names):] + names[:i % len(names)]:
      start = _Now()
      fns[n](x)[0].numpy()
      times[n].append(_Now() - start)
  profile = _Average(before, cell_profile.ProfileLayer(
      layers[names[0]], (x,), reps))
  rows = []
  for n in names:
    s = parsed[n]
    table = schedule_builders.Build(s.schedule, 2, tt,
                                    s.num_stages_per_device)
    cut = layers[n].partition_plan.boundaries
    rows.append(dict(
        setting=n, schedule=s.schedule, v=s.num_stages_per_device,
        measured_s=statistics.median(times[n]),
        predicted_s=cost_model.Predict(table, profile, cut, True,
                                       'shared').step_s,
        separate_s=cost_model.Predict(table, profile, cut, True,
                                      'separate').step_s))
  report = model_analysis.AnalyzeLayers(
      layer_ps, [shape], num_partitions=2, num_micro_batches=tt,
      exact_optimizer_state=False)
  best = schedule_auto.Rank(report, profile, True, 'shared').best
  return dict(model=model, T=tt, rows=rows, pick=[best.name,
                                                  best.num_stages_per_device],
              profile=profile.ToJson())


def _Profile(model: str, setting: str, reps: int) -> Dict[str, Any]:
  """--profile: the profile of one setting's layer, with the threads and
  devices of the setting; per stage of its cut the summed cells."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from tensorpipe import cell_profile, devices
  from tools.benchmark_lib import runner, settings
  # pylint: enable=g-import-not-at-top
  s = settings.ParseSetting(setting)
  intra, inter = s.threads
  tf.config.threading.set_intra_op_parallelism_threads(intra)
  tf.config.threading.set_inter_op_parallelism_threads(inter)
  devices.SetNumLogicalCpuDevices(max(1, s.num_partitions))
  layer_ps, shape = runner.ModelLayers(model)
  layer = runner.BuildLayer(s, layer_ps, shape)
  x = tf.random.stateless_uniform(shape, seed=[1, 2])
  start = _Now()
  prof = cell_profile.ProfileLayer(layer, (x,), reps)
  took = _Now() - start
  plan = layer.partition_plan
  cut = plan.boundaries if plan else [(0, len(prof.layers))]
  stages = [{f: sum(getattr(c, f) for c in prof.layers[a:b]) for f in
             ('forward', 'backward', 'input_grad', 'weight_grad')}
            for a, b in cut]
  return dict(profile=prof.ToJson(), stages=stages, seconds=took)


def _Now() -> float:
  import time  # pylint: disable=g-import-not-at-top
  return time.perf_counter()


def ChildMain() -> None:
  """Entry point of the child: argv[1] is a JSON request."""
  request = json.loads(sys.argv[1])
  fn = _Profile if request.pop('action') == 'profile' else _Measure
  sys.stdout.write(RESULT_PREFIX + json.dumps(fn(**request)) + '\n')


def RunChild(model: str, tt: int, steps: int = 10, reps: int = 10,
             timeout_s: float = 900) -> Dict[str, Any]:
  """`_Measure` in a fresh process.

  Raises:
    RuntimeError: the child failed (with its stderr tail).
  """
  return _Spawn(dict(action='check', model=model, tt=tt, steps=steps,
                     reps=reps), timeout_s)


def ProfileChild(model: str, setting: str, reps: int = 10,
                 timeout_s: float = 900) -> Dict[str, Any]:
  """`_Profile` in a fresh process: {'profile', 'stages', 'seconds'}."""
  return _Spawn(dict(action='profile', model=model, setting=setting,
                     reps=reps), timeout_s)


def _Spawn(request: Dict[str, Any], timeout_s: float) -> Dict[str, Any]:
  """Runs ChildMain on `request`; RuntimeError with its stderr tail if it
  fails."""
  env = dict(os.environ)
  env['PYTHONPATH'] = paths.REPO_ROOT
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  proc = subprocess.run([sys.executable, '-c', _CHILD, json.dumps(request)],
                        capture_output=True, text=True, timeout=timeout_s,
                        env=env, cwd=paths.REPO_ROOT, check=False)
  for line in proc.stdout.splitlines():
    if line.startswith(RESULT_PREFIX):
      return json.loads(line[len(RESULT_PREFIX):])
  raise RuntimeError(f'{request} failed (exit {proc.returncode}):\n'
                     f'{proc.stderr[-3000:]}')


def Summary(results: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
  """Median and worst |predicted / measured - 1|, and per (model, T) the
  pick's measured step over the fastest measured one."""
  errs = [r['predicted_s'] / r['measured_s'] - 1 for res in results
          for r in res['rows']]
  picks = []
  for res in results:
    by = {(r['schedule'], r['v']): r['measured_s'] for r in res['rows']}
    picked = by[tuple(res['pick'])]
    picks.append(dict(model=res['model'], T=res['T'], pick=res['pick'],
                      over_best=picked / min(by.values()) - 1))
  return dict(median_abs_error=statistics.median(abs(e) for e in errs),
              worst_abs_error=max(abs(e) for e in errs), picks=picks,
              picks_within_3pct=sum(p['over_best'] <= 0.03 for p in picks))


def Table(results: Sequence[Dict[str, Any]]) -> str:
  """Markdown: one row per (model, T, schedule), then the summary."""
  lines = ['| model | T | schedule | measured ms | predicted ms | error | '
           'measured / 1F1B | predicted / 1F1B | separate-regime ms |',
           '|---|---|---|---|---|---|---|---|---|']
  for res in results:
    base = {k: next(r[k] for r in res['rows'] if r['schedule'] == '1f1b')
            for k in ('measured_s', 'predicted_s')}
    for r in res['rows']:
      lines.append(
          f'| {res["model"]} | {res["T"]} | {r["schedule"]} v={r["v"]} | '
          f'{r["measured_s"] * 1e3:.1f} | {r["predicted_s"] * 1e3:.1f} | '
          f'{r["predicted_s"] / r["measured_s"] - 1:+.1%} | '
          f'{r["measured_s"] / base["measured_s"]:.3f} | '
          f'{r["predicted_s"] / base["predicted_s"]:.3f} | '
          f'{r["separate_s"] * 1e3:.1f} |')
  s = Summary(results)
  lines += ['', f'median |error| {s["median_abs_error"]:.1%}, worst '
            f'{s["worst_abs_error"]:.1%}; picks within 3% of the best '
            f'measured: {s["picks_within_3pct"]} of {len(s["picks"])}']
  lines += [f'- {p["model"]} T={p["T"]}: pick {p["pick"][0]} v={p["pick"][1]}'
            f', {p["over_best"]:+.1%} over the fastest measured'
            for p in s['picks']]
  return '\n'.join(lines)


def Run(models: Sequence[str], ts: Sequence[int], steps: int, reps: int,
        log=print) -> List[Dict[str, Any]]:
  """One child per (model, T), in turn."""
  out = []
  for model in models:
    for tt in ts:
      res = RunChild(model, tt, steps, reps)
      log(f'{model} T={tt}: ' + ', '.join(
          f'{r["schedule"]} {r["measured_s"] * 1e3:.1f} / '
          f'{r["predicted_s"] * 1e3:.1f} ms' for r in res['rows']))
      out.append(res)
  return out
