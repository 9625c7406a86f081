"""Benchmarks TensorPipeLayer: throughput, memory, timeline and simulator.

For each model and each setting (see tools/benchmark_lib/settings.py: plain,
plain-T<t>, naive-K, naive-K-serial, K<k>-T<t>-rc / -norc / -rcg, and the
1F1B schedule's K<k>-T<t>-1f1b-rc / -norc, paired with GPipe's K<k>-T<t>-rc
in the same process) a fresh
process builds the model, measures its memory over the warm-up steps, then
times --steps training steps (forward + backward + SGD update) with one
intra-op thread and K inter-op threads (one core per device). With --pair
(default) the same process also builds the setting's baselines (plain,
plain-T<t>, naive-K, the no-recompute twin) and times them in turn, one
step each per round: separate processes of one setting differ by up to 25%
on this machine, so ratios come from there. For pipelined settings with
loops a copy of the step with the timeline on is in the same rotation (for
no-recompute settings, of their recompute twin): its cells are the stage
costs the simulator predicts from, and for recompute settings its wall time
is what the prediction is compared with.

The binary prints a markdown table (examples/s, speed-up vs --baseline,
peak RSS above idle, TF allocator activation peak, simulator predictions),
the issue's targets with explanatory ratios, and writes results.json and
PNG plots under --out. --timeline records one step of the named settings of
the first model (Chrome trace JSON + Gantt PNG + figure-4 breakdown).

  python -m tools.benchmark --models=dense16,conv16 --out=benchmarks/out
  python -m tools.benchmark --models=dense16 --settings=plain,K2-T8-rc \
      --steps=5 --timeline=K2-T8-rc
  bazel run //tools:benchmark -- --models=tiny --settings=plain,K2-T2-rc
  python -m tools.benchmark --report_from=benchmarks/results/grid/results.json
  python -m tools.benchmark --tick_cost --tick_cost_repos=/tmp/old_worktree
  python -m tools.benchmark --profile --models=dense16 \
      --profile_setting=K2-T8-rc --profile_micro_batch_sizes=4,8,16,32
  python -m tools.benchmark --plan_check --models=dense16,conv16
  python -m tools.benchmark --step_profile --models=dense4w256,dense32w256 \
      --settings=K2-T8-1f1b-rc,K2-T8-zbh1-rc,K2-T8-i2-rc,K2-T8-zbv-rc
  python -m tools.benchmark --remote_check --models=dense16,conv16 \
      --settings=K2-T8-1f1b-rc,K2-T8-zbh1-rc
  python -m tools.benchmark --ramp_check --models=dense4w256,xfmr8 \
      --settings=K2-T8-1f1b-rc,K2-T8-zbv-rc
  python -m tools.benchmark --models=conv16 \
      --settings=K2-T32-1f1b-rc,K2-T32-1f1b-norc \
      --memory_settings=K2-T32-rc,K2-T32-1f1b-rc --timeline=
"""

import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags

from tensorpipe import schedule_program
from tools import paths
from tools.benchmark_lib import analysis
from tools.benchmark_lib import memory_check
from tools.benchmark_lib import plan_check
from tools.benchmark_lib import plan_uniform
from tools.benchmark_lib import plots
from tools.benchmark_lib import ramp_check
from tools.benchmark_lib import remote
from tools.benchmark_lib import report as report_lib
from tools.benchmark_lib import results as results_lib
from tools.benchmark_lib import settings as settings_lib
from tools.benchmark_lib import spawn
from tools.benchmark_lib import step_profile
from tools.benchmark_lib import targets
from tools.benchmark_lib import tick_cost

FLAGS = flags.FLAGS
flags.DEFINE_list('models', ['dense16', 'conv16'], 'Built-in micro-benchmarks '
                  f'({sorted(settings_lib.BUILTIN_MODELS)}) or registered '
                  'experiment keys.')
flags.DEFINE_list('settings', None, 'Settings to run; default: plain, naive-K '
                  'and K in {1,2,4} x T in {1,4,8} x recompute on/off.')
flags.DEFINE_string('baseline', 'plain', 'Setting the speed-up is against.')
flags.DEFINE_integer('steps', 10, 'Timed steps per setting (median).',
                     lower_bound=1)
flags.DEFINE_integer('warmup', 2, 'Untimed steps after tracing.',
                     lower_bound=0)
flags.DEFINE_list('memory_settings', ['plain', 'K1-T8-rc'], 'Settings run on '
                  '--memory_model for the memory target (empty: skip).')
flags.DEFINE_string('memory_model', 'dense32mem', 'Model of the memory runs.')
flags.DEFINE_list('timeline', ['K4-T8-rc'], 'Settings whose one-step '
                  'timeline is recorded, for the first model (empty: none).')
flags.DEFINE_string('out', 'benchmarks/out', 'Output folder (results.json, '
                    'PNGs, timelines); relative to the working directory (or '
                    'where bazel run was called).')
flags.DEFINE_float('wait_for_load', 0.0, 'If > 0, wait up to '
                   '--max_wait_s for the 1-minute load average to drop below '
                   'this before starting.')
flags.DEFINE_integer('max_wait_s', 600, 'See --wait_for_load.')
flags.DEFINE_boolean('pair', True, 'Time each setting\'s baselines (plain, '
                     'plain-T<t>, naive-K, the no-recompute twin) in the same '
                     'process, '
                     'interleaved step by step, and take ratios from there: '
                     'separate processes of one setting differ by up to ~25%.')
flags.DEFINE_string('report_from', None, 'Run nothing: re-render the tables '
                    '(targets re-evaluated) of this results.json and write '
                    'tables.md next to it.')
flags.DEFINE_boolean('tick_cost', False, 'Run nothing else: measure the '
                     'fixed cost of one pipeline clock tick per partition '
                     '(forward and backward loops, K in {1, 2, 4}, T in '
                     '{8, 32}, a tiny model; see benchmark_lib/tick_cost.py) '
                     'and the consistency model\'s K=4,T=8 / K=1,T=8 step '
                     'ratio; writes tick_cost.json under --out.')
flags.DEFINE_list('tick_cost_repos', [], 'With --tick_cost: other checkouts '
                  '(e.g. a `git worktree` of an earlier commit) measured in '
                  'the same run, process by process in turn.')
flags.DEFINE_integer('tick_cost_reps', 200, 'With --tick_cost: timed '
                     'rounds per child process (the 10th percentile is '
                     'kept).', lower_bound=10)
flags.DEFINE_boolean('profile', False, 'Run nothing else: the cost profile '
                     'of the first of --models at --profile_setting (per '
                     'layer t_F, t_B, t_I, t_W of the engine\'s cells, tick '
                     'and transfer cost; tensorpipe/cell_profile.py), '
                     'calibrated on a step of the setting and one step per '
                     'other execution mode (cost_model.MODES: GPipe, 1F1B, '
                     'ZB-H1, recompute on and off), written to profile.json '
                     "under --out: the plan_profile of schedule='auto'.")
flags.DEFINE_string('profile_setting', 'K2-T8-rc', 'With --profile: the '
                    'setting (K, T, threads) profiled.')
flags.DEFINE_list('profile_micro_batch_sizes', [], 'With --profile: also '
                  'time the cells at these micro-batch sizes (rows), the '
                  "curve num_micro_batches='auto' plans from, e.g. "
                  '4,8,16,32.')
flags.DEFINE_boolean('plan_check', False, 'Run nothing else: every schedule '
                     'of --models at K=2 with recompute, T in --plan_check_ts, '
                     'measured and predicted by the calibrated cost model in '
                     'one process per (model, T); the planner\'s pick '
                     'against the fastest (benchmark_lib/plan_check.py); '
                     'writes plan_check.json and plan_check.md under --out.')
flags.DEFINE_list('plan_check_ts', ['4', '8'], 'With --plan_check: the T '
                  'values.')
flags.DEFINE_boolean('plan_check_norc', False, 'With --plan_check: time '
                     'and predict every schedule without recompute too.')
flags.DEFINE_integer('plan_check_k', 2, 'With --plan_check: K, the '
                     'logical devices (and inter-op threads) the schedules '
                     'run on.')
flags.DEFINE_boolean('plan_check_calibrate', True, 'With --plan_check: '
                     'at the first T of --plan_check_ts (the first '
                     '--plan_check_calibrate_ts) fit the profile to the '
                     'timed steps, one schedule per execution mode '
                     '(cost_model.Mode; those rows are marked * and left '
                     'out of the error summary), and carry that calibration '
                     '(interpolate those) to the other T.')
flags.DEFINE_integer('plan_check_calibrate_ts', 1, 'With --plan_check: '
                     'the first N of --plan_check_ts are each calibrated on '
                     'their own rounds (those rows marked *); the other T '
                     'get those calibrations interpolated at their '
                     'micro-batch size (linear in log rows; the nearest '
                     'outside them).', lower_bound=1)
flags.DEFINE_boolean('plan_check_sweep_t', False, 'With --plan_check: per '
                     'model, 1F1B at every T of --plan_check_ts in one '
                     "process, and num_micro_batches='auto''s pick among "
                     'them (the measured micro-batch curve).')
flags.DEFINE_boolean('plan_uniform', False, 'Run nothing else: per '
                     'model of --models and T of --plan_check_ts (K = '
                     '--plan_check_k; recompute, and with --plan_check_norc '
                     'without it too), GPipe with the layers cut by count '
                     'against GPipe cut by FLOPs and the schedule the planner '
                     'picks from a profile taken in the same process '
                     '(benchmark_lib/plan_uniform.py); writes '
                     'plan_uniform.json and plan_uniform.md under --out.')
flags.DEFINE_boolean('memory_check', False, 'Run nothing else: per model '
                     'of --models and T of --plan_check_ts, every schedule '
                     'on --memory_check_k logical devices (default one: '
                     'they share one allocator), recompute on and off: '
                     'TF\'s allocator peak of a step against '
                     'schedule_plan\'s memory model '
                     '(benchmark_lib/memory_check.py); writes '
                     'memory_check.json and memory_check.md under --out.')
flags.DEFINE_integer('memory_check_k', 1, 'With --memory_check: K logical '
                     'devices (they share one allocator: above 1 the '
                     'measured peak is checked to lie between the fullest '
                     'device\'s prediction and the sum of the devices\').')
flags.DEFINE_boolean('step_profile', False, 'Run nothing else: each of '
                     '--settings of each of --models timed (--steps), then '
                     '--step_profile_steps more steps under TF\'s profiler: '
                     'per step the time with no kernel running on any '
                     'thread and each thread\'s busy time, per tick of the '
                     'table (benchmark_lib/step_profile.py); writes '
                     'step_profile.json and step_profile.md under --out.')
flags.DEFINE_integer('step_profile_steps', 5, 'With --step_profile: '
                     'profiled steps per setting (median).', lower_bound=1)
flags.DEFINE_boolean('remote_check_one_pass', True, '--remote_check: run '
                     'the stages on the servers as one pass without a loop '
                     '(schedule_program.UnrollAcrossProcesses; the '
                     'library\'s default); --noremote_check_one_pass: the '
                     'looped engine.')
flags.DEFINE_boolean('remote_check', False, 'Run nothing else: each of '
                     '--settings (pipelined, built-in --models) timed in '
                     'one process and with its K stages in K TF servers on '
                     '127.0.0.1 (the multi-host path), and the transfer '
                     'floor of its boundary tensor between two servers '
                     '(benchmark_lib/remote.py), and the calibrated cost '
                     'model\'s step with separate executors (from a '
                     '--profile of the setting); writes remote_check.json '
                     'and remote_check.md under --out.')
flags.DEFINE_boolean('ramp_check', False, 'Run nothing else: each of '
                     '--settings (loss-inside, recompute) of each of '
                     '--models timed in one process, in rotation, with its '
                     'ramps run with fixed cells (schedule_program.'
                     'RampTicks; the default), switching on the table, and '
                     'switching with its F, B and I cells inline (the engine '
                     'before schedule_program.ISOLATED_CELLS) '
                     '(benchmark_lib/ramp_check.py); writes ramp_check.json '
                     'and ramp_check.md under --out.')
flags.DEFINE_boolean('partition_costs', True, 'Time each partition alone '
                     '(needed by the simulator predictions).')


def _OutDir() -> str:
  out = paths.UserPath(FLAGS.out)
  os.makedirs(out, exist_ok=True)
  return out


def _WaitForQuiet() -> float:
  start = time.time()
  while True:
    load = os.getloadavg()[0]
    if load < FLAGS.wait_for_load or time.time() - start > FLAGS.max_wait_s:
      return load
    print(f'load average {load:.2f} >= {FLAGS.wait_for_load}; waiting',
          flush=True)
    time.sleep(20)


def _Run(argv):
  del argv
  if FLAGS.report_from:
    _ReportFrom(paths.UserPath(FLAGS.report_from))
    return
  if FLAGS.tick_cost:
    _TickCost()
    return
  if (FLAGS.profile or FLAGS.plan_check or FLAGS.plan_uniform or
      FLAGS.memory_check):
    _Plan()
    return
  if FLAGS.step_profile:
    _StepProfile()
    return
  if FLAGS.remote_check:
    _RemoteCheck()
    return
  if FLAGS.ramp_check:
    _RampCheck()
    return
  settings = FLAGS.settings or settings_lib.GridSettings()
  for s in settings + FLAGS.memory_settings + FLAGS.timeline:
    try:
      settings_lib.ParseSetting(s)
    except ValueError as e:
      raise app.UsageError(str(e)) from None
  out = _OutDir()
  load = _WaitForQuiet() if FLAGS.wait_for_load > 0 else os.getloadavg()[0]
  started = time.time()
  results, not_run = [], []
  runs = [(m, s, FLAGS.pair) for m in FLAGS.models for s in settings]
  # Memory runs hold one model each, so the peaks are the setting's own.
  runs += [(FLAGS.memory_model, s, False) for s in FLAGS.memory_settings]
  for model, setting, pair in runs:
    try:
      r = spawn.RunSettingSubprocess(
          model, setting, steps=FLAGS.steps, warmup=FLAGS.warmup,
          partition_costs=FLAGS.partition_costs,
          pair_with=settings_lib.PairedBaselines(setting) if pair else [])
    except (RuntimeError, subprocess.TimeoutExpired) as e:
      print(f'SKIPPED {model} {setting}: {e}', file=sys.stderr, flush=True)
      not_run.append({'model': model, 'setting': setting,
                      'reason': spawn.FailureReason(e)})
      continue
    paired = ', '.join(f'{b} {p.step_time_s * 1e3:.1f}'
                       for b, p in r.paired.items())
    print(f'{model} {setting}: {r.step_time_s * 1e3:.1f} ms/step'
          + (f' (same process: {paired})' if paired else ''), flush=True)
    results.append(r)
  timelines = []
  for setting in FLAGS.timeline:
    try:
      r = spawn.RunSettingSubprocess(
          FLAGS.models[0], setting, steps=1, warmup=FLAGS.warmup,
          partition_costs=False, timeline_dir=out)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
      not_run.append({'model': FLAGS.models[0],
                      'setting': f'{setting} (timeline)',
                      'reason': spawn.FailureReason(e)})
      continue
    timelines.append(r)
  analysis.AddSpeedups(results, FLAGS.baseline)
  calib = analysis.AddPredictions(results)
  pngs = []
  for model in FLAGS.models:
    for kind, fn in (('speedup', plots.PlotSpeedup),
                     ('memory', plots.PlotMemory)):
      path = os.path.join(out, f'{kind}_{model}.png')
      fn(results, model, path)
      pngs.append(path)
  if FLAGS.memory_settings:
    path = os.path.join(out, f'memory_{FLAGS.memory_model}.png')
    plots.PlotMemory(results, FLAGS.memory_model, path)
    pngs.append(path)
  report = results_lib.Report(
      load_average_at_start=load, cpu_count=os.cpu_count(),
      wall_time_s=time.time() - started, results=results, calibration=calib,
      targets=targets.EvaluateTargets(results), plots=pngs,
      timelines=timelines, not_run=not_run)
  with open(os.path.join(out, 'results.json'), 'w') as f:
    json.dump(report.ToJson(), f, indent=1)
  text = report_lib.ReportText(report)
  with open(os.path.join(out, 'tables.md'), 'w') as f:
    f.write(text)
  print()
  print(text)
  print(f'wrote {os.path.join(out, "results.json")}, tables.md and '
        f'{len(pngs)} plots in {time.time() - started:.0f} s (load average '
        f'at start {load:.2f})')


def _TickCost() -> None:
  """--tick_cost: per-tick fixed costs of this and --tick_cost_repos."""
  repos = [paths.REPO_ROOT] + [paths.UserPath(r)
                               for r in FLAGS.tick_cost_repos]
  for repo in repos:
    if not os.path.isdir(os.path.join(repo, 'tensorpipe')):
      raise app.UsageError(f'--tick_cost_repos: {repo!r} has no tensorpipe/ '
                           'folder; give a checkout of this repository')
  out = _OutDir()
  started = time.time()
  results = tick_cost.Measure(repos, reps=FLAGS.tick_cost_reps,
                              log=lambda line: print(line, flush=True))
  with open(os.path.join(out, 'tick_cost.json'), 'w') as f:
    json.dump(results, f, indent=1)
  print()
  print(tick_cost.Table(results))
  print(f'wrote {os.path.join(out, "tick_cost.json")} in '
        f'{time.time() - started:.0f} s')


def _WriteTable(out: str, stem: str, data, text: str) -> None:
  """Writes <stem>.json (data) and <stem>.md (text) under out; prints
  the text."""
  with open(os.path.join(out, f'{stem}.json'), 'w') as f:
    json.dump(data, f, indent=1)
  with open(os.path.join(out, f'{stem}.md'), 'w') as f:
    f.write(text + '\n')
  print(text)


def _ParsedSettings() -> list:
  """--settings parsed; an unknown name is a usage error naming the forms."""
  try:
    return [settings_lib.ParseSetting(s) for s in FLAGS.settings or []]
  except ValueError as e:
    raise app.UsageError(str(e)) from None


def _EachSettingChild(parsed, **kwargs):
  """(model, setting, result) of each of `parsed` of each of --models, run
  in a child of its own (spawn.RunSettingSubprocess with --steps,
  --warmup, no partition costs and `kwargs`); a failed child is reported
  and skipped."""
  for model in FLAGS.models:
    for setting in parsed:
      try:
        r = spawn.RunSettingSubprocess(
            model, setting.name, steps=FLAGS.steps, warmup=FLAGS.warmup,
            partition_costs=False, **kwargs)
      except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f'SKIPPED {model} {setting.name}: {spawn.FailureReason(e)}',
              file=sys.stderr, flush=True)
        continue
      yield model, setting, r


def _StepProfile() -> None:
  """--step_profile: per setting, the step's time with no kernel running."""
  if not FLAGS.settings:
    raise app.UsageError('--step_profile needs --settings, e.g. '
                         '--settings=K2-T8-1f1b-rc,K2-T8-zbv-rc')
  parsed = _ParsedSettings()
  out = _OutDir()
  rows = []
  for model, setting, r in _EachSettingChild(
      parsed, step_profile_steps=FLAGS.step_profile_steps):
    row = dict(model=model, setting=setting.name,
               ticks=step_profile.Ticks(setting),
               step_time_s=r.step_time_s, profile=r.step_profile)
    print(f'{model} {setting.name}: {r.step_time_s * 1e3:.1f} ms/step, '
          f'{r.step_profile.no_kernel_s * 1e3:.2f} ms with no kernel '
          f'running ({row["ticks"]} ticks)', flush=True)
    rows.append(row)
  _WriteTable(out, 'step_profile',
              [dict(r, profile=r['profile'].ToJson()) for r in rows],
              step_profile.Table(rows))


def _RampCheck() -> None:
  """--ramp_check: ramps with fixed cells against switching ramps, and
  against the engine before its F, B and I cells were isolated."""
  if not FLAGS.settings:
    raise app.UsageError('--ramp_check needs --settings, e.g. '
                         '--settings=K2-T8-1f1b-rc,K2-T8-zbv-rc')
  parsed = _ParsedSettings()
  for setting in parsed:
    try:
      ramp_check.CheckSetting(setting)
    except ValueError as e:
      raise app.UsageError(str(e)) from None
  out = _OutDir()
  rows = []
  for model, setting, r in _EachSettingChild(parsed, switching_ramps=True):
    row = ramp_check.Row(model, r, ramp_check.RampTicks(setting))
    print(f'{model} {setting.name}: fixed {row["fixed_ms"]:.2f} ms, '
          f'switching {row["switching_ms"]:.2f} ms ({row["ratio"]:.3f}), '
          f'before {row["inline_ms"]:.2f} ms (fixed / before '
          f'{row["over_before"]:.3f})', flush=True)
    rows.append(row)
  _WriteTable(out, 'ramp_check', rows, ramp_check.Table(rows))


def _RemoteCheck() -> None:
  """--remote_check: stages in other processes against one process."""
  parsed = _ParsedSettings()
  bad = [s.name for s in parsed if s.kind != 'pipe'
         or s.num_partitions < 2]
  if not parsed or bad:
    raise app.UsageError(f'--remote_check needs pipelined settings with '
                         f'K >= 2 in --settings (got {bad or "none"}), e.g. '
                         '--settings=K2-T8-1f1b-rc')
  unknown = [m for m in FLAGS.models if m not in settings_lib.BUILTIN_MODELS]
  if unknown:
    raise app.UsageError(f'--remote_check runs built-in models only, not '
                         f'{unknown}')
  shapes = {}
  for model in FLAGS.models:
    for setting in parsed:
      try:
        shapes[model, setting.name] = remote.BoundaryShape(
            settings_lib.BUILTIN_MODELS[model].input_shape,
            setting.num_micro_batches)
      except ValueError as e:
        raise app.UsageError(f'--remote_check: {model} {setting.name}: {e}; '
                             'use a T that divides the batch') from None
  out = _OutDir()
  rows = []
  for model in FLAGS.models:
    for setting in parsed:
      kwargs = dict(steps=FLAGS.steps, warmup=FLAGS.warmup,
                    partition_costs=False)
      shape = shapes[model, setting.name]
      try:
        local = spawn.RunSettingSubprocess(model, setting.name, **kwargs)
        procs, addresses = remote.StartServers(setting.num_partitions)
        try:
          far = spawn.RunSettingSubprocess(
              model, setting.name, remote_workers=addresses,
              cpu_pids=[p.pid for p in procs],
              one_pass_cells=(schedule_program.ONE_PASS_CELLS
                              if FLAGS.remote_check_one_pass else 0),
              **kwargs)
          [floor] = remote.TransferFloorSubprocess(addresses[:2], [shape])
        finally:
          remote.StopServers(procs)
        # The setting's own mode: no other mode's step needed.
        prof = plan_check.ProfileChild(model, setting.name, modes=False)
      except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f'SKIPPED {model} {setting.name}: {spawn.FailureReason(e)}',
              file=sys.stderr, flush=True)
        continue
      row = dict(model=model, setting=setting.name, shape=shape,
                 local_step_s=local.step_time_s,
                 remote_step_s=far.step_time_s,
                 crossings=remote.Crossings(setting),
                 remote_s=floor['remote_s'], local_s=floor['local_s'],
                 local_cpu_s=local.cpu_s,
                 remote_cpu_s=[far.cpu_s] + far.pid_cpu_s,
                 predicted_separate_s=remote.SeparatePrediction(
                     setting, prof['profile'], prof['cut']),
                 predicted_transfers_s=remote.SeparatePrediction(
                     setting, prof['profile'], prof['cut'],
                     floor['remote_s'], floor['bytes']))
      print(f'{model} {setting.name}: {local.step_time_s * 1e3:.1f} ms in '
            f'one process, {far.step_time_s * 1e3:.1f} ms in '
            f'{setting.num_partitions} servers; a transfer '
            f'{floor["remote_s"] * 1e6:.0f} µs between servers', flush=True)
      rows.append(row)
  _WriteTable(out, 'remote_check', rows, remote.Table(rows))


def _Plan() -> None:
  """--profile (one model's profile.json), --plan_check, --plan_uniform or
  --memory_check (their tables)."""
  out = _OutDir()
  if FLAGS.profile:
    try:
      settings_lib.ParseSetting(FLAGS.profile_setting)
    except ValueError as e:
      raise app.UsageError(f'--profile_setting: {e}') from None
    try:
      sizes = [int(m) for m in FLAGS.profile_micro_batch_sizes]
    except ValueError:
      sizes = None
    if sizes is None or any(m < 1 for m in sizes):
      raise app.UsageError(
          '--profile_micro_batch_sizes='
          f'{",".join(FLAGS.profile_micro_batch_sizes)} must be positive '
          'ints (rows per micro-batch), e.g. 4,8,16')
    try:
      res = plan_check.ProfileChild(FLAGS.models[0], FLAGS.profile_setting,
                                    micro_batch_sizes=sizes)
    except RuntimeError as e:
      sys.exit(f'benchmark: error: --profile: {e}')
    path = os.path.join(out, 'profile.json')
    with open(path, 'w') as f:
      json.dump(res['profile'], f, indent=1)
    for k, st in enumerate(res['stages']):
      print(f'stage {k}: ' + ', '.join(f'{n} {v * 1e3:.2f} ms'
                                       for n, v in st.items()))
    for q in res['profile']['points']:
      print(f'at {q["micro_batch_rows"]} rows: forward '
            f'{sum(c["forward"] for c in q["layers"]) * 1e3:.2f} ms, '
            f'backward {sum(c["backward"] for c in q["layers"]) * 1e3:.2f} '
            'ms (all layers)')
    print(f'tick {res["profile"]["tick_s"] * 1e3:.3f} ms, transfer '
          f'{res["profile"]["transfer_s_per_byte"] * 1e9:.3f} ns/B; '
          f'profiled in {res["seconds"]:.1f} s; wrote {path}')
    return
  try:
    ts = [int(t) for t in FLAGS.plan_check_ts]
  except ValueError:
    raise app.UsageError(f'--plan_check_ts={",".join(FLAGS.plan_check_ts)} '
                         'must be integers, e.g. 4,8') from None
  recompute = (True, False) if FLAGS.plan_check_norc else (True,)
  if FLAGS.memory_check:
    try:
      results = memory_check.Run(FLAGS.models, ts, FLAGS.memory_check_k,
                                 log=lambda line: print(line, flush=True))
    except RuntimeError as e:
      sys.exit(f'benchmark: error: --memory_check: {e}')
    _WriteTable(out, 'memory_check', results, memory_check.Table(results))
    return
  if FLAGS.plan_uniform:
    try:
      results = plan_uniform.Run(
          FLAGS.models, ts, FLAGS.steps, 10,
          log=lambda line: print(line, flush=True), recompute=recompute,
          num_partitions=FLAGS.plan_check_k)
    except (RuntimeError, ValueError) as e:
      sys.exit(f'benchmark: error: --plan_uniform: {e}')
    _WriteTable(out, 'plan_uniform', results, plan_uniform.Table(results))
    return
  try:
    results = plan_check.Run(
        FLAGS.models, ts, FLAGS.steps, 10,
        log=lambda line: print(line, flush=True),
        sweep=FLAGS.plan_check_sweep_t,
        recompute=recompute, calibrate=FLAGS.plan_check_calibrate,
        num_partitions=FLAGS.plan_check_k,
        calibrate_ts=FLAGS.plan_check_calibrate_ts)
  except RuntimeError as e:
    sys.exit(f'benchmark: error: --plan_check: {e}')
  _WriteTable(out, 'plan_check', results, plan_check.Table(results))


def _ReportFrom(path: str) -> None:
  """Re-renders tables.md (targets re-evaluated) from a results.json."""
  try:
    with open(path) as f:
      report = results_lib.Report.FromJson(json.load(f))
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise app.UsageError(f'--report_from={path!r} is not a results.json '
                         f'written by tools/benchmark: {e}') from None
  report.targets = targets.EvaluateTargets(report.results,
                                           num_cores=report.cpu_count)
  text = report_lib.ReportText(report)
  with open(os.path.join(os.path.dirname(os.path.abspath(path)),
                         'tables.md'), 'w') as f:
    f.write(text)
  print(text)


def main():
  app.run(_Run)


if __name__ == '__main__':
  main()
