"""The memory model against TF's allocator, one device at a time.

`tools/benchmark --memory_check` runs, per model of --models, T of
--plan_check_ts, schedule of `schedule_plan.ALL` and recompute on and
off, one child process with ONE logical CPU device (K=1: TF's logical
CPU devices share one allocator, so only a pipeline of one device has a
per-device peak to compare; with --memory_check_k=2 the measured peak of
both devices together is checked against the bracket [fullest device,
sum of the devices]; the schedules still differ at K=1: GPipe keeps
every micro-batch's boundary input, 1F1B one, the zero-bubble tables a
stash of (x, dz) pairs) that builds that setting, runs two steps, then
one more with the allocator's peak reset, and reports

  measured    the allocator's peak during that step minus what was
              allocated before it (weights, inputs, optimizer state), on
              TF's BFC CPU allocator (ALLOCATOR_ENV)
  predicted   `schedule_plan.TableMemory`: the step's peak on the device
              (gradient sums, activations, saved inputs and stash; of it
              the stash); the JSON also keeps the weights' bytes

  python -m tools.benchmark --memory_check --models=dense32mem \\
      --plan_check_ts=4,8
"""

import itertools
from typing import Any, Callable, Dict, List, Optional, Sequence

# With oneDNN on (TF's default on x86), TF's CPU allocator leaves out of
# its statistics every allocation under 256 KiB: measured, every setting of
# an 8-layer 256-wide FC model at batch 1024, T=8 (128 KiB activations per
# micro-batch) reported the same 2.25 MiB peak. TF's BFC allocator for the
# CPU counts every allocation; the child runs on it.
ALLOCATOR_ENV = {'TF_CPU_ALLOCATOR_USE_BFC': 'true'}

_SCHEDULES = (('gpipe', ''), ('1f1b', '1f1b-'), ('interleaved_1f1b', 'i2-'),
              ('zb_h1', 'zbh1-'), ('zb_v', 'zbv-'))


def Measure(model: str, tt: int, kk: int = 1,
            schedule: Optional[str] = None,
            recompute: Optional[bool] = None) -> Dict[str, Any]:
  """The child's work (module docstring); TF not yet started. With
  `schedule` and `recompute`, that one setting only (`Run` measures each
  in a process of its own)."""
  if (schedule is None) != (recompute is None):
    raise ValueError(f'schedule={schedule!r} and recompute={recompute!r}: '
                     'give both (one setting) or neither (every setting)')
  if schedule is not None and schedule not in dict(_SCHEDULES):
    raise ValueError(f'schedule={schedule!r} is not one memory_check '
                     f'runs; use one of {[n for n, _ in _SCHEDULES]}')
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from tensorpipe import cell_profile, model_analysis, schedule_plan
  from tools.benchmark_lib import plan_check, runner, settings
  # pylint: enable=g-import-not-at-top
  layer_ps, shape, x = plan_check.ChildInputs(model, kk)
  report = model_analysis.AnalyzeLayers(
      layer_ps, [shape], num_partitions=kk, num_micro_batches=tt,
      exact_optimizer_state=False)
  rows = []
  for (name, tag), rc in itertools.product(_SCHEDULES, (True, False)):
    if schedule is not None and (name, rc) != (schedule, recompute):
      continue
    s = settings.ParseSetting(
        f'K{kk}-T{tt}-{tag}{"rc" if rc else "norc"}')
    try:
      layer = runner.BuildLayer(s, layer_ps, shape)
    except ValueError:   # a schedule that does not apply at this T
      continue
    step = runner.StepFn(layer, x, 1e-3)
    for _ in range(2):
      step(x)[0].numpy()
    tf.config.experimental.reset_memory_stats('CPU:0')
    before = tf.config.experimental.get_memory_info('CPU:0')['current']
    step(x)[0].numpy()
    peak = tf.config.experimental.get_memory_info('CPU:0')['peak'] - before
    act, stash = schedule_plan.TableMemory(
        report, settings.ScheduleTable(s), cell_profile.StageCut(layer), rc)
    rows.append(dict(
        schedule=name, v=s.num_stages_per_device, recompute=rc,
        measured_bytes=int(peak), predicted_bytes=int(max(act)),
        predicted_devices=[int(a) for a in act], stash_bytes=int(max(stash)),
        weight_bytes=int(sum(v.shape.num_elements() * v.dtype.size
                             for v in layer.trainable_variables))))
  return dict(model=model, T=tt, K=kk, rows=rows)


def Run(models: Sequence[str], ts: Sequence[int], kk: int = 1,
        log: Callable[[str], None] = print) -> List[Dict[str, Any]]:
  """One child per setting (model, T, schedule, recompute), in turn, with
  K = kk logical devices. Settings built one after another in one
  process read 0.57-1.59x the peak the same setting has in a process of
  its own (benchmarks/results/memory_check_one_process/ against
  memory_check_stash/): what one setting left in the allocator and in
  TF's caches moved the next one's peak."""
  from tools.benchmark_lib import plan_check  # pylint: disable=g-import-not-at-top
  out = []
  for model, tt in itertools.product(models, ts):
    res = dict(model=model, T=tt, K=kk, rows=[])
    for (schedule, _), rc in itertools.product(_SCHEDULES, (True, False)):
      res['rows'] += plan_check.Spawn(
          dict(action='memory', model=model, tt=tt, kk=kk,
               schedule=schedule, recompute=rc),
          1800, extra_env=ALLOCATOR_ENV)['rows']
    log(f'{model} T={tt}: ' + ', '.join(
        f'{r["schedule"]}{"" if r["recompute"] else " norc"} '
        f'{r["measured_bytes"] / 2**20:.1f} MiB' for r in res['rows']))
    out.append(res)
  return out


def Table(results: Sequence[Dict[str, Any]]) -> str:
  """Markdown: one row per setting, then per model and over all the range
  of measured over predicted and how many are within 10%. With K > 1 the
  devices share one allocator: the row then says whether the measured
  peak lies between the fullest device's predicted peak and the sum of
  every device's (`bracket`)."""
  mib = lambda b: f'{b / 2**20:.1f}'
  lines = ['| model | K | T | schedule | recompute | allocator peak MiB | '
           'predicted MiB (stash) | measured / predicted |',
           '|---|---|---|---|---|---|---|---|']
  ratios: Dict[str, List[float]] = {}
  bracket: Dict[str, List[bool]] = {}
  for res in results:
    kk = res.get('K', 1)
    for r in res['rows']:
      m, p = r['measured_bytes'], r['predicted_bytes']
      total = sum(r.get('predicted_devices', [p]))
      if kk > 1:
        inside = p <= m <= total
        bracket.setdefault(res['model'], []).append(inside)
        shown = (f'{mib(p)} to {mib(total)} ({mib(r["stash_bytes"])}) | '
                 f'{"within" if inside else "outside"} '
                 f'({m / total if total else float("nan"):.3f} of the sum)')
      else:
        ratio = m / p if p else float('nan')
        ratios.setdefault(res['model'], []).append(ratio)
        shown = f'{mib(p)} ({mib(r["stash_bytes"])}) | {ratio:.3f}'
      lines.append(
          f'| {res["model"]} | {kk} | {res["T"]} | {r["schedule"]} '
          f'v={r["v"]} | {"on" if r["recompute"] else "off"} | {mib(m)} | '
          f'{shown} |')
  if ratios or bracket:
    lines.append('')
  if ratios:
    every = [x for xs in ratios.values() for x in xs]
    for name, xs in list(ratios.items()) + [('all', every)]:
      within = sum(0.9 <= x <= 1.1 for x in xs)
      lines.append(f'{name}: measured / predicted {min(xs):.3f} to '
                   f'{max(xs):.3f}, within 10% in {within} of {len(xs)}')
  for name, xs in bracket.items():
    lines.append(f'{name}: measured between the fullest device and the sum '
                 f'of the devices in {sum(xs)} of {len(xs)}')
  return '\n'.join(lines)
