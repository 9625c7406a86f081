"""The planner's accuracy: predicted vs measured step of every schedule.

`tools/benchmark --plan_check` runs, for each model of --models and each T
of --plan_check_ts, one child process (one intra-op thread, K inter-op
threads, K logical CPU devices: the benchmark's pipelined settings; K =
--plan_check_k, 2 by default) that

  1. builds the five schedules of `schedule_plan.ALL` at K with recompute
     (K<k>-T<t>-rc, -1f1b-rc, -i2-rc, -zbh1-rc, -zbv-rc) and, with
     --plan_check_norc, without it too (-norc),
  2. profiles the model (`cell_profile.ProfileLayer`: per-layer cells, tick
     and transfer cost) before and after the timed steps, and averages,
  3. times the five training steps in turn, one step each per round
     (median of --steps rounds); at the first T of a model it calibrates
     the profile on the median steps of one schedule per execution mode
     (`_FitToRounds`: 1F1B, GPipe and ZB-H1 with recompute, and without it
     too with --plan_check_norc: those rows are marked and not counted),
     at the others it applies that calibration (every row a prediction;
     with --plan_check_calibrate_ts=N the first N T are calibrated and the
     others get them interpolated at their micro-batch size), and
  4. predicts each with `cost_model.Predict` in the shared regime (the
     logical devices share the process's thread pools) on the cut the
     layer made, and ranks them with `schedule_auto.Rank` (the pick) on
     that FLOP cut too (schedule='auto' with a measured profile would cut
     on its cells: --plan_uniform times that).

The parent prints per schedule the measured and predicted step, the
error, both ratios to 1F1B, and per (model, T) whether the planner's pick
is within 3% of the fastest measured schedule; then the median and worst
|error| over all rows.

With --plan_check_sweep_t one child per model times 1F1B (K=2,
recompute) at every T of --plan_check_ts instead, profiles the cells at
each of those micro-batch sizes (the curve), and checks the T that
num_micro_batches='auto' picks against the fastest measured T.

  python -m tools.benchmark --plan_check --models=dense16,conv16
  python -m tools.benchmark --plan_check --plan_check_sweep_t \
      --plan_check_ts=1,2,4,8,16 --models=dense16,conv16
  python -m tools.benchmark --profile --models=dense16 --profile_setting=K2-T8-rc
"""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from tools import paths

RESULT_PREFIX = 'PLAN_CHECK_RESULT '
SUFFIXES = ('rc', '1f1b-rc', 'i2-rc', 'zbh1-rc', 'zbv-rc')
_CHILD = 'from tools.benchmark_lib import plan_check; plan_check.ChildMain()'


def _Average(a: Any, b: Any) -> Any:
  """The mean of two cost_model.Profiles, cell by cell (and point by
  point)."""
  from tensorpipe import cost_model  # pylint: disable=g-import-not-at-top
  mean = lambda x, y: (x + y) / 2
  fields = [f.name for f in dataclasses.fields(cost_model.LayerCost)]
  return cost_model.Profile(
      tuple(cost_model.LayerCost(*[mean(getattr(x, f), getattr(y, f))
                                   for f in fields])
            for x, y in zip(a.layers, b.layers)),
      a.micro_batch_rows, mean(a.tick_s, b.tick_s),
      mean(a.transfer_s_per_byte, b.transfer_s_per_byte), a.input_bytes,
      mean(a.num_cores, b.num_cores),
      points=tuple(_Average(p, q) for p, q in zip(a.points, b.points)),
      cell_scale=mean(a.cell_scale, b.cell_scale),
      mode_scales=a.mode_scales)


def _Measure(model: str, tt: int, steps: int, reps: int,
             sweep: Sequence[int] = (),
             recompute: Sequence[bool] = (True,),
             calibrate: bool = True,
             calibration: Optional[Any] = None,
             num_partitions: int = 2) -> Dict[str, Any]:
  """The child's work (module docstring); TF not yet started. With
  `sweep` (T values) it times 1F1B at each T instead, profiles the cells at
  each micro-batch size, and the pick is num_micro_batches='auto''s.

  With `calibrate` and no `calibration` the profile is fitted to this T's
  timed 1F1B steps with recompute and to those of one schedule per other
  execution mode (cost_model.MODES: GPipe's, ZB-H1's and 1F1B's rows;
  marked as calibration rows); with `calibration` (a list of [micro-batch
  rows, calibration] of other T: interpolated at this T's size by
  `cost_model.InterpolatedCalibration`; or one T's: cell_scale,
  num_cores, mode_scales) it is applied to this T's profile instead, and
  every row is a prediction."""
  # pylint: disable=g-import-not-at-top
  from tensorpipe import cell_profile, cost_model, model_analysis
  from tensorpipe import schedule_auto, schedule_plan
  from tools.benchmark_lib import runner, settings
  # pylint: enable=g-import-not-at-top
  kk = num_partitions
  layer_ps, shape, x = ChildInputs(model, kk)
  names = ([f'K{kk}-T{t}-1f1b-rc' for t in sweep] if sweep else
           [f'K{kk}-T{tt}-{s[:-2]}{"rc" if rc else "norc"}'
            for rc in recompute for s in SUFFIXES])
  sizes = [shape[0] // t for t in sweep]
  parsed = {n: settings.ParseSetting(n) for n in names}
  layers = {}
  for n in names:
    try:
      layers[n] = runner.BuildLayer(parsed[n], layer_ps, shape)
    except ValueError as e:   # a schedule that does not apply (ZB-V, T < 2K-1)
      print(f'plan_check: {n} skipped: {e}', file=sys.stderr)
  names = [n for n in names if n in layers]
  # Calibrated on 1F1B with recompute (of a sweep: at its first T).
  calib = next((n for n in names if parsed[n].schedule == '1f1b' and
                parsed[n].recompute), names[0])
  fit = calibrate and calibration is None
  before = cell_profile.ProfileLayer(layers[calib], (x,), reps,
                                     micro_batch_sizes=sizes)
  load = os.getloadavg()[0]
  times, cpu = TimeInTurn(
      {n: runner.StepFn(layers[n], x, 1e-3) for n in names}, x, steps)
  profile = _Average(before, cell_profile.ProfileLayer(
      layers[calib], (x,), reps, micro_batch_sizes=sizes))
  if isinstance(calibration, list):   # (rows, calibration) of other T
    calibration = cost_model.InterpolatedCalibration(
        [(r, c) for r, c in calibration], profile.micro_batch_rows)
  if calibration is not None:
    profile = profile.Applied(**calibration)
  fitted = set()
  if fit:
    profile, fitted = _FitToRounds(
        profile, {n: (settings.ScheduleTable(parsed[n]),
                      cell_profile.StageCut(layers[n]), parsed[n].recompute,
                      times[n], cpu[n])
                  for n in names}, calib, modes=not sweep)
  rows = []
  for n in names:
    s = parsed[n]
    table = settings.ScheduleTable(s)
    cut = cell_profile.StageCut(layers[n])
    at_t = profile.Scaled(shape[0] // s.num_micro_batches)
    pred = cost_model.Predict(table, at_t, cut, s.recompute, 'shared')
    rows.append(dict(
        setting=n, schedule=s.schedule, v=s.num_stages_per_device,
        calibration=(n == calib if sweep else
                     (s.schedule, s.recompute) in fitted) and fit,
        T=s.num_micro_batches, recompute=s.recompute,
        measured_s=times[n], measured_cpu_s=cpu[n],
        predicted_s=pred.step_s,
        predicted_cpu_s=pred.work_s + pred.ticks * at_t.tick_s,
        separate_s=cost_model.Predict(table, at_t, cut, s.recompute,
                                      'separate').step_s))
  report = model_analysis.AnalyzeLayers(
      layer_ps, [shape], num_partitions=kk, num_micro_batches=tt,
      exact_optimizer_state=False)
  best = schedule_auto.RankOverT(
      report, lambda r: schedule_auto.ProfileFor(r, profile),
      list(sweep) or [tt], True, 'shared',
      [('1f1b', 1)] if sweep else schedule_plan.ALL).best
  return dict(model=model, T='auto' if sweep else tt, K=kk, rows=rows,
              pick=[best.name, best.num_stages_per_device,
                    best.num_micro_batches],
              profile=profile.ToJson(), load_average=load,
              calibration=profile.Calibration())


def ChildInputs(model: str, num_devices: int) -> Tuple[List[Any],
                                                     List[int], Any]:
  """A child's start (before any op runs): one intra-op thread and one
  inter-op thread per device, `num_devices` logical CPU devices, then
  (the model's layer Params, its input shape, a random input)."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from tensorpipe import devices
  from tools.benchmark_lib import runner
  # pylint: enable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(num_devices)
  devices.SetNumLogicalCpuDevices(num_devices)
  layer_ps, shape = runner.ModelLayers(model)
  return layer_ps, shape, tf.random.stateless_uniform(shape, seed=[1, 2])


def TimeInTurn(fns: Dict[str, Callable[[Any], Any]], x: Any, steps: int
               ) -> Tuple[Dict[str, float], Dict[str, float]]:
  """Median wall and CPU seconds of each step function on `x`, timed in
  turn (one step each per round, the order rotated: this machine drifts)
  after two warm-up steps each."""
  for fn in fns.values():
    for _ in range(2):
      fn(x)[0].numpy()
  names = list(fns)
  wall = {n: [] for n in names}
  cpu = {n: [] for n in names}
  for i in range(steps):
    for n in names[i % len(names):] + names[:i % len(names)]:
      start, start_cpu = _Now(), time.process_time()
      fns[n](x)[0].numpy()
      wall[n].append(_Now() - start)
      cpu[n].append(time.process_time() - start_cpu)
  return ({n: statistics.median(v) for n, v in wall.items()},
          {n: statistics.median(v) for n, v in cpu.items()})


def _FitToRounds(profile: Any, measured: Dict[str, Any], calib: str,
                 modes: bool = True, max_cores: Optional[float] = None):
  """`profile` calibrated on the timed rounds themselves: on the median
  step of `calib` (`cost_model.Profile.Calibrated`), then, with `modes`,
  per execution mode of `cost_model.MODES` on the median CPU time of the
  first setting that runs it (`WithMode`). A separate calibration step
  (`cell_profile.StepTime`) ran minutes before the rounds and drifted with
  the machine: the calibration rows predicted back were off by up to 13%.

  Args:
    profile: the uncalibrated profile.
    measured: setting name -> (table, cut, recompute, median wall s,
      median CPU s).
    calib: the setting whose step fits the cells and the cores.
    modes: whether to fit the other modes' factors too.
    max_cores: the most cores a fit may give (None: this machine's).

  Returns:
    (the calibrated profile, the (schedule, recompute) pairs of the rows
    it was fitted to).
  """
  # pylint: disable=g-import-not-at-top
  from tensorpipe import cost_model
  if max_cores is None:
    from tensorpipe import cell_profile
    max_cores = cell_profile.NumCores()
  # pylint: enable=g-import-not-at-top
  table, cut, rc, wall, cpu = measured[calib]
  profile = profile.Calibrated(table, cut, rc, wall, cpu, max_cores)
  own = cost_model.Mode(table, rc)
  fitted = {(table.name, rc)} if profile.cell_scale != 1.0 else set()
  for mode, pair in cost_model.MODES.items() if modes else ():
    n = next((n for n, m in measured.items() if n != calib and
              (m[0].name, m[2]) == pair and
              m[0].num_stages == m[0].num_devices), None)
    if n is None or mode == own:
      continue
    t, c, r, _, c_cpu = measured[n]
    profile = profile.WithMode(t, c, r, c_cpu)
    if dict(profile.mode_scales).get(mode) is not None:
      fitted.add(pair)
  return profile, fitted


def _Profile(model: str, setting: str, reps: int,
             micro_batch_sizes: Sequence[int] = (),
             modes: bool = True) -> Dict[str, Any]:
  """--profile: the profile of one setting's layer, with the threads and
  devices of the setting (and its cells at `micro_batch_sizes`), fitted to
  a step of that layer (`cost_model.Profile.Calibrated`) and, with
  `modes`, to one step per other execution mode (`cost_model.MODES`); per
  stage of its cut the summed cells."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from tensorpipe import cell_profile, cost_model, devices
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
  prof = cell_profile.ProfileLayer(layer, (x,), reps,
                                   micro_batch_sizes=micro_batch_sizes,
                                   calibrate=True,
                                   calibrate_modes=(tuple(cost_model.MODES)
                                                    if modes else ()))
  took = _Now() - start
  cut = cell_profile.StageCut(layer)
  stages = [{f: sum(getattr(c, f) for c in prof.layers[a:b]) for f in
             ('forward', 'backward', 'input_grad', 'weight_grad')}
            for a, b in cut]
  return dict(profile=prof.ToJson(), stages=stages, seconds=took,
              cut=[list(c) for c in cut])


def _Now() -> float:
  return time.perf_counter()


def ChildMain() -> None:
  """Entry point of the child: argv[1] is a JSON request."""
  # pylint: disable=g-import-not-at-top
  from tools.benchmark_lib import memory_check, plan_uniform
  # pylint: enable=g-import-not-at-top
  request = json.loads(sys.argv[1])
  fn = {'profile': _Profile, 'check': _Measure,
        'uniform': plan_uniform.Measure,
        'memory': memory_check.Measure}[request.pop('action')]
  sys.stdout.write(RESULT_PREFIX + json.dumps(fn(**request)) + '\n')


def RunChild(model: str, tt: int, steps: int = 10, reps: int = 10,
             timeout_s: float = 1800, sweep: Sequence[int] = (),
             recompute: Sequence[bool] = (True,),
             calibrate: bool = True,
             calibration: Optional[Any] = None,
             num_partitions: int = 2) -> Dict[str, Any]:
  """`_Measure` in a fresh process.

  Raises:
    RuntimeError: the child failed (with its stderr tail).
  """
  return Spawn(dict(action='check', model=model, tt=tt, steps=steps,
                     reps=reps, sweep=list(sweep),
                     recompute=list(recompute), calibrate=calibrate,
                     calibration=calibration,
                     num_partitions=num_partitions),
                timeout_s)


def ProfileChild(model: str, setting: str, reps: int = 10,
                 timeout_s: float = 900,
                 micro_batch_sizes: Sequence[int] = (),
                 modes: bool = True) -> Dict[str, Any]:
  """`_Profile` in a fresh process: {'profile', 'stages', 'seconds', 'cut'
  (the layer's stage boundaries)}."""
  return Spawn(dict(action='profile', model=model, setting=setting,
                     reps=reps, micro_batch_sizes=list(micro_batch_sizes),
                     modes=modes), timeout_s)


def Spawn(request: Dict[str, Any], timeout_s: float,
          extra_env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
  """Runs ChildMain on `request` (`extra_env` added to its environment);
  RuntimeError with its stderr tail if it fails."""
  env = dict(os.environ, **(extra_env or {}))
  env['PYTHONPATH'] = paths.REPO_ROOT
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  try:
    proc = subprocess.run([sys.executable, '-c', _CHILD, json.dumps(request)],
                          capture_output=True, text=True, timeout=timeout_s,
                          env=env, cwd=paths.REPO_ROOT, check=False)
  except subprocess.TimeoutExpired:
    raise RuntimeError(f'{request} ran past {timeout_s:.0f} s (a loaded '
                       'machine? fewer --steps or T values)') from None
  for line in proc.stdout.splitlines():
    if line.startswith(RESULT_PREFIX):
      return json.loads(line[len(RESULT_PREFIX):])
  raise RuntimeError(f'{request} failed (exit {proc.returncode}):\n'
                     f'{proc.stderr[-3000:]}')


def _Errors(results: Sequence[Dict[str, Any]], clock: str) -> List[float]:
  """predicted / measured - 1 of every row but the one the profile was
  calibrated on (its own step: no prediction)."""
  return [r[f'predicted{clock}_s'] / r[f'measured{clock}_s'] - 1
          for res in results for r in res['rows']
          if not r.get('calibration')]


def Summary(results: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
  """Median and worst |predicted / measured - 1| of the step (wall) and of
  its CPU time (work) over the rows predicted (not calibrated on), and per
  (model, T) the pick's measured step over the fastest measured one (wall
  and CPU)."""
  out = {}
  for clock, name in (('', 'wall'), ('_cpu', 'cpu')):
    errs = [abs(e) for e in _Errors(results, clock)]
    out[name] = dict(median_abs_error=(statistics.median(errs) if errs
                                       else float('nan')),
                     worst_abs_error=max(errs, default=float('nan')),
                     rows=len(errs))
  picks = []
  for res in results:
    over = {}
    for clock, name in (('', 'wall'), ('_cpu', 'cpu')):
      # The planner plans with recompute: its pick against those rows.
      by = {(r['schedule'], r['v'], r['T']): r[f'measured{clock}_s']
            for r in res['rows'] if r.get('recompute', True)}
      over[name] = by[tuple(res['pick'])] / min(by.values()) - 1
    picks.append(dict(model=_Name(res), T=res['T'], pick=res['pick'],
                      over_best=over))
  out['picks'] = picks
  return out


def _Name(res: Dict[str, Any]) -> str:
  """The model, with its K where it is not 2."""
  kk = res.get('K', 2)
  return res['model'] if kk == 2 else f'{res["model"]} K={kk}'


def Table(results: Sequence[Dict[str, Any]]) -> str:
  """Markdown: one row per (model, T, schedule), then the summary."""
  lines = ['| model | T | schedule | step ms measured / predicted | error | '
           'CPU ms measured / predicted | error | measured / 1F1B | '
           'predicted / 1F1B | separate-regime ms |',
           '|---|---|---|---|---|---|---|---|---|---|']
  for res in results:
    # The base: 1F1B (of a sweep over T, at its first T).
    base = {(rc, k): next((r[k] for r in res['rows']
                           if r['schedule'] == '1f1b' and
                           r.get('recompute', True) == rc), float('nan'))
            for rc in (True, False) for k in ('measured_s', 'predicted_s')}
    for r in res['rows']:
      rc = r.get('recompute', True)
      lines.append(
          f'| {_Name(res)} | {r["T"]} | {r["schedule"]} v={r["v"]}'
          f'{"" if r.get("recompute", True) else " norc"}'
          f'{" *" if r.get("calibration") else ""} | '
          f'{r["measured_s"] * 1e3:.1f} / {r["predicted_s"] * 1e3:.1f} | '
          f'{r["predicted_s"] / r["measured_s"] - 1:+.1%} | '
          f'{r["measured_cpu_s"] * 1e3:.1f} / '
          f'{r["predicted_cpu_s"] * 1e3:.1f} | '
          f'{r["predicted_cpu_s"] / r["measured_cpu_s"] - 1:+.1%} | '
          f'{r["measured_s"] / base[rc, "measured_s"]:.3f} | '
          f'{r["predicted_s"] / base[rc, "predicted_s"]:.3f} | '
          f'{r["separate_s"] * 1e3:.1f} |')
  s = Summary(results)
  lines.append('')
  for name in ('wall', 'cpu'):
    lines.append(f'{name}: median |error| {s[name]["median_abs_error"]:.1%}'
                 f', worst {s[name]["worst_abs_error"]:.1%} over '
                 f'{s[name]["rows"]} predicted rows (rows marked * are '
                 'the step the profile was calibrated on)')
  lines += [f'- {p["model"]} T={p["T"]} (load {res["load_average"]:.1f}): '
            f'pick {p["pick"][0]} v={p["pick"][1]} T={p["pick"][2]}, '
            f'{p["over_best"]["wall"]:+.1%} (wall) / '
            f'{p["over_best"]["cpu"]:+.1%} (CPU) over the fastest measured'
            for p, res in zip(s['picks'], results)]
  return '\n'.join(lines)


def Run(models: Sequence[str], ts: Sequence[int], steps: int, reps: int,
        log=print, sweep: bool = False,
        recompute: Sequence[bool] = (True,),
        calibrate: bool = True,
        num_partitions: int = 2,
        calibrate_ts: int = 1) -> List[Dict[str, Any]]:
  """One child per (model, T), in turn, timing every schedule with each
  `recompute` setting; with `sweep` one per model over every T of `ts`
  (1F1B with recompute). With `calibrate` the profile is calibrated at
  each of the first `calibrate_ts` T of `ts` (their rows of the calibrated
  modes marked), and the model's other T get those calibrations
  interpolated at their micro-batch size
  (`cost_model.InterpolatedCalibration`; one: carried as it is)."""
  out = []
  for model in models:
    points = []
    for i, tt in enumerate(ts[:1] if sweep else ts):
      carried = calibrate and not sweep and i >= calibrate_ts
      res = RunChild(model, tt, steps, reps, sweep=ts if sweep else (),
                     recompute=recompute, calibrate=calibrate,
                     calibration=points if carried else None,
                     num_partitions=num_partitions)
      if calibrate and not sweep and not carried:
        points.append([res['profile']['micro_batch_rows'],
                       res['calibration']])
      log(f'{model} T={tt}: ' + ', '.join(
          f'{r["schedule"]} {r["measured_s"] * 1e3:.1f} / '
          f'{r["predicted_s"] * 1e3:.1f} ms' for r in res['rows']))
      out.append(res)
  return out
